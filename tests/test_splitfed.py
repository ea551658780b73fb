"""SplitFed (docs/methods/splitfed.md): the Split work shape's cost and timing by hand, a
split task's update against an independent client-net/server-net loop, bad cuts refused."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedclock.config import ConfigError, load_config
from fedclock.devices.cost import SplitExchange, TaskCost, task_timing
from fedclock.devices.population import Population, build_population
from fedclock.experiment import run_experiment
from fedclock.models import build_model, layer_view, param_bytes
from fedclock.models.shapes import FULL, Layout, Split, UnsupportedShapeError, build_units
from fedclock.strategies.planners import local_sgd_plan
from fedclock.train.executor import batch_schedule, snapshot
from fedclock.train.factory import make_executor
from fedclock.train.local import LocalTraining, Needs
from tests.conftest import EQUIV_TOL, tiny_raw
from tests.test_vectorized import _assert_same, _data, _tasks


def _mlp(dtype: torch.dtype = torch.float32):
    """6 → 5 → 4 → 3 (three layers)."""
    m = build_model("mlp", input_shape=(6,), num_classes=3, hidden=[5, 4], seed=0).to(dtype)
    units = build_units(m, layer_view(m, (6,)), "paper")
    return m, Layout.of(m, units, param_bytes(m))


def test_split_cost_hand_computed() -> None:
    """Per sample (2 FLOPs per multiply-add): layer 1 forward 2·6·5 = 60, backward 60 (its
    weight gradient only); layer 2 40 and 80; layer 3 24 and 48. Cut after layer 1: the
    client 120, the server 192; activations 5 float32 = 20 bytes (and an 8-byte label) up,
    20 bytes of gradient down; the client-side model (6·5 + 5)·4 = 140 bytes down and up."""
    _, layout = _mlp()
    cost = Split(1, label_bytes=8).cost(layout, 10)
    assert cost == TaskCost(
        flops=10 * 120.0, bytes_down=140, bytes_up=140,
        split=SplitExchange(server_flops=10 * 192.0, bytes_up=10 * 28, bytes_down=10 * 20),
    )  # fmt: skip
    # cut after layer 2: client 60 + 60 + 40 + 80, server 24 + 48, 4 floats cross
    two = Split(2).cost(layout, 1)
    assert (two.flops, two.split) == (240.0, SplitExchange(72.0, 16, 16))
    assert two.bytes_up == 4 * (35 + 24)
    # the two sides together are the full task's FLOPs
    for cut in (1, 2):
        c = Split(cut).cost(layout, 7)
        assert c.split is not None
        assert c.flops + c.split.server_flops == FULL.cost(layout, 7).flops


def test_split_timing_hand_computed_and_per_batch() -> None:
    """speed 100, server 1000 FLOP/s, links 10 B/s up and 20 B/s down, 10 samples cut after
    layer 1: download 140/20 = 7 s; training 1200/100 + 280/10 + 1920/1000 + 200/20 =
    51.92 s; upload 140/10 = 14 s. The training phase is the sum over the batches (4, 4, 2
    samples) of client compute, activations up, server compute, gradients down."""
    _, layout = _mlp()
    shape = Split(1, label_bytes=8)
    plan = local_sgd_plan(10, 4, local_epochs=1.0, local_steps=None)
    assert plan.samples == 10 and plan.local_steps == 3
    cost = shape.cost(layout, plan.samples)
    pop = Population(
        speed=np.array([100.0]), up_bandwidth=np.array([10.0]), down_bandwidth=np.array([20.0]),
        server_speed=1000.0,
    )  # fmt: skip
    want = (7.0, 12.0 + 28.0 + 1.92 + 10.0, 14.0)
    tol = 8 * np.finfo(np.float64).eps
    for got in (pop.timing(0, cost, 0), pop.nominal_timing(0, cost), Population.timing(pop, 0, cost, 0)):  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=tol)
    per_batch = sum(
        b * 120 / 100 + b * 28 / 10 + b * 192 / 1000 + b * 20 / 20 for b in (4, 4, 2)
    )  # fmt: skip
    assert pop.timing(0, cost, 0).compute_s == pytest.approx(per_batch, rel=tol)
    # a slowdown draw scales the client's compute only
    slow = replace(pop, slowdown_kind="lognormal")
    s = slow.slowdown(0, 5)
    for got in (slow.timing(0, cost, 5), Population.timing(slow, 0, cost, 5)):
        assert got.compute_s == pytest.approx(12.0 * s + 28.0 + 1.92 + 10.0, rel=tol)
    # a cost without a split is timed as before (the server plays no part)
    plain = task_timing(TaskCost(100.0, 20, 10), speed=100.0, up_bandwidth=10.0,
                        down_bandwidth=20.0, server_speed=1.0)  # fmt: skip
    assert tuple(plain) == (1.0, 1.0, 1.0)


def test_server_speed_default_and_validation() -> None:
    cfg = load_config(raw=tiny_raw()).population  # classes of 2e6 and 5e5 FLOP/s
    assert build_population(cfg, 6, 0).server_speed == 10 * 2.0e6
    given = cfg.model_copy(update={"server_speed": 3.0e9})
    assert build_population(given, 6, 0).server_speed == 3.0e9
    for bad in (0, -1.0, ".inf"):
        with pytest.raises(ConfigError, match="server_speed"):
            load_config(raw=tiny_raw(population={"server_speed": bad}))


def _split_sgd(model, data, task, cut: int, lr: float) -> dict[str, torch.Tensor]:
    """Plain split training, written independently: the client net holds the modules up to
    layer ``cut`` (and its activation), the server net the rest; per batch the client's
    activations are handed over detached (requires_grad), the server steps on the loss and
    passes the activations' gradient back, through which the client steps. Returns Δ."""
    ref = copy.deepcopy(model)
    mods = list(ref.net)
    linear = [i for i, m in enumerate(mods) if isinstance(m, torch.nn.Linear)]
    at = linear[cut]  # the first server-side layer
    client, server = torch.nn.Sequential(*mods[:at]), torch.nn.Sequential(*mods[at:])
    opt_c = torch.optim.SGD(client.parameters(), lr=lr)
    opt_s = torch.optim.SGD(server.parameters(), lr=lr)
    idx = data.indices[task.client]
    for local in batch_schedule(3, task, len(idx)):
        rows = idx[local]
        opt_c.zero_grad()
        opt_s.zero_grad()
        a = client(data.x[rows])  # the client's forward
        a_server = a.detach().requires_grad_(True)  # sent up
        loss = torch.nn.functional.cross_entropy(server(a_server), data.y[rows])
        loss.backward()  # the server's backward
        opt_s.step()
        a.backward(a_server.grad)  # the gradient sent down
        opt_c.step()
    return {n: p.detach() - task.base.params[n] for n, p in ref.named_parameters()}


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("cut", [1, 2])
def test_a_split_task_is_split_training(cut: int) -> None:
    """Serial and vectorized executors give a Split task the Δ of the independent split
    loop on the same batches (client-side and server-side parts alike), covering all."""
    model, layout = _mlp(torch.float64)
    sizes = [16, 16, 12, 20]
    data = _data(sizes, (6,), seed=1)
    data = replace(data, x=data.x.double(), y=data.y % 3)
    tasks = [
        replace(t, plan=replace(t.plan, shape=Split(cut)))
        for t in _tasks(snapshot(model, 0), sizes, 8, epochs=2.0)
    ]
    needs = Needs(shapes=frozenset({Split}), layout=layout, synchronous=True)
    local = LocalTraining(lr=0.1)
    out = {
        kind: make_executor(needs, copy.deepcopy(model), data, seed=3, local=local, kind=kind).run(
            tasks
        )
        for kind in ("serial", "vectorized")
    }
    _assert_same(out["serial"], out["vectorized"])
    for task, c in zip(tasks, out["serial"], strict=True):
        want = _split_sgd(model, data, task, cut, lr=0.1)
        assert set(c.delta) == set(want)
        for n in want:
            torch.testing.assert_close(c.delta[n], want[n], atol=EQUIV_TOL, rtol=EQUIV_TOL)
            assert c.covers(n) is True


