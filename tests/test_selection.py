"""Speed-aware selection (strategies/selection.py, train/statistics.py): Oort's scores,
pacer and exploration and TiFL's tiers, credits and probabilities against hand-computed
cases; the client statistics from both executors; selection in runs (config checks,
availability, reproducibility)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedclock.config import load_config
from fedclock.errors import ConfigError
from fedclock.experiment import run_experiment
from fedclock.strategies.selection import (
    REFL,
    Oort,
    StaleAwareWeighting,
    TiFL,
    latency_tiers,
    oort_scores,
    refl_priority,
    tifl_probabilities,
    top_positions,
    weighted_sample,
)
from fedclock.train.statistics import (
    SELECTION_STATS,
    STAT_NAMES,
    segment_statistics,
    statistics_of,
    utility,
)
from tests.conftest import tiny_raw


# ------------------------------------------------------------------ helpers
class _Ctx:
    """What a selection reads of the simulator's context: the round's random stream."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.num_clients = n
        self.seed = seed

    def rng(self, purpose: str, *ids: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, hash(purpose) % 1000, *ids])


def _oort(n: int, **kw: Any) -> Oort:
    o = Oort(planner=None, sizes=np.full(n, 100), **kw)
    o.reward = np.full(n, 100.0)
    o.duration = np.arange(1, n + 1, dtype=np.float64)
    o.time_stamp = np.zeros(n, dtype=np.int64)
    o.count = np.zeros(n, dtype=np.int64)
    o.sorted_duration = np.sort(o.duration)
    return o


def _contribution(client: int, loss_sq: float, samples: float, correct: float, dur: float) -> Any:
    values = torch.tensor([loss_sq, 0.0, correct, samples], dtype=torch.float64)
    task = SimpleNamespace(timing=SimpleNamespace(duration=dur))
    return SimpleNamespace(client=client, up={SELECTION_STATS: {"values": values}}, task=task)


# ------------------------------------------------------------------ Oort
def test_oort_utility_is_size_times_root_mean_square_loss() -> None:
    """|B|·√(Σ loss²/|B|): losses 1, 2, 2 → 3·√(9/3) = 3√3 (segment 1); segment 2 holds
    one sample of loss 3."""
    losses = torch.tensor([1.0, 2.0, 2.0, 3.0], dtype=torch.float64)
    table = segment_statistics(losses, torch.tensor([True, False, True, False]), [3, 1])
    first = dict(zip(STAT_NAMES, table[0].tolist(), strict=True))
    assert first == {"loss_sq_sum": 9.0, "loss_sum": 5.0, "correct": 2.0, "samples": 3.0}
    assert table[1].tolist() == [9.0, 3.0, 0.0, 1.0]
    assert utility(first) == pytest.approx(3 * math.sqrt(3), rel=1e-15)


def test_oort_scores_by_hand() -> None:
    """Three explored clients at round 5, rewards 2, 4, 10, last heard in rounds 1, 2, 4,
    durations 1, 2, 8, preferred T = 4, α = 2; normalisation over rewards 2, 4, 10 with the
    clip at the 0.9 quantile (position int(3·0.9) = 2: 10)."""
    reward = np.array([2.0, 4.0, 10.0])
    sc = oort_scores(
        reward, np.array([1.0, 2.0, 8.0]), np.array([1, 2, 4]), 5,
        preferred=4.0, penalty=2.0, clip_bound=0.9, norm_rewards=reward,
    )  # fmt: skip
    lo, span = 2 * 0.999, 10 - 2 * 0.999
    want = [
        (2 - lo) / span + math.sqrt(0.1 * math.log(5) / 1),
        (4 - lo) / span + math.sqrt(0.1 * math.log(5) / 2),
        ((10 - lo) / span + math.sqrt(0.1 * math.log(5) / 4)) * (4 / 8) ** 2,  # slower than T
    ]
    np.testing.assert_allclose(sc, want, rtol=1e-14)


def test_oort_clips_rewards_at_the_quantile() -> None:
    """Ten rewards 1..10, clip_bound 0.5: the clip is the sorted value at position 5 (6); a
    reward of 10 scores as 6."""
    reward = np.arange(1.0, 11.0)
    sc = oort_scores(reward, np.ones(10), np.ones(10, dtype=np.int64), 1, preferred=math.inf,
                     penalty=2.0, clip_bound=0.5, norm_rewards=reward)  # fmt: skip
    assert sc[9] == sc[5] and sc[4] < sc[5]


