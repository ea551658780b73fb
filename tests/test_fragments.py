"""Fed-RAA's model fragments as a work shape: masks, cost, execution (serial = vectorized =
an independent masked SGD)."""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedclock.models import build_model, layer_view, param_bytes
from fedclock.models.shapes import (
    FRAGMENT_RATIOS,
    FULL,
    Fragment,
    Layout,
    build_units,
    fragment_masks,
    group_bounds,
)
from fedclock.train.executor import batch_schedule, snapshot
from tests.conftest import EQUIV_TOL, partial_executor
from tests.test_vectorized import _assert_same, _data, _tasks


def test_group_bounds_follow_table_4() -> None:
    assert group_bounds(200, FRAGMENT_RATIOS[4]) == [0, 20, 60, 120, 200]
    assert group_bounds(200, FRAGMENT_RATIOS[5]) == [0, 10, 30, 70, 130, 200]
    assert group_bounds(10, FRAGMENT_RATIOS[2]) == [0, 4, 10]


def test_fragments_of_one_hidden_layer_hand_computed() -> None:
    # 6 inputs → 10 hidden → 3 outputs, fragments of 40 / 60 %: hidden units 0–3 and 4–9
    shapes = {"0.weight": (10, 6), "0.bias": (10,), "2.weight": (3, 10), "2.bias": (3,)}
    a, b = fragment_masks(shapes, (40.0, 60.0))
    assert a["0.weight"][:4].all() and not a["0.weight"][4:].any()  # incoming weights
    assert a["0.bias"].tolist() == [True] * 4 + [False] * 6
    assert a["2.weight"][:, :4].all() and not a["2.weight"][:, 4:].any()  # outgoing
    assert a["2.bias"].all() and b["2.bias"].all()  # the output bias: in every fragment
    for n in ("0.weight", "0.bias", "2.weight"):  # the hidden layer: each element once
        assert torch.equal(a[n] ^ b[n], torch.ones(shapes[n], dtype=torch.bool))


def test_a_hidden_neuron_owns_every_incoming_weight() -> None:
    """Cross-group weights go to the destination's fragment: hidden layer 2's group j holds
    its rows from every unit of hidden layer 1; the output layer's columns go with the
    hidden neuron they leave."""
    shapes = {"w1": (10, 4), "b1": (10,), "w2": (5, 10), "b2": (5,), "w3": (2, 5), "b3": (2,)}
    masks = fragment_masks(shapes, (40.0, 60.0))
    first, second = masks
    # hidden 1: units 0–3 / 4–9; hidden 2: units 0–1 / 2–4
    assert first["w2"][:2, :].all() and int(first["w2"].sum()) == 2 * 10
    assert second["w2"][2:, :].all() and int(second["w2"].sum()) == 3 * 10
    assert first["w3"][:, :2].all() and int(first["w3"].sum()) == 4
    assert second["b2"][2:].all() and int(second["b2"].sum()) == 3
    with pytest.raises(ValueError, match="too few for 5 fragments"):
        fragment_masks({"w": (3, 4), "o": (2, 3)}, FRAGMENT_RATIOS[5])


@settings(max_examples=25, deadline=None)
@given(
    hidden=st.lists(st.integers(20, 60), min_size=1, max_size=3),  # 5 % of 20: one unit
    m=st.sampled_from(sorted(FRAGMENT_RATIOS)),
)
def test_fragments_cover_each_element_exactly_once(hidden: list[int], m: int) -> None:
    dims = [7, *hidden, 3]
    shapes: dict[str, tuple[int, ...]] = {}
    for i, (a, b) in enumerate(itertools.pairwise(dims)):
        shapes[f"w{i}"], shapes[f"b{i}"] = (b, a), (b,)
    masks = fragment_masks(shapes, FRAGMENT_RATIOS[m])
    for n in shapes:
        count = sum(mk[n].int() for mk in masks)
        if n == f"b{len(hidden)}":  # the output bias: every fragment's
            assert bool((count == m).all())
        else:  # every other element (cross-group weights included): one fragment's
            assert bool((count == 1).all())


def _mlp(hidden: list[int] | None = None, dtype: torch.dtype = torch.float32):
    m = build_model("mlp", input_shape=(6,), num_classes=10, hidden=hidden or [20], seed=0)
    m = m.to(dtype)
    units = build_units(m, layer_view(m, (6,)), "paper")
    return m, units, Layout.of(m, units, param_bytes(m))


def test_a_fragment_costs_its_share_of_the_model() -> None:
    _, _, layout = _mlp()
    full = FULL.cost(layout, 32)
    for j, r in enumerate(FRAGMENT_RATIOS[4]):
        cost = Fragment(j, FRAGMENT_RATIOS[4]).cost(layout, 32)
        # one hidden layer: the fragment holds r % of both weight layers
        assert cost.flops == pytest.approx(r / 100 * full.flops, rel=1e-12)
        held = sum(int(mk.sum()) for mk in layout.fragment(FRAGMENT_RATIOS[4], j).values())
        assert cost.bytes_up == cost.bytes_down == 4 * held  # float32 elements
    # fragment 1 (10 %): hidden units 0–1, so 2·6 + 2 incoming, 10·2 outgoing, the 10
    # output biases: 44 elements of the model's 350
    assert Fragment(0, FRAGMENT_RATIOS[4]).cost(layout, 1).bytes_up == 4 * 44
    assert full.bytes_up == 4 * 350


