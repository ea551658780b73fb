from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedclock.config import ExperimentConfig, load_config

REPO = Path(__file__).resolve().parents[1]


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