def test_oort_first_round_explores_every_slot_then_exploration_decays() -> None:
    """Round 1: nobody explored, every slot goes to exploration (the largest rewards first
    within the window); ε decays 0.9·0.98^r down to 0.3."""
    o = _oort(50)
    o.reward[:10] = 1000.0  # ten big clients: the exploration window of 5·4 = 20 holds them
    picked = o.select(_Ctx(50), 0, np.arange(50), 4)
    assert len(picked) == 4 and len(set(picked.tolist())) == 4
    assert o.explore_clients and not o.exploit_clients
    assert o.exploration == pytest.approx(0.9 * 0.98)
    for r in range(1, 100):
        o.select(_Ctx(50), r, np.arange(50), 4)
    assert o.exploration == pytest.approx(max(0.9 * 0.98**100, 0.3))


def test_oort_exploits_heard_clients_and_fills_unexplored_shortfall() -> None:
    """With every client heard from, all m slots are exploitation (none left to explore);
    the slow client is penalised to near zero and the high-utility ones are preferred."""
    n = 30
    o = _oort(n, round_threshold=50.0)
    o.count[:] = 1
    o.time_stamp[:] = 1
    o.reward = np.linspace(1.0, 30.0, n)
    o.duration = np.ones(n)
    o.duration[-1] = 1000.0  # the highest reward, but far slower than T
    o.sorted_duration = np.sort(o.duration)
    counts = np.zeros(n)
    for r in range(1, 201):
        picked = o.select(_Ctx(n, seed=r), r, np.arange(n), 3)
        assert len(picked) == 3 and not o.explore_clients
        counts[picked] += 1
    assert counts[-1] < counts[-2] / 10  # (T/t)^2 = (1/1000)^2: almost never
    assert counts[20:29].sum() > counts[:9].sum()  # higher utility, picked more


def test_oort_pacer_relaxes_the_preferred_duration_when_utility_is_flat() -> None:
    """Pacer step 2: at round 4 the exploited utility of rounds 3–4 equals that of 1–2
    (within 10 %) → round_threshold + Δ; a sharp (≥ 5×) change lowers it again."""
    o = _oort(10, pacer_step=2, pacer_delta=5.0, round_threshold=30.0)
    o.exploit_history = [1.0, 1.0, 1.0]
    o.exploit_clients, o.successful = [0], [0]
    o.reward[0] = 1.0
    o._pacer(4)
    assert o.exploit_history[-1] == pytest.approx(1 / (1 + 1e-4))
    assert o.round_threshold == 35.0 and o.last_util_record == 2
    o.exploit_history = [1.0, 1.0, 10.0]
    o.exploit_clients, o.successful = [0], [0]
    o.reward[0] = 10.0
    o._pacer(6)
    assert o.round_threshold == 30.0


