"""The asynchronous family: weights d_i, staleness, eq. 6, triggers, sanity equalities, metrics."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedclock.config import load_config
from fedclock.devices import TaskCost, build_population
from fedclock.devices.population import fx_update_times
from fedclock.errors import ConfigError
from fedclock.experiment import run_experiment
from fedclock.metrics.recorder import federated_metrics
from fedclock.sim import Context, Contribution, ModelVersion, Simulator, TaskPlan
from fedclock.sim.observers import EvaluationSchedule, Metrics, Progress
from fedclock.sim.simulator import Budget
from fedclock.sim.types import Task
from fedclock.strategies import (
    STRATEGIES,
    ArrivalBuffer,
    FixedPeriod,
    Strategy,
    Update,
    UpdateTimes,
    WeightRule,
)
from fedclock.strategies.aggregators import mix
from fedclock.strategies.asynchronous import ConstantWeight, StalenessWeighting
from fedclock.strategies.server import ServerOptimizer
from fedclock.strategies.weights import (
    Staleness,
    fedbuff_weights,
    fedfix_periods,
    fedfix_weights,
    identical_weights,
    participation_weights,
    sync_weights,
    time_based_weights,
)
from tests.conftest import tiny_raw

# ------------------------------------------------------------------ d_i (pure math)


def test_identical_and_sync_weights():
    assert identical_weights(3).tolist() == [1.0, 1.0, 1.0]
    assert sync_weights([0.2, 0.8]).tolist() == [0.2, 0.8]


def test_time_based_weights_hand_computed():
    # Σ 1/τ = 1 + 2 = 3;  d = 3 · τ · p = 3 · [1, 0.5] · 0.5
    assert time_based_weights([1.0, 0.5], [0.5, 0.5]) == pytest.approx([1.5, 0.75])
    # F80, M = 20, p = 1/20: the authors' range "about 0.41 to 2.1", ratio 5
    d = time_based_weights(fx_update_times(20, 80), np.full(20, 1 / 20))
    assert d.max() == pytest.approx(2.06, abs=0.01)
    assert d.min() == pytest.approx(0.41, abs=0.01)
    assert d.max() / d.min() == pytest.approx(5.0)
    # expected weight per server step (1/τ_i)/Σ(1/τ_j) · d_i is p_i (eq. 36)
    tau = fx_update_times(20, 80)
    rate = (1 / tau) / (1 / tau).sum()
    assert rate * d == pytest.approx(np.full(20, 1 / 20))


def test_time_based_equals_identical_times_m_p_with_equal_times():
    p = np.array([0.2, 0.3, 0.5])
    assert time_based_weights([2.0, 2.0, 2.0], p) == pytest.approx(identical_weights(3) * 3 * p)


def test_fedfix_worked_example_f80_half_period():
    for m, small, large in ((20, 0.05, 0.1), (50, 0.02, 0.04)):
        tau = fx_update_times(m, 80)
        periods = fedfix_periods(tau, 0.5)
        assert set(periods.tolist()) == {1.0, 2.0}
        assert ((periods == 2) == (tau > 0.5)).all()
        d = fedfix_weights(tau, np.full(m, 1 / m), 0.5)
        assert set(np.round(d, 12).tolist()) == {small, large}
    # M = 20: τ_i > 0.5 for i ≤ 11 (τ_11 = 0.5368, τ_12 = 0.4947)
    d20 = fedfix_weights(fx_update_times(20, 80), np.full(20, 1 / 20), 0.5)
    assert d20[:12] == pytest.approx([0.1] * 12) and d20[12:] == pytest.approx([0.05] * 8)


def test_fedfix_ceil_ignores_round_off_and_equals_sync_when_period_covers_everyone():
    assert fedfix_periods([0.6, 0.3, 0.9], 0.3).tolist() == [2.0, 1.0, 3.0]
    assert fedfix_periods([1e-6], 0.5).tolist() == [1.0]
    p = np.array([0.1, 0.9])
    assert fedfix_weights([0.4, 1.0], p, 1.0).tolist() == sync_weights(p).tolist()
    with pytest.raises(ValueError):
        fedfix_weights([1.0], [1.0], 0.0)


def test_fedbuff_and_participation_weights():
    assert fedbuff_weights(4, 2).tolist() == [0.25, 0.25]
    # rates r = [3/4, 1/4] → d = p / r
    assert participation_weights([0.5, 0.5], [3, 1], 4) == pytest.approx([2 / 3, 2.0])


def test_staleness_functions_hand_computed():
    assert Staleness("constant")(7) == 1.0
    assert Staleness("polynomial", a=0.5)(3) == pytest.approx(0.5)  # 4^-0.5
    hinge = Staleness("hinge", a=1.0, b=2.0)
    assert hinge(0) == hinge(2) == 1.0
    assert hinge(4) == pytest.approx(1 / 3)  # 1/(1·(4−2)+1)
    # FLSim normalisation: s(avg) = 1
    norm = Staleness("polynomial", a=1.0, normalize_at=1)
    assert norm(1) == pytest.approx(1.0) and norm(3) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        Staleness("exponential")
    with pytest.raises(ValueError):
        Staleness("polynomial")(-1)


# ------------------------------------------------------------------ eq. 6 aggregator


def _task(client: int, base: ModelVersion | None) -> Task:
    from fedclock.devices.cost import TaskTiming

    return Task(0, client, 0, base, None, None, TaskTiming(0, 0, 0), 0.0)  # type: ignore[arg-type]


def _contribution(client: int, delta: float, base: ModelVersion | None = None) -> Contribution:
    return Contribution(
        task=_task(client, base),
        delta={"w": torch.tensor([delta])},
        buffers={},
        num_samples=10,
        train_loss=0.0,
    )


def test_async_update_applies_eq6_with_stale_deltas():
    old = ModelVersion(2, {"w": torch.tensor([0.0])})
    base = ModelVersion(4, {"w": torch.tensor([1.0])})
    agg = Update(StalenessWeighting(ConstantWeight(0.5)), server=ServerOptimizer(lr=2.0))
    cs = [_contribution(0, 2.0, old), _contribution(1, -1.0, base)]
    new = agg.aggregate(None, base, cs)  # type: ignore[arg-type]
    # 1 + 2 · (0.5·2 + 0.5·(−1)) = 2 — the stale Δ is added as it is
    assert new.version == 5 and new.params["w"].item() == pytest.approx(2.0)
    assert [c.weight for c in cs] == [0.5, 0.5]
    assert agg.aggregate(None, base, []) is base  # type: ignore[arg-type]


def test_async_update_staleness_weight_and_momentum():
    old = ModelVersion(1, {"w": torch.tensor([0.0])})
    base = ModelVersion(4, {"w": torch.tensor([0.0])})
    agg = Update(StalenessWeighting(ConstantWeight(1.0), Staleness("polynomial", a=0.5)))
    c = _contribution(0, 2.0, old)
    new = agg.aggregate(None, base, [c])  # type: ignore[arg-type]
    assert c.weight == pytest.approx(0.5)  # staleness 3: (1+3)^-0.5
    assert new.params["w"].item() == pytest.approx(1.0)
    mom = Update(StalenessWeighting(ConstantWeight(1.0)), server=ServerOptimizer(momentum=0.5))
    v1 = mom.aggregate(None, base, [_contribution(0, 1.0, base)])  # type: ignore[arg-type]
    v2 = mom.aggregate(None, v1, [_contribution(0, 1.0, v1)])  # type: ignore[arg-type]
    assert v1.params["w"].item() == pytest.approx(1.0)
    assert v2.params["w"].item() == pytest.approx(2.5)  # v = 0.5·1 + 1


def test_server_optimizer_steps_hand_computed():
    """FedAvg (SGD), FedAvgM (momentum) and FedAdam steps on Δ = 1, then Δ = 2 (float64)."""
    theta = {"w": torch.tensor([0.5], dtype=torch.float64)}
    one, two = ({"w": torch.tensor([v], dtype=torch.float64)} for v in (1.0, 2.0))
    sgd = ServerOptimizer(lr=0.5)
    assert sgd.step(theta, one)["w"].item() == 1.0  # 0.5 + 0.5·1
    # FedAvgM: v = 1, θ = 0.5 + 0.5·1 = 1; v = 0.9·1 + 2 = 2.9, θ = 1 + 0.5·2.9 = 2.45
    m = ServerOptimizer(lr=0.5, momentum=0.9)
    t1 = m.step(theta, one)
    assert t1["w"].item() == pytest.approx(1.0, abs=1e-15)
    assert m.step(t1, two)["w"].item() == pytest.approx(2.45, abs=1e-15)
    # FedAdam (torch's bias correction): step 1 moves by η·m̂/(√v̂ + τ) = η·1/(1 + τ)
    adam = ServerOptimizer("adam", lr=0.1, momentum=0.9, beta2=0.99, eps=1e-3)
    a1 = adam.step(theta, one)
    assert a1["w"].item() == pytest.approx(0.5 + 0.1 / (1 + 1e-3), abs=1e-15)
    # step 2: m = 0.9·0.1 + 0.1·2 = 0.29, v = 0.99·0.01 + 0.01·4 = 0.0499; m̂ = m/0.19,
    # v̂ = v/(1 − 0.99²) = v/0.0199
    m_hat, v_hat = 0.29 / (1 - 0.9**2), 0.0499 / (1 - 0.99**2)
    want = a1["w"].item() + 0.1 * m_hat / (math.sqrt(v_hat) + 1e-3)
    assert adam.step(a1, two)["w"].item() == pytest.approx(want, abs=1e-14)
    assert torch.equal(theta["w"], torch.tensor([0.5], dtype=torch.float64))  # versions intact


@settings(max_examples=30, deadline=None)
@given(lr=st.floats(0.01, 4.0), seed=st.integers(0, 2**16))
def test_stateless_server_step_is_torch_sgd_bit_for_bit(lr: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    theta = {"a": torch.randn(7, generator=g), "b": torch.randn(3, 2, generator=g)}
    delta = {k: torch.randn(v.shape, generator=g) for k, v in theta.items()}
    fast = ServerOptimizer(lr=lr).step(theta, delta)
    ref = {k: v.clone() for k, v in theta.items()}
    opt = torch.optim.SGD(list(ref.values()), lr=lr)
    for k, p in ref.items():
        p.grad = -delta[k]
    opt.step()
    assert all(torch.equal(fast[k], ref[k]) for k in theta)


def test_fedasync_mixing_hand_computed():
    old = ModelVersion(3, {"w": torch.tensor([0.0])})
    cur = ModelVersion(5, {"w": torch.tensor([1.0])})
    # client trained θ_base = 0 into θ_new = 4;  θ ← 0.5·1 + 0.5·4
    agg = Update(StalenessWeighting(ConstantWeight(0.5)), target=mix)
    c = _contribution(0, 4.0, old)
    assert agg.aggregate(None, cur, [c]).params["w"].item() == 2.5  # type: ignore[arg-type]
    assert c.weight == 0.5  # constant s: α_t = α
    # α_t = α · s(t − τ) (Xie et al.): staleness 2 with (1+x)^-1 gives 0.5/3;  1 + (4 − 1)/6
    agg = Update(
        StalenessWeighting(ConstantWeight(0.5), Staleness("polynomial", a=1.0)), target=mix
    )
    c = _contribution(0, 4.0, old)
    new = agg.aggregate(None, cur, [c])  # type: ignore[arg-type]
    assert c.weight == pytest.approx(0.5 / 3, rel=4 * np.finfo(np.float64).eps)
    assert new.params["w"].item() == pytest.approx(1.5, rel=4 * torch.finfo(torch.float32).eps)


class _Ctx:
    """Just enough of a Context for the weight rules."""

    def __init__(self, participation: dict[int, int], aggregations: int, now: float = 0.0):
        from fedclock.sim.simulator import Counters

        self.counters = Counters(aggregations=aggregations, participation=participation)
        self.now = now


def test_weight_rules_pick_the_committed_clients():
    p = np.array([0.25, 0.25, 0.5])

    class Times:
        def tau(self, now):
            return np.array([1.0, 0.5, 0.25])

    cs = [_contribution(2, 0.0), _contribution(0, 0.0)]
    ctx = _Ctx({0: 1, 2: 3}, aggregations=4)
    rule = lambda kind: WeightRule(kind, importance=p, times=Times(), delta_t=0.4, buffer_size=2)  # type: ignore[arg-type]
    assert rule("identical")(ctx, cs).tolist() == [1.0, 1.0]  # type: ignore[arg-type]
    assert rule("sync")(ctx, cs).tolist() == [0.5, 0.25]  # type: ignore[arg-type]
    # Σ 1/τ = 7: d = 7·τ·p
    assert rule("time-based")(ctx, cs) == pytest.approx([7 * 0.25 * 0.5, 7 * 1.0 * 0.25])  # type: ignore[arg-type]
    assert rule("fedfix")(ctx, cs).tolist() == [0.5, 3 * 0.25]  # type: ignore[arg-type]
    assert rule("fedbuff")(ctx, cs).tolist() == [0.5, 0.5]  # type: ignore[arg-type]
    # counts include this step: client 2: 4 of 5, client 0: 2 of 5
    assert rule("participation")(ctx, cs) == pytest.approx([0.5 * 5 / 4, 0.25 * 5 / 2])  # type: ignore[arg-type]


# ------------------------------------------------------------------ schedules (paper Fig. 1)


class _FixedPlanner:
    """Client c's task takes ``durations[c]`` virtual seconds (speed 1 FLOP/s, free links)."""

    def __init__(self, durations: Sequence[float]) -> None:
        self.durations = durations

    def nominal(self, client: int) -> tuple[TaskPlan, TaskCost]:
        return TaskPlan(1, 1, 1), TaskCost(flops=self.durations[client], bytes_down=0, bytes_up=0)

    def plan(self, ctx: Context, client: int) -> tuple[TaskPlan, TaskCost]:
        return self.nominal(client)