def _masked_sgd(
    model, data, task, masks, *, momentum: float, rho: float = 0.0, zero_outside: bool
) -> dict[str, torch.Tensor]:
    """An independent fragment task: torch SGD on ``model`` (zeroed outside the fragment
    when ``zero_outside``, else the rest frozen at the base) with gradients kept inside the
    fragment; with ρ the gradient adds ρ(θ − θ^j_q), θ^j_q the received fragment. Returns
    the expected Δ (0 outside the fragment)."""
    ref = copy.deepcopy(model)
    if zero_outside:
        with torch.no_grad():
            for n, p in ref.named_parameters():
                p.mul_(masks[n])
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=momentum)
    idx = data.indices[task.client]
    for local in batch_schedule(3, task, len(idx)):
        rows = idx[local]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(data.x[rows]), data.y[rows]).backward()
        for n, p in ref.named_parameters():
            start = task.base.params[n] * masks[n] if zero_outside else task.base.params[n]
            p.grad.add_(rho * (p.detach() - start))
            p.grad.mul_(masks[n])
        opt.step()
    return {
        n: torch.where(masks[n], p.detach() - task.base.params[n], 0.0)
        for n, p in ref.named_parameters()
    }


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize(("momentum", "rho"), [(0.0, 0.0), (0.5, 0.0), (0.5, 0.3)])
@pytest.mark.parametrize("hidden", [[20], [20, 12]])
def test_fragment_tasks_train_the_fragment_alone(
    momentum: float, rho: float, hidden: list[int]
) -> None:
    """Serial and vectorized executors equal an independent masked SGD with gradients kept
    inside the fragment and Δ = 0 outside: one hidden layer, the model zeroed outside the
    fragment (the fragment's own network); two, the other groups frozen at the base. With
    ρ, the objective adds (ρ/2)‖θ^j − θ^j_q‖² (gradient ρ(θ − θ_received) on the fragment)."""
    model, units, layout = _mlp(hidden, torch.float64)
    sizes = [16, 16, 12, 20]
    data = _data(sizes, (6,))
    data = replace(data, x=data.x.double())
    ratios = FRAGMENT_RATIOS[3]
    shapes = [Fragment(0, ratios), Fragment(0, ratios), Fragment(2, ratios), FULL]
    tasks = [
        replace(t, plan=replace(t.plan, shape=s))
        for t, s in zip(_tasks(snapshot(model, 0), sizes, 8, steps=3), shapes, strict=True)
    ]
    opts = dict(seed=3, lr=0.1, momentum=momentum, units=units, proximal_mu=rho)
    serial = partial_executor(copy.deepcopy(model), data, **opts).run(tasks)
    vec = partial_executor(copy.deepcopy(model), data, vectorize=True, **opts).run(tasks)
    _assert_same(serial, vec)
    for task, c in zip(tasks[:3], serial[:3], strict=True):
        masks = layout.fragment(ratios, task.plan.shape.index)
        want = _masked_sgd(model, data, task, masks, momentum=momentum, rho=rho,
                           zero_outside=len(hidden) == 1)  # fmt: skip
        for n in want:
            torch.testing.assert_close(c.delta[n], want[n], atol=EQUIV_TOL, rtol=EQUIV_TOL)
            assert c.covers(n) is True or torch.equal(c.covers(n), masks[n])


# ------------------------------------------------------------------ Gre-RAA (Algorithm 2)
def test_gre_raa_takes_the_least_updated_feasible_fragment() -> None:
    from fedclock.strategies.fedraa import gre_raa

    rng = np.random.default_rng(0)
    costs, k = [0.1, 0.2, 0.3, 0.4], 0.25  # S = {1, 2} (1-based)
    # fragments 3 and 4 are less updated but do not fit K
    assert {gre_raa(costs, [3, 1, 0, 0], k, rng) for _ in range(50)} == {1}
    with pytest.raises(ValueError, match=r"no fragment fits the delay bound K = 0\.05"):
        gre_raa(costs, [0, 0, 0, 0], 0.05, rng)


def test_gre_raa_ties_follow_algorithm_2() -> None:
    """h starts at a uniform draw from S and moves only to a strictly less-updated j':
    q = (1, 0, 0) gives fragment 2 for draws 1 and 2, fragment 3 for draw 3."""
    from fedclock.strategies.fedraa import gre_raa

    rng = np.random.default_rng(1)
    picks = [gre_raa([1.0, 1.0, 1.0], [1, 0, 0], 2.0, rng) for _ in range(6000)]
    share = np.bincount(picks, minlength=3) / len(picks)
    assert share[0] == 0 and abs(share[1] - 2 / 3) < 0.03 and abs(share[2] - 1 / 3) < 0.03


def test_delay_bounds_on_the_authors_example() -> None:
    """The spec's example: M = 4 (10/20/30/40 %), cost (part/100)/cmp, 10 clients with cmp
    1 (4 clients), 2 (3), 3 (3): the README's K = 0.15 is the offline bound."""
    from fedclock.strategies.fedraa import k_feasible, k_offline

    cmp = np.array([1, 1, 1, 1, 2, 2, 2, 3, 3, 3], dtype=float)
    parts = np.array(FRAGMENT_RATIOS[4]) / 100
    costs = parts[None, :] / cmp[:, None]
    # fastest first: cmp 3, 3 → 40 %; 3, 2 → 30 %; 2, 2 → 20 %; the four cmp-1 → 10 %
    assert k_offline(costs) == pytest.approx(0.15)
    assert k_feasible(costs) == pytest.approx(0.1)  # every cmp-1 client fits 10 % only


def test_mix_target_hand_computed() -> None:
    """Alg. 1's updater as the Update with the mix target: θ ← (1 − α)·θ + α·θ_new where the
    fragment covers the element, θ elsewhere."""
    from fedclock.devices.cost import TaskTiming
    from fedclock.sim.types import Contribution, ModelVersion, Task
    from fedclock.strategies.aggregators import Update, keep_buffers, mix
    from fedclock.strategies.asynchronous import ConstantWeight, StalenessWeighting

    theta = ModelVersion(3, {"w": torch.tensor([1.0, 1.0])})
    update = Update(StalenessWeighting(ConstantWeight(0.5)), target=mix, buffers=keep_buffers)

    def mixed(cover: torch.Tensor | bool) -> list[float]:
        task = Task(0, 0, 0, theta, None, None, TaskTiming(0, 0, 0), 0.0)  # type: ignore[arg-type]
        c = Contribution(task, {"w": torch.tensor([2.0, 4.0])}, {}, 1, 0.0,
                         coverage={"w": cover})  # θ_new = [3, 5]  # fmt: skip
        return update.aggregate(None, theta, [c]).params["w"].tolist()  # type: ignore[arg-type]

    assert mixed(torch.tensor([True, False])) == [2.0, 1.0]  # (1 − ½)·1 + ½·3; θ elsewhere
    assert mixed(True) == [2.0, 3.0]
    assert mixed(False) == [1.0, 1.0]


