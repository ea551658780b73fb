"""FedRolex (docs/methods/fedrolex.md): RAM-Fed's speed-sized neuron submodels with a
window of kept units that rolls one index per round, each element averaged over the
clients that trained it."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fedclock.config import load_config
from fedclock.experiment import _build
from fedclock.models.shapes import FULL, Neurons
from fedclock.sim.simulator import Budget, Simulator
from fedclock.strategies.ramfed import rolling_keep
from tests.conftest import tiny_raw


def test_the_window_by_hand() -> None:
    """Widths (5, 4), keeping (3, 2): round 0 is the prefix; round 3 keeps 3, 4, 0 of the
    first layer and 3, 0 of the second."""
    assert rolling_keep(0, (3, 2), (5, 4)) == ((0, 1, 2), (0, 1))
    assert rolling_keep(3, (3, 2), (5, 4)) == ((0, 3, 4), (0, 3))
    assert rolling_keep(4, (3, 2), (5, 4)) == ((0, 1, 4), (0, 1))


@given(c=st.integers(1, 40), k=st.integers(1, 40), start=st.integers(0, 1000))
def test_over_c_rounds_every_unit_is_trained_k_times(c: int, k: int, start: int) -> None:
    k = min(k, c)
    counts = Counter(u for r in range(start, start + c) for u in rolling_keep(r, (k,), (c,))[0])
    assert counts == dict.fromkeys(range(c), k)


def test_a_run_dispatches_the_rolling_window_to_the_slow_clients() -> None:
    raw = tiny_raw(
        strategy={"name": "fedrolex"},
        population={"scenario": "classes", "slowdown": {"kind": "none"}, "classes": [
            {"fraction": 0.5, "speed": 1.0e8}, {"fraction": 0.5, "speed": 2.5e7}]},
        budget={"aggregations": 4},
    )  # fmt: skip
    cfg = load_config(raw=raw)
    parts = _build(cfg, None)
    seen: dict[int, list[Any]] = {}

    class Watch:
        def on_dispatch(self, sim: Any, task: Any) -> None:
            seen.setdefault(task.base.version, []).append((task.client, task.plan.shape))

    sim = Simulator(strategy=parts.strategy, executor=parts.executor, population=parts.population,
                    initial=parts.initial, seed=cfg.seed, budget=Budget(aggregations=4),
                    observers=[Watch()])  # fmt: skip
    sim.run()
    work = parts.strategy.planner
    assert len(seen) == 4
    slow = [c for c in range(6) if not work.is_full(c)]
    assert slow and len(slow) < 6  # the fast class trains the full model
    for version, tasks in seen.items():
        for client, shape in tasks:
            if client in slow:
                assert isinstance(shape, Neurons)
                want = rolling_keep(version, work.counts[client], work.widths)
                assert shape.keep == want, (version, client)
            else:
                assert shape is FULL
    assert sim.model.version == 4