class _NullExecutor:
    def run(self, tasks):
        return [
            Contribution(task=t, delta={}, buffers={}, num_samples=1, train_loss=0.0) for t in tasks
        ]


class _LoggingAggregator(Update):
    def __init__(self) -> None:
        super().__init__(StalenessWeighting(ConstantWeight(1.0)))
        self.log: list[tuple[float, int, list[tuple[int, int]]]] = []

    def aggregate(self, ctx, base, contributions):
        self.log.append(
            (ctx.now, base.version, [(c.client, c.base_version) for c in contributions])
        )
        return super().aggregate(ctx, base, contributions)


def _schedule(durations, trigger_factory, t_end):
    planner = _FixedPlanner(durations)
    times = UpdateTimes("profile", planner)  # type: ignore[arg-type]
    agg = _LoggingAggregator()
    strategy = Strategy("test", planner, trigger_factory(times), agg)  # type: ignore[arg-type]
    cfg = load_config(
        raw={"population": {"speed": 1.0, "up_bandwidth": None, "down_bandwidth": None}}
    )
    n = len(durations)
    sim = Simulator(
        strategy=strategy, executor=_NullExecutor(), population=build_population(cfg.population, n, 0),
        initial=ModelVersion(0, {}), seed=0, budget=Budget(virtual_time=t_end),
        observers=[EvaluationSchedule(None), Metrics(lambda v: (0.0, 0.0))],
    )  # fmt: skip
    sim.run()
    return agg.log, sim


