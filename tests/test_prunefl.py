"""PruneFL: the Mask work shape (density, cost, execution), the reconfiguration rule, the
time model it reads, the initial pruning and the strategy's update."""

from __future__ import annotations

import copy
import itertools
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedclock.devices.population import Population
from fedclock.errors import ConfigError
from fedclock.models import build_model, layer_view, param_bytes
from fedclock.models.shapes import FULL, Layout, Mask, build_units
from fedclock.strategies.aggregators import Update
from fedclock.strategies.prunefl import (
    MaskPlanner,
    PruneFLState,
    PruneFLUpdate,
    adapt,
    element_times,
    initial_pruning,
    reconfigure,
    release,
)
from fedclock.strategies.server import ServerOptimizer
from fedclock.train.executor import batch_schedule, snapshot
from tests.conftest import EQUIV_TOL, tiny_raw
from tests.test_vectorized import _assert_same, _data, _tasks


def _mlp(dtype: torch.dtype = torch.float32):
    # 6 inputs → 20 hidden → 10 outputs: net.1.weight (20, 6), net.3.weight (10, 20)
    m = build_model("mlp", input_shape=(6,), num_classes=10, hidden=[20], seed=0).to(dtype)
    units = build_units(m, layer_view(m, (6,)), "paper")
    return m, Layout.of(m, units, param_bytes(m))


def _hand_mask() -> dict[str, torch.Tensor]:
    w1 = torch.zeros(20, 6, dtype=torch.bool)
    w1[:3] = True  # 18 of 120
    w2 = torch.zeros(10, 20, dtype=torch.bool)
    w2[:, :10] = True  # 100 of 200
    return {"net.1.weight": w1, "net.3.weight": w2}


def _masked_mlp() -> tuple[torch.nn.Module, Layout, dict[str, torch.Tensor]]:
    """The float64 MLP with :func:`_hand_mask` applied (the server's model is zero outside
    the mask), its layout and the mask."""
    model, layout = _mlp(torch.float64)
    masks = _hand_mask()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in masks:
                p.mul_(masks[n])
    return model, layout, masks


def test_a_mask_task_costs_its_density_by_hand() -> None:
    _, layout = _mlp()
    mask = Mask(_hand_mask())
    # kept: 18 + 20 biases + 100 + 10 biases = 148 of the model's 350 elements
    assert mask.kept(layout) == 148
    assert mask.density(layout) == pytest.approx(148 / 350, rel=1e-15)
    # per sample: layer 1 forward 2·6·20 = 240 and weight gradient 240, at 18/120 = 0.15;
    # layer 2 forward 2·20·10 = 400 and backward 800, at 100/200 = 0.5 → 72 + 600 = 672
    cost = mask.cost(layout, 32)
    assert cost.flops == pytest.approx(32 * 672.0, rel=1e-12)
    assert cost.bytes_down == cost.bytes_up == 4 * 148  # float32 values of the kept elements
    reporting = Mask(_hand_mask(), reports=True).cost(layout, 32)
    assert reporting.bytes_up == 4 * 148 + 4 * 350  # + every parameter's squared gradient
    assert reporting.flops == cost.flops
    # a dense mask costs the full task
    ones = {n: torch.ones_like(m) for n, m in _hand_mask().items()}
    assert Mask(ones).cost(layout, 32) == FULL.cost(layout, 32)


def test_masks_compare_by_their_bits() -> None:
    a, b = Mask(_hand_mask()), Mask(_hand_mask())
    assert a == b and hash(a) == hash(b)
    other = _hand_mask()
    other["net.1.weight"][5, 0] = True
    assert Mask(other) != a
    assert Mask(_hand_mask(), reports=True) != a


def test_element_times_by_hand() -> None:
    _, layout = _mlp()
    pop = Population(
        speed=np.array([1e4, 1e3]), up_bandwidth=np.array([100.0, 100.0]),
        down_bandwidth=np.array([200.0, 200.0]),
    )  # fmt: skip
    times, c, b = element_times(layout, pop, [32, 32], _hand_mask())
    assert b == 1  # the slower device closes the round
    # t_j = samples · FLOPs per element / speed + 4 bytes · (1/down + 1/up)
    assert times["net.1.weight"] == pytest.approx(32 * (480 / 120) / 1e3 + 4 / 200 + 4 / 100)
    assert times["net.3.weight"] == pytest.approx(32 * (1200 / 200) / 1e3 + 4 / 200 + 4 / 100)
    # c: the 30 biases' bytes down and up
    assert c == pytest.approx(120 / 200 + 120 / 100)