# ------------------------------------------------------------------ the strategy, end to end
def _fedraa_raw(**strategy: object) -> dict:
    from tests.conftest import tiny_raw

    # 10 clients: β = 0.4 "extremely low" devices (speed 1) and "low" ones (speed 3), in
    # units of 1e6 FLOP/s; free links, so a fragment's time is its compute alone
    return tiny_raw(
        partition={"num_clients": 10},
        model={"arch": "mlp", "hidden": [40]},
        population={
            "scenario": "classes", "up_bandwidth": None, "down_bandwidth": None,
            "classes": [{"fraction": 0.4, "speed": 1e6}, {"fraction": 0.6, "speed": 3e6}],
        },
        strategy={"name": "fed-raa", "fragments": 4, **strategy},
        budget={"aggregations": 60},
    )  # fmt: skip


def _fragments_seen(monkeypatch) -> list[tuple[int, int]]:
    """(client, fragment index) of every update Fed-RAA's updater mixes in, in order."""
    from fedclock.strategies.aggregators import Update

    seen: list[tuple[int, int]] = []
    real = Update.aggregate

    def spy(self, ctx, base, contributions):
        seen.extend((c.client, c.task.plan.shape.index) for c in contributions)
        return real(self, ctx, base, contributions)

    monkeypatch.setattr(Update, "aggregate", spy)
    return seen


def test_fedraa_assigns_only_fragments_within_k(tmp_path, monkeypatch) -> None:
    """Gre-RAA under a K that only the smallest fragment meets on the slow devices: every
    slow device trains fragment 1, fast ones spread over the others (q(j) counted at
    assignment: the slow devices keep fragment 1 the most assigned, so the fast ones are
    sent to 2–4)."""
    from fedclock.config import load_config
    from fedclock.experiment import run_experiment

    seen = _fragments_seen(monkeypatch)
    cfg = load_config(raw=_fedraa_raw())
    res = run_experiment(cfg, run_dir=tmp_path / "k")
    assert res.summary["status"] == "completed" and len(seen) == 60
    from fedclock.devices import build_population

    speed = build_population(cfg.population, 10, cfg.seed).speed
    assert sorted(speed.tolist()) == [1e6] * 4 + [3e6] * 6
    # the offline bound (Theorem 2): fastest first, two clients per fragment, largest
    # first — 40 % and 30 % on fast devices, 20 % on fast ones, 10 % on the slow ones — so
    # K ≈ the 40 % fragment's time on a fast device (0.4/3 of a full task at speed 1):
    # a slow device fits only the 10 % one (0.1 < 0.133 < 0.2), a fast one all four
    slow = {j for c, j in seen if speed[c] == 1e6}
    fast = {j for c, j in seen if speed[c] == 3e6}
    assert slow == {0} and {1, 2, 3} <= fast <= {0, 1, 2, 3}
    assert res.history[-1]["test_accuracy"] > res.history[0]["test_accuracy"]


def test_fedraa_refuses_an_infeasible_k_in_one_sentence(tmp_path) -> None:
    from fedclock.config import load_config
    from fedclock.errors import ConfigError
    from fedclock.experiment import run_experiment

    with pytest.raises(ConfigError, match=r"^strategy\.k = 1e-09 s is infeasible: .*\.$"):
        run_experiment(load_config(raw=_fedraa_raw(k=1e-9)), run_dir=tmp_path / "bad")


@pytest.mark.parametrize("scheduler", ["random", "mp-raa"])
def test_random_and_mp_raa_ignore_k(tmp_path, monkeypatch, scheduler: str) -> None:
    """The ablations ignore K: slow devices also get fragments beyond the 10 % one. MP-RAA
    takes the least-updated fragment, so no fragment lags the others by more than the
    tasks in flight (10 clients)."""
    from fedclock.config import load_config
    from fedclock.devices import build_population
    from fedclock.experiment import run_experiment

    seen = _fragments_seen(monkeypatch)
    cfg = load_config(raw=_fedraa_raw(scheduler=scheduler))
    run_experiment(cfg, run_dir=tmp_path / scheduler)
    speed = build_population(cfg.population, 10, cfg.seed).speed
    assert {j for c, j in seen if speed[c] == 1e6} - {0}  # beyond K for a slow device
    counts = np.bincount([j for _, j in seen], minlength=4)
    if scheduler == "mp-raa":
        assert counts.max() - counts.min() <= 10


def test_sync_fedraa_averages_the_fragments_of_every_client_each_round(
    tmp_path, monkeypatch
) -> None:
    """The Sync ablation: every round all 10 clients train a Gre-RAA fragment; the round's
    updates are summed with weights n_i/n (each zero outside its fragment), once each."""
    import torch as _torch

    from fedclock.config import load_config
    from fedclock.experiment import run_experiment
    from fedclock.strategies.aggregators import Update

    calls: list[list[float]] = []
    real = Update.aggregate

    def spy(self, ctx, base, contributions):
        new = real(self, ctx, base, contributions)
        # θ_new − θ = Σ p_i Δ_i with p_i = n_i / Σ n over the round (no double counting)
        n = sum(c.num_samples for c in contributions)
        for name, w in base.params.items():
            want = w + sum(c.num_samples / n * c.delta[name] for c in contributions)
            _torch.testing.assert_close(new.params[name], want, rtol=1e-5, atol=1e-6)
        calls.append([c.weight for c in contributions])
        return new

    monkeypatch.setattr(Update, "aggregate", spy)
    raw = _fedraa_raw(sync=True)
    raw["budget"] = {"aggregations": 5}
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "sync")
    assert res.summary["status"] == "completed"
    assert [len(w) for w in calls] == [10] * 5
    assert all(abs(sum(w) - 1.0) < 1e-12 for w in calls)


