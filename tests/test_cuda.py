"""executor.device: cuda gives the same results as the CPU (in float64, to EQUIV_TOL).

Skipped where no CUDA device is present (CI and the development machines are CPU-only);
run on a GPU machine with ``python -m pytest tests/test_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch

from fedclock.config import load_config
from fedclock.experiment import run_experiment
from fedclock.train.executor import SerialExecutor, snapshot
from fedclock.train.vectorized import VectorizedExecutor
from tests.conftest import EQUIV_TOL
from tests.test_vectorized import CASES, _assert_same, case_setup

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _on_cpu(contributions: list) -> list:
    for c in contributions:
        assert all(d.device.type == "cuda" for d in c.delta.values())
        c.delta = {k: d.cpu() for k, d in c.delta.items()}
    return contributions


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("kind", ["serial", "vectorized"])
@pytest.mark.usefixtures("float64")
def test_cuda_contributions_equal_cpu(name: str, kind: str) -> None:
    data, model, tasks_on, opts = case_setup(CASES[name])
    cpu = SerialExecutor(model(), data, **opts).run(tasks_on(snapshot(model(), 3)))
    cuda_tasks = tasks_on(snapshot(model().cuda(), 3))
    ex: SerialExecutor | VectorizedExecutor
    if kind == "serial":
        ex = SerialExecutor(model(), data, device="cuda", **opts)
    else:
        ex = VectorizedExecutor(
            model(), data, device="cuda", max_batch_clients=CASES[name].block, **opts
        )
    _assert_same(cpu, _on_cpu(ex.run(cuda_tasks)), same_tasks=False)


_SALF = {"salf.scenario": "ratio", "population.straggler_ratio": 0.5,
         "train.local_steps": 1, "train.local_epochs": "null"}  # fmt: skip
STRATEGIES: dict[str, dict[str, object]] = {
    "fedavg": {},
    "drop-stragglers": {"strategy.t_max": 2.5},
    "fedbuff": {"strategy.buffer_size": 3, "eval.client_losses": "true"},
    "salf-paper": {**_SALF, "strategy.name": "salf", "salf.mode": "paper"},
    "salf-reference": {
        **_SALF,
        "strategy.name": "salf",
        "salf.mode": "reference",
        "train.momentum": 0.5,
    },
    "heterofl": {**_SALF, "strategy.name": "heterofl"},
    "asyncfl": {**_SALF, "strategy.name": "asyncfl"},
    "prunefl": {"strategy.reconfig_interval": 2, "strategy.initial_max_rounds": 20},
}


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.usefixtures("float64")
def test_run_on_cuda_matches_cpu(tmp_path, name: str) -> None:
    """A whole run (digits MLP) gives the same curve on the GPU as on the CPU."""
    sets = {"strategy.name": name, **STRATEGIES[name]}
    histories = {}
    for device in ("cpu", "cuda"):
        cfg = load_config(
            None,
            [
                "data.name=digits", "partition.num_clients=8", "model.arch=mlp",
                "model.hidden=[16]", "budget.aggregations=5", f"executor.device={device}",
                *(f"{k}={v}" for k, v in sets.items()),
            ],
        )  # fmt: skip
        histories[device] = run_experiment(cfg, run_dir=tmp_path / device).history
    a, b = histories["cpu"], histories["cuda"]
    assert len(a) == len(b) > 2
    for ra, rb in zip(a, b, strict=True):
        assert ra["virtual_time"] == rb["virtual_time"]  # the clock never depends on the device
        assert ra["aggregation"] == rb["aggregation"]
        assert ra["test_loss"] == pytest.approx(rb["test_loss"], rel=EQUIV_TOL, abs=EQUIV_TOL)


@pytest.mark.usefixtures("float64")
def test_batchnorm_fedavg_on_cuda_matches_cpu(tmp_path) -> None:
    """A VGG (BatchNorm, vectorized with per-client running statistics) on the GPU."""
    histories = {}
    for device in ("cpu", "cuda"):
        cfg = load_config(
            None,
            [
                "data.name=synthetic", "data.synthetic.num_samples=400",
                "data.synthetic.image_shape=[3, 32, 32]", "data.synthetic.separation=2.0",
                "partition.num_clients=4", "model.arch=vgg11", "model.vgg_width=0.125",
                "train.lr=0.01", "train.batch_size=16", "budget.aggregations=3",
                f"executor.device={device}",
            ],
        )  # fmt: skip
        histories[device] = run_experiment(cfg, run_dir=tmp_path / device).history
    for ra, rb in zip(histories["cpu"], histories["cuda"], strict=True):
        assert ra["virtual_time"] == rb["virtual_time"]
        assert ra["test_loss"] == pytest.approx(rb["test_loss"], rel=EQUIV_TOL, abs=EQUIV_TOL)