def test_the_reconfiguration_rule_on_a_hand_made_case() -> None:
    z = np.array([2.0, 8.0, 5.0, 1.0, 6.0])
    t = np.array([1.0, 1.0, 1.0, 1.0, 2.0])
    keep = np.array([True, False, False, False, False])
    cand = ~keep
    # objective (Σ Z)/(c + Σ t) with c = 1: start {0}: 2/2 = 1; the candidates by Z/t:
    # 1 (8), 2 (5), 4 (3), 3 (1). 8 > 1: add 1 → 10/3; 5 > 10/3: add 2 → 15/4 = 3.75;
    # 3 < 3.75: stop
    got = reconfigure(z, t, keep, cand, fixed_time=1.0)
    assert got.tolist() == [True, True, True, False, False]
    # a larger fixed part raises the bar: Z_fixed = 30 → (32)/(2) = 16 > every Z/t
    assert reconfigure(z, t, keep, cand, fixed_importance=30.0, fixed_time=1.0).tolist() == [
        True, False, False, False, False,
    ]  # fmt: skip
    # elements neither kept nor candidates are never chosen
    assert not reconfigure(z, t, keep, np.array([False, False, True, True, True]), fixed_time=1.0)[
        1
    ]


@settings(max_examples=60, deadline=None)
@given(
    z=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=8),
    data=st.data(),
)
def test_the_rule_finds_the_best_superset_of_the_kept(z: list[float], data) -> None:  # type: ignore[no-untyped-def]
    n = len(z)
    t = np.array(data.draw(st.lists(st.floats(0.1, 5.0), min_size=n, max_size=n)))
    keep = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    zf, c = data.draw(st.floats(0.0, 5.0)), data.draw(st.floats(0.1, 5.0))
    za = np.array(z)
    got = reconfigure(za, t, keep, ~keep, fixed_importance=zf, fixed_time=c)
    assert (got[keep]).all()

    def objective(m: np.ndarray) -> float:
        return float((zf + za[m].sum()) / (c + t[m].sum()))

    free = np.flatnonzero(~keep)
    best = max(
        objective(keep | np.isin(np.arange(n), sub))
        for k in range(len(free) + 1)
        for sub in itertools.combinations(free, k)
    )
    assert objective(got) == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_release_takes_the_smallest_in_use_magnitudes() -> None:
    theta = torch.tensor([[0.5, -0.1, 0.0, 2.0], [-0.3, 0.2, 0.05, -1.0]])
    in_use = torch.tensor([[True, True, False, True], [True, True, True, True]])
    # 7 in use, ⌊0.5·7⌋ = 3: |0.05|, |−0.1|, |0.2| (the pruned 0.0 is not in use)
    out = release(theta, in_use, 0.5)
    assert out.tolist() == [[False, True, False, False], [False, True, True, False]]
    assert not release(theta, in_use, 0.0).any()