def test_cnn_fragments_group_channels_and_their_flattened_features() -> None:
    """conv 1→10 (k3), conv 10→10, fc 10·2·2 → 20 → 10 (8×8 input, valid, two pools):
    fragment 1 of 40/60 % holds channels 0–3 of both convs (conv 2's kernels from every
    input channel), fc1's units 0–7 (from every feature), fc2's columns of those units."""
    m = build_model("cnn", input_shape=(1, 8, 8), num_classes=10, channels=[10, 10],
                    kernel_size=3, fc_hidden=20, padding="same", seed=0)  # fmt: skip
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
    names = list(shapes)
    first = fragment_masks(shapes, (40.0, 60.0))[0]
    conv1, _, conv2, _, fc1, _, fc2, fc2b = names
    assert first[conv1][:4].all() and not first[conv1][4:].any()
    assert first[conv2][:4].all() and int(first[conv2].sum()) == 4 * 10 * 9
    per = shapes[fc1][1] // 10  # features per channel after flattening
    assert first[fc1][:8].all() and int(first[fc1].sum()) == 8 * 10 * per
    assert first[fc2][:, :8].all() and first[fc2b].all()


@pytest.mark.usefixtures("float64")
def test_cnn_fragment_tasks_serial_equal_vectorized() -> None:
    m = build_model("cnn", input_shape=(1, 8, 8), num_classes=10, channels=[10, 10],
                    kernel_size=3, fc_hidden=20, padding="same", seed=0).double()  # fmt: skip
    units = build_units(m, layer_view(m, (1, 8, 8)), "paper")
    sizes = [12, 12, 16, 10]
    data = _data(sizes, (1, 8, 8))
    data = replace(data, x=data.x.double())
    ratios = FRAGMENT_RATIOS[2]
    shapes = [Fragment(1, ratios), Fragment(1, ratios), Fragment(0, ratios), Fragment(0, ratios)]
    tasks = [
        replace(t, plan=replace(t.plan, shape=s))
        for t, s in zip(_tasks(snapshot(m, 0), sizes, 4, steps=2), shapes, strict=True)
    ]
    opts = dict(seed=5, lr=0.1, momentum=0.5, units=units)
    serial = partial_executor(copy.deepcopy(m), data, **opts).run(tasks)
    vec = partial_executor(copy.deepcopy(m), data, vectorize=True, **opts).run(tasks)
    _assert_same(serial, vec)
    layout = Layout.of(m, units, 0)
    for t, c in zip(tasks, serial, strict=True):
        masks = layout.fragment(ratios, t.plan.shape.index)
        assert all(torch.count_nonzero(c.delta[n][~masks[n]]) == 0 for n in masks)


# ------------------------------------------------------------------ reference mode
def test_element_fragments_split_the_later_weights_by_initial_rank() -> None:
    from fedclock.models.shapes import element_masks

    g = torch.Generator().manual_seed(0)
    init = {"w1": torch.randn(6, 4, generator=g), "b1": torch.zeros(6),
            "w2": torch.randn(5, 6, generator=g), "b2": torch.zeros(5)}  # fmt: skip
    masks = element_masks(init, FRAGMENT_RATIOS[4])
    # the first layer and the biases: in every fragment; w2 (30 elements): 3/6/9/12
    assert all(m["w1"].all() and m["b1"].all() and m["b2"].all() for m in masks)
    assert [int(m["w2"].sum()) for m in masks] == [3, 6, 9, 12]
    assert torch.equal(sum(m["w2"].int() for m in masks), torch.ones(5, 6, dtype=torch.int))
    # fragment j holds the positions whose argsort value falls in its range
    order = torch.argsort(init["w2"].reshape(-1), stable=True)
    assert torch.equal(masks[0]["w2"].reshape(-1), order < 3)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_element_fragment_tasks_step_by_hand_and_equal_a_masked_sgd(momentum: float) -> None:
    """The authors' element-wise fragments in the vectorized executor step with the
    hand-written MLP gradient (one block per fragment, even for a lone task) and equal the
    serial executor and an independent SGD on the model zeroed outside the fragment,
    gradients kept inside it."""
    from fedclock.train.factory import make_executor
    from fedclock.train.local import LocalTraining, Needs

    model, units, _ = _mlp([20], torch.float64)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    layout = Layout.of(model, units, 0, initial=initial)
    needs = Needs(shapes=frozenset({Fragment}), layout=layout)
    local = LocalTraining(lr=0.1, momentum=momentum)
    sizes = [16, 16, 12, 20]
    data = _data(sizes, (6,))
    data = replace(data, x=data.x.double())
    ratios = FRAGMENT_RATIOS[3]
    shapes = [Fragment(j, ratios, "elements") for j in (0, 0, 2, 1)]
    tasks = [
        replace(t, plan=replace(t.plan, shape=s))
        for t, s in zip(_tasks(snapshot(model, 0), sizes, 8, steps=3), shapes, strict=True)
    ]

    def executor(kind: str):
        return make_executor(needs, copy.deepcopy(model), data, seed=3, local=local, kind=kind)

    vec = executor("vectorized")
    assert all(vec._by_hand(s) for s in shapes)
    got = vec.run(tasks)
    _assert_same(executor("serial").run(tasks), got)
    for task, c in zip(tasks, got, strict=True):
        masks = layout.fragment(ratios, task.plan.shape.index, "elements")
        want = _masked_sgd(model, data, task, masks, momentum=momentum, zero_outside=True)
        for n in want:
            torch.testing.assert_close(c.delta[n], want[n], atol=EQUIV_TOL, rtol=EQUIV_TOL)


def test_gre_raa_as_the_authors_run_it() -> None:
    from fedclock.strategies.fedraa import gre_raa_reference

    costs, k = [0.1, 0.2, 0.3, 0.4], 0.25
    assert gre_raa_reference(costs, [3, 1, 0, 0], k) == 1  # 3 and 4 do not fit K
    assert gre_raa_reference(costs, [0, 0, 0, 0], k) == 0  # ties: the lowest index
    assert gre_raa_reference([9.0, 9.0], [5, 0], 1.0) == 0  # fragment 1 is never checked


@given(
    n=st.integers(1, 10_000),
    total=st.integers(10_000, 100_000),
    duration=st.floats(0, 1e4, allow_nan=False),
)
def test_share_discount_factors(n: int, total: int, duration: float) -> None:
    """a = (n_i/n)·s, s = 1/(1 + duration/100) (spec §2.2), and each ablation keeps the
    factors it names: share → n_i/n, discount → s, one → 1."""
    from fedclock.strategies.fedraa import ShareDiscount

    share, s = n / total, 1.0 / (1.0 + duration / 100.0)
    want = {"share-discount": share * s, "share": share, "discount": s, "one": 1.0}
    for kind, a in want.items():
        assert ShareDiscount(total, kind).weight(n, duration) == pytest.approx(a, rel=1e-12)
    with pytest.raises(ValueError, match="reference weight"):
        ShareDiscount(total, "half")


