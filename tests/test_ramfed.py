"""RAM-Fed (docs/methods/ram-fed.md): neuron submodels sized to each device's speed (eq. 1–2),
the memory average (eq. 3–4) and RA-Fed's coverage average (eq. 5)."""

from __future__ import annotations

import copy
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from fedclock.config import ConfigError, load_config
from fedclock.devices.cost import TaskTiming
from fedclock.devices.population import Population
from fedclock.experiment import run_experiment
from fedclock.models import build_model, layer_view, param_bytes
from fedclock.models.shapes import (
    FULL,
    Layout,
    Neurons,
    Width,
    build_units,
    neuron_masks,
    prefix_mask,
)
from fedclock.rng import stream
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan
from fedclock.strategies.aggregators import Update
from fedclock.strategies.base import BuildInfo
from fedclock.strategies.ramfed import (
    ClientShare,
    MemoryAverage,
    SubmodelWork,
    build_ramfed,
    coverage_average,
    submodel_counts,
)
from fedclock.train.executor import batch_schedule, snapshot
from tests.conftest import EQUIV_TOL, partial_executor, tiny_raw
from tests.test_vectorized import _assert_same, _data, _tasks


# ------------------------------------------------------------------ the submodel's elements
def test_neuron_masks_hand_computed() -> None:
    """5 inputs → 4 hidden → 3 hidden → 2 outputs, keeping hidden units (1, 3) and (0, 2):
    a weight is kept when its destination and its source unit are."""
    shapes = {"w1": (4, 5), "b1": (4,), "w2": (3, 4), "b2": (3,), "w3": (2, 3), "b3": (2,)}
    m = neuron_masks(shapes, ((1, 3), (0, 2)))
    want_w1 = torch.zeros(4, 5, dtype=torch.bool)
    want_w1[[1, 3], :] = True  # every input of the kept units
    want_w2 = torch.zeros(3, 4, dtype=torch.bool)
    for i in (0, 2):
        for j in (1, 3):
            want_w2[i, j] = True
    want_w3 = torch.zeros(2, 3, dtype=torch.bool)
    want_w3[:, [0, 2]] = True  # every output, from the kept units
    assert torch.equal(m["w1"], want_w1) and torch.equal(m["w2"], want_w2)
    assert torch.equal(m["w3"], want_w3)
    assert m["b1"].tolist() == [False, True, False, True]
    assert m["b2"].tolist() == [True, False, True]
    assert m["b3"].tolist() == [True, True]
    assert sum(int(x.sum()) for x in m.values()) == 10 + 2 + 4 + 2 + 4 + 2


def test_neuron_masks_after_a_convolution_take_the_channels_features() -> None:
    """A linear layer after a convolution of 4 channels of 2×2 features (flattened channel
    by channel) keeps the features of the kept channels 1 and 3: columns 4–7 and 12–15."""
    shapes = {"c": (4, 1, 3, 3), "cb": (4,), "f": (5, 16), "fb": (5,), "o": (3, 5), "ob": (3,)}
    m = neuron_masks(shapes, ((1, 3), (0,)))
    assert m["c"][[1, 3]].all() and int(m["c"].sum()) == 2 * 9
    cols = m["f"][0].nonzero().flatten().tolist()
    assert cols == [4, 5, 6, 7, 12, 13, 14, 15] and int(m["f"].sum()) == 8
    assert torch.equal(m["o"][:, 0], torch.ones(3, dtype=torch.bool)) and int(m["o"].sum()) == 3


@pytest.mark.parametrize("rate", [0.25, 0.5, 0.75])
def test_a_prefix_of_units_is_heterofls_width_submodel(rate: float) -> None:
    _model, _, layout = _mlp([8, 4])
    keep = layout.width_keep(rate)
    counts = [keep[n][0] for n, s in layout.param_shapes.items() if len(s) >= 2][:-1]
    m = neuron_masks(layout.param_shapes, tuple(tuple(range(k)) for k in counts))
    for n, s in layout.param_shapes.items():
        assert torch.equal(m[n], prefix_mask(s, keep[n]))
        assert torch.equal(_as_mask(Width(rate).coverage(layout, n, m[n]), s), m[n])


def _as_mask(c: torch.Tensor | bool, shape: tuple[int, ...]) -> torch.Tensor:
    return c if isinstance(c, torch.Tensor) else torch.full(shape, bool(c))