def test_async_schedule_two_clients_fast_one_twice_as_frequent():
    # client 0: τ = 1 (fast), client 1: τ = 2; a server step on every arrival
    log, sim = _schedule([1.0, 2.0], lambda t: ArrivalBuffer(t, buffer_size=1), 4.5)
    # (time, global version before the step, [(client, base version)])
    assert log == [
        (1.0, 0, [(0, 0)]),
        (2.0, 1, [(1, 0)]),  # ties resolve in dispatch order: client 1 was sent its model first
        (2.0, 2, [(0, 1)]),
        (3.0, 3, [(0, 3)]),
        (4.0, 4, [(1, 2)]),
        (4.0, 5, [(0, 4)]),
    ]
    # staleness n − ρ_i(n): 0, 1, 1, 0, 2, 1
    assert sim.counters.staleness == {0: 2, 1: 3, 2: 1}
    assert sim.counters.participation == {0: 4, 1: 2}


def test_fedfix_schedule_matches_fig1():
    # Δt = 1: client 0 (τ = 1) contributes every tick, client 1 (τ = 2) every second tick
    log, sim = _schedule([1.0, 2.0], lambda t: FixedPeriod(t, delta_t=1.0), 4.5)
    assert log == [
        (1.0, 0, [(0, 0)]),
        (2.0, 1, [(0, 1), (1, 0)]),
        (3.0, 2, [(0, 2)]),
        (4.0, 3, [(0, 3), (1, 2)]),
    ]
    assert sim.counters.staleness == {0: 4, 1: 2}