@pytest.mark.parametrize("kind", ["share-discount", "share", "one"])
def test_fedraa_reference_mode_weights_by_data_share_and_duration(
    tmp_path, monkeypatch, kind: str
) -> None:
    """θ ← θ + (n_i/n)·Δ/(1 + duration/100), counts at assignment, element fragments; the
    ``reference_weight`` ablations drop the factors they name."""
    from fedclock.config import load_config
    from fedclock.experiment import run_experiment
    from fedclock.strategies.aggregators import Update

    seen: list[tuple[float, float, int, Fragment]] = []
    real = Update.aggregate

    def spy(self, ctx, base, contributions):
        new = real(self, ctx, base, contributions)
        for c in contributions:
            seen.append((c.weight, ctx.now - c.task.t_start, c.num_samples, c.task.plan.shape))
        for n, w in base.params.items():  # θ + a·Δ, a the recorded weight
            want = w + sum(c.weight * c.delta[n] for c in contributions)
            torch.testing.assert_close(new.params[n], want, rtol=1e-6, atol=1e-7)
        return new

    monkeypatch.setattr(Update, "aggregate", spy)
    raw = _fedraa_raw(mode="reference")
    raw["strategy"]["reference_weight"] = kind
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "ref")
    assert res.summary["status"] == "completed" and len(seen) == 60
    import csv

    with (res.run_dir / "clients.csv").open() as fh:  # n_total: every client's data
        n_total = sum(int(row["num_samples"]) for row in csv.DictReader(fh))
    for weight, duration, n, shape in seen:
        assert shape.kind == "elements"
        share = n / n_total if kind != "one" else 1.0
        s = 1 / (1 + duration / 100) if kind == "share-discount" else 1.0
        assert weight == pytest.approx(share * s, rel=1e-12)


def test_fedraa_reference_mode_mix_ablation_is_alg1s_update_on_element_fragments(
    tmp_path, monkeypatch
) -> None:
    """``reference_weight=mix``: each arrival moves the elements its fragment covers to
    (1 − α)θ + α·θ_new (θ_new = its base + Δ), α = 0.4 with a constant staleness, and leaves
    the rest of θ as it was; the fragments stay the authors' element-wise ones."""
    from fedclock.config import load_config
    from fedclock.experiment import run_experiment
    from fedclock.strategies.aggregators import Update

    seen: list[tuple[float, Fragment]] = []
    real = Update.aggregate

    def spy(self, ctx, base, contributions):
        new = real(self, ctx, base, contributions)
        (c,) = contributions  # (a server step per arrival)
        seen.append((c.weight, c.task.plan.shape))
        for n, w in base.params.items():
            cover = c.covers(n)
            mixed = 0.6 * w + 0.4 * (c.task.base.params[n] + c.delta[n])
            want = w if cover is False else mixed if cover is True else torch.where(cover, mixed, w)
            torch.testing.assert_close(new.params[n], want, rtol=1e-6, atol=1e-7)
        return new

    monkeypatch.setattr(Update, "aggregate", spy)
    raw = _fedraa_raw(mode="reference")
    raw["strategy"].update(reference_weight="mix", alpha=0.4)
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "mix")
    assert res.summary["status"] == "completed" and len(seen) == 60
    assert all(w == 0.4 and shape.kind == "elements" for w, shape in seen)
    partial = [shape for _, shape in seen if shape.index > 0]
    assert partial  # (some arrival trained a fragment that is not the whole model's first)


def test_fedraa_with_one_fragment_and_mixing_is_fedasync(tmp_path) -> None:
    """M = 1 (the ablation of docs/reproductions/fed-raa.md: the whole model as the one
    fragment) under reference mode's ``mix``: every task trains the whole model and each
    arrival mixes it in with α = 0.6 and a constant staleness — FedAsync's update, so the
    two runs are the same run, metric for metric (wall time aside)."""
    import csv

    from fedclock.config import load_config
    from fedclock.experiment import run_experiment

    def metrics(raw: dict, name: str) -> list[dict[str, str]]:
        res = run_experiment(load_config(raw=raw), run_dir=tmp_path / name)
        assert res.summary["status"] == "completed"
        with open(tmp_path / name / "metrics.csv") as f:
            return [{k: v for k, v in r.items() if k != "wall_time"} for r in csv.DictReader(f)]

    one = _fedraa_raw(mode="reference", fragments=1, reference_weight="mix")
    fedasync = copy.deepcopy(one)
    fedasync["strategy"] = {"name": "fedasync"}
    a, b = metrics(one, "m1"), metrics(fedasync, "fedasync")
    assert len(a) == 61 and a == b  # (the initial model and 60 server steps)
    four = metrics(_fedraa_raw(mode="reference", reference_weight="mix"), "m4")
    assert four != a  # (fragments do change the run)


# ------------------------------------------------------------------ views, names, devices
@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    data=st.data(),
)
def test_box_view_finds_exactly_the_blocks(shape: list[int], data) -> None:
    """A mask that is one non-empty block gives its slices; anything else gives None."""
    from fedclock.models.shapes import box_view

    lo = [data.draw(st.integers(0, s - 1)) for s in shape]
    hi = [data.draw(st.integers(a + 1, s)) for a, s in zip(lo, shape, strict=True)]
    mask = torch.zeros(shape, dtype=torch.bool)
    block = tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))
    mask[block] = True
    assert box_view(mask) == block
    holes = mask.clone()
    holes.view(-1)[data.draw(st.integers(0, mask.numel() - 1))] ^= True
    view = box_view(holes)
    if view is not None:  # flipping an element kept it a block: the block must be exact
        assert int(holes[view].sum()) == holes[view].numel() == int(holes.sum())
    assert box_view(torch.zeros(shape, dtype=torch.bool)) is None