def _mlp(hidden: list[int], dtype: torch.dtype = torch.float32, inputs: int = 6):
    m = build_model("mlp", input_shape=(inputs,), num_classes=10, hidden=hidden, seed=0)
    m = m.to(dtype)
    units = build_units(m, layer_view(m, (inputs,)), "paper")
    return m, units, Layout.of(m, units, param_bytes(m))


def test_a_submodel_costs_its_share_of_the_weights() -> None:
    """One hidden layer of 20 units, 6 of them kept: both weight layers shrink to 6/20, so
    the task's FLOPs are 6/20 of the full task's; it moves its 6·6 + 6 + 10·6 + 10 elements."""
    _, _, layout = _mlp([20])
    shape = Neurons(((0, 3, 4, 9, 11, 19),))
    cost, full = shape.cost(layout, 32), FULL.cost(layout, 32)
    assert cost.flops == pytest.approx(6 / 20 * full.flops, rel=1e-12)
    assert cost.bytes_up == cost.bytes_down == 4 * (6 * 6 + 6 + 10 * 6 + 10)
    assert Neurons(((0, 1, 2, 3, 4, 5),)).cost(layout, 32) == cost  # which units: no matter


def test_bad_unit_lists_are_refused() -> None:
    for keep in (((),), ((2, 1),), ((1, 1),), ((-1, 2),)):
        with pytest.raises(ValueError, match="non-empty, increasing list of units"):
            Neurons(keep)  # type: ignore[arg-type]


# ------------------------------------------------------------------ eq. 1: sizes per capability
def _info(model, population: Population, sizes: list[int]) -> BuildInfo:
    layers = layer_view(model, (6,))
    return BuildInfo(
        client_sizes=np.asarray(sizes), layer_fwd_flops=tuple(x.fwd_flops for x in layers),
        layer_bwd_flops=tuple(x.bwd_flops for x in layers), model_bytes=param_bytes(model),
        model=model, layers=tuple(layers), population=population,
    )  # fmt: skip


def _population(speeds: list[float]) -> Population:
    n = len(speeds)
    return Population(speed=np.array(speeds), up_bandwidth=np.full(n, np.inf),
                      down_bandwidth=np.full(n, np.inf))  # fmt: skip


def _strategy_cfg(**strategy: object):
    return load_config(raw=tiny_raw(strategy={"name": "ram-fed", **strategy}))


def test_submodels_follow_the_devices_capability() -> None:
    """Capabilities 1, 3, 3, 1.5, 0.05 (× speed): shares σ = 1/3, 1, 1, 1/2, 1/60 of the
    fastest. One hidden layer of 10 units: a submodel of k units costs k/10 of the full
    model, so k = ⌊10σ⌋ — 3, 10, 10, 5 — and at least one unit (the slowest)."""
    model, _, _ = _mlp([10])
    speeds = [1.0, 3.0, 3.0, 1.5, 0.05]
    strategy = build_ramfed(_strategy_cfg(), _info(model, _population(speeds), [8] * 5))
    work = strategy.planner
    assert isinstance(work, SubmodelWork)
    assert work.counts == [(3,), (10,), (10,), (5,), (1,)]
    assert [work.is_full(c) for c in range(5)] == [False, True, True, False, False]


