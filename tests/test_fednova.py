"""FedNova (docs/methods/fednova.md): a new weighting on the shared Update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedclock.config import ConfigError, load_config
from fedclock.devices.cost import TaskTiming
from fedclock.experiment import run_experiment
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan
from fedclock.strategies.aggregators import Update
from fedclock.strategies.fednova import FedNovaWeighting
from tests.conftest import tiny_raw


def _update(client: int, n: int, steps: int, delta: float, base: ModelVersion) -> Contribution:
    plan = TaskPlan(steps, 32, n)
    task = Task(0, client, 0, base, plan, None, TaskTiming(0, 0, 0), 0.0)  # type: ignore[arg-type]
    return Contribution(task, {"w": torch.tensor([delta], dtype=torch.float64)}, {}, n, 0.0)


def test_weights_hand_computed() -> None:
    """p = (0.25, 0.75), τ = (2, 4): τ_eff = 0.25·2 + 0.75·4 = 3.5, ω = τ_eff·p/τ."""
    base = ModelVersion(0, {"w": torch.tensor([1.0], dtype=torch.float64)})
    cs = [_update(0, 10, 2, 2.0, base), _update(1, 30, 4, -1.0, base)]
    w = FedNovaWeighting("samples")(None, base, cs)  # type: ignore[arg-type]
    np.testing.assert_allclose(w, [3.5 * 0.25 / 2, 3.5 * 0.75 / 4])
    new = Update(FedNovaWeighting()).aggregate(None, base, cs)  # type: ignore[arg-type]
    assert new.params["w"].item() == pytest.approx(1.0 + 0.4375 * 2.0 - 0.65625)
    assert [c.weight for c in cs] == pytest.approx([0.4375, 0.65625])


def _run(tmp_path, name: str, **partition):
    raw = tiny_raw(executor={"threads": 1}, strategy={"name": name}, budget={"aggregations": 4},
                   partition=partition)  # fmt: skip
    return run_experiment(load_config(raw=raw), run_dir=tmp_path / name).history


def test_equal_steps_give_fedavg_and_unequal_steps_differ(tmp_path) -> None:
    """Equal τ_i: ω_i = p_i (to rounding), so FedAvg's run; lognormal sizes: another run."""
    same = [_run(tmp_path / "eq", n) for n in ("fedavg", "fednova")]
    for a, b in zip(*same, strict=True):
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-5)
    skewed = [_run(tmp_path / "ln", n, sizes="lognormal", size_sigma=1.0)
              for n in ("fedavg", "fednova")]  # fmt: skip
    assert skewed[0][-1]["test_loss"] != skewed[1][-1]["test_loss"]
    assert skewed[1][-1]["test_loss"] < skewed[1][0]["test_loss"]  # it learns


def test_local_momentum_is_refused(tmp_path) -> None:
    raw = tiny_raw(strategy={"name": "fednova"}, train={"momentum": 0.5})
    with pytest.raises(ConfigError, match=r"fednova.*train\.momentum"):
        run_experiment(load_config(raw=raw), run_dir=tmp_path / "m")
