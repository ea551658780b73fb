"""SALF: eq. 9/10 math, layer-suffix execution, the five strategies end to end."""

from __future__ import annotations

import copy
import itertools
import json
import math
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedclock.config import load_config
from fedclock.devices import Population
from fedclock.errors import ConfigError
from fedclock.experiment import run_experiment
from fedclock.models import build_model, layer_view
from fedclock.models.shapes import (
    FULL,
    Layout,
    Suffix,
    Units,
    Width,
    build_units,
    prefix_mask,
    width_shapes,
)
from fedclock.sim.types import TaskPlan
from fedclock.strategies.planners import SuffixWork
from fedclock.strategies.salf import (
    DeadlineDepths,
    coverage_delta,
    deadline_depth,
    divide_by_u_delta,
    p_eq10,
    p_exact_deadline,
    p_exact_ratio,
    p_values,
    salf_layer_delta,
    suffix_depth,
    update_sets,
)
from fedclock.train.executor import suffix_grads
from tests.conftest import EQUIV_TOL


# ------------------------------------------------------------------ eq. 8–10
def test_update_sets_nested() -> None:
    sets = update_sets([1, 3, 2, 4], num_layers=3)  # user 3 (d = 4 = L+1) computed nothing
    assert sets == [[0], [0, 2], [0, 1, 2]]


def test_eq9_hand_computed() -> None:
    w = torch.tensor([1.0, 2.0])
    locals_ = [torch.tensor([0.0, 2.0]), torch.tensor([2.0, 4.0])]  # w_{u,t}^l
    p = 0.2
    # (1/(1−p))·(mean(w_u) − p·w) = 1.25·([1, 3] − [0.2, 0.4]) = [1.0, 3.25]
    out = w + salf_layer_delta(w, [x - w for x in locals_], p)
    assert torch.allclose(out, torch.tensor([1.0, 3.25]))
    assert torch.equal(w + salf_layer_delta(w, [], p), w)  # U^l empty: w unchanged


def test_divide_by_u_hand_computed() -> None:
    w = torch.tensor([1.0])
    out = w + divide_by_u_delta(w, [torch.tensor([0.3]), torch.tensor([0.6])], num_users=3)
    assert torch.allclose(out, torch.tensor([1.3]))


def test_p_exact_equals_eq10_under_as4() -> None:
    for L in (3, 6, 8):
        for U in (1, 5, 30):
            for layer in range(1, L + 1):
                # AS4: every user's depth uniform on {1..L+1} ⇔ all U users "straggle"
                assert p_exact_ratio(layer, L, U, U) == pytest.approx(p_eq10(layer, L, U))
    assert p_eq10(1, 6, 30) == pytest.approx(0.0098, abs=1e-4)  # the spec's example
    assert p_exact_ratio(1, 6, 30, 27) == 0.0  # a non-straggler always computes everything


def test_p_exact_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    L, U = 4, 3
    d = rng.integers(1, L + 2, size=(200_000, U))
    for layer in range(1, L + 1):
        emp = float(np.mean((d > layer).all(axis=1)))
        assert emp == pytest.approx(p_exact_ratio(layer, L, U, U), abs=4e-3)


@pytest.mark.parametrize("stragglers", [4, 2])  # AS4 (all), and a straggler ratio of 0.5
def test_paper_salf_update_is_unbiased(stragglers: int) -> None:
    """E[w̃^l] over depth draws equals the FedAvg update w + mean_u Δ_u (paper mode)."""
    rng = np.random.default_rng(1)
    L, U, draws = 3, 4, 40_000
    w = rng.normal(size=L)
    deltas = rng.normal(size=(U, L))  # Δ_u^l (one scalar per layer)
    p = [p_exact_ratio(layer, L, U, stragglers) for layer in range(1, L + 1)]
    acc = np.zeros(L)
    for _ in range(draws):
        d = np.ones(U, dtype=int)
        who = rng.choice(U, size=stragglers, replace=False)
        d[who] = rng.integers(1, L + 2, size=stragglers)
        for layer in range(1, L + 1):
            held = [torch.tensor(deltas[u, layer - 1]) for u in range(U) if d[u] <= layer]
            w_l = torch.tensor(w[layer - 1])
            acc[layer - 1] += float(w_l + salf_layer_delta(w_l, held, p[layer - 1]))
    assert np.allclose(acc / draws, w + deltas.mean(axis=0), atol=0.03)


def test_deadline_depth() -> None:
    # a depth-d task's whole duration (download, fwd + bwd of layers d..L, upload of d..L);
    # e.g. fwd 1 s, backward of layers 1..3 = 1, 2, 3 s, no transfers: 7, 6, 4 s
    assert deadline_depth([7.0, 6.0, 4.0], 10.0) == 1
    assert deadline_depth([7.0, 6.0, 4.0], 6.0) == 2
    assert deadline_depth([7.0, 6.0, 4.0], 4.0) == 3
    assert deadline_depth([7.0, 6.0, 4.0], 3.0) == 4  # not even the output layer
    assert deadline_depth([], 1.0) == 1


# ------------------------------------------------------------------ exact p_l, deadline scenario
def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def test_p_exact_deadline_hand_computed() -> None:
    # L = 2 units: forward 2 FLOP/sample, backward [1, 3] → a depth-1 task computes 6 FLOP
    # per sample, a depth-2 task 5; n = 10 samples; download 100 bytes; the upload is the
    # whole model (100 bytes) at depth 1 and layer 2 alone (40 bytes) at depth 2
    kw = dict(t_max=1.0, samples=[10, 10], flops_per_sample=[6.0, 5.0], down_bytes=100,
              up_bytes=[100, 40])  # fmt: skip
    # user 0: 100 FLOP/s, free links → avail 1.0; layer 2 needs 10·5/100 = 0.5 s·s_u,
    #   layer 1 needs 10·6/100 = 0.6 s·s_u → it reaches l iff s ≤ 2 (l=2), s ≤ 1/0.6 (l=1)
    # user 1: 200 FLOP/s, 1000 B/s down, 500 B/s up → avail 1 − 0.1 − 0.2 = 0.7 at l = 1,
    #   1 − 0.1 − 0.08 = 0.82 at l = 2; layer 2: 0.25 s·s_u, layer 1: 0.3 s·s_u
    #   → s ≤ 3.28 (l=2), s ≤ 7/3 (l=1)
    pop = dict(speed=[100.0, 200.0], up_bandwidth=[math.inf, 500.0],
               down_bandwidth=[math.inf, 1000.0])  # fmt: skip
    x = {1: (1 / 0.6, 7 / 3), 2: (2.0, 3.28)}
    sigma = 0.5
    p = p_exact_deadline(**kw, **pop, slowdown_kind="lognormal", slowdown_sigma=sigma)
    for layer in (1, 2):
        # ln s ~ N(−σ²/2, σ²): P(s ≤ x) = Φ((ln x + σ²/2)/σ); p_l = Π_u (1 − P(s_u ≤ x_u))
        want = math.prod(1.0 - _phi((math.log(xu) + sigma**2 / 2) / sigma) for xu in x[layer])
        assert p[layer - 1] == pytest.approx(want, rel=1e-12)
    # (ln(5/3) + 0.125)/0.5 = 1.2716, (ln(7/3) + 0.125)/0.5 = 1.9446: 0.10184 · 0.02591
    assert p[0] == pytest.approx(0.10184 * 0.02591, rel=1e-3)
    p = p_exact_deadline(**kw, **pop, slowdown_kind="exponential", slowdown_sigma=sigma)
    for layer in (1, 2):  # s ~ Exp(1): P(s > x) = e^(−x)
        assert p[layer - 1] == pytest.approx(math.exp(-sum(x[layer])), rel=1e-12)
    # no slowdown: both users reach both layers (every x ≥ 1)
    assert p_exact_deadline(**kw, **pop, slowdown_kind="none", slowdown_sigma=sigma) == [0.0, 0.0]
    # t_max = 0.45 without slowdown: user 0 needs 0.6 / 0.5 s; user 1 needs 0.3 + 0.3 s at
    # depth 1 but 0.18 + 0.25 = 0.43 s at depth 2 (it uploads layer 2 only), so it reaches
    # layer 2 (with the whole model's upload it would need 0.55 s and reach nothing)
    kw["t_max"] = 0.45
    got = p_exact_deadline(**kw, **pop, slowdown_kind="none", slowdown_sigma=sigma)
    assert got == [1.0, 0.0]
    kw["t_max"] = 0.29  # too little time for anyone
    got = p_exact_deadline(**kw, **pop, slowdown_kind="none", slowdown_sigma=sigma)
    assert got == [1.0, 1.0]