def test_fedfix_client_waits_idle_for_the_next_tick():
    # τ = 1.5 with Δt = 1: arrives at 1.5, waits, restarts at 2, arrives 3.5, contributes at 4
    log, _ = _schedule([0.5, 1.5], lambda t: FixedPeriod(t, delta_t=1.0), 4.5)
    assert [(t, [c for c, _ in cs]) for t, _, cs in log] == [
        (1.0, [0]),
        (2.0, [0, 1]),
        (3.0, [0]),
        (4.0, [0, 1]),
    ]
    assert fedfix_periods([0.5, 1.5], 1.0).tolist() == [1.0, 2.0]


def test_fedbuff_contributors_restart_and_others_keep_working():
    log, _ = _schedule([1.0, 2.0, 3.0], lambda t: ArrivalBuffer(t, buffer_size=2), 3.5)
    assert log == [
        (2.0, 0, [(0, 0), (1, 0)]),  # client 0 waited from t = 1 in the buffer
        (3.0, 1, [(0, 1), (2, 0)]),  # client 2 kept working on version 0
    ]


def _in_flight_trace(durations, trigger, t_end, seed=0):
    """Run a schedule and record, after every event, which clients are training."""
    planner = _FixedPlanner(durations)
    strategy = Strategy(
        "test", planner, trigger(UpdateTimes("profile", planner)), _LoggingAggregator()
    )  # type: ignore[arg-type]
    cfg = load_config(
        raw={"population": {"speed": 1.0, "up_bandwidth": None, "down_bandwidth": None}}
    )
    n = len(durations)
    trace: list[list[int]] = []
    sim = Simulator(
        strategy=strategy, executor=_NullExecutor(), population=build_population(cfg.population, n, 0),
        initial=ModelVersion(0, {}), seed=seed, budget=Budget(virtual_time=t_end),
        observers=[
            EvaluationSchedule(None), Metrics(lambda v: (0.0, 0.0)),
            Progress(lambda s: trace.append([t.client for t in s._in_flight.values()])),
        ],
    )  # fmt: skip
    sim.run()
    return trace, sim, strategy.aggregator.log  # type: ignore[attr-defined]


