"""Every normaliser uses the weighting ω it is given (issue 42): SALF's per-unit eq. 9 and
HeteroFL's per-element mean weight by ω, RAM-Fed's memory average refuses an ω it would
ignore. Equal ω give exactly the old plain means (the goldens are bit-identical)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedclock.devices.cost import TaskTiming
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan
from fedclock.strategies.aggregators import delta
from fedclock.strategies.ramfed import MemoryAverage
from fedclock.strategies.salf import PerUnit, coverage_delta, per_element

BASE = ModelVersion(0, {"w": torch.zeros(3, dtype=torch.float64)})


def _c(client: int, d: list[float], cover: list[bool] | None = None) -> Contribution:
    task = Task(0, client, 0, BASE, TaskPlan(1, 1, 1), None, TaskTiming(0, 0, 0), 0.0)  # type: ignore[arg-type]
    coverage = None if cover is None else {"w": torch.tensor(cover)}
    return Contribution(task, {"w": torch.tensor(d, dtype=torch.float64)}, {}, 1, 0.0,
                        coverage=coverage)  # fmt: skip


def test_per_element_weights_each_element_by_omega() -> None:
    """Element 0 held by both (ω = 0.25, 0.75): 0.25·4 + 0.75·8 = 7; element 1 by the
    first only: 2; element 2 by none: 0."""
    cs = [_c(0, [4.0, 2.0, 0.0], [True, True, False]), _c(1, [8.0, 0.0, 0.0], [True, False, False])]
    got = per_element(BASE, cs, np.array([0.25, 0.75]), delta)["w"]
    torch.testing.assert_close(got, torch.tensor([7.0, 2.0, 0.0], dtype=torch.float64))
    equal = per_element(BASE, cs, np.array([0.5, 0.5]), delta)["w"]
    masks = [c.coverage["w"] for c in cs]  # type: ignore[index]
    assert torch.equal(equal, coverage_delta(BASE.params["w"], [c.delta["w"] for c in cs], masks))
    assert equal.tolist() == [6.0, 2.0, 0.0]


def test_per_unit_weights_the_mean_over_the_units_holders() -> None:
    units = SimpleNamespace(of_param={"w": 1})
    cs = [_c(0, [1.0, 1.0, 1.0]), _c(1, [3.0, 3.0, 3.0])]
    paper = PerUnit(mode="paper", units=units, num_users=4, p_values=[0.5])  # type: ignore[arg-type]
    # (0.25·1 + 0.75·3) / 1 / (1 − 0.5) = 5; equal ω: mean 2 / 0.5 = 4
    assert paper(BASE, cs, np.array([0.25, 0.75]), delta)["w"].tolist() == [5.0] * 3
    assert paper(BASE, cs, np.array([0.5, 0.5]), delta)["w"].tolist() == [4.0] * 3
    ref = PerUnit(mode="reference", units=units, num_users=4, p_values=[0.0])  # type: ignore[arg-type]
    # ω = 1/U: (1 + 3)/4 = 1; another ω: Σ ω Δ = 0.1·1 + 0.2·3 = 0.7
    assert ref(BASE, cs, np.array([0.25, 0.25]), delta)["w"].tolist() == [1.0] * 3
    torch.testing.assert_close(ref(BASE, cs, np.array([0.1, 0.2]), delta)["w"],
                               torch.full((3,), 0.7, dtype=torch.float64))  # fmt: skip


def test_per_unit_reads_the_rounds_p_when_a_round_asks_some_users() -> None:
    """SALF over some users a round: eq. 9 divides by 1 − p_l of that round's users."""
    units = SimpleNamespace(of_param={"w": 1})
    cs = [_c(0, [1.0, 1.0, 1.0]), _c(1, [3.0, 3.0, 3.0])]
    ps = iter([[0.5], [0.75]])
    paper = PerUnit(mode="paper", units=units, num_users=4, p_values=[0.0],  # type: ignore[arg-type]
                    round_p=lambda: next(ps))  # fmt: skip
    assert paper(BASE, cs, np.array([0.5, 0.5]), delta)["w"].tolist() == [4.0] * 3  # 2/0.5
    assert paper(BASE, cs, np.array([0.5, 0.5]), delta)["w"].tolist() == [8.0] * 3  # 2/0.25


def test_memory_average_refuses_a_weighting_it_would_ignore() -> None:
    p = np.array([0.2, 0.3, 0.5])
    norm = MemoryAverage(p)
    cs = [_c(0, [1.0, 1.0, 1.0]), _c(2, [2.0, 2.0, 2.0])]
    got = norm(BASE, cs, p[[0, 2]], delta)["w"]  # ClientShare's ω: p_i
    torch.testing.assert_close(got, torch.full((3,), 0.2 + 1.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="takes only ClientShare's weighting"):
        MemoryAverage(p)(BASE, cs, np.array([0.5, 0.5]), delta)
