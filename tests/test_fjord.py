"""FjORD (docs/methods/fjord.md): ordered dropout — a width drawn per local step up to the
device's p_max — and nested slices averaged over the clients that hold them."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from fedclock.config import ConfigError, load_config
from fedclock.experiment import _build, run_experiment
from fedclock.models.shapes import FULL, OrderedDropout, od_counts
from fedclock.sim.simulator import Budget, Simulator
from fedclock.strategies.fjord import p_max_of
from fedclock.train.executor import batch_schedule, snapshot
from tests.conftest import EQUIV_TOL, partial_executor, tiny_raw
from tests.test_ramfed import _as_mask, _mlp
from tests.test_vectorized import _assert_same, _data, _tasks

P = (0.2, 0.4, 0.6, 0.8, 1.0)


# ------------------------------------------------------------------ widths and their units
def test_units_kept_at_each_width_by_hand() -> None:
    """⌈p·K⌉ units of K = 20 and 12 (3.2 → 4 would be wrong for 0.6·5: it keeps 3)."""
    assert [od_counts(p, (20, 12)) for p in P] == [(4, 3), (8, 5), (12, 8), (16, 10), (20, 12)]
    assert od_counts(0.6, (5,)) == (3,)
    assert od_counts(0.01, (50,)) == (1,)


@given(k=st.integers(1, 300), a=st.sampled_from(P), b=st.sampled_from(P))
def test_narrower_widths_are_prefixes_of_wider_ones(k: int, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert od_counts(lo, (k,))[0] <= od_counts(hi, (k,))[0] <= k


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="not one of the widths"):
        OrderedDropout(0.5, P)
    with pytest.raises(ValueError, match="≤ p_max"):
        OrderedDropout(0.4, P, (0, 2))
    with pytest.raises(ValueError, match="increase"):
        OrderedDropout(1.0, (1.0, 0.5))


def test_cost_follows_the_widths_the_steps_trained() -> None:
    """One hidden layer of 20 units (6 inputs, 10 outputs): a width-p step costs ⌈20p⌉/20 of
    a full step (both weight layers shrink with the hidden units), so steps at 0.2, 1.0, 1.0
    and 0.6 cost (0.2 + 1 + 1 + 0.6)/4 = 0.7 of the full task; the task moves its p_max
    submodel: 12·6 + 12 + 10·12 + 10 elements of 4 bytes."""
    _, _, layout = _mlp([20])
    full = FULL.cost(layout, 32)
    shape = OrderedDropout(1.0, P, (0, 4, 4, 2))
    assert shape.cost(layout, 32).flops == pytest.approx(0.7 * full.flops, rel=1e-12)
    held = OrderedDropout(0.6, P, (2, 0)).cost(layout, 32)
    assert held.flops == pytest.approx(0.4 * full.flops, rel=1e-12)
    assert held.bytes_up == held.bytes_down == 4 * (12 * 6 + 12 + 10 * 12 + 10)
    # the shape's identity (its program) is p_max and the widths, not the draws
    assert OrderedDropout(0.6, P, (2, 0)) == OrderedDropout(0.6, P, (1, 1, 1))


def test_p_max_follows_the_devices_speed() -> None:
    """One hidden layer: a width's FLOPs are ⌈20p⌉/20 of the full model's, so shares 1, ½,
    0.39 and 0.01 afford widths 1.0, 0.4, 0.2 and (none: the narrowest) 0.2."""
    _, _, layout = _mlp([20])
    assert p_max_of(layout, P, [1.0, 0.5, 0.39, 0.01]) == [1.0, 0.4, 0.2, 0.2]


# ------------------------------------------------------------------ a task, by hand
def _od_sgd(model: nn.Module, data: Any, task: Any, momentum: float) -> dict[str, torch.Tensor]:
    """FjORD's client as its own code: the device holds the p_max slices of every weight and
    bias as leaf tensors, and each step's forward pass uses the first ⌈p_s·K⌉ units of them
    (F.linear on the sliced rows and columns); torch.optim.SGD steps every held tensor.
    Returns Δ scattered into the full shapes (0 outside the p_max submodel)."""
    shape = task.plan.shape
    lin = [m for m in model.modules() if isinstance(m, nn.Linear)]
    hidden = [m.out_features for m in lin[:-1]]
    held_units = od_counts(shape.p_max, hidden)
    rows = [*held_units, lin[-1].out_features]
    cols = [lin[0].in_features, *held_units]
    w = [
        m.weight.detach()[:r, :c].clone().requires_grad_(True)
        for m, r, c in zip(lin, rows, cols, strict=True)
    ]
    b = [m.bias.detach()[:r].clone().requires_grad_(True) for m, r in zip(lin, rows, strict=True)]
    opt = torch.optim.SGD([*w, *b], lr=0.1, momentum=momentum)
    idx = data.indices[task.client]
    for s, local in enumerate(batch_schedule(3, task, len(idx))):
        k = od_counts(shape.widths[shape.levels[s]], hidden)
        r_s = [*k, lin[-1].out_features]
        c_s = [lin[0].in_features, *k]
        h = data.x[idx[local]].flatten(1)
        for i, (r, c) in enumerate(zip(r_s, c_s, strict=True)):
            h = nn.functional.linear(h, w[i][:r, :c], b[i][:r])
            if i < len(lin) - 1:
                h = torch.relu(h)
        opt.zero_grad()
        nn.functional.cross_entropy(h, data.y[idx[local]]).backward()
        opt.step()
    out: dict[str, torch.Tensor] = {}
    names = [n for n, _ in model.named_parameters()]
    for i, m in enumerate(lin):
        dw, db = torch.zeros_like(m.weight), torch.zeros_like(m.bias)
        dw[: rows[i], : cols[i]] = w[i].detach() - m.weight.detach()[: rows[i], : cols[i]]
        db[: rows[i]] = b[i].detach() - m.bias.detach()[: rows[i]]
        out[names[2 * i]], out[names[2 * i + 1]] = dw, db
    return out


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_an_ordered_dropout_task_is_the_per_step_subnetworks_sgd(momentum: float) -> None:
    """Serial and vectorized executors equal :func:`_od_sgd` (6 → 20 → 12 → 10; p_max 0.6
    holds 12 and 8 units; the steps train widths 0.2, 0.6, 0.4, 0.6, 0.2 and others)."""
    model, units, layout = _mlp([20, 12], torch.float64)
    sizes = [16, 12, 20]
    data = _data(sizes, (6,))
    data = replace(data, x=data.x.double())
    shapes = [
        OrderedDropout(0.6, P, (0, 2, 1, 2, 0)),
        OrderedDropout(0.6, P, (2, 2, 0, 1, 1)),
        OrderedDropout(1.0, P, (4, 3, 0, 1, 2)),
    ]
    tasks = [
        replace(t, plan=replace(t.plan, shape=s))
        for t, s in zip(_tasks(snapshot(model, 0), sizes, 8, steps=5), shapes, strict=True)
    ]
    opts = dict(seed=3, lr=0.1, momentum=momentum, units=units)
    serial = partial_executor(copy.deepcopy(model), data, **opts).run(tasks)
    vec = partial_executor(copy.deepcopy(model), data, vectorize=True, **opts).run(tasks)
    _assert_same(serial, vec)
    for task, c in zip(tasks, serial, strict=True):
        want = _od_sgd(model, data, task, momentum)
        held = layout.prefix_units(task.plan.shape.p_max)
        for n in want:
            torch.testing.assert_close(c.delta[n], want[n], atol=EQUIV_TOL, rtol=EQUIV_TOL)
            assert torch.equal(_as_mask(c.covers(n), layout.param_shapes[n]), held[n])


# ------------------------------------------------------------------ the run
def _fleet(**sections: Any) -> dict[str, Any]:
    sections.setdefault("strategy", {"name": "fjord"})
    return tiny_raw(
        population={"scenario": "classes", "slowdown": {"kind": "none"}, "classes": [
            {"fraction": 0.5, "speed": 1.0e8}, {"fraction": 0.5, "speed": 2.5e7}]},
        **sections,
    )  # fmt: skip


def test_a_run_draws_each_steps_width_up_to_the_clients_p_max() -> None:
    """MLP [16]: the fast half holds the full model (p_max 1), the quarter-speed half
    p_max 0.2 (⌈3.2⌉ = 4 of 16 units cost 0.25 of the full model); each step's width is a
    uniform draw among the widths ≤ p_max, and the task's time follows them."""
    cfg = load_config(raw=_fleet(budget={"aggregations": 6}))
    parts = _build(cfg, None)
    seen: list[Any] = []

    class Watch:
        def on_dispatch(self, sim: Any, task: Any) -> None:
            seen.append(task)

    sim = Simulator(strategy=parts.strategy, executor=parts.executor, population=parts.population,
                    initial=parts.initial, seed=cfg.seed, budget=Budget(aggregations=6),
                    observers=[Watch()])  # fmt: skip
    sim.run()
    work = parts.strategy.planner
    assert sorted(set(work.p_max)) == [0.2, 1.0]
    layout = work.layout
    draws: Counter[int] = Counter()
    for t in seen:
        shape = t.plan.shape
        assert isinstance(shape, OrderedDropout) and shape.p_max == work.p_max[t.client]
        assert len(shape.levels) == t.plan.local_steps
        if shape.p_max == 0.2:
            assert set(shape.levels) == {0}
        else:
            draws.update(shape.levels)
        per = [layout.prefix_cost(p).flops for p in P]
        want = t.plan.samples * sum(per[v] for v in shape.levels) / len(shape.levels)
        assert t.cost.flops == pytest.approx(want, rel=1e-12)
    # every width drawn, none far from a fifth (a few hundred draws)
    total = sum(draws.values())
    assert set(draws) == set(range(5)) and all(abs(n / total - 0.2) < 0.08 for n in draws.values())
    assert sim.model.version == 6


def test_fjord_runs_end_to_end_and_refuses_what_it_cannot_split(tmp_path) -> None:
    hist = run_experiment(load_config(raw=_fleet()), run_dir=tmp_path / "a").history
    assert hist[-1]["test_loss"] < hist[0]["test_loss"]
    with pytest.raises(ConfigError, match="'fjord' splits single-exit models only"):
        raw = _fleet(model={"arch": "ee_cnn", "channels": [4, 4, 8]})
        run_experiment(load_config(raw=raw), run_dir=tmp_path / "b")
    with pytest.raises(ConfigError, match=r"end at 1\.0"):
        load_config(raw=_fleet(strategy={"name": "fjord", "widths": [0.5, 0.8]}))