@pytest.mark.parametrize("buffer_size", [1, 3])
def test_concurrency_keeps_c_distinct_clients_training_drawn_uniformly(buffer_size):
    trace, sim, _ = _in_flight_trace(
        [1.0] * 10, lambda t: ArrivalBuffer(t, buffer_size=buffer_size, concurrency=3), 200.5
    )
    # every slot is refilled at once (FLSim): always 3 distinct clients training
    assert all(len(clients) == len(set(clients)) == 3 for clients in trace[:-1])
    # 3 updates per virtual second for 200 s, spread uniformly over the 10 clients
    counts = np.array([sim.counters.participation.get(c, 0) for c in range(10)])
    assert counts.sum() == 600 - 600 % buffer_size
    assert counts.min() > 30 and counts.max() < 90  # mean 60, sd ≈ 7
    again, _, _ = _in_flight_trace(
        [1.0] * 10, lambda t: ArrivalBuffer(t, buffer_size=buffer_size, concurrency=3), 200.5
    )
    assert again == trace  # seeded selection
    other, _, _ = _in_flight_trace(
        [1.0] * 10,
        lambda t: ArrivalBuffer(t, buffer_size=buffer_size, concurrency=3),
        200.5,
        seed=1,
    )
    assert other != trace


def test_fedbuff_with_concurrency_restarts_on_the_current_model():
    # m = 2, C = 2 of 4 clients, τ = 1 for client 0..3: both slots free at t = 1,
    # the first arrival's replacement starts on version 0 (before the step), the second's on 1
    _trace, sim, log = _in_flight_trace(
        [1.0, 1.0, 1.0, 1.0], lambda t: ArrivalBuffer(t, buffer_size=2, concurrency=2), 2.5
    )
    assert [(t, v, [b for _, b in cs]) for t, v, cs in log] == [(1.0, 0, [0, 0]), (2.0, 1, [0, 1])]
    assert sim.counters.staleness == {0: 3, 1: 1}


def test_fedfix_with_concurrency_refills_at_the_tick():
    # τ = 0.5, Δt = 1: every contributor waits for the tick, then its slot goes to a random idle client
    trace, _, log = _in_flight_trace(
        [0.5] * 6, lambda t: FixedPeriod(t, delta_t=1.0, concurrency=2), 3.5
    )
    assert [(t, v, len(cs)) for t, v, cs in log] == [(1.0, 0, 2), (2.0, 1, 2), (3.0, 2, 2)]
    assert all(b == v for _, v, cs in log for _, b in cs)  # started on the model of the last tick
    assert max(len(c) for c in trace) == 2


def test_estimated_update_times_converge_to_the_observed_ones():
    planner = _FixedPlanner([1.0, 2.0])
    times = UpdateTimes("estimated", planner)  # type: ignore[arg-type]

    class C:
        num_clients = 2

    times.setup(C())  # type: ignore[arg-type]
    # nobody heard yet: the elapsed time is the best lower bound
    assert times.tau(0.5).tolist() == [0.5, 0.5]
    assert times.tau(0.0).tolist() == [1.0, 1.0]  # nothing known at all: equal times
    t0 = _task(0, None)
    times.observe(t0, 1.0)
    assert times.tau(1.5).tolist() == [1.0, 1.5]  # client 1: at least 1.5 s so far
    t1 = _task(1, None)
    times.observe(t1, 2.0)
    assert times.tau(5.0).tolist() == [1.0, 2.0]


# ------------------------------------------------------------------ sanity equalities end to end


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def tiny(**sections):
    """tiny_raw on one torch thread: these runs are single-task batches, and on a busy
    machine the default thread pool makes them ten times slower."""
    return tiny_raw(executor={"threads": 1}, **sections)