def test_oorts_fedscale_constants_are_options() -> None:
    """The uncertainty c of √(c·ln r/L_i), the pacer's flat and sharp thresholds, its cap on
    T's percentile and the exploit pool's floor are options (FedScale's 0.1, 0.1, 5, 100, 10
    by default, as in the config), each changing what it names."""
    from fedclock.config import SelectionConfig

    d = SelectionConfig()
    assert (d.uncertainty, d.pacer_flat, d.pacer_sharp, d.round_threshold_max,
            d.exploit_pool) == (0.1, 0.1, 5.0, 100.0, 10.0)  # fmt: skip
    one = np.array([3.0])
    sc = oort_scores(one, np.ones(1), np.array([2]), 5, preferred=math.inf, penalty=2.0,
                     clip_bound=0.9, norm_rewards=one, uncertainty=0.4)  # fmt: skip
    # one reward: (R − 0.999R)/(R − 0.999R) = 1, plus the bonus with c = 0.4
    assert sc[0] == pytest.approx(1 + math.sqrt(0.4 * math.log(5) / 2), rel=1e-14)
    # a 30 % change: flat only when pacer_flat ≥ 0.3; the cap holds T's percentile at 32
    o = _oort(10, pacer_step=2, pacer_delta=5.0, round_threshold=30.0, pacer_flat=0.35,
              round_threshold_max=32.0)  # fmt: skip
    o.exploit_history = [1.0, 1.0, 1.3]
    o.exploit_clients, o.successful = [0], [0]
    o.reward[0] = 1.3 * (1 + 1e-4)
    o._pacer(4)
    assert o.round_threshold == 32.0
    o = _oort(10, pacer_step=2, pacer_delta=5.0, round_threshold=30.0, pacer_sharp=0.25)
    o.exploit_history = [1.0, 1.0, 1.3]
    o.exploit_clients, o.successful = [0], [0]
    o.reward[0] = 1.3 * (1 + 1e-4)
    o._pacer(4)
    assert o.round_threshold == 25.0  # a 30 % change is "sharp" at 0.25
    # the exploit pool: with cut_off_util 1 only the top exploit_pool·k + 1 are drawn from
    n = 40
    o = _oort(n, cut_off_util=1.0, exploit_pool=1.0, clip_bound=1.0)  # (no ties at the clip)
    o.count[:] = 1
    o.time_stamp[:] = 1
    o.reward = np.arange(1.0, n + 1)
    o.duration = o.sorted_duration = np.ones(n)  # (no speed penalty: scores follow rewards)
    seen: set[int] = set()
    for r in range(1, 60):
        seen |= set(o.select(_Ctx(n, seed=r), r, np.arange(n), 2).tolist())
    assert seen <= set(range(n - 3, n))  # the top 1·2 + 1 = 3
    o.exploit_pool = 10.0  # FedScale's: the top 21
    for r in range(1, 60):
        seen |= set(o.select(_Ctx(n, seed=r), r, np.arange(n), 2).tolist())
    assert min(seen) < n - 3 and min(seen) >= n - 21


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=6, max_size=6),
       st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4)), max_size=12))  # fmt: skip
def test_oort_keeps_its_sorted_durations_in_step(start: list[int], feedback: list[Any]) -> None:
    """The sorted durations T is read from, updated in place, equal a fresh sort after any
    round's feedback (repeated values included)."""
    o = _oort(6)
    o.duration = np.array(start, dtype=np.float64)
    o.sorted_duration = np.sort(o.duration)
    used = {c: _contribution(c, 1.0, 1.0, 1.0, float(d)) for c, d in feedback}  # one per client
    o.on_round(_Ctx(6), 0, list(used.values()), [])
    np.testing.assert_array_equal(o.sorted_duration, np.sort(o.duration))


def test_oort_preferred_duration_is_the_threshold_percentile() -> None:
    o = _oort(10, round_threshold=30.0)  # durations 1..10: position int(10·0.3) = 3 → 4
    assert o.preferred_duration() == 4.0
    o.round_threshold = 100.0
    assert o.preferred_duration() == math.inf


def test_oort_feedback_sets_utility_duration_and_round() -> None:
    o = _oort(4)
    o.on_round(_Ctx(4), 6, [_contribution(2, loss_sq=8.0, samples=2.0, correct=1.0, dur=3.5)], [])
    assert o.reward[2] == pytest.approx(4.0)  # √(2·8)
    assert o.duration[2] == 3.5 and o.time_stamp[2] == 7 and o.count[2] == 1
    assert o.successful == [2]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 5), min_size=1, max_size=30), st.integers(0, 35), st.integers(0, 9))
def test_weighted_sample_draws_distinct_positions_zero_weights_last(
    weights: list[float], k: int, seed: int
) -> None:
    w = np.array(weights)
    got = weighted_sample(np.random.default_rng(seed), w, k)
    assert len(got) == min(k, len(w)) and len(set(got.tolist())) == len(got)
    positive = int((w > 0).sum())
    if len(got) <= positive:  # a zero weight is drawn only once every positive one is
        assert (w[got] > 0).all()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=0, max_size=40), st.integers(0, 45))
def test_top_positions_is_a_stable_descending_sort(values: list[int], k: int) -> None:
    v = np.array(values, dtype=np.float64)
    want = sorted(range(len(v)), key=lambda i: (-v[i], i))[:k]
    assert top_positions(v, k).tolist() == want


def test_weighted_sample_first_draw_is_proportional_to_weight() -> None:
    """Successive sampling: the first position is drawn with probability w/Σw (20,000
    draws, three standard errors)."""
    w = np.array([1.0, 2.0, 3.0, 4.0])
    rng = np.random.default_rng(1)
    first = np.array([weighted_sample(rng, w, 2)[0] for _ in range(20_000)])
    freq = np.bincount(first, minlength=4) / len(first)
    p = w / w.sum()
    assert np.all(np.abs(freq - p) < 3 * np.sqrt(p * (1 - p) / len(first)) + 1e-3)