def _independent_masked_sgd(model, data, task, masks, lr: float):  # type: ignore[no-untyped-def]
    """A Mask task by hand: torch SGD on the model zeroed outside the mask, re-zeroed after
    each step; the squared gradients of every element summed over the steps."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if n in masks:
                p.mul_(masks[n])
    sq = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    idx = data.indices[task.client]
    for local in batch_schedule(3, task, len(idx)):
        rows = idx[local]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(data.x[rows]), data.y[rows]).backward()
        for n, p in ref.named_parameters():
            sq[n] += p.grad**2
        opt.step()
        with torch.no_grad():
            for n, p in ref.named_parameters():
                if n in masks:
                    p.mul_(masks[n])
    delta = {n: p.detach() - task.base.params[n] for n, p in ref.named_parameters()}
    return delta, sq


@pytest.mark.usefixtures("float64")
def test_mask_tasks_train_the_pruned_model_and_report_dense_squared_gradients() -> None:
    from fedclock.train.factory import make_executor
    from fedclock.train.local import LocalTraining, Needs

    model, layout, masks = _masked_mlp()
    needs = Needs(shapes=frozenset({Mask}), layout=layout, synchronous=True)
    local = LocalTraining(lr=0.1)
    sizes = [16, 16, 12, 20]
    data = _data(sizes, (6,))
    data = replace(data, x=data.x.double())
    shape = Mask(masks)
    tasks = [
        replace(t, plan=replace(t.plan, shape=shape))
        for t in _tasks(snapshot(model, 0), sizes, 8, steps=3)
    ]

    def executor(kind: str):  # type: ignore[no-untyped-def]
        return make_executor(needs, copy.deepcopy(model), data, seed=3, local=local, kind=kind)

    serial = executor("serial").run(tasks)
    vec = executor("vectorized").run(tasks)
    _assert_same(serial, vec)
    for task, a, b in zip(tasks, serial, vec, strict=True):
        want, sq = _independent_masked_sgd(model, data, task, masks, 0.1)
        for n in want:
            torch.testing.assert_close(a.delta[n], want[n], atol=EQUIV_TOL, rtol=EQUIV_TOL)
            assert "sq_grads" in a.up and "sq_grads" in b.up
            torch.testing.assert_close(a.up["sq_grads"][n], sq[n], atol=EQUIV_TOL, rtol=EQUIV_TOL)
            torch.testing.assert_close(b.up["sq_grads"][n], sq[n], atol=EQUIV_TOL, rtol=EQUIV_TOL)
        for n, m in masks.items():
            assert not a.delta[n][~m].any() and not b.delta[n][~m].any()  # pruned stay 0
            assert bool((a.up["sq_grads"][n][~m] > 0).any())  # dense


@pytest.mark.usefixtures("float64")
def test_a_step_statistic_is_declared_data_not_executor_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both executors accumulate whatever ``train.local.STEP_STATISTICS`` says for the names
    a program declares (``Program.step_statistics``): replacing Σg² by Σ|g| changes what comes
    up in ``Contribution.up`` (one step: |g| = √(g²)), with no executor code naming it."""
    from fedclock.train import local as local_mod
    from fedclock.train.factory import make_executor
    from fedclock.train.local import LocalTraining, Needs

    monkeypatch.setitem(local_mod.STEP_STATISTICS, "sq_grads", lambda acc, g: acc.add_(g.abs()))
    model, layout, masks = _masked_mlp()
    sizes = [16, 12]
    data = _data(sizes, (6,))
    data = replace(data, x=data.x.double())
    tasks = [replace(t, plan=replace(t.plan, shape=Mask(masks)))
             for t in _tasks(snapshot(model, 0), sizes, 8, steps=1)]  # fmt: skip
    needs = Needs(shapes=frozenset({Mask}), layout=layout, synchronous=True)
    for kind in ("serial", "vectorized"):
        ex = make_executor(needs, copy.deepcopy(model), data, seed=3,
                           local=LocalTraining(lr=0.1), kind=kind)  # fmt: skip
        for task, c in zip(tasks, ex.run(tasks), strict=True):
            _, sq = _independent_masked_sgd(model, data, task, masks, 0.1)  # one step: Σg² = g²
            for n in sq:
                torch.testing.assert_close(
                    c.up["sq_grads"][n], sq[n].sqrt(), atol=EQUIV_TOL, rtol=EQUIV_TOL
                )


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_pruned_weights_stay_zero_through_aggregation_and_reconfiguration(optimizer: str) -> None:
    from fedclock.train.factory import make_executor
    from fedclock.train.local import LocalTraining, Needs

    model, layout, masks = _masked_mlp()
    sizes = [16, 16, 12]
    data = _data(sizes, (6,))
    data = replace(data, x=data.x.double())
    state = PruneFLState(
        masks={n: m.clone() for n, m in masks.items()}, layout=layout, interval=2,
        fraction=0.3, samples=[16, 16, 12], started=True,
    )  # fmt: skip
    server = ServerOptimizer(kind=optimizer, lr=1.0 if optimizer == "sgd" else 0.01)
    update = PruneFLUpdate(state, Update(server=server), None)
    pop = Population(
        speed=np.full(3, 1e4), up_bandwidth=np.full(3, 1e3), down_bandwidth=np.full(3, 1e3)
    )
    ctx = SimpleNamespace(population=pop)
    needs = Needs(shapes=frozenset({Mask}), layout=layout, synchronous=True)
    ex = make_executor(needs, copy.deepcopy(model), data, seed=3, local=LocalTraining(lr=0.1))
    base = snapshot(model, 0)
    for r in range(4):
        shape = state.shape(state.reporting())
        assert shape.reports == (r % 2 == 1)
        tasks = [
            replace(t, plan=replace(t.plan, shape=shape))
            for t in _tasks(base, sizes, 8, steps=2, first_id=10 * r)
        ]
        contributions = ex.run(tasks)
        generation = state.generation
        base = update.aggregate(ctx, base, contributions)  # type: ignore[arg-type]
        assert state.generation == generation and state.rounds == r  # the update changes no state
        MaskPlanner(state, []).on_commit(contributions)  # the simulator's next call
        assert base.version == r + 1 and state.pending is None
        for n, m in state.masks.items():
            assert not base.params[n][~m].any()  # exactly zero outside the (new) mask
    assert state.generation == 2 and len(state.densities) == 3
    assert state.importance == {}  # reset at each reconfiguration