def _metrics(path, drop=("wall_time",)):
    lines = (path / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    keep = [i for i, h in enumerate(header) if h not in drop]
    return [[line.split(",")[i] for i in keep] for line in lines]


def test_fedfix_with_period_beyond_every_update_time_is_fedavg(tmp_path):
    run_experiment(load_config(raw=tiny()), run_dir=tmp_path / "avg")
    fix = run_experiment(
        load_config(raw=tiny(strategy={"name": "fedfix", "delta_t": 1.0e6})),
        run_dir=tmp_path / "fix",
    )
    drop = ("wall_time", "virtual_time")  # the ticks come later than the barrier
    assert _metrics(tmp_path / "avg", drop) == _metrics(tmp_path / "fix", drop)
    assert fix.summary["aggregations"] == 4 and fix.summary["max_staleness"] == 0


def test_fedfix_with_period_equal_to_the_slowest_update_is_fedavg_exactly(tmp_path):
    no_noise = {"slowdown": {"kind": "none"}}
    raw = tiny()
    raw["population"] = {**raw["population"], **no_noise}
    avg = run_experiment(load_config(raw=raw), run_dir=tmp_path / "avg")
    slowest = avg.history[1]["virtual_time"]  # first barrier = max_i τ_i
    raw_fix = tiny(strategy={"name": "fedfix", "delta_t": slowest})
    raw_fix["population"] = raw["population"]
    run_experiment(load_config(raw=raw_fix), run_dir=tmp_path / "fix")
    assert _metrics(tmp_path / "avg") == _metrics(tmp_path / "fix")


def test_fedbuff_with_buffer_of_all_clients_is_fedavg(tmp_path):
    # equal τ (homogeneous devices, no noise) and uniform p = 1/m
    pop = {"scenario": "homogeneous", "speed": 1.0e6, "slowdown": {"kind": "none"}}
    raw_avg = tiny(strategy={"name": "fedavg", "weights": "uniform"})
    raw_avg["population"] = pop
    raw_buff = tiny(strategy={"name": "fedbuff", "buffer_size": 6})
    raw_buff["population"] = pop
    run_experiment(load_config(raw=raw_avg), run_dir=tmp_path / "avg")
    run_experiment(load_config(raw=raw_buff), run_dir=tmp_path / "buff")
    assert _metrics(tmp_path / "avg") == _metrics(tmp_path / "buff")


def test_fedbuff_with_concurrency_runs_end_to_end(tmp_path):
    raw = tiny(strategy={"name": "fedbuff", "buffer_size": 2, "concurrency": 3},
               budget={"aggregations": 6})  # fmt: skip
    a = run_experiment(load_config(raw=raw), run_dir=tmp_path / "a")
    b = run_experiment(load_config(raw=raw), run_dir=tmp_path / "b")
    assert a.summary["aggregations"] == 6 and a.summary["updates_used"] == 12
    assert _metrics(a.run_dir) == _metrics(b.run_dir)
    assert a.history[-1]["test_accuracy"] > a.history[0]["test_accuracy"]


def test_async_strategies_run_deterministically_and_count_staleness(tmp_path):
    for name in ("async-identical", "async-time-based", "fedasync"):
        # fedasync has no weight rule that reads the update times τ_i
        tau = {} if name == "fedasync" else {"tau_source": "estimated"}
        raw = tiny(strategy={"name": name, **tau}, budget={"aggregations": 12})
        a = run_experiment(load_config(raw=raw), run_dir=tmp_path / name / "a")
        b = run_experiment(load_config(raw=raw), run_dir=tmp_path / name / "b")
        assert a.summary["status"] == "completed"
        assert _metrics(a.run_dir) == _metrics(b.run_dir)
        assert a.summary["aggregations"] == a.summary["updates_used"] == 12
        assert a.summary["max_staleness"] >= 1  # six clients in flight
        hist = a.summary["staleness_histogram"]
        assert sum(hist.values()) == 12


def test_async_config_errors_are_one_sentence(tmp_path):
    cases = [
        ({"name": "fedfix"}, "strategy.delta_t"),
        ({"name": "fedbuff"}, "strategy.buffer_size"),
        ({"name": "fedbuff", "buffer_size": 7}, "exceeds the 6 clients"),
        ({"name": "async-identical", "client_fraction": 0.5}, "client_fraction"),
        ({"name": "fedasync", "aggregation_weights": "sync"}, "aggregation_weights"),
        ({"name": "fedavg", "aggregation_weights": "identical"}, "aggregation_weights"),
        ({"name": "async-identical", "aggregation_weights": "fedfix"}, "needs strategy.delta_t"),
        ({"name": "fedavg", "concurrency": 2}, "strategy.concurrency"),
        ({"name": "salf", "concurrency": 2}, "strategy.concurrency"),
    ]
    for strategy, expected in cases:
        with pytest.raises(ConfigError) as info:
            run_experiment(load_config(raw=tiny(strategy=strategy)), run_dir=tmp_path / "x")
        msg = str(info.value)
        assert expected in msg and msg.endswith(".") and "\n" not in msg
    with pytest.raises(ConfigError, match=r"strategy\.staleness"):
        load_config(raw={"strategy": {"staleness": "exponential"}})


def test_registry_lists_the_family():
    for name in ("fedavg", "async-identical", "async-time-based", "fedfix", "fedbuff", "fedasync"):
        assert name in STRATEGIES


# ------------------------------------------------------------------ metrics


def test_federated_metrics_hand_computed():
    m = federated_metrics(
        np.array([1.0, 3.0]),
        np.array([0.5, 0.5]),
        weight_received=np.array([3.0, 1.0]),
        participations=np.array([1.0, 1.0]),
    )
    assert m["federated_loss"] == 2.0  # eq. 2
    assert m["surrogate_loss"] == 1.5  # eq. 10 with q̃ = [0.75, 0.25]
    assert m["participation_loss"] == 2.0
    assert m["client_loss_std"] == 1.0
    # before any aggregation q̃ = p
    m0 = federated_metrics(
        np.array([1.0, 3.0]),
        np.array([0.25, 0.75]),
        weight_received=np.zeros(2),
        participations=np.zeros(2),
    )
    assert m0["surrogate_loss"] == m0["federated_loss"] == 2.5


def test_client_losses_are_recorded_and_weights_received_measured(tmp_path):
    raw = tiny(
        strategy={"name": "async-identical"},
        budget={"aggregations": 18},
        eval={"every_aggregations": 6, "client_losses": True},
    )
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "r")
    header = (res.run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    for col in ("test_accuracy", "federated_loss", "surrogate_loss", "client_loss_std"):
        assert col in header
    s = json.loads((res.run_dir / "summary.json").read_text())
    assert s["federated_loss"] > 0 and s["surrogate_loss"] > 0 and s["client_loss_std"] >= 0
    rows = list(csv.DictReader((res.run_dir / "clients.csv").open()))
    assert len(rows) == 6
    parts = [int(r["participations"]) for r in rows]
    assert sum(parts) == 18
    # identical weights: each update got weight 1, so q̃ is the participation share
    for r in rows:
        assert float(r["weight_received"]) == int(r["participations"])
        assert float(r["q_share"]) == pytest.approx(int(r["participations"]) / 18)
    # the fast class (speed 2e6) participates more than the slow one
    assert max(parts) > min(parts)
    # federated loss = p-weighted client losses; p ∝ n_i, so the mean loss over all samples
    losses = np.array([float(r["final_train_loss"]) for r in rows])
    n = np.array([int(r["num_samples"]) for r in rows])
    assert s["federated_loss"] == pytest.approx(float((n * losses).sum() / n.sum()))


def test_sync_fedavg_surrogate_equals_federated(tmp_path):
    raw = tiny(budget={"aggregations": 2}, eval={"every_aggregations": 1, "client_losses": True})
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "r")
    last = res.history[-1]
    assert last["surrogate_loss"] == pytest.approx(last["federated_loss"])
    assert res.summary["max_staleness"] == 0
    assert math.isfinite(res.summary["client_loss_std"])