# ------------------------------------------------------------------ TiFL
def test_latency_tiers_are_equal_count_fastest_first() -> None:
    tiers = latency_tiers(np.array([5.0, 1.0, 3.0, 2.0, 4.0, 6.0]), 3)
    assert tiers.tolist() == [2, 0, 1, 0, 1, 2]


def test_tifl_probabilities_by_hand() -> None:
    """Accuracies 0.8, 0.5, 0.9: ascending tier 1, 0, 2 → 3/6, 2/6, 1/6; with tier 1 out of
    credits: n = 2 → tier 0 2/3, tier 2 1/3, tier 1 0."""
    acc = np.array([0.8, 0.5, 0.9])
    np.testing.assert_allclose(tifl_probabilities(acc, None), [2 / 6, 3 / 6, 1 / 6])
    np.testing.assert_allclose(tifl_probabilities(acc, np.array([3, 0, 1])), [2 / 3, 0, 1 / 3])


def test_tifl_selects_one_tier_spends_its_credit_and_tops_up() -> None:
    t = TiFL(planner=None, tiers=2, interval=1, credits=1)
    t.tier_of = np.array([0, 0, 0, 1, 1, 1])
    t.probs, t.accuracy, t.credits = np.array([0.5, 0.5]), np.zeros(2), np.array([1, 1])
    first = t.select(_Ctx(6), 0, np.arange(6), 2)
    tier = t.chosen[-1]
    assert set(t.tier_of[first]) == {tier} and t.credits[tier] == 0
    # the other tier has the only credit left: it is chosen; 4 asked, 3 in it → topped up
    second = t.select(_Ctx(6), 1, np.arange(6), 4)
    assert t.chosen[-1] == 1 - tier and t.credits.tolist() == [0, 0]
    assert len(second) == 4 and (t.tier_of[second] == 1 - tier).sum() == 3


def test_tifl_changes_probabilities_when_the_tier_did_not_improve() -> None:
    """Interval 2: at round 4 the tier of round 3 (tier 0) reads 0.6, as 2 rounds before →
    ChangeProbs from the accuracies (tier 0 least accurate: 2/3)."""
    t = TiFL(planner=None, tiers=2, interval=2)
    t.tier_of = np.array([0, 0, 1, 1])
    t.probs, t.accuracy = np.array([0.5, 0.5]), np.array([0.6, 0.9])
    t.history = [[0.0, 0.0], [0.6, 0.0], [0.6, 0.9], [0.6, 0.9]]
    t.chosen = [0, 1, 0, 0]
    t.select(_Ctx(4), 4, np.arange(4), 1)
    np.testing.assert_allclose(t.probs, [2 / 3, 1 / 3])
    t.on_round(_Ctx(4), 4, [_contribution(2, 1.0, 10.0, 7.0, 1.0)], [])
    assert t.accuracy.tolist() == [0.6, 0.7] and t.history[-1] == [0.6, 0.7]


# ------------------------------------------------------------------ in runs
def _run(tmp_path: Any, name: str, **over: Any) -> Any:
    raw = tiny_raw(executor={"threads": 1}, partition={"scheme": "iid", "num_clients": 12},
                   budget={"aggregations": 6})  # fmt: skip
    cfg = load_config(raw=raw, overrides=[f"{k}={v}" for k, v in over.items()])
    return run_experiment(cfg, run_dir=tmp_path / name)


