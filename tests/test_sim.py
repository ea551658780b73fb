"""Simulator: event ordering, accounting, cost model, FedAvg rules, determinism."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fedclock.config import load_config
from fedclock.devices import TaskCost, build_population, task_timing
from fedclock.devices.cost import TaskTiming
from fedclock.devices.population import fx_update_times
from fedclock.experiment import run_experiment
from fedclock.sim import Context, Contribution, ModelVersion, Simulator, TaskPlan
from fedclock.sim.observers import EvaluationSchedule, Metrics
from fedclock.sim.simulator import Budget
from fedclock.strategies import client_importance, local_sgd_plan, select_clients
from fedclock.strategies.aggregators import Importance, Update
from tests.conftest import tiny_raw

# ------------------------------------------------------------------ cost model


def test_task_timing_hand_computed():
    cost = TaskCost(flops=3.0e6, bytes_down=40_000, bytes_up=20_000)
    t = task_timing(cost, speed=1.5e6, up_bandwidth=1.0e4, down_bandwidth=2.0e4, slowdown=1.5)
    assert t.down_s == pytest.approx(2.0)  # 40 kB / 20 kB/s
    assert t.compute_s == pytest.approx(3.0)  # 3 MFLOP / 1.5 MFLOP/s × 1.5
    assert t.up_s == pytest.approx(2.0)
    assert t.duration == pytest.approx(7.0)
    # compute done by an abort: nothing during the download, all of it after
    assert t.compute_done_by(1.0) == 0.0
    assert t.compute_done_by(3.5) == pytest.approx(1.5)
    assert t.compute_done_by(10.0) == pytest.approx(3.0)


def test_infinite_bandwidth_is_free():
    t = task_timing(
        TaskCost(2.0, 10, 10), speed=1.0, up_bandwidth=math.inf, down_bandwidth=math.inf
    )
    assert (t.down_s, t.compute_s, t.up_s) == (0.0, 2.0, 0.0)


def test_fx_update_times_match_the_authors_code():
    eps = np.finfo(np.float64).eps
    # τ_i = 1 − i·(X/100)/(M − 1)
    np.testing.assert_allclose(fx_update_times(5, 80), [1.0, 0.8, 0.6, 0.4, 0.2], rtol=4 * eps)
    assert fx_update_times(4, 0).tolist() == [1.0] * 4
    assert fx_update_times(1, 80).tolist() == [1.0]


def test_fx_population_matches_fraboni_times():
    cfg = load_config(
        raw={
            "population": {
                "scenario": "fx",
                "fx_percent": 80,
                "speed": 1.0,
                "up_bandwidth": None,
                "down_bandwidth": None,
            }
        }
    )
    pop = build_population(cfg.population, 5, seed=0)
    cost = TaskCost(flops=1.0, bytes_down=0, bytes_up=0)
    durations = [pop.timing(i, cost, 0).duration for i in range(5)]
    # τ_i = 1 − i·0.8/(M−1): 1.0, 0.8, 0.6, 0.4, 0.2
    assert durations == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])


def test_classes_population_counts_and_determinism():
    raw = tiny_raw()["population"]
    raw["classes"] = [{"fraction": 0.25, "speed": 1.0}, {"fraction": 0.75, "speed": 4.0}]
    cfg = load_config(raw={"population": raw})
    a = build_population(cfg.population, 10, seed=1)
    b = build_population(cfg.population, 10, seed=1)
    assert np.array_equal(a.speed, b.speed)
    # 2.5 / 7.5 clients: the tie in remainders goes to the first class
    assert sorted(a.speed.tolist()) == [1.0] * 3 + [4.0] * 7
    assert a.slowdown(3, 7) == b.slowdown(3, 7)
    assert a.slowdown(3, 7) != a.slowdown(3, 8)


def test_lognormal_slowdown_has_mean_one():
    cfg = load_config(raw={"population": {"slowdown": {"kind": "lognormal", "sigma": 0.5}}})
    pop = build_population(cfg.population, 1, seed=0)
    draws = np.array([pop.slowdown(0, k) for k in range(4000)])
    assert draws.mean() == pytest.approx(1.0, abs=0.03)
    assert (draws > 0).all()
    assert np.log(draws).std() == pytest.approx(0.5, abs=0.02)


def test_exponential_slowdown_is_exp1():
    from scipy import stats

    cfg = load_config(raw={"population": {"slowdown": {"kind": "exponential"}}})
    pop = build_population(cfg.population, 50, seed=4)
    draws = np.array([pop.slowdown(c, k) for c in range(50) for k in range(100)])
    assert stats.kstest(draws, "expon").pvalue > 1e-3


def test_slowdown_draws_are_keyed_and_uncorrelated():
    """The counter-based slowdown: neighbouring clients and consecutive tasks uncorrelated,
    the same (seed, client, k) the same draw, another seed another."""
    cfg = load_config(raw={"population": {"slowdown": {"kind": "exponential"}}})
    pop = build_population(cfg.population, 100, seed=7)
    grid = np.array([[pop.slowdown(c, k) for k in range(100)] for c in range(100)])
    assert abs(np.corrcoef(grid[:, :-1].ravel(), grid[:, 1:].ravel())[0, 1]) < 0.05
    assert abs(np.corrcoef(grid[:-1].ravel(), grid[1:].ravel())[0, 1]) < 0.05
    again = build_population(cfg.population, 100, seed=7)
    other = build_population(cfg.population, 100, seed=8)
    assert again.slowdown(3, 4) == grid[3, 4] != other.slowdown(3, 4)


@pytest.mark.parametrize("kind", ["none", "lognormal", "exponential"])
def test_population_timing_matches_the_cost_model(kind):
    from fedclock.devices.cost import TaskCost, task_timing
    from fedclock.devices.population import Population

    raw = {"scenario": "fx", "fx_percent": 50, "speed": 1.0e6, "up_bandwidth": 2.0e5,
           "down_bandwidth": None, "slowdown": {"kind": kind}}  # fmt: skip
    pop = build_population(load_config(raw={"population": raw}).population, 5, seed=2)
    cost = TaskCost(flops=3.0e6, bytes_down=4000, bytes_up=8000)
    for c in range(5):
        expect = task_timing(
            cost, speed=float(pop.speed[c]), up_bandwidth=float(pop.up_bandwidth[c]),
            down_bandwidth=float(pop.down_bandwidth[c]), slowdown=pop.slowdown(c, 3),
        )  # fmt: skip
        assert pop.timing(c, cost, 3) == expect
        assert Population.timing(pop, c, cost, 3) == expect  # the method and its closure agree
    assert pop.timing(0, cost, 0).down_s == 0.0  # infinite bandwidth: free


# ------------------------------------------------------------------ math


def test_client_importance_hand_computed():
    assert client_importance([10, 30, 60], "samples") == pytest.approx([0.1, 0.3, 0.6])
    assert client_importance([10, 30, 60], "uniform") == pytest.approx([1 / 3] * 3)


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=50))
def test_client_importance_sum_to_one(ns):
    w = client_importance(ns, "samples")
    assert w.sum() == pytest.approx(1.0)
    assert (w > 0).all()


@given(n=st.integers(1, 500), b=st.integers(1, 64), epochs=st.floats(0.1, 5))
def test_local_sgd_plan_counts_samples(n, b, epochs):
    plan = local_sgd_plan(n, b, local_epochs=epochs, local_steps=None)
    per_epoch = math.ceil(n / min(b, n))
    assert plan.local_steps == max(1, math.floor(epochs * per_epoch + 0.5))
    if plan.local_steps % per_epoch == 0:
        assert plan.samples == n * plan.local_steps // per_epoch
    assert plan.samples <= plan.local_steps * plan.batch_size


def test_local_sgd_plan_example():
    # 70 samples, batch 32: batches of 32, 32, 6 per epoch
    assert local_sgd_plan(70, 32, local_epochs=1, local_steps=None).samples == 70
    assert local_sgd_plan(70, 32, local_epochs=None, local_steps=4).samples == 70 + 32


def test_select_clients_fraction():
    rng = np.random.default_rng(0)
    assert select_clients(rng, 10, 1.0).tolist() == list(range(10))
    chosen = select_clients(rng, 10, 0.3)
    assert len(chosen) == 3 and len(set(chosen.tolist())) == 3
    assert len(select_clients(rng, 10, 0.01)) == 1


def _contribution(client: int, n: int, delta: float) -> Contribution:
    from fedclock.sim.types import Task

    task = Task(0, client, 0, None, None, None, TaskTiming(0, 0, 0), 0.0)  # type: ignore[arg-type]
    return Contribution(
        task=task, delta={"w": torch.tensor([delta])}, buffers={}, num_samples=n, train_loss=0.0
    )


def test_fedavg_update_hand_computed():
    base = ModelVersion(4, {"w": torch.tensor([1.0])})
    agg = Update(Importance("samples"))
    new = agg.aggregate(None, base, [_contribution(0, 10, 2.0), _contribution(1, 30, -2.0)])  # type: ignore[arg-type]
    # 1 + 0.25·2 + 0.75·(−2) = 0
    assert new.version == 5
    assert new.params["w"].item() == pytest.approx(0.0)
    assert agg.aggregate(None, base, []) is base  # type: ignore[arg-type]


# ------------------------------------------------------------------ event engine


class _Clock:
    """Fake planner/strategy: every task has a fixed duration per client."""

    name = "fake"

    def __init__(self, durations: dict[int, float], script) -> None:
        self.durations = durations
        self.script = script
        self.log: list[tuple[str, float, Any]] = []

    def plan(self, ctx: Context, client: int):
        return TaskPlan(1, 1, 1), TaskCost(flops=self.durations[client], bytes_down=0, bytes_up=0)

    def on_start(self, ctx: Context) -> None:
        self.script(self, ctx)

    def on_arrival(self, ctx: Context, c: Contribution) -> None:
        self.log.append(("arrival", ctx.now, c.client))

    def on_timer(self, ctx: Context, tag: Any) -> None:
        self.log.append(("timer", ctx.now, tag))

    def aggregate(self, ctx: Context, cs: Sequence[Contribution]) -> ModelVersion:
        return ctx.model


class _NullExecutor:
    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def run(self, tasks):
        self.batches.append([t.client for t in tasks])
        return [
            Contribution(task=t, delta={}, buffers={}, num_samples=1, train_loss=0.0) for t in tasks
        ]


def _sim(strategy, n=4, **budget):
    cfg = load_config(
        raw={"population": {"speed": 1.0, "up_bandwidth": None, "down_bandwidth": None}}
    )
    executor = _NullExecutor()
    sim = Simulator(
        strategy=strategy, executor=executor, population=build_population(cfg.population, n, 0),
        initial=ModelVersion(0, {}), seed=0, budget=Budget(**budget),
        observers=[EvaluationSchedule(None), Metrics(lambda v: (0.0, 0.0))],
    )  # fmt: skip
    return sim, executor


def test_events_are_ordered_by_time_then_sequence():
    def script(s, ctx):
        for client in (0, 1, 2, 3):
            ctx.dispatch(ctx.prepare(client))
        ctx.set_timer(2.0, "tick")  # ties with client 1 and 2's arrivals, scheduled after them
        ctx.set_timer(0.5, "early")

    strategy = _Clock({0: 3.0, 1: 2.0, 2: 2.0, 3: 1.0}, script)
    sim, executor = _sim(strategy)
    sim.run()
    assert strategy.log == [
        ("timer", 0.5, "early"),
        ("arrival", 1.0, 3),
        ("arrival", 2.0, 1),
        ("arrival", 2.0, 2),
        ("timer", 2.0, "tick"),
        ("arrival", 3.0, 0),
    ]
    # all four dispatches of the one callback reached the executor as one batch
    assert executor.batches == [[0, 1, 2, 3]]


def test_cancel_accounts_partial_compute_as_wasted():
    def script(s, ctx):
        s.task = ctx.dispatch(ctx.prepare(0))
        ctx.set_timer(1.5, "abort")

    strategy = _Clock({0: 4.0}, script)
    strategy.on_timer = lambda ctx, tag: ctx.cancel(strategy.task)  # type: ignore[method-assign]
    sim, _ = _sim(strategy, n=1)
    sim.run()
    assert sim.counters.compute_s_spent == pytest.approx(1.5)
    assert sim.counters.compute_s_wasted == pytest.approx(1.5)
    assert sim.counters.updates_discarded == 1


def test_virtual_time_budget_stops_and_truncates_in_flight_work():
    def script(s, ctx):
        ctx.dispatch(ctx.prepare(0))

    sim, _ = _sim(_Clock({0: 10.0}, script), n=1, virtual_time=4.0)
    assert sim.run().value == "virtual_time"
    assert sim.now == 4.0
    assert sim.counters.compute_s_spent == pytest.approx(4.0)
    assert sim.counters.compute_s_wasted == pytest.approx(4.0)


# ------------------------------------------------------------------ end to end


def _metrics_without_wall(path):
    lines = (path / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    wall = header.index("wall_time")
    return [[v for i, v in enumerate(line.split(",")) if i != wall] for line in lines]


def test_same_config_and_seed_give_identical_metrics(tmp_path):
    cfg = load_config(raw=tiny_raw())
    run_experiment(cfg, run_dir=tmp_path / "a")
    run_experiment(cfg, run_dir=tmp_path / "b")
    a, b = _metrics_without_wall(tmp_path / "a"), _metrics_without_wall(tmp_path / "b")
    assert len(a) == 6  # header + evaluation at t=0 + 4 aggregations
    assert a == b
    other = load_config(raw=tiny_raw(seed=4))
    run_experiment(other, run_dir=tmp_path / "c")
    assert _metrics_without_wall(tmp_path / "c") != a


def test_drop_stragglers_equals_fedavg_when_nobody_is_late(tmp_path):
    fedavg = run_experiment(load_config(raw=tiny_raw()), run_dir=tmp_path / "f")
    slowest = 1e9  # a deadline nobody can miss
    drop = run_experiment(
        load_config(raw=tiny_raw(strategy={"name": "drop-stragglers", "t_max": slowest})),
        run_dir=tmp_path / "d",
    )
    assert _metrics_without_wall(tmp_path / "f") == _metrics_without_wall(tmp_path / "d")
    assert drop.summary["updates_discarded"] == 0
    assert fedavg.summary["final_test_accuracy"] == drop.summary["final_test_accuracy"]


def test_drop_stragglers_discards_late_updates_and_counts_waste(tmp_path):
    raw = tiny_raw(strategy={"name": "drop-stragglers", "t_max": 1.0}, budget={"aggregations": 3})
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "d")
    s = res.summary
    assert s["updates_discarded"] > 0
    assert s["updates_used"] + s["updates_discarded"] == 3 * 6
    assert 0 < s["compute_s_wasted"] < s["compute_s_spent"]
    # every round closes at the deadline or earlier
    assert s["virtual_time"] <= 3 * 1.0 + 1e-9


def test_digits_fedavg_preset_reaches_90_percent(tmp_path):
    from fedclock.presets import load_preset

    res = run_experiment(load_config(raw=load_preset("digits-fedavg")), run_dir=tmp_path / "r")
    assert res.summary["status"] == "completed"
    assert res.summary["final_test_accuracy"] >= 0.90


def test_deadline_tie_in_floating_point_does_not_deliver_a_skipped_task(tmp_path):
    # duration and t_max differ in the last bit, but now + duration == now + t_max:
    # the task must be treated exactly as the event heap orders it
    raw = tiny_raw(
        partition={"num_clients": 4},
        model={"arch": "logreg"},
        population={"scenario": "homogeneous", "speed": 921599.9999999998, "up_bandwidth": None,
                    "down_bandwidth": None, "slowdown": {"kind": "none"}},
        strategy={"name": "drop-stragglers", "t_max": 1.0},
        budget={"aggregations": 3},
    )  # fmt: skip
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "r")
    assert res.summary["status"] == "completed"


def test_compute_spent_only_grows(tmp_path):
    raw = tiny_raw(strategy={"name": "drop-stragglers", "t_max": 1.5}, budget={"aggregations": 5})
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "r")
    spent = [row["compute_s_spent"] for row in res.history]
    assert spent == sorted(spent) and spent[-1] > 0
    received = [row["updates_received"] for row in res.history]
    used = [row["updates_used"] for row in res.history]
    assert all(u <= r for u, r in zip(used, received, strict=True))


def test_package_version_is_the_projects():
    import tomllib

    from fedclock import __version__

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert project["project"]["version"] == __version__


def test_a_fine_evaluation_grid_evaluates_each_model_version_once(tmp_path, monkeypatch) -> None:
    """Over synchronous rounds a 0.05-s grid writes a row at every grid time, but a model
    version is evaluated once: its rows repeat the metrics (time_to_target to 0.05 s)."""
    from fedclock.config import load_config
    from fedclock.experiment import run_experiment
    from fedclock.train import evaluate as ev
    from tests.conftest import tiny_raw

    calls: list[int] = []
    real = ev.Evaluator.__call__

    def spy(self, version):
        calls.append(version.version)
        return real(self, version)

    monkeypatch.setattr(ev.Evaluator, "__call__", spy)
    raw = tiny_raw(eval={"every_aggregations": None, "every_virtual_seconds": 0.05})
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "r")
    assert len(calls) == len(set(calls)) == 5  # versions 0..4
    rows = res.history
    assert len(rows) > 5 * 3
    by_version: dict[int, set[float]] = {}
    for row in rows:
        by_version.setdefault(row["aggregation"], set()).add(row["test_accuracy"])
    assert all(len(v) == 1 for v in by_version.values())


def test_observers_get_every_hook_in_order():
    """One protocol (sim/observers.py): start, dispatch, arrival, aggregation, evaluation,
    after each event, end — and the simulator takes at most 8 parameters."""
    import inspect

    log: list[tuple[str, Any]] = []

    class Watch:
        def on_start(self, sim):
            log.append(("start", sim.now))

        def on_dispatch(self, sim, task):
            log.append(("dispatch", task.client))

        def on_arrival(self, sim, c):
            log.append(("arrival", c.client))

        def on_aggregation(self, sim, version):
            log.append(("aggregation", sim.counters.aggregations))

        def on_evaluation(self, sim, row):
            log.append(("evaluation", row["virtual_time"]))

        def on_event(self, sim):
            log.append(("event", sim.now))

        def on_end(self, sim):
            log.append(("end", sim.now))

    def script(s, ctx):
        ctx.dispatch(ctx.prepare(0))

    strategy = _Clock({0: 1.0}, script)
    strategy.on_arrival = lambda ctx, c: ctx.commit([c])  # type: ignore[method-assign]
    sim, _ = _sim(strategy, n=1, aggregations=1)
    sim = Simulator(
        strategy=strategy, executor=_NullExecutor(), population=sim.population,
        initial=ModelVersion(0, {}), seed=0, budget=Budget(aggregations=1),
        observers=[EvaluationSchedule(1), Metrics(lambda v: (0.0, 0.0)), Watch()],
    )  # fmt: skip
    sim.run()
    assert log == [
        ("evaluation", 0.0), ("start", 0.0), ("dispatch", 0), ("arrival", 0),
        ("evaluation", 1.0), ("aggregation", 1), ("event", 1.0), ("end", 1.0),
    ]  # fmt: skip
    # 9: run batching's ``execute`` is a constructor argument (no attribute patched after)
    assert len(inspect.signature(Simulator.__init__).parameters) - 1 <= 9