def test_neuron_fragments_train_their_slices_and_element_fragments_their_masks() -> None:
    """With one hidden layer a neuron group is a block of every tensor and a network of its
    own, so its program trains the narrower network (views); with two, its neurons take
    inputs from every group below (masks, the rest frozen at the base); the authors'
    element-wise fragments are not blocks (masks, the rest zero)."""
    model, _, layout = _mlp([20], torch.float32)
    ratios = FRAGMENT_RATIOS[3]
    prog = Fragment(1, ratios).program(layout)
    b1 = group_bounds(20, ratios)
    names = list(layout.param_shapes)
    assert prog.masks is None and prog.views is not None
    assert prog.views[names[0]] == (slice(b1[1], b1[2]), slice(0, 6))  # every input
    assert prog.views[names[2]] == (slice(0, 10), slice(b1[1], b1[2]))
    assert prog.views[names[3]] == (slice(0, 10),)  # the output bias: every fragment's
    deep = Fragment(1, ratios).program(_mlp([20, 12], torch.float32)[2])
    assert deep.views is None and deep.masks and deep.mask_fill == "base"
    model, _, layout = _mlp([20, 12], torch.float32)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    with_initial = Layout.of(model, layout.units, layout.model_bytes, initial=initial)
    elements = Fragment(1, ratios, "elements").program(with_initial)
    assert elements.views is None and elements.masks


def test_capability_population_is_two_classes() -> None:
    """β of 'extremely low' devices at capabilities[0]·speed, the rest at capabilities[1]·
    speed, assigned as the classes scenario would (same counts, same shuffle)."""
    from fedclock.config import PopulationConfig
    from fedclock.devices import build_population

    cap = PopulationConfig(scenario="capability", beta=0.3, capabilities=(1, 5), speed=2e9)
    classes = PopulationConfig(
        scenario="classes",
        classes=[{"fraction": 0.3, "speed": 2e9}, {"fraction": 0.7, "speed": 1e10}],
    )
    a, b = build_population(cap, 10, 7), build_population(classes, 10, 7)
    assert np.array_equal(a.speed, b.speed) and sorted(a.speed) == [2e9] * 3 + [1e10] * 7
    assert np.array_equal(a.up_bandwidth, b.up_bandwidth)
    assert sorted(build_population(cap.model_copy(update={"beta": 0.0}), 4, 7).speed) == [1e10] * 4


def test_capabilities_must_be_positive() -> None:
    from fedclock.config import load_config
    from fedclock.errors import ConfigError
    from tests.conftest import tiny_raw

    raw = tiny_raw(population={"scenario": "capability", "capabilities": [0, 3]})
    with pytest.raises(ConfigError, match="capabilities must be two positive numbers"):
        load_config(raw=raw)


@pytest.mark.parametrize(
    ("name", "option"),
    [("fed-raa-random", {"scheduler": "random"}), ("fed-raa-mp", {"scheduler": "mp-raa"}),
     ("fed-raa-sync", {"sync": True})],
)  # fmt: skip
def test_named_ablations_are_fed_raa_with_their_option(tmp_path, name, option) -> None:
    """fed-raa-random / -mp / -sync run exactly fed-raa with scheduler random / mp-raa /
    sync true; giving such a variant the option it fixes is refused in one sentence."""
    from fedclock.config import load_config
    from fedclock.errors import ConfigError
    from fedclock.experiment import run_experiment

    def metrics(raw: dict, folder: str) -> list[dict]:
        raw["budget"] = {"aggregations": 6}
        res = run_experiment(load_config(raw=raw), run_dir=tmp_path / folder)
        return [{k: v for k, v in r.items() if "wall" not in k} for r in res.history]

    named = _fedraa_raw()
    named["strategy"] = {"name": name, "fragments": 4}
    assert metrics(named, "named") == metrics(_fedraa_raw(**option), "option")
    (field,) = option
    bad = _fedraa_raw()
    bad["strategy"] = {"name": name, field: option[field]}
    with pytest.raises(ConfigError, match=rf"^Config field 'strategy\.{field}' is read by .*\.$"):
        load_config(raw=bad)