# ------------------------------------------------------------------ compare: variants and lr grid


def test_compare_lr_grid_picks_the_best_rate_and_sweeps_strategy_fields(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from fedclock.cli import app

    raw = tiny(budget={"aggregations": 3}, eval={"every_aggregations": 1, "client_losses": True})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / "cmp"
    args = ["compare", str(cfg), "--strategies", "fedavg,fedfix:delta_t=2.0", "--seeds", "1"]
    args += ["--lr-grid", "0.05,1e6", "--out", str(out), "-q"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((out / "table.csv").open()))
    header = list(rows[0])
    assert header[:3] == ["strategy", "delta_t", "lr"] and header[-1] == "n_seeds"
    assert [(r["strategy"], r["delta_t"], r["lr"]) for r in rows] == [
        ("fedavg", "", "0.05"),
        ("fedfix", "2.0", "0.05"),
    ]
    for metric in ("federated_loss", "surrogate_loss", "client_loss_std", "final_test_accuracy"):
        assert f"{metric}_mean" in header
    grid = list(csv.DictReader((out / "lr_grid.csv").open()))
    assert len(grid) == 4
    assert {(g["lr"], g["status"], g["selected"]) for g in grid} == {
        ("0.05", "completed", "1"),
        ("1000000.0", "diverged", "0"),
    }
    assert (out / "runs" / "fedfix-delta_t=2.0" / "lr-0.05" / "seed-1" / "metrics.csv").is_file()
    for png in ("accuracy.png", "losses.png", "lr_grid.png"):
        assert (out / png).stat().st_size > 1000
    # the diverged cells are reused, not re-run
    again = CliRunner().invoke(app, args[:-1])  # without -q: the notes are printed
    assert again.exit_code == 0 and again.output.count("reused finished run") == 4


def test_compare_rejects_a_malformed_strategy_entry(tmp_path):
    from fedclock.runs import parse_strategy

    assert parse_strategy("fedbuff:buffer_size=5:staleness=polynomial") == (
        "fedbuff",
        {"buffer_size": 5, "staleness": "polynomial"},
    )
    with pytest.raises(ConfigError, match="name:field=value"):
        parse_strategy("fedfix:delta_t")


def test_fedbuff_with_concurrency_never_trains_two_tasks_on_one_stream(tmp_path, monkeypatch):
    """A freed slot can go back to the same client before the buffer fills: its second
    task on the same base must get its own batch stream, not an exact copy of the first."""
    from fedclock.sim.simulator import Simulator
    from fedclock.train.executor import batch_key

    committed: list[Contribution] = []
    real = Simulator.commit

    def spy(self, contributions):
        committed.extend(contributions)
        return real(self, contributions)

    monkeypatch.setattr(Simulator, "commit", spy)
    raw = tiny(strategy={"name": "fedbuff", "buffer_size": 3, "concurrency": 3},
               budget={"aggregations": 40})  # fmt: skip
    run_experiment(load_config(raw=raw), run_dir=tmp_path / "a")
    assert len(committed) == 120
    same_base = {}
    for c in committed:
        same_base.setdefault((c.client, c.base_version), []).append(c)
    assert any(len(v) > 1 for v in same_base.values())  # the case the fix is about occurs
    keys = [batch_key(3, c.task) for c in committed]
    assert len(set(keys)) == len(keys)  # no two tasks share a stream
    for group in same_base.values():
        assert sorted(c.task.repeat for c in group) == list(range(len(group)))
        for i, a in enumerate(group):
            for b in group[i + 1 :]:
                assert not all(torch.equal(a.delta[k], b.delta[k]) for k in a.delta)


def test_simulator_task_repeat_counts_tasks_per_client_and_base():
    """Task.repeat: 0 for a client's first task on a base, then 1, 2, …; a stale (older)
    base gets k + 1, above every index used on that base before."""
    from fedclock.sim.simulator import Simulator

    sim = Simulator.__new__(Simulator)
    sim._last_base, sim._on_last_base = [-1], [0]
    seen = []
    for k, v in enumerate([0, 0, 0, 1, 1, 0, 2]):
        seen.append(sim._repeat(0, v, k))
        sim._count_base(0, v)
    assert seen == [0, 1, 2, 0, 1, 6, 0]


# ------------------------------------------------------------------ FedProx


def test_fedprox_with_mu_zero_is_fedavg(tmp_path):
    run_experiment(load_config(raw=tiny()), run_dir=tmp_path / "avg")
    raw = tiny(strategy={"name": "fedprox", "mu": 0.0})
    run_experiment(load_config(raw=raw), run_dir=tmp_path / "prox")
    assert _metrics(tmp_path / "avg") == _metrics(tmp_path / "prox")


def test_fedprox_pulls_local_models_towards_the_global_one(tmp_path, monkeypatch):
    """The proximal term (μ/2)‖θ − θ^t‖² shrinks every client's first-round update (same
    base, same batches), more so as μ grows (lr·μ < 2: the explicit step on the term
    contracts θ − θ^t by 1 − lr·μ)."""
    from fedclock.sim.simulator import Simulator

    norms: dict[float, list[float]] = {}
    real = Simulator.commit

    def spy(self, contributions):
        if self.counters.aggregations == 0:
            mu = self.strategy.needs.proximal_mu
            norms[mu] = [
                float(torch.sqrt(sum((d**2).sum() for d in c.delta.values())))
                for c in sorted(contributions, key=lambda c: c.client)
            ]
        return real(self, contributions)

    monkeypatch.setattr(Simulator, "commit", spy)
    for mu in (0.0, 1.0, 5.0):
        raw = tiny(strategy={"name": "fedprox", "mu": mu}, budget={"aggregations": 1})
        run_experiment(load_config(raw=raw), run_dir=tmp_path / str(mu))
    assert all(a > b > c for a, b, c in zip(norms[0.0], norms[1.0], norms[5.0], strict=True))


def test_fedprox_mu_is_not_a_fedavg_field():
    with pytest.raises(ConfigError, match=r"strategy\.mu.*fedprox.*fedavg"):
        load_config(raw=tiny(strategy={"name": "fedavg", "mu": 0.1}))


@pytest.mark.parametrize(
    ("name", "server"),
    [
        ("fedavg", {"server_optimizer": "adam", "server_lr": 0.03, "server_momentum": 0.9}),
        ("fedavg", {"server_momentum": 0.5}),
        ("fedbuff", {"server_optimizer": "adam", "server_lr": 0.01, "buffer_size": 2}),
    ],
)
def test_server_optimizers_run_end_to_end(tmp_path, name: str, server: dict) -> None:
    """FedAdam and FedAvgM from the config: they learn, and differ from plain FedAvg."""
    budget = {"aggregations": 8}
    base = tiny_raw(strategy={"name": name, "buffer_size": server.get("buffer_size")},
                    budget=budget)  # fmt: skip
    plain = run_experiment(load_config(raw=base), run_dir=tmp_path / "plain")
    raw = tiny_raw(strategy={"name": name, **server}, budget=budget)
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "opt")
    first, last = res.history[0], res.history[-1]
    assert last["test_loss"] < first["test_loss"]
    assert last["test_loss"] != plain.history[-1]["test_loss"]