def test_splitfed_runs_fedavgs_arithmetic_on_split_time(tmp_path) -> None:
    """SFL-V1 averages both sides with FedAvg's p_i: the same models as FedAvg round by
    round (to rounding), at the split schedule's virtual times, which differ."""
    runs = {}
    for name in ("fedavg", "splitfed"):
        raw = tiny_raw(executor={"threads": 1}, strategy={"name": name})
        runs[name] = run_experiment(load_config(raw=raw), run_dir=tmp_path / name).history
    for a, b in zip(runs["fedavg"], runs["splitfed"], strict=True):
        assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-5)
        assert a["virtual_time"] == b["virtual_time"] == 0 or not math.isclose(
            a["virtual_time"], b["virtual_time"]
        )
    assert runs["splitfed"][-1]["test_loss"] < runs["splitfed"][0]["test_loss"]


@pytest.mark.parametrize(
    ("sections", "match"),
    [
        ({"strategy": {"name": "splitfed", "cut": 2}}, r"strategy\.cut = 2 leaves the server "
                                                       r"no layer.*has 2 layers.*1\.\.1"),
        ({"strategy": {"name": "splitfed", "cut": 0}}, r"cut"),
        (
            {"strategy": {"name": "splitfed"}, "model": {"arch": "ee_cnn", "channels": [4, 4, 8]}},
            r"early-exit",
        ),
    ],
)  # fmt: skip
def test_bad_cuts_are_refused(tmp_path, sections, match) -> None:
    with pytest.raises((ConfigError, ValueError), match=match):
        run_experiment(load_config(raw=tiny_raw(**sections)), run_dir=tmp_path / "bad")


def test_split_shape_refuses_what_it_cannot_split() -> None:
    _, layout = _mlp()
    with pytest.raises(UnsupportedShapeError, match="leaves the server none"):
        Split(3).cost(layout, 1)
    with pytest.raises(ValueError, match="at least one layer"):
        Split(0)
    m = build_model("mlp", input_shape=(6,), num_classes=3, hidden=[5], seed=0)
    reference = Layout.of(m, build_units(m, layer_view(m, (6,)), "reference"), param_bytes(m))
    with pytest.raises(UnsupportedShapeError, match="paper-mode"):
        Split(1).program(reference)