def test_cifar10_preset_runs_on_cifar_files(tmp_path) -> None:
    """fedraa-table2-cifar10 runs from the CLI once CIFAR-10 files are given (a small fake
    set here; the model narrowed so the test is fast)."""
    from typer.testing import CliRunner

    from fedclock.cli import app
    from tests.test_text_cifar import write_fake_cifar10

    write_fake_cifar10(tmp_path / "data", per_batch=20)
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["run", "--preset", "fedraa-table2-cifar10", "--data-dir", str(tmp_path / "data"),
         "--set", "model.hidden=[40]", "--set", "budget.virtual_time=2",
         "--set", "eval.every_virtual_seconds=1", "--out", str(out), "-q"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["aggregations"] > 0


# ------------------------------------------------------------------ the planner's contract
_PLANNER_CASES = [
    {"name": "fed-raa"},
    {"name": "fed-raa", "count": "completed"},
    {"name": "fed-raa", "mode": "reference"},
    {"name": "fed-raa", "mode": "reference", "count": "completed"},
    {"name": "fed-raa-random"},
    {"name": "fed-raa-mp"},
    {"name": "fed-raa-mp", "count": "completed"},
    {"name": "fed-raa-sync"},
    {"name": "fed-raa-sync", "count": "completed"},
]


@pytest.mark.parametrize("strategy", _PLANNER_CASES, ids=lambda s: "-".join(map(str, s.values())))
def test_fragment_planner_state_changes_only_on_dispatch_and_commit(
    tmp_path, monkeypatch, strategy: dict
) -> None:
    """No phantom assignments: at the first dispatch every q(j) is 0 and every client's
    fragment stream is at index 0; each client's i-th task draws from ("fragment", n, i);
    q(j) ends as the number of fragment-j tasks dispatched (count: assigned) or of
    fragment-j updates used by server steps (count: completed)."""
    from fedclock.config import load_config
    from fedclock.experiment import run_experiment
    from fedclock.sim.simulator import Context
    from fedclock.strategies.fedraa import FragmentPlanner

    dispatched: list[tuple[int, int, list[int], int]] = []  # client, j, q before, i before
    committed: list[int] = []
    real_dispatch, real_commit = FragmentPlanner.on_dispatch, FragmentPlanner.on_commit
    planners: list[FragmentPlanner] = []

    def on_dispatch(self, task):
        planners.append(self)
        c = task.client
        dispatched.append((c, task.plan.shape.index, list(self.updates), self._asked[c]))
        real_dispatch(self, task)

    def on_commit(self, contributions):
        committed.extend(c.task.plan.shape.index for c in contributions)
        real_commit(self, contributions)

    draws: list[tuple[int, int]] = []
    real_rng = Context.rng

    def rng(self, purpose, *ids):
        if purpose == "fragment":
            draws.append(ids)
        return real_rng(self, purpose, *ids)

    monkeypatch.setattr(FragmentPlanner, "on_dispatch", on_dispatch)
    monkeypatch.setattr(FragmentPlanner, "on_commit", on_commit)
    monkeypatch.setattr(Context, "rng", rng)
    raw = _fedraa_raw(**strategy)
    raw["budget"] = {"aggregations": 4 if strategy["name"] == "fed-raa-sync" else 30}
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "r")
    assert res.summary["status"] == "completed"
    assert dispatched[0][2] == [0, 0, 0, 0]
    first: dict[int, int] = {}
    for c, _, _, i in dispatched:
        first.setdefault(c, i)
    assert set(first) == set(range(10)) and set(first.values()) == {0}
    # the i-th dispatched task of a client has i tasks before it
    seen: dict[int, int] = {}
    for c, _, _, i in dispatched:
        assert i == seen.get(c, 0)
        seen[c] = i + 1
    # stream indices: only those of tasks really dispatched (a stream may be asked again
    # for the same task; never for an index ahead of the client's dispatched tasks)
    assert all(i <= seen.get(c, 0) for c, i in draws)
    if strategy["name"] in ("fed-raa-random", "fed-raa") and strategy.get("mode") != "reference":
        assert {(c, i) for c, _, _, i in dispatched} <= set(draws)
    q = planners[-1].updates
    count = strategy.get("count", "assigned")
    if strategy["name"] == "fed-raa-random":
        count = "assigned"  # (its counts are kept, never read)
    events = [j for _, j, _, _ in dispatched] if count == "assigned" else committed
    assert q == np.bincount(events, minlength=4).tolist()


def test_fragment_planner_plan_has_no_side_effects() -> None:
    """plan() and nominal() may be asked any number of times: the same answer, no state."""
    from fedclock.models.shapes import FULL
    from fedclock.sim.types import TaskPlan
    from fedclock.strategies.fedraa import FragmentPlanner

    class Ctx:
        def rng(self, purpose, *ids):
            return np.random.default_rng(abs(hash((purpose, *ids))) % 2**32)

    m = build_model("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=[20], seed=0)
    units = build_units(m, layer_view(m, (1, 4, 4)), "paper")
    layout = Layout.of(m, units, 100)
    plan = TaskPlan(local_steps=2, batch_size=4, samples=8)
    costs = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]])
    p = FragmentPlanner(full_plans=[plan, plan], layout=layout, ratios=(10, 20, 30, 40),
                        costs=costs, k=10.0, scheduler="gre-raa")  # fmt: skip
    ctx = Ctx()
    got = [p.plan(ctx, 1)[0].shape.index for _ in range(5)]  # type: ignore[arg-type]
    assert len(set(got)) == 1 and p.updates == [0, 0, 0, 0] and p._asked == [0, 0]
    assert p.nominal(0)[0].shape is FULL


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_one_task_of_every_fragment_moves_every_weight_of_the_split_layers(arch: str) -> None:
    """No weight is left at its initial value by the fragment rule: after one task of each
    fragment (paper mode, from one base), every element of every weight tensor has moved."""
    if arch == "mlp":
        m = build_model("mlp", input_shape=(6,), num_classes=10, hidden=[20, 12], seed=0)
        shape: tuple[int, ...] = (6,)
    else:
        m = build_model("cnn", input_shape=(1, 8, 8), num_classes=10, channels=[10, 10],
                        kernel_size=3, fc_hidden=20, padding="same", seed=0)  # fmt: skip
        shape = (1, 8, 8)
    m = m.double()  # (a float32 step smaller than half an ulp would not move a weight)
    with torch.no_grad():  # positive weights and inputs: every ReLU active, so no weight's
        for p in m.parameters():  # gradient is zero because its unit happens to be silent
            p.abs_()
    units = build_units(m, layer_view(m, shape), "paper")
    ratios = FRAGMENT_RATIOS[4]
    sizes = [128] * 4  # batches of 128: no hidden unit is silent on all of them
    data = _data(sizes, shape)
    data = replace(data, x=data.x.double().abs())
    tasks = [
        replace(t, plan=replace(t.plan, shape=Fragment(j, ratios)))
        for j, t in enumerate(_tasks(snapshot(m, 0), sizes, 128, steps=2))
    ]
    for vectorize in (False, True):
        got = partial_executor(copy.deepcopy(m), data, seed=1, lr=0.1, units=units,
                               vectorize=vectorize).run(tasks)  # fmt: skip
        for n, p in m.named_parameters():
            moved = sum((c.delta[n] != 0).int() for c in got)
            if p.dim() >= 2:
                assert bool((moved >= 1).all()), (arch, n, vectorize)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["strategy.name=fed-raa-random", "strategy.scheduler=mp-raa"],
         "fed-raa-random fixes it to 'random'"),
        (["strategy.mode=reference", "strategy.alpha=0.5"], "reference mode has no mixing"),
        (["strategy.mode=reference", "strategy.rho=0.1"], "reference mode has no mixing"),
        (["strategy.mode=reference", "strategy.reference_weight=mix", "strategy.rho=0.1"],
         "reference mode has no proximal term"),
        (["strategy.reference_weight=one"], "paper mode mixes with α"),
        (["strategy.name=fed-raa-sync", "strategy.mode=reference", "strategy.reference_weight=one"],
         "synchronous rounds"),
        (["strategy.name=fed-raa-mp", "strategy.k=3"], "ignores the delay bound K"),
        (["strategy.name=fed-raa-random", "strategy.count=completed"], "reads no update counts"),
        (["strategy.name=fed-raa-sync", "strategy.concurrency=3"], "synchronous rounds"),
        (["strategy.name=fedavg", "strategy.alpha=0.5"], "read by"),
    ],
)  # fmt: skip
def test_conflicting_explicit_fields_are_refused_in_one_sentence(overrides, says) -> None:
    from fedclock.config import load_config
    from fedclock.errors import ConfigError

    raw = _fedraa_raw()
    raw["compare"] = {"strategies": ["fed-raa", "fed-raa-random", "fedasync"]}
    with pytest.raises(ConfigError) as err:
        load_config(raw=raw, overrides=overrides)
    msg = str(err.value)
    assert says in msg and msg.count(". ") == 0 and msg.endswith("; remove it.")
    # the same fields in a comparison's base config are carried for the cells
    load_config(raw=raw, overrides=overrides, grid=True)


