from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fedclock.config import ExperimentConfig, load_config

REPO = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------ equivalence in float64
# Equivalence tests compare two computations of the same numbers that round differently:
# the vectorized executor's batched (vmap) kernels against one client at a time, the GPU
# against the CPU, a layer-suffix backward pass against the full one. Their differences
# start at one rounding error and grow through every SGD step; in float32 they reach 1e-4
# on a BatchNorm VGG after a few steps, and how far they grow depends on the CPU's kernels
# and thread count. So these tests run in float64 (`float64_default`, fixture `float64`),
# where the same growth stays below 1e-14 (measured: 5e-15 at most, with 1 or 2 threads).
# EQUIV_TOL = 1e6 float64 epsilons ≈ 2.2e-10, used as atol and rtol: 4e4 times that growth,
# and still far below a real difference (one SGD step on another batch, rate or weight moves
# a parameter by about lr·|grad|, orders of magnitude more).
EQUIV_TOL = 1e6 * torch.finfo(torch.float64).eps


@contextlib.contextmanager
def float64_default() -> Iterator[None]:
    """torch's default dtype is float64 inside: models built and random tensors drawn
    there are float64 (hypothesis tests use this; others the fixture ``float64``)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@pytest.fixture
def float64(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test runs in float64: models are built with float64 parameters and every
    dataset ``run_experiment`` loads has float64 inputs (token ids stay int64)."""
    import fedclock.experiment as experiment

    real = experiment.load_dataset

    def load_float64(*args, **kwargs):
        ds = real(*args, **kwargs)
        if not ds.x_train.is_floating_point():
            return ds
        return dataclasses.replace(ds, x_train=ds.x_train.double(), x_test=ds.x_test.double())

    monkeypatch.setattr(experiment, "load_dataset", load_float64)
    with float64_default():
        yield


def mnist_dir() -> Path | None:
    """The shared MNIST folder if present (../shared/data/mnist or $FEDCLOCK_DATA)."""
    candidates = [REPO.parent / "shared" / "data" / "mnist", REPO / "shared" / "data" / "mnist"]
    env = os.environ.get("FEDCLOCK_DATA")
    if env:
        candidates.insert(0, Path(env))
        candidates.insert(1, Path(env) / "mnist")
    for c in candidates:
        if (c / "train-images-idx3-ubyte.gz").is_file():
            return c
    return None


def tiny_raw(**sections) -> dict:
    """A digits experiment small enough to run in well under a second."""
    raw = {
        "name": "tiny",
        "seed": 3,
        "data": {"name": "digits"},
        "partition": {"scheme": "iid", "num_clients": 6},
        "model": {"arch": "mlp", "hidden": [16]},
        "population": {
            "scenario": "classes",
            "classes": [
                {"fraction": 0.5, "speed": 2.0e6, "up_bandwidth": 2.0e5, "down_bandwidth": 2.0e5},
                {"fraction": 0.5, "speed": 5.0e5, "up_bandwidth": 1.0e5, "down_bandwidth": 1.0e5},
            ],
            "slowdown": {"kind": "lognormal", "sigma": 0.3},
        },
        "train": {"local_epochs": 1, "batch_size": 32, "lr": 0.1},
        "strategy": {"name": "fedavg"},
        "budget": {"aggregations": 4},
        "eval": {"every_aggregations": 1},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return raw


@pytest.fixture
def tiny_config() -> ExperimentConfig:
    return load_config(raw=tiny_raw())