def test_two_hidden_layers_sized_by_their_flops() -> None:
    """Hidden layers of 8 and 4 units and share ½: rate q/8 keeps ⌈q⌉ and ⌈q/2⌉ units; the
    largest q whose FLOPs (each layer's forward + backward times its kept weight share,
    computed here from the layer view) stay within half the full model's."""
    _model, units, layout = _mlp([8, 4], torch.float64)
    fb = [f + b for f, b in zip(units.unit_fwd, (units.bwd_first[0], *units.bwd_flops[1:]),
                                strict=True)]  # fmt: skip
    dims_in, dims_out = [6, 8, 4], [8, 4, 10]

    def flops(k1: int, k2: int) -> float:
        kept_in, kept_out = [6, k1, k2], [k1, k2, 10]
        return sum(
            f * (ko * ki) / (do * di)
            for f, ko, ki, do, di in zip(fb, kept_out, kept_in, dims_out, dims_in, strict=True)
        )

    full = flops(8, 4)
    fits = [q for q in range(1, 9) if flops(q, -(-q // 2)) <= 0.5 * full]
    q = max(fits)
    assert submodel_counts(layout, [0.5, 1.0]) == [(q, -(-q // 2)), (8, 4)]


# ------------------------------------------------------------------ eq. 2: which units
def _ctx(seed: int = 5) -> SimpleNamespace:
    return SimpleNamespace(rng=lambda purpose, *ids: stream(seed, purpose, *ids))


def _work(extraction: str, counts: list[tuple[int, ...]]) -> SubmodelWork:
    _, _, layout = _mlp([10, 6])
    plans = [TaskPlan(2, 4, 8)] * len(counts)
    return SubmodelWork(full_plans=plans, layout=layout, counts=counts, extraction=extraction)


def test_random_submodels_are_fresh_draws_of_the_given_sizes() -> None:
    work = _work("random", [(3, 2), (10, 6), (5, 3)])
    ctx = _ctx()
    assert work.shape(ctx, 0, 1) is FULL  # every unit kept: the full model
    draws = [work.keep(ctx, r, 0) for r in range(6)]
    for keep in draws:
        assert [len(k) for k in keep] == [3, 2]
        assert all(list(k) == sorted(set(k)) and k[0] >= 0 and k[-1] < c
                   for k, c in zip(keep, (10, 6), strict=True))  # fmt: skip
    assert len(set(draws)) > 1  # a fresh draw each round
    assert work.keep(ctx, 3, 0) == draws[3]  # keyed by (round, client)
    assert work.keep(ctx, 3, 2) != work.keep(ctx, 3, 0)[:2]  # and by client
    assert isinstance(work.shape(ctx, 0, 0), Neurons)


def test_static_submodels_keep_the_first_units() -> None:
    work = _work("static", [(3, 2), (10, 6)])
    assert work.keep(_ctx(), 0, 0) == work.keep(_ctx(), 7, 0) == ((0, 1, 2), (0, 1))


def test_random_submodels_cover_every_parameter_over_rounds() -> None:
    """A client keeping 3 of 10 and 2 of 6 units trains each element with probability
    ≥ 0.3·(1/3) a round: over 40 rounds its submodels cover the whole model (every round
    the fastest clients cover it anyway: they train the full model)."""
    work = _work("random", [(3, 2)])
    layout, ctx = work.layout, _ctx()
    seen = {n: torch.zeros(s, dtype=torch.bool) for n, s in layout.param_shapes.items()}
    for r in range(40):
        shape = work.shape(ctx, r, 0)
        for n, s in layout.param_shapes.items():
            seen[n] |= _as_mask(shape.coverage(layout, n, seen[n]), s)
    assert all(bool(m.all()) for m in seen.values())


# ------------------------------------------------------------------ the task trains the submodel
@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_a_submodel_task_trains_the_narrower_network(momentum: float) -> None:
    """Serial and vectorized executors equal torch SGD on the narrower network built from
    the kept units' rows and columns (6 → 20 → 12 → 10 kept as 6 → 7 → 4 → 10)."""
    model, units, layout = _mlp([20, 12], torch.float64)
    keep = ((0, 2, 5, 6, 11, 17, 19), (1, 4, 8, 10))
    sizes = [16, 12, 20]
    data = _data(sizes, (6,))
    data = replace(data, x=data.x.double())
    shapes = [Neurons(keep), Neurons(keep), FULL]
    tasks = [
        replace(t, plan=replace(t.plan, shape=s))
        for t, s in zip(_tasks(snapshot(model, 0), sizes, 8, steps=3), shapes, strict=True)
    ]
    opts = dict(seed=3, lr=0.1, momentum=momentum, units=units)
    serial = partial_executor(copy.deepcopy(model), data, **opts).run(tasks)
    vec = partial_executor(copy.deepcopy(model), data, vectorize=True, **opts).run(tasks)
    _assert_same(serial, vec)
    masks = neuron_masks(layout.param_shapes, keep)
    for task, c in zip(tasks[:2], serial[:2], strict=True):
        want = _narrow_sgd(model, data, task, keep, momentum)
        for n in want:
            torch.testing.assert_close(c.delta[n], want[n], atol=EQUIV_TOL, rtol=EQUIV_TOL)
            assert torch.equal(_as_mask(c.covers(n), layout.param_shapes[n]), masks[n])


def _narrow_sgd(model, data, task, keep, momentum: float) -> dict[str, torch.Tensor]:
    """The submodel as its own network: each Linear sliced to the kept rows and columns,
    trained by torch SGD on the task's batches; its Δ scattered back (0 elsewhere)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    rows = [*(list(k) for k in keep), list(range(linears[-1].out_features))]
    cols = [list(range(linears[0].in_features)), *rows[:-1]]
    narrow = []
    for lin, r, c in zip(linears, rows, cols, strict=True):
        sub = nn.Linear(len(c), len(r)).double()
        with torch.no_grad():
            sub.weight.copy_(lin.weight[r][:, c])
            sub.bias.copy_(lin.bias[r])
        narrow.append(sub)
    net = nn.Sequential(nn.Flatten(), narrow[0], nn.ReLU(), narrow[1], nn.ReLU(), narrow[2])
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=momentum)
    idx = data.indices[task.client]
    for local in batch_schedule(3, task, len(idx)):
        opt.zero_grad()
        nn.functional.cross_entropy(net(data.x[idx[local]]), data.y[idx[local]]).backward()
        opt.step()
    names = [n for n, _ in model.named_parameters()]
    out: dict[str, torch.Tensor] = {}
    for i, (sub, lin, r, c) in enumerate(zip(narrow, linears, rows, cols, strict=True)):
        dw = torch.zeros_like(lin.weight)
        dw[torch.tensor(r)[:, None], torch.tensor(c)[None, :]] = (
            sub.weight.detach() - lin.weight[r][:, c]
        )
        db = torch.zeros_like(lin.bias)
        db[r] = sub.bias.detach() - lin.bias[r]
        out[names[2 * i]], out[names[2 * i + 1]] = dw, db
    return out


# ------------------------------------------------------------------ eq. 3–5: the update
def _contribution(client: int, base: ModelVersion, delta: list[float], cover) -> Contribution:
    task = Task(0, client, 0, base, None, None, TaskTiming(0, 0, 0), 0.0)  # type: ignore[arg-type]
    d = torch.tensor(delta, dtype=torch.float64)
    c = {"w": cover if isinstance(cover, bool) else torch.tensor(cover)}
    return Contribution(task, {"w": d}, {}, 1, 0.0, coverage=c)


def test_memory_average_hand_computed() -> None:
    """Three clients, p = (0.5, 0.3, 0.2), a model of 3 elements; round 1: client 0 full
    (Δ = 1, 2, 3), client 1 elements 0–1 (Δ = 10, 20), client 2 element 2 (Δ = 100);
    round 2: client 1 element 2 only (Δ = −5), client 2 elements 0 and 2 (Δ = 4, 6)."""
    p = np.array([0.5, 0.3, 0.2])
    update = Update(ClientShare(p), normaliser=MemoryAverage(p))
    theta = ModelVersion(0, {"w": torch.zeros(3, dtype=torch.float64)})
    r1 = [
        _contribution(0, theta, [1.0, 2.0, 3.0], True),
        _contribution(1, theta, [10.0, 20.0, 0.0], [True, True, False]),
        _contribution(2, theta, [0.0, 0.0, 100.0], [False, False, True]),
    ]
    theta = update.aggregate(None, theta, r1)  # type: ignore[arg-type]
    # G_0 = (1, 2, 3), G_1 = (10, 20, 0), G_2 = (0, 0, 100)
    want1 = [0.5 * 1 + 0.3 * 10, 0.5 * 2 + 0.3 * 20, 0.5 * 3 + 0.2 * 100]
    assert theta.params["w"].tolist() == pytest.approx(want1, rel=1e-15)
    assert [c.weight for c in r1] == [0.5, 0.3, 0.2]
    r2 = [
        _contribution(1, theta, [0.0, 0.0, -5.0], [False, False, True]),
        _contribution(2, theta, [4.0, 0.0, 6.0], [True, False, True]),
    ]
    theta2 = update.aggregate(None, theta, r2)  # type: ignore[arg-type]
    # G_0 = (1, 2, 3) kept; G_1 = (10, 20, −5); G_2 = (4, 0, 6)
    step2 = [0.5 * 1 + 0.3 * 10 + 0.2 * 4, 0.5 * 2 + 0.3 * 20, 0.5 * 3 - 0.3 * 5 + 0.2 * 6]
    want2 = [a + b for a, b in zip(want1, step2, strict=True)]
    assert theta2.params["w"].tolist() == pytest.approx(want2, rel=1e-15)


def test_coverage_average_hand_computed() -> None:
    """RA-Fed: element j moves by Σ_{i ∋ j} ω_i Δ_ij / Σ_{i ∋ j} ω_i; uncovered: 0."""
    p = np.array([0.5, 0.3, 0.2])
    update = Update(ClientShare(p), normaliser=coverage_average)
    theta = ModelVersion(0, {"w": torch.ones(4, dtype=torch.float64)})
    cs = [
        _contribution(0, theta, [1.0, 2.0, 0.0, 0.0], [True, True, False, False]),
        _contribution(1, theta, [10.0, 0.0, 30.0, 0.0], [True, False, True, False]),
        _contribution(2, theta, [0.0, 0.0, 100.0, 0.0], [False, False, True, False]),
    ]
    got = update.aggregate(None, theta, cs).params["w"].tolist()  # type: ignore[arg-type]
    want = [
        1 + (0.5 * 1 + 0.3 * 10) / 0.8,
        1 + 2.0,
        1 + (0.3 * 30 + 0.2 * 100) / 0.5,
        1.0,  # nobody trained it
    ]
    assert got == pytest.approx(want, rel=1e-15)


def test_memory_average_of_full_updates_is_fedavg() -> None:
    p = np.array([0.25, 0.75])
    theta = ModelVersion(0, {"w": torch.tensor([1.0, -1.0], dtype=torch.float64)})
    cs = [_contribution(0, theta, [2.0, 4.0], True), _contribution(1, theta, [-2.0, 8.0], True)]
    got = Update(ClientShare(p), normaliser=MemoryAverage(p)).aggregate(None, theta, cs)  # type: ignore[arg-type]
    assert got.params["w"].tolist() == pytest.approx([1.0 - 1.0, -1.0 + 7.0], rel=1e-15)


# ------------------------------------------------------------------ end to end
def _run(tmp_path, name: str, **sections):
    raw = tiny_raw(executor={"threads": 1}, budget={"aggregations": 4}, strategy={"name": name},
                   **sections)  # fmt: skip
    return run_experiment(load_config(raw=raw), run_dir=tmp_path / name).history


def test_equal_devices_train_full_models_as_fedavg(tmp_path) -> None:
    """Every device equally fast: every submodel is the full model and the memory average
    is Σ p_i Δ_i, so the run is FedAvg's (to float rounding)."""
    pop = {"scenario": "homogeneous", "speed": 1e6}
    runs = [_run(tmp_path / n, n, population=pop) for n in ("fedavg", "ram-fed")]
    for a, b in zip(*runs, strict=True):
        assert a["virtual_time"] == pytest.approx(b["virtual_time"], rel=1e-12)
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-5)


def test_ram_fed_learns_and_rounds_are_as_long_as_the_fastest_device(tmp_path) -> None:
    """The tiny population: speeds 2e6 and 5e5 FLOP/s (share ¼). The slow clients' submodels
    cost a quarter of the full task, so no round waits for a full task on a slow device."""
    fed = _run(tmp_path / "a", "fedavg")
    ram = _run(tmp_path / "b", "ram-fed")
    assert ram[-1]["test_loss"] < ram[0]["test_loss"]
    assert ram[-1]["virtual_time"] < fed[-1]["virtual_time"]


def test_models_it_cannot_split_are_refused(tmp_path) -> None:
    from fedclock.strategies.ramfed import refusal

    assert refusal(nn.Sequential(nn.Flatten(), nn.Linear(4, 3))) is not None
    lstm = nn.Sequential(nn.Embedding(5, 4), nn.LSTM(4, 4), nn.Linear(4, 3))
    assert "Linear and Conv2d layers only" in str(refusal(lstm))
    bn = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    assert "without BatchNorm buffers" in str(refusal(bn))
    assert refusal(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3))) is None
    ee = build_model("ee_cnn", input_shape=(1, 8, 8), num_classes=3, seed=0, channels=[2, 2, 4])
    assert "single-exit models only" in str(refusal(ee))
    raw = tiny_raw(strategy={"name": "ram-fed"}, model={"arch": "logreg"})
    with pytest.raises(ConfigError, match=r"^Strategy 'ram-fed' needs a model with a hidden layer"):
        run_experiment(load_config(raw=raw), run_dir=tmp_path / "r")


def test_unknown_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="extraction"):
        load_config(raw=tiny_raw(strategy={"name": "ram-fed", "extraction": "sliding"}))
    with pytest.raises(ConfigError, match="ram-fed"):
        load_config(raw=tiny_raw(strategy={"name": "ram-fed", "fragments": 3}))