@pytest.mark.parametrize("selection", ["oort", "tifl"])
def test_a_selection_runs_and_reruns_identically(tmp_path: Any, selection: str) -> None:
    a = _run(tmp_path, "a", **{"strategy.client_fraction": 0.25, "selection.name": selection})
    _run(tmp_path, "b", **{"strategy.client_fraction": 0.25, "selection.name": selection})
    assert a.summary["status"] == "completed" and a.summary["aggregations"] == 6
    ma = (tmp_path / "a" / "metrics.csv").read_text().splitlines()
    mb = (tmp_path / "b" / "metrics.csv").read_text().splitlines()
    strip = lambda lines: [ln.split(",", 2)[0] + ln.split(",", 2)[2] for ln in lines]
    assert strip(ma) == strip(mb)  # (the wall-time column aside)


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
def test_statistics_are_the_received_models_losses_on_the_first_epoch(kind: str) -> None:
    """Both executors send up the same statistics: Σ loss², Σ loss, correct and |B| of the
    base model on the task's first-epoch samples, equal to a direct computation."""
    from fedclock.devices.cost import TaskTiming
    from fedclock.experiment import _build
    from fedclock.sim.types import Task
    from fedclock.train.executor import batch_schedule

    raw = tiny_raw(executor={"threads": 1, "kind": kind}, train={"local_epochs": 2})
    cfg = load_config(raw=raw, overrides=["strategy.client_fraction=0.5", "selection.name=oort"])
    parts = _build(cfg, None)
    assert parts.strategy.needs.statistics
    plan, cost = parts.strategy.planner.nominal(2)
    task = Task(0, 2, 0, parts.initial, plan, cost, TaskTiming(0.0, 1.0, 0.0), 0.0)
    (c,) = parts.executor.run([task])
    stats = statistics_of(c)
    assert stats is not None
    data = parts.executor.data
    n = len(data.indices[2])
    steps = batch_schedule(cfg.seed, task, n)
    assert len(steps) > -(-n // plan.batch_size)  # two epochs: only the first is read
    rows = data.indices[2][torch.cat(steps[: -(-n // plan.batch_size)])]
    model = parts.executor.model
    with torch.no_grad():
        out = torch.func.functional_call(model, dict(parts.initial.params), (data.x[rows],))
    per = torch.nn.functional.cross_entropy(out, data.y[rows], reduction="none").double()
    assert stats["samples"] == len(rows) == n
    assert stats["loss_sq_sum"] == pytest.approx(float((per * per).sum()), rel=1e-6)
    assert stats["loss_sum"] == pytest.approx(float(per.sum()), rel=1e-6)
    assert stats["correct"] == float((out.argmax(-1) == data.y[rows]).sum())


def test_selection_config_is_checked(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="client_fraction is 1"):
        load_config(raw=tiny_raw(), overrides=["selection.name=oort"])
    with pytest.raises(ConfigError, match="does not sample clients"):
        load_config(raw=tiny_raw(), overrides=["selection.name=tifl", "strategy.name=fedbuff",
                                               "strategy.buffer_size=2"])  # fmt: skip
    cfg = load_config(raw=tiny_raw(), overrides=["strategy.client_fraction=0.5"])
    from fedclock.config import STRATEGY_OPTIONS

    fedavg, fedbuff = STRATEGY_OPTIONS["fedavg"], STRATEGY_OPTIONS["fedbuff"]
    assert fedavg.reads(cfg, "selection.name") and not fedbuff.reads(cfg, "selection.name")
    assert not fedavg.reads(cfg, "selection.tiers")  # (random reads no field of the others)


# ------------------------------------------------------------------ REFL
def test_refl_priority_is_online_through_the_window_and_leaving_in_the_next() -> None:
    """Now 100, W 10: offline at 105 (leaves within the window: no), 110 (yes: online through
    [100, 110], not through [110, 120]), 119 (yes), 120 (no: online through both), inf (no)."""
    off = np.array([105.0, 110.0, 119.0, 120.0, math.inf])
    assert refl_priority(off, 100.0, 10.0).tolist() == [False, True, True, False, False]


class _AvailCtx(_Ctx):
    has_availability = True

    def __init__(self, n: int, off: list[float], now: float = 0.0, seed: int = 0) -> None:
        super().__init__(n, seed)
        self.off, self.now = off, now

    def next_offline(self, client: int) -> float:
        return self.off[client]


def test_refl_selects_the_leaving_first_and_not_the_recent() -> None:
    """Clients 1 and 3 leave after the window: both picked first; client 5 was asked last
    round (prohibit 2): left out while enough others remain; the rest drawn at random."""
    off = [math.inf, 15.0, math.inf, 12.0, math.inf, 14.0, math.inf, math.inf]
    r = REFL(planner=None, t_max=10.0, prohibit_reselect=2)
    r.last_round = np.array([-99, -99, -99, -99, -99, 3, -99, -99])
    for seed in range(20):
        got = r.select(_AvailCtx(8, off, seed=seed), 4, np.arange(8), 3)
        assert {1, 3} <= set(got.tolist()) and 5 not in got and len(got) == 3
    r.on_round(_Ctx(8), 4, [], [SimpleNamespace(client=c) for c in (0, 1, 3)])
    assert r.last_round[[0, 1, 3]].tolist() == [4, 4, 4]


def test_refl_window_follows_round_durations_without_a_deadline() -> None:
    r = REFL(planner=None, t_max=None, deadline_alpha=0.25)
    r.last_round, r.window = np.full(4, -99), 40.0
    ctx = _AvailCtx(4, [math.inf] * 4, now=100.0)
    r.select(ctx, 0, np.arange(4), 2)
    ctx.now = 180.0  # the round took 80 s
    r.on_round(ctx, 0, [], [])
    assert r.window == pytest.approx(0.75 * 80 + 0.25 * 40)


def test_refl_stale_weight_by_hand() -> None:
    """One parameter vector; θ = (1, 0) at version 5; two fresh updates Δ = (1, 0), (0, 1)
    (models (2, 0), (1, 1): mean P/n = (1.5, 0.5)) and one stale update trained on version
    3 (τ = 2) whose model is (3, 1); uniform p. r_c = ‖u − P/n‖²/((n+1)²‖P/n‖²) =
    2.5/(9·2.5) = 1/9 = r_max → s = 0.65/3 + 0.35·(1 − e^{−1}/10)."""
    from fedclock.sim.types import ModelVersion

    def contrib(base_version: int, base: list[float], d: list[float]) -> Any:
        bv = ModelVersion(base_version, {"w": torch.tensor(base, dtype=torch.float64)})
        task = SimpleNamespace(base=bv)
        return SimpleNamespace(task=task, base_version=base_version, num_samples=10,
                               delta={"w": torch.tensor(d, dtype=torch.float64)})  # fmt: skip

    base = ModelVersion(5, {"w": torch.tensor([1.0, 0.0], dtype=torch.float64)})
    cs = [contrib(5, [1, 0], [1, 0]), contrib(5, [1, 0], [0, 1]), contrib(3, [2, 0], [1, 1])]
    w = StaleAwareWeighting("uniform", beta=0.35, scale=10.0)(None, base, cs)
    s = 0.65 / 3 + 0.35 * (1 - math.exp(-1.0) / 10)
    np.testing.assert_allclose(w, np.array([1.0, 1.0, s]) / (2 + s), rtol=1e-12)
    assert StaleAwareWeighting._deviation(base, cs[:2], cs[2]) == pytest.approx(1 / 9)


def test_refl_uses_late_updates_stale_instead_of_dropping_them(tmp_path: Any) -> None:
    """Drop-stragglers under a 2-s deadline: the slow devices' updates are discarded; with
    REFL they train on and are used, stale, by a later round (nothing discarded)."""
    over = {"strategy.name": "drop-stragglers", "strategy.t_max": 2.0,
            "strategy.client_fraction": 0.5, "budget.aggregations": 8}  # fmt: skip
    plain = _run(tmp_path, "drop", **over).summary
    refl = _run(tmp_path, "refl", **over, **{"selection.name": "refl"}).summary
    assert plain["updates_discarded"] > 0 and plain["mean_staleness"] == 0
    assert refl["updates_discarded"] == 0 and refl["mean_staleness"] > 0
    assert refl["max_staleness"] >= 1


def test_refl_parts_follow_the_deadline_and_the_switch() -> None:
    """Staleness-aware aggregation only under a deadline and with stale_updates: a barrier
    strategy gets REFL's participant selection alone."""
    from fedclock.experiment import _build

    def parts(*over: str) -> Any:
        raw = tiny_raw()
        cfg = load_config(raw=raw, overrides=["strategy.client_fraction=0.5",
                                               "selection.name=refl", *over])  # fmt: skip
        return _build(cfg, None).strategy

    barrier = parts("strategy.name=scaffold")
    assert isinstance(barrier.trigger.selection, REFL) and not barrier.trigger.keep_late
    late = parts("strategy.name=drop-stragglers", "strategy.t_max=2")
    assert late.trigger.keep_late
    assert isinstance(late.aggregator.weighting, StaleAwareWeighting)
    assert not late.needs.synchronous  # (late updates may not share a round's block)
    assert not late.needs.statistics  # (REFL reads availability and round times only)
    ips = parts("strategy.name=drop-stragglers", "strategy.t_max=2",
                "selection.stale_updates=false")  # fmt: skip
    assert not ips.trigger.keep_late


@pytest.mark.parametrize("selection", ["oort", "tifl", "refl"])
def test_a_selection_fills_the_slots_of_an_asynchronous_concurrency(
    tmp_path: Any, selection: str
) -> None:
    """FedBuff with 4 of 12 clients training at once: the selection picks 4 idle clients at
    a time, one per freed slot; never more than 4 in flight; reruns are identical."""
    over = {"strategy.name": "fedbuff", "strategy.buffer_size": 2, "strategy.concurrency": 4,
            "selection.name": selection, "budget.aggregations": 10}  # fmt: skip
    a = _run(tmp_path, "a", **over)
    _run(tmp_path, "b", **over)
    assert a.summary["aggregations"] == 10 and a.summary["updates_used"] == 20
    import csv

    lines = [ln for ln in (tmp_path / "a" / "timeline.csv").open() if not ln.startswith("#")]
    rows = [r for r in csv.DictReader(lines) if r["event"] == "task"]
    ends = [(float(r["t_end"]), -1) for r in rows]  # (an end before a start at one time)
    events = sorted(ends + [(float(r["t_start"]), 1) for r in rows])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak <= 4
    ma = (tmp_path / "a" / "metrics.csv").read_text().splitlines()
    mb = (tmp_path / "b" / "metrics.csv").read_text().splitlines()
    strip = lambda lines: [ln.split(",", 2)[0] + ln.split(",", 2)[2] for ln in lines]
    assert strip(ma) == strip(mb)


def test_selection_needs_clients_to_choose_from() -> None:
    over = ["strategy.name=fedbuff", "strategy.buffer_size=2", "selection.name=oort"]
    with pytest.raises(ConfigError, match="does not sample"):
        load_config(raw=tiny_raw(), overrides=over)  # every client works: no concurrency
    with pytest.raises(ConfigError, match="whole population"):
        load_config(raw=tiny_raw(), overrides=[*over, "strategy.concurrency=6"])
    with pytest.raises(ConfigError, match="does not sample"):
        load_config(raw=tiny_raw(), overrides=["strategy.name=fed-raa", "strategy.concurrency=2",
                                               "selection.name=oort"])  # fmt: skip


@pytest.mark.parametrize("strategy", ["fjord", "fedrolex", "salf"])
@pytest.mark.usefixtures("float64")
def test_oort_composes_with_partial_work(tmp_path: Any, strategy: str) -> None:
    """Oort's selection over partial work (FjORD's ordered dropout, FedRolex's rolling
    submodels, SALF's layer suffixes under a deadline) in both executors, in float64: the
    same clients asked in every round and the same metrics (within EQUIV_TOL)."""
    from fedclock.metrics.timeline import read_timeline
    from tests.conftest import EQUIV_TOL

    over = {"strategy.name": strategy, "strategy.client_fraction": 0.5, "selection.name": "oort"}
    if strategy == "salf":
        over |= {"salf.scenario": "deadline", "salf.mode": "paper", "strategy.t_max": 1.0}
    runs = {k: _run(tmp_path, k, **over, **{"executor.kind": k}) for k in ("serial", "vectorized")}
    asked = {}
    for k, got in runs.items():
        assert got.summary["aggregations"] == 6 and got.summary["updates_used"] > 0
        tl = read_timeline(tmp_path / k / "timeline.csv")
        asked[k] = (tl.tasks["client"].tolist(), tl.tasks["base_version"].tolist())
    assert asked["serial"] == asked["vectorized"]
    for ra, rb in zip(runs["serial"].history, runs["vectorized"].history, strict=True):
        assert ra["test_loss"] == pytest.approx(rb["test_loss"], rel=EQUIV_TOL, abs=EQUIV_TOL)
        assert ra["test_accuracy"] == pytest.approx(rb["test_accuracy"], abs=0.02)
    if strategy == "salf":  # partial work was really done
        work = read_timeline(tmp_path / "serial" / "timeline.csv").tasks["work"]
        assert any(w.startswith("layer-suffix") for w in work), set(work)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=40),
    st.data(),
)
def test_a_sorted_array_updated_in_place_equals_a_sort(values: list[int], data: Any) -> None:
    """Oort keeps every positive reward sorted across rounds by removing the replaced values
    and inserting the new ones (repeated values included): the same array a sort gives."""
    from fedclock.strategies.selection import _replace_sorted

    arr = np.array(values, dtype=np.float64)
    idx = data.draw(st.lists(st.integers(0, len(arr) - 1), unique=True, max_size=len(arr)))
    new = data.draw(st.lists(st.integers(1, 6), min_size=len(idx), max_size=len(idx)))
    got = _replace_sorted(np.sort(arr), [float(arr[i]) for i in idx], [float(v) for v in new])
    arr[idx] = new
    assert np.array_equal(got, np.sort(arr))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 60))
def test_the_cached_exploration_order_is_top_positions_over_the_unexplored(
    seed: int, k: int
) -> None:
    """Oort's exploration over every client reads a cached order (one per preferred duration
    T) instead of ranking the unexplored each round: the same clients, in the same order."""
    rng = np.random.default_rng(seed)
    n = 300
    oort = Oort(SimpleNamespace(), np.full(n, 10))
    oort.reward = rng.integers(1, 5, n).astype(np.float64)  # ties on purpose
    oort.duration = rng.choice([1.0, 2.0, 3.0], n)
    oort.count = (rng.random(n) < 0.4).astype(np.int64)
    for preferred in (2.0, 2.0, 1.5):  # (cached, then rebuilt for another T)
        unexplored = np.flatnonzero(oort.count == 0)
        want = unexplored[top_positions(oort._explore_values(unexplored, preferred), k)]
        assert np.array_equal(oort._top_unexplored(preferred, k), want)
        oort.count[rng.choice(n, 20)] += 1  # some more explored


@pytest.mark.parametrize("selection", ["random", "oort"])
def test_k_of_n_rounds_use_the_first_m_arrivals_and_cut_the_rest(
    tmp_path: Any, selection: str
) -> None:
    """selection.over_commit 2 with C = 0.25 of 12 clients: each round asks ⌈2·3⌉ = 6 and
    closes at the 3rd arrival; the 3 used are the round's 3 earliest finishers, the other 3
    are cut (discarded, their compute up to the close wasted), and the next round starts
    then — with a uniform draw and with Oort's."""
    from fedclock.metrics.timeline import read_timeline

    got = _run(tmp_path, selection, **{"strategy.client_fraction": 0.25,
                                       "selection.name": selection,
                                       "selection.over_commit": 2.0})  # fmt: skip
    assert got.summary["aggregations"] == 6
    tl = read_timeline(tmp_path / selection / "timeline.csv")
    t = tl.tasks
    for v in range(6):
        rows = np.flatnonzero(t["base_version"] == v)
        assert len(rows) == 6 and len(set(t["client"][rows].tolist())) == 6
        used = rows[np.isin(np.array(t["outcome"])[rows], ["used"])]
        cut = rows[np.isin(np.array(t["outcome"])[rows], ["discarded"])]
        assert len(used) == 3 and len(cut) == 3
        close = tl.agg_t[v]  # the round's commit: its 3rd arrival
        assert t["t_end"][used].max() == pytest.approx(close, abs=1e-12)
        np.testing.assert_allclose(t["t_end"][cut], close, atol=1e-12)  # cut at the close
        if v + 1 < 6:  # the next round starts at the close
            nxt = np.flatnonzero(t["base_version"] == v + 1)
            assert t["t_start"][nxt].min() == pytest.approx(close, abs=1e-12)
    assert got.summary["updates_discarded"] == 18 and got.summary["compute_s_wasted"] > 0
    assert got.summary["updates_used"] == 18


def test_k_of_n_needs_synchronous_rounds_over_a_fraction() -> None:
    with pytest.raises(ConfigError, match="client_fraction is 1"):
        load_config(raw=tiny_raw(), overrides=["selection.over_commit=1.3"])
    with pytest.raises(ConfigError, match="no rounds that sample clients"):
        load_config(raw=tiny_raw(), overrides=["strategy.name=fedbuff", "strategy.buffer_size=2",
                                               "strategy.concurrency=3",
                                               "selection.over_commit=1.3"])  # fmt: skip
    cfg = load_config(raw=tiny_raw(), overrides=["strategy.client_fraction=0.5",
                                                 "selection.over_commit=1.3"])  # fmt: skip
    assert cfg.selection.over_commit == 1.3
