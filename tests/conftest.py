from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture(autouse=True, scope="session")
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """fedclock's cache folder (the report's packed plotly.js) is the session's, not the
    user's ~/.cache; subprocesses inherit it."""
    old = os.environ.get("FEDCLOCK_CACHE_DIR")
    os.environ["FEDCLOCK_CACHE_DIR"] = str(tmp_path_factory.mktemp("fedclock-cache"))
    yield
    if old is None:
        os.environ.pop("FEDCLOCK_CACHE_DIR", None)
    else:
        os.environ["FEDCLOCK_CACHE_DIR"] = old


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


# ------------------------------------------------------------------ shared data sets
# Real MNIST and Tiny Shakespeare live outside the repository, in ../shared/data (CI provides
# them there) or wherever $FEDCLOCK_DATA points. A test that needs one takes the fixture
# `mnist_data` or `shakespeare_data` (or calls `require_data`): when the files are missing
# it is skipped with a sentence naming where they were looked for, and under CI=true it
# fails with that sentence instead, so a green CI run has exercised every such test. Skip
# reasons are printed at the end of every run (`-rfEs` in pyproject's addopts).

SHARED_ROOTS = [REPO.parent / "shared" / "data", REPO / "shared" / "data"]
DATA_FILES = {
    "mnist": (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ),
    "shakespeare": ("tinyshakespeare.txt",),
}
DATA_TITLES = {"mnist": "MNIST", "shakespeare": "Tiny Shakespeare"}


def in_ci() -> bool:
    """True when $CI says this is a CI run (CI=true, as .ci/run and CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def data_candidates(name: str) -> list[Path]:
    """Where the data set ``name`` may be: $FEDCLOCK_DATA itself, its ``name/`` folder and
    its sibling ``../name`` (FEDCLOCK_DATA may point at the mnist folder), then the shared
    roots' ``name/`` folders."""
    out: list[Path] = []
    env = os.environ.get("FEDCLOCK_DATA")
    if env:
        out += [Path(env), Path(env) / name, Path(env).parent / name]
    out += [root / name for root in SHARED_ROOTS]
    return list(dict.fromkeys(out))


def _has_files(folder: Path, name: str) -> bool:
    gz = name == "mnist"  # the MNIST loader reads the IDX files plain or gzip-compressed
    return all(
        (folder / f).is_file() or (gz and (folder / f"{f}.gz").is_file()) for f in DATA_FILES[name]
    )


def find_data(name: str) -> Path | None:
    """The first folder holding every file of the data set ``name``, or None."""
    return next((c for c in data_candidates(name) if _has_files(c, name)), None)


def mnist_dir() -> Path | None:
    """The shared MNIST folder if present (../shared/data/mnist or $FEDCLOCK_DATA)."""
    return find_data("mnist")


@functools.cache
def load_script(name: str) -> Any:
    """``scripts/<name>.py`` imported as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def require_data(name: str) -> Path:
    """The folder of the data set ``name`` for a test that needs it; if it is missing, skip
    the test, or under CI=true fail it, with one sentence naming where it was looked for."""
    found = find_data(name)
    if found is not None:
        return found
    where = ", ".join(str(c) for c in data_candidates(name))
    files = DATA_FILES[name]
    what = files[0] if len(files) == 1 else f"{files[0]}[.gz] and the other {len(files) - 1} files"
    reason = f"{DATA_TITLES[name]} not found: none of {where} holds {what}; set FEDCLOCK_DATA."
    if in_ci():
        pytest.fail(f"CI=true and this test needs shared data: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def mnist_data() -> Path:
    """The real MNIST folder (skip, or fail under CI=true, when it is missing)."""
    return require_data("mnist")


@pytest.fixture
def shakespeare_data() -> Path:
    """The Tiny Shakespeare folder (skip, or fail under CI=true, when it is missing)."""
    return require_data("shakespeare")


@pytest.fixture
def ylims(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """The y-limits of every panel of each figure fedclock's plots save, in order."""
    from fedclock.metrics import plots

    limits: list[tuple[float, float]] = []
    real_save = plots._save

    def spy(fig, out):
        limits.extend(ax.get_ylim() for ax in fig.axes)
        return real_save(fig, out)

    monkeypatch.setattr(plots, "_save", spy)
    return limits


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


def partial_executor(
    model, data, *, units, mode: str = "paper", persistent_momentum: bool = False,
    vectorize: bool = False, seed: int, lr: float, momentum: float = 0.0,
    weight_decay: float = 0.0, proximal_mu: float = 0.0,
):  # fmt: skip
    """The executor ``make_executor`` builds for the SALF family's work on ``units``
    (``proximal_mu``: a proximal term, as Fed-RAA's ρ)."""
    from fedclock.models.shapes import FULL, Layout, Suffix, Width
    from fedclock.train.factory import make_executor
    from fedclock.train.local import LocalTraining, Needs

    needs = Needs(
        shapes=frozenset({type(FULL), Suffix, Width}), layout=Layout.of(model, units, 0),
        suffix_trains_fully=mode == "reference", momentum_per_client=persistent_momentum,
    )  # fmt: skip
    local = LocalTraining(
        lr=lr, momentum=momentum, weight_decay=weight_decay, proximal_mu=proximal_mu
    )
    kind = "vectorized" if vectorize else "serial"
    return make_executor(needs, model, data, seed=seed, local=local, kind=kind)