def test_adapt_regrows_important_pruned_weights() -> None:
    """A pruned element with a large accumulated squared gradient returns; a released kept
    one with none leaves (one tensor, equal time per element)."""
    theta = {"w": torch.tensor([[1.0, 0.01, 0.0, 0.5]])}
    masks = {"w": torch.tensor([[True, True, False, True]])}
    z = {"w": torch.tensor([[1.0, 0.0, 9.0, 1.0]]), "b": torch.tensor([0.0])}
    # release ⌊0.34·3⌋ = 1: the smallest |θ| in use (0.01); candidates: it and the pruned
    # one. Kept {0, 3}: (1 + 1)/(1 + 2) = 2/3; Z/t: 9 > 2/3 joins → 11/4; 0 does not
    new = adapt(theta, masks, z, {"w": 1.0}, 1.0, 0.34)
    assert new["w"].tolist() == [[True, False, True, True]]


def test_initial_pruning_stops_by_its_rule_and_charges_its_client() -> None:
    model, layout = _mlp()
    data = _data([64, 64], (6,))
    pop = Population(
        speed=np.array([1e4, 1e5]), up_bandwidth=np.full(2, 1e3), down_bandwidth=np.full(2, 1e3)
    )
    kw = dict(
        client=1, layout=layout, population=pop, samples=[64, 64], batch_size=8, lr=0.1,
        batches=4, interval=2, fraction=0.3, seed=0,
    )  # fmt: skip
    x, y = data.x, data.y
    done = initial_pruning(model, x, y, data.indices[1], max_rounds=200, threshold=1.0, **kw)  # type: ignore[arg-type]
    # any change is within a threshold of 100 %: the 5th successive such reconfiguration
    # (6 in all) stops it; the first once the accuracy reaches 1.5/10
    assert len(done.densities) == 6
    assert done.steps == 4 * done.rounds and done.rounds < 200
    for n, m in done.masks.items():
        assert not done.params[n][~m].any()
    # the time: download the model, every step's sparse FLOPs, upload the pruned values
    assert done.duration > 4 * 350 / 1e3
    never = initial_pruning(model, x, y, data.indices[1], max_rounds=7, threshold=0.0, **kw)  # type: ignore[arg-type]
    assert never.rounds == 7
    # the model passed in is not changed
    assert all(
        torch.equal(p, q) for p, q in zip(model.parameters(), _mlp()[0].parameters(), strict=True)
    )


def test_prunefl_runs_and_refuses_a_client_that_does_not_exist(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fedclock.config import ExperimentConfig
    from fedclock.experiment import run_experiment

    raw = tiny_raw(
        strategy={"name": "prunefl", "reconfig_interval": 2, "initial_interval": 2,
                  "initial_max_rounds": 10},
        budget={"aggregations": 5}, output_dir=str(tmp_path),
    )  # fmt: skip
    res = run_experiment(ExperimentConfig.model_validate(raw))
    s = res.summary if hasattr(res, "summary") else res
    assert s["aggregations"] == 5 and s["updates_used"] == 4 * 6  # the first: initial pruning
    assert 0 < s["prunefl_initial_density"] < 1
    assert s["virtual_time"] > s["prunefl_initial_seconds"] > 0
    bad = tiny_raw(strategy={"name": "prunefl", "initial_client": 6}, output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="initial_client = 6 is not a client"):
        run_experiment(ExperimentConfig.model_validate(bad))