@pytest.mark.usefixtures("float64")
def test_fedraa_updater_end_to_end_against_a_hand_computation(tmp_path, monkeypatch) -> None:
    """Every server step of a paper-mode run equals, element by element, the updater of
    Alg. 1 computed here independently: θ ← (1 − α_t)·θ + α_t·θ_new where the arriving
    fragment covers the element (θ_new = the client's base + its Δ), θ elsewhere, with
    α_t = α·(1 + staleness)^(−a) (polynomial staleness, a = 0.5)."""
    from fedclock.config import load_config
    from fedclock.experiment import run_experiment
    from fedclock.strategies.aggregators import Update

    steps: list[tuple[dict, dict, list]] = []  # (θ before, θ after, contributions)
    real = Update.aggregate

    def spy(self, ctx, base, contributions):
        new = real(self, ctx, base, contributions)
        steps.append((base, new, list(contributions)))
        return new

    monkeypatch.setattr(Update, "aggregate", spy)
    raw = _fedraa_raw(alpha=0.7, staleness="polynomial", staleness_a=0.5)
    raw["budget"] = {"aggregations": 25}
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "r")
    assert res.summary["status"] == "completed" and len(steps) == 25
    stale = []
    for base, new, contributions in steps:
        (c,) = contributions  # a server step per arrival
        x = base.version - c.task.base.version
        stale.append(x)
        a = 0.7 * (1.0 + x) ** -0.5
        for n, theta in base.params.items():
            arrived = c.task.base.params[n] + c.delta[n]
            cover = c.covers(n)
            want = (1 - a) * theta + a * arrived
            if cover is not True:
                want = torch.where(cover, want, theta) if cover is not False else theta
            torch.testing.assert_close(new.params[n], want, rtol=1e-12, atol=1e-12)
    assert max(stale) >= 1  # the staleness factor was exercised


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize(
    ("momentum", "rho", "weight_decay"), [(0.0, 0.0, 0.0), (0.5, 0.3, 0.0), (0.9, 0.1, 1e-3)]
)
def test_flat_buffer_steps_equal_the_per_tensor_steps_bit_for_bit(
    momentum: float, rho: float, weight_decay: float, persistent: bool, monkeypatch
) -> None:
    """A small hand-stepped block keeps its parameters, gradients, momentum and proximal
    pull in flat buffers (VectorizedExecutor._train_steps_flat): the same operations in the
    same order as the per-tensor loop, so the same float32 contributions and kept momentum,
    bit for bit — fragments on a shared base and on stale bases, full tasks with a short
    last batch (weighted rows)."""
    from fedclock.train import vectorized
    from tests.test_vectorized import _bump

    model, units, _ = _mlp([20])
    sizes = [16, 12, 12, 20]
    data = _data(sizes, (6,))
    ratios = FRAGMENT_RATIOS[4]
    v0 = snapshot(model, 0)
    v1 = _bump(v0, 1, seed=5)
    frags = [Fragment(j, ratios) for j in (3, 0, 3, 0)]
    rounds = [
        [replace(t, plan=replace(t.plan, shape=s))
         for t, s in zip(_tasks(v0, sizes, 8, steps=3), frags, strict=True)],
        [replace(t, base=v1 if t.client % 2 else v0, plan=replace(t.plan, shape=s))
         for t, s in zip(_tasks(v0, sizes, 8, steps=3, first_id=4), frags, strict=True)],
        _tasks(v1, [12, 12, 12, 12], 8, epochs=1.0, first_id=8),  # 2 steps, the 2nd of 4 rows
    ]  # fmt: skip
    opts = dict(seed=3, lr=0.1, momentum=momentum, proximal_mu=rho,
                weight_decay=weight_decay, units=units, persistent_momentum=persistent)  # fmt: skip
    flat = partial_executor(copy.deepcopy(model), data, vectorize=True, **opts)
    per_tensor = partial_executor(copy.deepcopy(model), data, vectorize=True, **opts)
    calls: list[str] = []
    for name in ("_train_steps", "_train_steps_flat"):
        orig = getattr(vectorized.VectorizedExecutor, name)

        def counted(self, *a, _orig=orig, _name=name, **k):  # type: ignore[no-untyped-def]
            calls.append(_name)
            return _orig(self, *a, **k)

        monkeypatch.setattr(vectorized.VectorizedExecutor, name, counted)
    for tasks in rounds:
        calls.clear()
        want = per_tensor_run(per_tensor, tasks, monkeypatch)
        assert set(calls) == {"_train_steps"}
        calls.clear()
        got = flat.run(tasks)
        assert set(calls) == {"_train_steps_flat"}
        _assert_same(want, got, atol=0)
    if persistent and momentum:
        a, b = flat._momentum_store, per_tensor._momentum_store
        assert a is not None and b is not None and a.keys() == b.keys()
        for c in a:
            for n in a[c]:
                assert torch.equal(a[c][n], b[c][n])


def per_tensor_run(executor, tasks, monkeypatch):  # type: ignore[no-untyped-def]
    """``executor.run(tasks)`` with the flat-buffer steps turned off."""
    from fedclock.train import vectorized

    with monkeypatch.context() as m:
        m.setattr(vectorized, "FLAT_ELEMENTS", 0)
        return executor.run(tasks)