class _DepthCtx:
    """Just enough of the simulator's Context for ``DeadlineDepths.draw``: the population,
    and ``prepare`` giving the task counter k (it keys the slowdown draw)."""

    def __init__(self, population: Population) -> None:
        self.population, self.k = population, 0

    def prepare(self, client: int) -> SimpleNamespace:
        return SimpleNamespace(k=self.k)


def _deadline_rounds(
    population: Population, t_max: float, *, fwd: float = 2.0e4,
    bwd: tuple[float, ...] = (1.0e4, 3.0e3, 6.0e3), samples: int = 16, nbytes: int = 4000,
) -> DeadlineDepths:  # fmt: skip
    L = len(bwd)
    units = Units(L, {}, {}, bwd, fwd, (nbytes // L,) * L)
    return DeadlineDepths(
        t_max=t_max, layout=Layout(units, {}, nbytes),
        full_plans=[TaskPlan(local_steps=1, batch_size=samples, samples=samples)] * len(population),
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["lognormal", "exponential"])
def test_p_exact_deadline_matches_the_simulated_depths(kind: str) -> None:
    """Monte Carlo through the simulator's own depth code (``DeadlineDepths.draw``)."""
    pop = Population(
        speed=np.array([1.0e9, 2.0e9, 3.0e9, 5.0e8]),
        up_bandwidth=np.array([np.inf, 8.0e7, np.inf, np.inf]),
        down_bandwidth=np.array([np.inf, 8.0e7, 4.0e7, 1.0e8]),
        slowdown_kind=kind, slowdown_sigma=0.8, seed=7,
    )  # fmt: skip
    # 4000 model bytes: users 1–3 spend 100, 100, 40 µs of the 200 µs on transfers (which
    # matter: with free links p_l would be about a third of these)
    depths = _deadline_rounds(pop, t_max=2.0e-4)
    L = depths.layout.units.count
    p = p_values("exact", depths, pop)
    assert min(p) > 0.02 and max(p) < 0.98  # an informative case: no p_l near 0 or 1
    ctx = _DepthCtx(pop)
    draws = 20_000
    empty = np.zeros(L)
    for k in range(draws):
        ctx.k = k
        d = depths.draw(ctx, k).depths
        empty += [(d > layer).all() for layer in range(1, L + 1)]
    for layer in range(L):
        sd = math.sqrt(p[layer] * (1 - p[layer]) / draws)
        assert empty[layer] / draws == pytest.approx(p[layer], abs=4.5 * sd + 1e-3)


@settings(max_examples=60, deadline=None)
@given(
    speeds=st.lists(st.floats(1.0e8, 1.0e10), min_size=1, max_size=5),
    t_max=st.floats(1.0e-5, 2.0e-3),
    bw=st.sampled_from([np.inf, 1.0e7, 1.0e8]),
)
def test_p_exact_deadline_without_slowdown_is_the_deterministic_depths(
    speeds: list[float], t_max: float, bw: float
) -> None:
    n = len(speeds)
    pop = Population(speed=np.array(speeds), up_bandwidth=np.full(n, bw),
                     down_bandwidth=np.full(n, bw))  # fmt: skip
    depths = _deadline_rounds(pop, t_max=t_max)
    u, L, nbytes = depths.layout.units, depths.layout.units.count, depths.layout.model_bytes
    # away from exact ties at a layer boundary (measure zero; float round-off decides those)
    for spd in speeds:
        for layer in range(1, L + 1):
            up = nbytes if layer == 1 else u.suffix_bytes(layer)
            avail = t_max - (nbytes + up) / bw
            need = 16 * (u.fwd_flops + sum(u.bwd_flops[layer - 1 :])) / spd
            assume(abs(need - avail) > 1e-9 * max(need, abs(avail)))
    p = p_values("exact", depths, pop)
    d = depths.draw(_DepthCtx(pop), 0).depths
    assert p == [1.0 if (d > layer).all() else 0.0 for layer in range(1, L + 1)]


@settings(max_examples=60, deadline=None)
@given(
    speeds=st.lists(st.floats(1.0e8, 1.0e10), min_size=1, max_size=6),
    t_max=st.floats(1.0e-5, 2.0e-3),
    kind=st.sampled_from(["lognormal", "exponential"]),
    sigma=st.floats(0.05, 2.0),
)
def test_p_exact_deadline_is_a_probability_monotone_in_layer_and_t_max(
    speeds: list[float], t_max: float, kind: str, sigma: float
) -> None:
    n = len(speeds)
    pop = Population(speed=np.array(speeds), up_bandwidth=np.full(n, np.inf),
                     down_bandwidth=np.full(n, 1.0e8), slowdown_kind=kind,
                     slowdown_sigma=sigma)  # fmt: skip
    p = p_values("exact", _deadline_rounds(pop, t_max=t_max), pop)
    later = p_values("exact", _deadline_rounds(pop, t_max=2 * t_max), pop)
    assert all(0.0 <= v <= 1.0 for v in p)
    # U^1 ⊆ U^2 ⊆ … (eq. 8): P(U^l empty) does not grow with l; more time, fewer empty sets
    assert all(a >= b for a, b in itertools.pairwise(p))
    assert all(a >= b for a, b in zip(p, later, strict=True))


def test_eq9_guard_when_p_rounds_to_one() -> None:
    w = torch.tensor([1.0])
    assert torch.equal(w + salf_layer_delta(w, [], 1.0), w)  # the expected case: nobody reached it
    out = w + salf_layer_delta(w, [torch.tensor([0.5])], 1.0)  # a boundary tie: plain mean
    assert torch.allclose(out, torch.tensor([1.5]))


def test_deadline_p_values_need_the_population_and_other_rules_are_unchanged() -> None:
    pop = Population(speed=np.full(3, 1.0e9), up_bandwidth=np.full(3, np.inf),
                     down_bandwidth=np.full(3, np.inf), slowdown_kind="lognormal")  # fmt: skip
    depths = _deadline_rounds(pop, t_max=4.0e-4)
    with pytest.raises(ValueError, match="population"):
        p_values("exact", depths)
    assert p_values("zero", depths, pop) == [0.0] * 3
    assert p_values("eq10", depths, pop) == [p_eq10(layer, 3, 3) for layer in (1, 2, 3)]


@pytest.mark.parametrize("method", ["vanilla", "drop-stragglers", "asyncfl", "salf"])
def test_only_salf_divides_by_one_minus_p(method: str) -> None:
    """p_rule (exact by default) is SALF's; its baselines average plainly over the holders
    (p = 0), though every user straggles here, so SALF's exact p_l are all > 0."""
    from fedclock.models import param_bytes
    from fedclock.strategies import BuildInfo, build_strategy

    cfg = _cfg(**{"strategy.name": method, "salf.mode": "paper",
                  "population.straggler_ratio": 1.0})  # fmt: skip
    model = build_model("mlp", input_shape=(64,), num_classes=10, hidden=[16], seed=0)
    layers = tuple(layer_view(model, (64,)))
    info = BuildInfo(
        client_sizes=np.full(8, 20), layer_fwd_flops=tuple(x.fwd_flops for x in layers),
        layer_bwd_flops=tuple(x.bwd_flops for x in layers), model_bytes=param_bytes(model),
        model=model, layers=layers,
    )  # fmt: skip
    strategy = build_strategy(cfg, info)
    # rounds aggregate a block's updates together: the executor may share the block's memory
    assert strategy.needs.synchronous is (method != "asyncfl")
    p = strategy.aggregator.normaliser.p_values  # type: ignore[attr-defined]
    L = len(p)
    assert L == 2
    # every user a straggler (AS4): the exact p_l is eq. 10
    assert p == (tuple(p_eq10(layer, L, 8) for layer in range(1, L + 1)) if method == "salf"
                 else (0.0,) * L)  # fmt: skip


# ------------------------------------------------------------------ HeteroFL slicing
def test_width_shapes_cnn() -> None:
    m = build_model("cnn", input_shape=(1, 28, 28), num_classes=10, channels=[6, 6],
                    kernel_size=5, fc_hidden=50, padding="valid", seed=0)  # fmt: skip
    shapes = [tuple(p.shape) for p in m.parameters()]
    keep = width_shapes(shapes, 0.5)
    # the spec: conv1 1→3, conv2 3→3, fc1 48→25, fc2 25→10
    assert keep == [(3, 1, 5, 5), (3,), (3, 3, 5, 5), (3,), (25, 48), (25,), (10, 25), (10,)]


def test_coverage_delta() -> None:
    w = torch.zeros(3)
    deltas = [torch.tensor([1.0, 1.0, 1.0]), torch.tensor([3.0, 0.0, 0.0])]
    masks = [torch.tensor([True, True, False]), prefix_mask((3,), (1,))]
    out = w + coverage_delta(w, deltas, masks)
    assert torch.allclose(out, torch.tensor([2.0, 1.0, 0.0]))


# ------------------------------------------------------------------ layer-suffix tasks
def _mlp() -> nn.Module:
    return build_model("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=[32, 16], seed=0)


@pytest.mark.usefixtures("float64")
def test_suffix_grads_equal_full_backprop() -> None:
    model = _mlp()
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    full, _ = suffix_grads(model, [n for n, _ in model.named_parameters()], x, y)
    layers = layer_view(model, (1, 28, 28))
    for d in range(1, len(layers) + 1):
        names = [n for lay in layers[d - 1 :] for n in lay.param_names]
        part, _ = suffix_grads(model, names, x, y)
        assert set(part) == set(names)
        for n in names:
            assert part[n].dtype == torch.float64
            torch.testing.assert_close(part[n], full[n], atol=EQUIV_TOL, rtol=EQUIV_TOL)


def test_depth_task_flops_shrink() -> None:
    model = build_model("cnn", input_shape=(1, 28, 28), num_classes=10, channels=[6, 6],
                        kernel_size=5, fc_hidden=50, padding="valid", seed=0)  # fmt: skip
    layers = layer_view(model, (1, 28, 28))
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    flops = []
    for d in range(1, len(layers) + 1):
        names = [n for lay in layers[d - 1 :] for n in lay.param_names]
        with FlopCounterMode(display=False) as fc:
            suffix_grads(model, names, x, y)
        flops.append(fc.get_total_flops())
    assert all(a > b for a, b in itertools.pairwise(flops))
    # the planner's cost model charges the same: forward + backward of layers d..L
    units = build_units(model, layers, "paper")
    fwd = sum(lay.fwd_flops for lay in layers) * 16
    for d, f in enumerate(flops, start=1):
        assert f == pytest.approx(fwd + 16 * units.suffix_bwd(d))


def test_units_reference_mode_counts_tensors() -> None:
    model = _mlp()
    units = build_units(model, layer_view(model, (1, 28, 28)), "reference")
    assert units.count == 6
    assert max(units.of_param.values()) == 6
    assert units.of_param[next(iter(units.of_param))] == 1


# ------------------------------------------------------------------ end to end
def _cfg(**over: object):
    sets = [
        "data.name=digits", "partition.num_clients=8", "model.arch=mlp", "model.hidden=[16]",
        "train.local_steps=1", "train.local_epochs=null", "train.batch_size=16", "train.lr=0.1",
        "budget.aggregations=6", "salf.scenario=ratio", "population.straggler_ratio=0.5",
        "executor.threads=1",
    ]  # fmt: skip
    sets += [f"{k}={v}" for k, v in over.items()]
    return load_config(None, sets)


@pytest.mark.parametrize("mode", ["paper", "reference"])
@pytest.mark.parametrize("method", ["vanilla", "drop-stragglers", "salf", "heterofl", "asyncfl"])
def test_methods_run(tmp_path, mode: str, method: str) -> None:
    cfg = _cfg(**{"strategy.name": method, "salf.mode": mode, "output_dir": str(tmp_path)})
    res = run_experiment(cfg, run_dir=tmp_path / "run")
    assert res.summary["status"] == "completed"
    assert res.summary["aggregations"] == 6


def test_vanilla_ignores_stragglers_and_salf_equals_vanilla_without_them(tmp_path) -> None:
    a = run_experiment(_cfg(**{"strategy.name": "vanilla"}), run_dir=tmp_path / "a")
    b = run_experiment(
        _cfg(**{"strategy.name": "salf", "population.straggler_ratio": 0.0}),
        run_dir=tmp_path / "b",
    )
    assert a.history[-1]["test_accuracy"] == b.history[-1]["test_accuracy"]


def test_reference_mode_holdout_reports_best_val(tmp_path) -> None:
    cfg = _cfg(**{"strategy.name": "salf", "salf.mode": "reference", "eval.val_holdout": 300,
                  "train.momentum": 0.5})  # fmt: skip
    res = run_experiment(cfg, run_dir=tmp_path / "r")
    assert 0.0 <= res.summary["val_best_test_accuracy"] <= 1.0


def test_validation_schedule_picks_the_same_model_as_evaluating_every_round(tmp_path) -> None:
    """eval.val_every_aggregations=1 with a sparse test curve: the same best-validation
    model and its test accuracy as testing and validating every round, in fewer test passes."""
    base = {"strategy.name": "salf", "salf.mode": "reference", "eval.val_holdout": 300,
            "train.momentum": 0.5, "budget.aggregations": 12}  # fmt: skip
    every = run_experiment(_cfg(**base), run_dir=tmp_path / "every")
    sparse = run_experiment(
        _cfg(**base, **{"eval.every_aggregations": 5, "eval.val_every_aggregations": 1}),
        run_dir=tmp_path / "sparse",
    )
    for key in ("val_best_test_accuracy", "best_val_accuracy"):
        assert sparse.summary[key] == every.summary[key]
    assert sparse.summary["validations"] == every.summary["validations"] == 13  # θ_0..θ_12
    assert len(sparse.history) == 4 and len(every.history) == 13  # sparse: 0, 5, 10, 12
    # validating alone (no test curve) finds it too; without a validation split it is refused
    only = run_experiment(
        _cfg(**base, **{"eval.every_aggregations": "null", "eval.val_every_aggregations": 1}),
        run_dir=tmp_path / "only",
    )
    assert only.summary["val_best_test_accuracy"] == every.summary["val_best_test_accuracy"]
    with pytest.raises(ConfigError, match="val_every_aggregations needs a validation split"):
        _cfg(**{"eval.val_every_aggregations": 1})


def test_deadline_scenario_depths_shrink_with_t_max(tmp_path) -> None:
    accs = {}
    for t_max in (1e6, 1e-9):
        cfg = _cfg(**{"strategy.name": "salf", "salf.scenario": "deadline",
                      "strategy.t_max": t_max, "population.up_bandwidth": "null",
                      "population.down_bandwidth": "null"})  # fmt: skip
        res = run_experiment(cfg, run_dir=tmp_path / f"d{t_max}")
        accs[t_max] = res.history[-1]["test_accuracy"]
    # nothing fits in 1e-9 s: the model never moves
    assert accs[1e-9] == res.history[0]["test_accuracy"]


@pytest.mark.parametrize("method", ["salf", "drop-stragglers"])
def test_deadline_rounds_last_t_max_and_every_device_redraws(tmp_path, method: str) -> None:
    free = {"population.up_bandwidth": "null", "population.down_bandwidth": "null"}
    vanilla = run_experiment(
        _cfg(**{"strategy.name": "vanilla", "budget.aggregations": 1, **free}),
        run_dir=tmp_path / "v",
    )
    full = vanilla.history[1]["virtual_time"]  # one full task at nominal speed
    rounds = 16
    cfg = _cfg(**{"strategy.name": method, "salf.scenario": "deadline", "strategy.t_max": full,
                  "salf.mode": "paper", "population.slowdown.kind": "lognormal",
                  "population.slowdown.sigma": 1.0, "budget.aggregations": rounds, **free})  # fmt: skip
    res = run_experiment(cfg, run_dir=tmp_path / "d")
    times = [row["virtual_time"] for row in res.history[1:]]
    # a round with a straggler closes at the deadline, whoever arrived earlier
    assert times == pytest.approx([full * (r + 1) for r in range(rounds)])
    # every user works every round: it sends something, or is cut at t_max
    sm = res.summary
    assert sm["updates_received"] + sm["updates_discarded"] == 8 * rounds
    assert 0 < sm["updates_discarded"] < 8 * rounds
    # fresh slowdown draws each round: users keep arriving in the second half
    half = res.history[rounds // 2]["updates_received"]
    assert res.history[-1]["updates_received"] - half >= rounds // 2


def test_sweep_table_and_resume(tmp_path) -> None:
    from fedclock.runs import parse_over, run_sweep

    cfg = _cfg(**{"strategy.name": "salf", "budget.aggregations": 3})
    path, values = parse_over("population.straggler_ratio=0.5,0.9")
    out = tmp_path / "sweep"
    rows, err = run_sweep(cfg, path, values, ["salf", "drop-stragglers"], [1], out)
    assert err is None
    assert [(r["strategy"], r[path]) for r in rows] == [
        ("salf", 0.5), ("salf", 0.9), ("drop-stragglers", 0.5), ("drop-stragglers", 0.9)
    ]  # fmt: skip
    header = (out / "table.csv").read_text().splitlines()[0].split(",")
    assert header[:2] == ["strategy", path]
    assert (out / "pivot.md").exists() and (out / "sweep.png").exists()
    reran: list[object] = []
    run_sweep(cfg, path, values, ["salf", "drop-stragglers"], [1], out,
              on_result=lambda s, seed, r: reran.append(r))  # fmt: skip
    assert reran == [None] * 4  # every finished cell reused
    # a run made by other fedclock source (an edit inside the version) is recomputed
    meta_path = out / "runs" / "salf" / f"{path}=0.9" / "seed-1" / "meta.json"
    meta = json.loads(meta_path.read_text())
    assert meta["source_digest"].startswith("sha256:")
    meta_path.write_text(json.dumps({**meta, "source_digest": "sha256:edited"}))
    reran.clear()
    why: list[str] = []
    run_sweep(cfg, path, values, ["salf", "drop-stragglers"], [1], out,
              on_result=lambda s, seed, r: reran.append(r),
              on_rerun=lambda c, seed, reason: why.append(f"{c}: {reason}"))  # fmt: skip
    assert [r is None for r in reran] == [True, False, True, True]
    assert why == [
        f"salf {path}=0.9: it was made by other fedclock source (the code changed since)"
    ]


def test_sweep_table_merges_earlier_commands(tmp_path) -> None:
    """Two sweeps into one folder (e.g. two processes split by strategy) give one table;
    an earlier strategy joins at the values where all its seeds are finished."""
    from fedclock.runs import run_sweep

    cfg = _cfg(**{"strategy.name": "salf", "budget.aggregations": 2})
    path, out = "population.straggler_ratio", tmp_path / "sweep"
    run_sweep(cfg, path, [0.5], ["drop-stragglers"], [1], out)
    merged: list[str] = []
    rows, err = run_sweep(cfg, path, [0.5, 0.9], ["salf"], [1], out, on_merged=merged.append)
    assert err is None and merged == ["drop-stragglers"]
    assert [(r["strategy"], r[path]) for r in rows] == [
        ("salf", 0.5), ("salf", 0.9), ("drop-stragglers", 0.5)
    ]  # fmt: skip
    assert "| drop-stragglers | 0." in (out / "pivot.md").read_text()
    assert "—" in (out / "pivot.md").read_text()  # drop-stragglers at 0.9 never ran
    # with another seed list nothing of drop-stragglers is finished
    rows, _ = run_sweep(cfg, path, [0.5], ["salf"], [1, 2], out)
    assert {r["strategy"] for r in rows} == {"salf"}


def test_sweep_runs_vanilla_once_over_fields_it_does_not_read(tmp_path) -> None:
    """Vanilla ignores the straggler ratio: one run per seed fills every value's row, and
    it equals a run made at another value."""
    from fedclock.runs import reads, run_sweep

    cfg = _cfg(**{"strategy.name": "salf", "budget.aggregations": 3})
    path, values = "population.straggler_ratio", [0.3, 0.9]
    assert not reads(cfg, "vanilla", path) and reads(cfg, "salf", path)
    assert reads(cfg, "vanilla", "train.lr")
    ran: list[tuple[str, object]] = []
    rows, err = run_sweep(cfg, path, values, ["vanilla"], [1, 2], tmp_path / "s",
                          on_result=lambda label, seed, r: ran.append((label, r)))  # fmt: skip
    assert err is None and len(ran) == 4  # two values × two seeds reported, two runs made
    assert [r is not None for _, r in ran] == [True, True, False, False]
    assert "does not read" in ran[2][0]
    assert not (tmp_path / "s" / "runs" / "vanilla" / f"{path}=0.9").exists()
    a, b = rows
    assert {k: v for k, v in a.items() if k != path} == {k: v for k, v in b.items() if k != path}
    # the shared cell is what a vanilla run at the other value gives
    other = run_experiment(_cfg(**{"budget.aggregations": 3, "strategy.name": "vanilla",
                                   "salf.scenario": "ratio", path: 0.9, "seed": 1}),
                           run_dir=tmp_path / "direct")  # fmt: skip
    shared = run_experiment(_cfg(**{"budget.aggregations": 3, "strategy.name": "vanilla",
                                    "salf.scenario": "ratio", path: 0.3, "seed": 1}),
                            run_dir=tmp_path / "direct3")  # fmt: skip
    assert [r["test_loss"] for r in other.history] == [r["test_loss"] for r in shared.history]


def test_authors_normalization_needs_mnist(tmp_path) -> None:
    from fedclock.errors import ConfigError

    cfg = _cfg(**{"strategy.name": "salf", "data.normalize": "authors"})
    with pytest.raises(ConfigError, match="'mnist' only"):
        run_experiment(cfg, run_dir=tmp_path / "n")


def test_salf_family_needs_a_scenario(tmp_path) -> None:
    from fedclock.errors import ConfigError

    cfg = _cfg(**{"strategy.name": "salf", "salf.scenario": "null"})
    with pytest.raises(ConfigError, match=r"salf\.scenario"):
        run_experiment(cfg, run_dir=tmp_path / "s")


@pytest.mark.usefixtures("float64")
def test_heterofl_full_width_equals_vanilla(tmp_path) -> None:
    a = run_experiment(_cfg(**{"strategy.name": "vanilla"}), run_dir=tmp_path / "a")
    b = run_experiment(
        _cfg(**{"strategy.name": "heterofl", "salf.heterofl_rate": 1.0}), run_dir=tmp_path / "b"
    )
    for ra, rb in zip(a.history, b.history, strict=True):
        assert ra["test_loss"] == pytest.approx(rb["test_loss"], rel=EQUIV_TOL, abs=EQUIV_TOL)


@pytest.mark.parametrize("mode", ["reference", "paper"])
def test_drop_stragglers_drops_the_whole_straggler_set(tmp_path, mode: str) -> None:
    # every member of the set (fixed in reference mode, re-drawn each round in paper mode)
    # is dropped, including one that drew depth 1 (k = L_e tensors in reference mode, 1 of
    # L + 1 depths in paper mode): the set is decided before the depth draw, so the
    # effective straggler ratio is the nominal one
    rounds = 20
    cfg = _cfg(**{"strategy.name": "drop-stragglers", "salf.mode": mode,
                  "population.straggler_ratio": 0.75, "budget.aggregations": rounds})  # fmt: skip
    res = run_experiment(cfg, run_dir=tmp_path / mode)
    assert res.summary["updates_used"] == 2 * rounds  # 8 users, round(0.75·8) = 6 dropped


def test_paper_mode_heterofl_and_asyncfl_treat_depth_one_members_as_stragglers(tmp_path) -> None:
    # HeteroFL: round(0.5·8) = 4 users train the width-0.5 submodel every round, whatever
    # depth they drew, so the upload is (4 + 4·0.25)/8 of vanilla's
    over = {"salf.mode": "paper", "population.straggler_ratio": 0.5, "budget.aggregations": 10}
    res = run_experiment(_cfg(**{"strategy.name": "heterofl", **over}), run_dir=tmp_path / "h")
    full = run_experiment(_cfg(**{"strategy.name": "vanilla", **over}), run_dir=tmp_path / "v")
    assert res.summary["bytes_up"] == pytest.approx(full.summary["bytes_up"] * 5 / 8, rel=1e-6)
    # AsyncFL: a member of the round's set delivers 2l − 1 ≥ 1 rounds later, so at most the
    # 4 non-stragglers of the first round deliver in it
    res = run_experiment(_cfg(**{"strategy.name": "asyncfl", **over}), run_dir=tmp_path / "a")
    assert res.history[1]["updates_used"] <= 4


def test_reference_heterofl_shrinks_every_member_of_the_set(tmp_path) -> None:
    cfg = _cfg(**{"strategy.name": "heterofl", "salf.mode": "reference",
                  "population.straggler_ratio": 0.5, "budget.aggregations": 10})  # fmt: skip
    res = run_experiment(cfg, run_dir=tmp_path / "h")
    full = run_experiment(
        _cfg(**{"strategy.name": "vanilla", "budget.aggregations": 10}), run_dir=tmp_path / "v"
    )
    # 4 of 8 users train the width-0.5 submodel every round: upload = (4 + 4·0.25)/8 of vanilla
    assert res.summary["bytes_up"] == pytest.approx(full.summary["bytes_up"] * 5 / 8, rel=1e-6)


def test_asyncfl_stragglers_participate_less(tmp_path) -> None:
    import csv

    cfg = _cfg(**{"strategy.name": "asyncfl", "salf.mode": "reference",
                  "budget.aggregations": 12})  # fmt: skip
    res = run_experiment(cfg, run_dir=tmp_path / "a")
    with (res.run_dir / "clients.csv").open() as fh:
        parts = sorted(int(r["participations"]) for r in csv.DictReader(fh))
    # 4 of 8 users are fixed stragglers: they deliver once per 2l ≥ 2 rounds
    assert parts[-4:] == [12] * 4
    assert all(p <= 6 for p in parts[:4])


# ------------------------------------------------------------------ vectorized suffix tasks
def _shape(depth: int | None):
    return FULL if depth is None else Suffix(depth)


def _vmap_blocks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that receives the task count of every block trained with ``vmap`` from now on."""
    from fedclock.train.vectorized import VectorizedExecutor

    blocks: list[int] = []
    real = VectorizedExecutor._run_block

    def spy(self: VectorizedExecutor, tasks: list) -> list:
        blocks.append(len(tasks))
        return real(self, tasks)

    monkeypatch.setattr(VectorizedExecutor, "_run_block", spy)
    return blocks


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
@pytest.mark.parametrize("momentum", [0.0, 0.5])
@pytest.mark.usefixtures("float64")
def test_vectorized_suffix_tasks_equal_the_serial_partial_executor(
    arch, momentum, monkeypatch
) -> None:
    from dataclasses import replace

    from fedclock.train.executor import snapshot
    from tests.conftest import partial_executor
    from tests.test_vectorized import _assert_same, _data, _tasks

    shape = (1, 8, 8)
    kw = {"hidden": [16, 8]} if arch == "mlp" else {"channels": [4, 4], "fc_hidden": 8}
    model = build_model(arch, input_shape=shape, num_classes=10, seed=3, **kw)
    units = build_units(model, layer_view(model, shape), "paper")
    L = units.count
    sizes = [16, 20, 12, 18, 16, 30, 9]
    data = _data(sizes, shape)
    v0 = snapshot(model, 0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05)
    v1 = snapshot(model, 1)
    tasks = []
    for c, t in enumerate(_tasks(v0, sizes, 8, steps=3)):
        depth = None if c == 0 else 1 + c % L  # full, and every depth 2..L (L+1: no task)
        tasks.append(
            replace(t, plan=replace(t.plan, shape=_shape(depth)), base=v1 if c % 3 == 0 else v0)
        )
    opts = dict(seed=4, lr=0.1, momentum=momentum, weight_decay=1e-3, units=units)
    blocks = _vmap_blocks(monkeypatch)
    serial = partial_executor(model, data, **opts).run(tasks)
    assert blocks == []
    vec = partial_executor(model, data, vectorize=True, **opts)
    _assert_same(serial, vec.run(tasks))
    # one vmap block per depth held by ≥ 2 tasks (a lone task runs on the serial path)
    per_depth = Counter(suffix_depth(t.plan.shape) for t in tasks)
    assert sorted(blocks) == sorted(n for n in per_depth.values() if n >= 2) != []
    for c, t in zip(serial, tasks, strict=True):  # the frozen prefix sends nothing
        d = suffix_depth(t.plan.shape)
        for name, delta in c.delta.items():
            assert (units.of_param[name] >= d) == bool(delta.abs().sum() > 0)


@pytest.mark.parametrize("mode", ["paper", "reference"])
@pytest.mark.usefixtures("float64")
def test_salf_run_vectorized_matches_serial(tmp_path, mode: str) -> None:
    base = {"strategy.name": "salf", "salf.mode": mode, "budget.aggregations": 4,
            "train.momentum": 0.5}  # fmt: skip
    a = run_experiment(_cfg(**base, **{"executor.kind": "serial"}), run_dir=tmp_path / "s")
    b = run_experiment(_cfg(**base), run_dir=tmp_path / "v")
    for ra, rb in zip(a.history, b.history, strict=True):
        assert ra["test_loss"] == pytest.approx(rb["test_loss"], rel=EQUIV_TOL, abs=EQUIV_TOL)


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
@pytest.mark.usefixtures("float64")
def test_vectorized_reference_tasks_equal_serial_with_persistent_momentum(
    arch, monkeypatch
) -> None:
    """Reference mode: full training, tensors d..L_e kept, momentum kept per client across
    tasks — three rounds, so the buffers carried from one round to the next matter (a
    serial executor that restarts momentum at zero gives other updates from round 2 on)."""
    from dataclasses import replace

    from fedclock.train.executor import snapshot
    from tests.conftest import partial_executor
    from tests.test_vectorized import _assert_same, _data, _tasks

    shape = (1, 8, 8)
    kw = {"hidden": [16, 8]} if arch == "mlp" else {"channels": [4, 4], "fc_hidden": 8}
    model = build_model(arch, input_shape=shape, num_classes=10, seed=3, **kw)
    units = build_units(model, layer_view(model, shape), "reference")
    L = units.count  # tensors
    sizes = [16, 20, 12, 18, 16, 30, 9]
    data = _data(sizes, shape)
    opts = dict(seed=4, lr=0.1, momentum=0.5, weight_decay=0.0, units=units, mode="reference",
                persistent_momentum=True)  # fmt: skip
    # each executor trains its own copy, so the bases depend on the rounds only (a base
    # reached through other training can put two max-pool inputs within 1e-7 of each other:
    # vmap's and the serial kernels' round-off then route that gradient differently)
    serial = partial_executor(copy.deepcopy(model), data, **opts)
    fresh = partial_executor(copy.deepcopy(model), data, **{**opts, "persistent_momentum": False})
    vec = partial_executor(copy.deepcopy(model), data, vectorize=True, **opts)
    blocks = _vmap_blocks(monkeypatch)
    for r in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * (r + 1))
        base = snapshot(model, r)
        tasks = []
        for c, t in enumerate(_tasks(base, sizes, 8, steps=2)):
            depth = None if c % 4 == 0 else 1 + (c + r) % L
            tasks.append(replace(t, plan=replace(t.plan, shape=_shape(depth))))
        a = serial.run(tasks)
        f = fresh.run(tasks)
        assert blocks == []
        b = vec.run(tasks)
        assert blocks == [len(tasks)]  # every depth in one vmap block (all train fully)
        blocks.clear()
        _assert_same(a, b)
        for c, t in zip(a, tasks, strict=True):  # only tensors d..L_e are sent
            d = suffix_depth(t.plan.shape)
            for name, delta in c.delta.items():
                assert (units.of_param[name] >= d) == bool(delta.abs().sum() > 0)
        # round 1 starts from zero momentum either way; later rounds use the carried buffers
        carried = any(
            not torch.equal(cf.delta[n], ca.delta[n])
            for ca, cf in zip(a, f, strict=True)
            for n in ca.delta
        )
        assert carried == (r > 0)


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
@pytest.mark.parametrize("mode", ["paper", "reference"])
@pytest.mark.usefixtures("float64")
def test_vectorized_heterofl_submodels_equal_serial(arch, mode, monkeypatch) -> None:
    """Width-0.5 submodel tasks (grouped by width) and full tasks, vectorized vs serial;
    reference mode carries each client's momentum (a full-shape buffer, the submodel's slice
    updated) across three rounds (restarting it at zero gives other updates from round 2 on)."""
    from dataclasses import replace

    from fedclock.train.executor import snapshot
    from tests.conftest import partial_executor
    from tests.test_vectorized import _assert_same, _data, _tasks

    shape = (1, 8, 8)
    kw = {"hidden": [16, 8]} if arch == "mlp" else {"channels": [4, 4], "fc_hidden": 8}
    model = build_model(arch, input_shape=shape, num_classes=10, seed=3, **kw)
    units = build_units(model, layer_view(model, shape), mode)
    sizes = [16, 20, 12, 18, 16, 30, 9]
    data = _data(sizes, shape)
    opts = dict(seed=4, lr=0.1, momentum=0.5, weight_decay=1e-3, units=units, mode=mode,
                persistent_momentum=mode == "reference")  # fmt: skip
    # each executor trains its own copy, so the bases depend on the rounds only (a base
    # reached through other training can put two max-pool inputs within 1e-7 of each other:
    # vmap's and the serial kernels' round-off then route that gradient differently)
    serial = partial_executor(copy.deepcopy(model), data, **opts)
    fresh = partial_executor(copy.deepcopy(model), data, **{**opts, "persistent_momentum": False})
    vec = partial_executor(copy.deepcopy(model), data, vectorize=True, **opts)
    names = [n for n, _ in model.named_parameters()]
    keep = width_shapes([tuple(model.get_parameter(n).shape) for n in names], 0.5)
    held = {n: tuple(slice(0, k) for k in kp) for n, kp in zip(names, keep, strict=True)}
    blocks = _vmap_blocks(monkeypatch)
    for r in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * (r + 1))
        base = snapshot(model, r)
        tasks = [
            replace(t, plan=replace(t.plan, shape=Width(0.5) if c % 3 else FULL))
            for c, t in enumerate(_tasks(base, sizes, 8, steps=2))
        ]
        a, f = serial.run(tasks), fresh.run(tasks)
        assert blocks == []
        b = vec.run(tasks)
        assert sorted(blocks) == [3, 4]  # one vmap block per width: 3 full, 4 of width 0.5
        blocks.clear()
        _assert_same(a, b)
        for c, t in zip(a, tasks, strict=True):  # a submodel sends nothing outside its slice
            if isinstance(t.plan.shape, Width):
                for name, delta in c.delta.items():
                    outside = delta.clone()
                    outside[held[name]] = 0
                    assert not outside.any()
        carried = any(
            not torch.equal(cf.delta[n], ca.delta[n])
            for ca, cf in zip(a, f, strict=True)
            for n in ca.delta
        )
        assert carried == (mode == "reference" and r > 0)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["vanilla", "salf"])
def test_salf_vgg_preset_learns(tmp_path, method: str) -> None:
    """The shipped VGG preset (BatchNorm, synthetic CIFAR-shaped data) trains well above
    chance: its data were once too hard to learn and every method sat at 0.10."""
    from fedclock.presets import load_preset

    raw = load_preset("salf-vgg")
    raw["strategy"] = {"name": method}
    raw["executor"] = {"kind": "serial", "threads": 1}
    result = run_experiment(load_config(raw=raw), run_dir=tmp_path)
    assert result.summary["final_test_accuracy"] > 0.6


# ------------------------------------------------------------------ costs match the work
def _ref_rounds(charge: str) -> SuffixWork:
    # 3 reference-mode units (tensors): backward [10, 20, 30] FLOP/sample, forward 100
    units = Units(3, {}, {}, (10.0, 20.0, 30.0), 100.0, (40, 8, 12))
    layout = Layout(units, {}, 60, charge_full_step=charge == "work")
    return SuffixWork(depths=None, full_plans=[TaskPlan(1, 4, 4)], layout=layout)


def test_reference_mode_charges_the_full_step_it_trains() -> None:
    from dataclasses import replace

    full = TaskPlan(local_steps=1, batch_size=4, samples=4)
    depth3 = replace(full, shape=Suffix(3))
    # charge = work: the authors' straggler runs the whole step (4·(100 + 60) FLOP) and
    # uploads only the tensors it keeps (unit 3: 12 bytes)
    cost = _ref_rounds("work").cost(depth3)
    assert (cost.flops, cost.bytes_down, cost.bytes_up) == (640.0, 60, 12)
    # charge = suffix (the paper's accounting): forward + backward of unit 3 only
    cost = _ref_rounds("suffix").cost(depth3)
    assert (cost.flops, cost.bytes_down, cost.bytes_up) == (4 * (100 + 30), 60, 12)
    assert _ref_rounds("work").cost(full) == _ref_rounds("suffix").cost(full)


def test_reference_mode_under_a_deadline_needs_the_suffix_charge(tmp_path) -> None:
    from fedclock.errors import ConfigError

    cfg = _cfg(**{"strategy.name": "salf", "salf.scenario": "deadline", "salf.mode": "reference",
                  "strategy.t_max": 1.0})  # fmt: skip
    with pytest.raises(ConfigError, match=r"salf\.charge: suffix"):
        run_experiment(cfg, run_dir=tmp_path / "r")


def test_deadline_depth_reserves_only_the_suffix_upload() -> None:
    # one user, free download, 1000 B/s upload, 4000 model bytes in 3 equal units; compute of
    # a depth-d task (16 samples at 1 GFLOP/s, no slowdown): 16·(2e4 + Σ_{l≥d} bwd_l)/1e9 s
    pop = Population(speed=np.array([1.0e9]), up_bandwidth=np.array([1000.0]),
                     down_bandwidth=np.array([np.inf]))  # fmt: skip
    # depth 3 needs 16·(2e4 + 6e3)/1e9 = 0.416 ms of compute + 1333/1000 s of upload;
    # the whole model's upload alone (4 s) would exceed t_max = 2 s
    depths = _deadline_rounds(pop, t_max=2.0)
    d = depths.draw(_DepthCtx(pop), 0).depths
    assert d.tolist() == [3]
    assert p_values("exact", depths, pop) == [1.0, 1.0, 0.0]


def test_every_user_plans_an_epoch_of_its_own_data(tmp_path, monkeypatch) -> None:
    from fedclock.sim.simulator import Simulator

    seen: dict[int, int] = {}
    real = Simulator.commit

    def spy(self, contributions):
        for c in contributions:
            seen[c.client] = c.task.plan.samples
            assert c.task.cost.flops > 0
        return real(self, contributions)

    monkeypatch.setattr(Simulator, "commit", spy)
    cfg = _cfg(**{"strategy.name": "salf", "train.local_steps": "null", "train.local_epochs": 1,
                  "partition.sizes": "lognormal", "partition.size_sigma": 0.8,
                  "budget.aggregations": 2, "population.straggler_ratio": 0.0})  # fmt: skip
    res = run_experiment(cfg, run_dir=tmp_path / "e")
    import csv

    with (res.run_dir / "clients.csv").open() as fh:
        sizes = {int(r["client"]): int(r["num_samples"]) for r in csv.DictReader(fh)}
    assert len(set(sizes.values())) > 1  # unequal sizes: the case this is about
    assert seen == sizes  # one epoch = every sample of the user's own shard


# ------------------------------------------------------------------ parts compose
def test_salf_suffix_work_composes_with_a_fedbuff_trigger(tmp_path, monkeypatch) -> None:
    """SALF's suffix work (reference-mode depth draws) × FedBuff's arrival buffer × eq. 9:
    built from the public parts, run end to end through run_experiment."""
    from dataclasses import replace as dc_replace

    from fedclock.strategies import STRATEGIES, Strategy
    from fedclock.strategies.aggregators import Update
    from fedclock.strategies.asynchronous import ArrivalBuffer, UpdateTimes
    from fedclock.strategies.planners import PerTask, local_sgd_plan
    from fedclock.strategies.salf import RatioDepths, salf_update
    from fedclock.train.local import Needs

    seen: list[list[tuple[object, dict[str, torch.Tensor]]]] = []

    def spy(update: Update) -> Update:
        real = update.aggregate

        def aggregate(ctx, base, contributions):
            seen.append([(c.task.plan.shape, c.delta) for c in contributions])
            return real(ctx, base, contributions)

        update.aggregate = aggregate  # type: ignore[method-assign]
        return update

    def compose(cfg, info):
        units = build_units(info.model, info.layers, "paper")
        layout = Layout.of(info.model, units, info.model_bytes)
        full = [local_sgd_plan(int(n), 16, local_epochs=None, local_steps=1)
                for n in info.client_sizes]  # fmt: skip
        depths = RatioDepths(
            num_users=len(full), num_units=units.count, ratio=1.0, reference=True
        )  # every user straggles, depth uniform on 1..L
        planner = PerTask(SuffixWork(depths=depths, full_plans=full, layout=layout))
        return Strategy(
            name="salf-fedbuff", planner=planner,
            trigger=ArrivalBuffer(UpdateTimes("profile", planner), buffer_size=3),
            aggregator=spy(salf_update(mode="paper", units=units, num_users=3,
                                       p_values=[0.0] * units.count)),
            needs=Needs(shapes=frozenset({type(FULL), Suffix}), layout=layout),
        )  # fmt: skip

    monkeypatch.setitem(STRATEGIES, "fedbuff", dc_replace(STRATEGIES["fedbuff"], build=compose))
    cfg = load_config(None, [
        "data.name=digits", "partition.num_clients=8", "model.arch=mlp", "model.hidden=[16]",
        "train.local_steps=1", "train.local_epochs=null", "train.batch_size=16", "train.lr=0.1",
        "strategy.name=fedbuff", "strategy.buffer_size=3", "budget.aggregations=12",
        "population.slowdown.kind=lognormal", "executor.threads=1",
    ])  # fmt: skip
    res = run_experiment(cfg, run_dir=tmp_path / "r")
    assert res.summary["status"] == "completed" and len(seen) == 12
    assert all(len(batch) == 3 for batch in seen)
    shapes = [s for batch in seen for s, _ in batch]
    assert any(s is FULL for s in shapes) and any(isinstance(s, Suffix) for s in shapes)
    names = list(seen[0][0][1])  # mlp 64-16-10: units 1 and 2 hold two tensors each
    for shape, delta in (x for batch in seen for x in batch):
        if isinstance(shape, Suffix):  # a depth-2 task leaves unit 1 untouched
            assert shape.depth == 2
            assert all(torch.count_nonzero(delta[n]) == 0 for n in names[:2])
            assert any(torch.count_nonzero(delta[n]) > 0 for n in names[2:])
    assert res.history[-1]["test_accuracy"] > res.history[0]["test_accuracy"]


def test_p_over_some_users_multiplies_their_factors() -> None:
    """Hand-computed: users 0 and 2 of three, P(not reaching l) 0.5, 0.9 and 1.0, 0.3:
    p = (0.5·1.0, 0.9·0.3) = (0.5, 0.27); over every user it is p_exact's product."""
    from fedclock.strategies.salf import p_over_users

    factors = np.array([[0.5, 0.9], [0.2, 1.0], [1.0, 0.3]])
    got = p_over_users(factors, [0, 2])
    assert got[0] == 0.5 and abs(got[1] - 0.27) < 1e-15
    assert p_over_users(factors, []) == [1.0, 1.0]


_SALF_SOME = [
    "strategy.name=salf",
    "salf.scenario=deadline",
    "strategy.t_max=0.5",
    "strategy.client_fraction=0.5",
]


def test_the_reach_factors_multiply_to_p_exact() -> None:
    from fedclock.experiment import _build
    from fedclock.strategies.salf import DeadlineDepths, p_over_users
    from tests.conftest import tiny_raw

    cfg = load_config(raw=tiny_raw(), overrides=_SALF_SOME[:3])
    parts = _build(cfg, None)
    depths = parts.strategy.planner.depths
    assert isinstance(depths, DeadlineDepths)
    factors = depths.reach_factors(parts.population)
    want = depths.p_exact(parts.population)
    assert np.allclose(p_over_users(factors, range(len(factors))), want, rtol=1e-12, atol=0.0)
    assert min(want) > 0.0 and max(want) < 1.0  # (not a trivial case: some layers uncertain)


@pytest.mark.parametrize("selection", ["random", "oort", "tifl"])
def test_salf_over_some_users_a_round_composes_with_selection(tmp_path, selection: str) -> None:
    """Oort / TiFL / uniform choose half the users a round; the slow ones among them still
    send the layer suffix they reach by the deadline, aggregated by eq. 9 over the round."""
    from tests.conftest import tiny_raw

    cfg = load_config(raw=tiny_raw(), overrides=[*_SALF_SOME, f"selection.name={selection}",
                                                 "budget.aggregations=6"])  # fmt: skip
    res = run_experiment(cfg, run_dir=tmp_path)
    assert res.summary["status"] == "completed" and res.summary["aggregations"] == 6
    assert res.summary["updates_used"] <= 6 * 3  # 3 of the 6 users a round


@pytest.mark.parametrize("change", ["salf.mode=reference", "salf.scenario=ratio"])
def test_salf_over_some_users_needs_the_deadline_scenario_in_paper_mode(
    tmp_path, change: str
) -> None:
    from tests.conftest import tiny_raw

    over = [*_SALF_SOME, change]
    if change == "salf.scenario=ratio":  # (the ratio scenario reads no deadline)
        over = ["strategy.name=salf", "strategy.client_fraction=0.5", change,
                "population.straggler_ratio=0.5"]  # fmt: skip
    with pytest.raises(ConfigError, match="paper mode"):
        run_experiment(load_config(raw=tiny_raw(), overrides=over), run_dir=tmp_path)


def test_salf_with_oort_gives_the_same_run_in_both_executors(tmp_path) -> None:
    from tests.conftest import tiny_raw

    got = []
    for kind in ("serial", "vectorized"):
        cfg = load_config(raw=tiny_raw(), overrides=[*_SALF_SOME, "selection.name=oort",
                                                     f"executor.kind={kind}"])  # fmt: skip
        got.append(run_experiment(cfg, run_dir=tmp_path / kind).history)
    keys = ("aggregation", "updates_used", "compute_s_spent")  # the same rounds and work
    rows = [[{k: r.get(k) for k in keys} for r in h] for h in got]
    assert rows[0] == rows[1]
    for a, b in zip(got[0], got[1], strict=True):  # (float32 training: a flipped test image)
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=0.01)
