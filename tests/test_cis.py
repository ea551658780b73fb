"""CIS (Kaplan et al.): tree rates (eqs. 2–5), p matrix, Λ̃ strategies, server update,
routed CIS accuracy, the Exit work shape, and a run from the config."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedclock.config import ConfigError, load_config
from fedclock.devices.cost import TaskCost, TaskTiming
from fedclock.devices.topology import TREES, Tree, build_tree, parse_serving
from fedclock.errors import ConfigError as FedclockConfigError
from fedclock.models.early_exit import ExitLoss, MultiExitLoss, ee_cnn, exit_view
from fedclock.models.shapes import Exit, Layout, build_units
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan
from fedclock.strategies.cis import (
    balanced_weights,
    cis_update,
    cosine_lr_scale,
    flops_weights,
    gradient_variance,
    lambda_tilde,
    p_matrix,
)
from fedclock.strategies.server import ServerOptimizer
from fedclock.train.evaluate import cis_route
from tests.conftest import tiny_raw

INF = math.inf


# ----------------------------------------------------------------------------- tree
def test_serving_rates_of_the_papers_tree() -> None:
    """4-2-1 with the authors' 80-15-5 rates: leaves 2.5 in, 0.5 forwarded; edges 0.25."""
    tree = TREES["4-2-1"]
    t, s = tree.rates()
    assert t.tolist() == [0.0, 0.25, 0.25, 0.5, 0.5, 0.5, 0.5]
    assert s.tolist() == [0.5, 0.75, 0.75, 2.0, 2.0, 2.0, 2.0]
    assert tree.serving_rates().tolist() == [8.0, 1.5, 0.5]


def test_serving_rates_hand_computed_tree() -> None:
    """Root 0 ← {1 (exit 2), 2 (exit 1)}; 1 ← {3, 4} (exit 1). Arrivals 3 at 3, 2 at 4, 1 at 2
    and 0.5 at 1; capacities 1 (3), 5 (4), 0.2 (2), 1.5 (1).
    λ^t_3 = min(1, 3) = 1, λ^s_3 = 2; λ^t_4 = min(5, 2) = 2, λ^s_4 = 0;
    node 1 receives 0.5 + 1 + 2 = 3.5, forwards 1.5, serves 2; node 2 receives 1, forwards 0.2,
    serves 0.8; the root receives 1.5 + 0.2 = 1.7 and serves it.
    Λ = (2 + 0 + 0.8, 2, 1.7)."""
    tree = Tree((-1, 0, 0, 1, 1), (3, 2, 1, 1, 1), (0.0, 0.5, 1.0, 3.0, 2.0),
                (INF, 1.5, 0.2, 1.0, 5.0))  # fmt: skip
    t, s = tree.rates()
    np.testing.assert_allclose(t, [0, 1.5, 0.2, 1, 2])
    np.testing.assert_allclose(s, [1.7, 2, 0.8, 2, 0])
    np.testing.assert_allclose(tree.serving_rates(), [2.8, 2, 1.7])


def test_tree_with_given_serving_and_data_split() -> None:
    tree = TREES["4-2-1"].with_serving(parse_serving("5-15-80"))
    np.testing.assert_allclose(tree.serving_rates(), [0.05, 0.15, 0.80])
    np.testing.assert_allclose(tree.data_shares("highly-biased"),
                               [0.767, 0.0995, 0.0995, 0.0085, 0.0085, 0.0085, 0.0085])  # fmt: skip
    np.testing.assert_allclose(tree.data_shares("equal")[[0, 1, 3]], [1 / 3, 1 / 6, 1 / 12])
    assert TREES["12-4-1"].size == 17 and TREES["12-4-1"].exits == 3


@pytest.mark.parametrize(
    ("parent", "exit_", "words"),
    [
        ((-1, 0, 5), (2, 1, 1), "not a node"),
        ((-1, -1), (2, 1), "exactly one root"),
        ((-1, 0), (1, 1), "deeper exit"),
        ((1, 2, 1), (3, 2, 1), "exactly one root"),
    ],
)
def test_bad_trees_are_one_sentence(parent: tuple, exit_: tuple, words: str) -> None:
    n = len(parent)
    with pytest.raises(FedclockConfigError, match=words):
        Tree(parent, exit_, (1.0,) * n, (INF,) * n)


def test_impossible_serving_is_refused() -> None:
    with pytest.raises(FedclockConfigError, match=r"cis\.serving"):
        parse_serving("80-x-5")
    with pytest.raises(FedclockConfigError, match=r"3 exits"):
        TREES["4-2-1"].with_serving((50.0, 50.0))


# ----------------------------------------------------------------------------- p and Λ̃
def test_p_matrix_paper_and_code_rules() -> None:
    tree = TREES["4-2-1"]
    p0 = p_matrix(tree, 0.0)
    assert (
        p0[0].tolist() == [0, 0, 1] and p0[1].tolist() == [0, 1, 0] and p0[3].tolist() == [1, 0, 0]
    )
    p = p_matrix(tree, 0.2)
    np.testing.assert_allclose(p[0], [0.2, 0.2, 0.6])  # ε per lower exit, 1 − 2ε for E_i = 3
    np.testing.assert_allclose(p[1], [0.2, 0.8, 0.0])
    np.testing.assert_allclose(p[3], [1.0, 0.0, 0.0])
    code = p_matrix(tree, 0.4, "code")  # the authors' 0.4: 0.2 to each lower exit of the root
    np.testing.assert_allclose(code[0], [0.2, 0.2, 0.6])
    np.testing.assert_allclose(code[1], [0.4, 0.6, 0.0])
    np.testing.assert_allclose(p.sum(1), 1.0)
    with pytest.raises(FedclockConfigError, match="too large"):
        p_matrix(tree, 0.6)


@given(eps=st.floats(0.0, 0.5), rule=st.sampled_from(["paper", "code"]))
@settings(max_examples=50, deadline=None)
def test_p_rows_are_distributions(eps: float, rule: str) -> None:
    p = p_matrix(TREES["12-4-1"], eps, rule)
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)
    assert (p >= 0).all()
    for i, top in enumerate(TREES["12-4-1"].exit):
        assert (p[i, top:] == 0).all()


def test_lambda_tilde_equal_serving_flops() -> None:
    serving = [8.0, 1.5, 0.5]
    np.testing.assert_allclose(lambda_tilde("equal", serving=serving), [1 / 3] * 3)
    np.testing.assert_allclose(lambda_tilde("serving", serving=serving), [0.8, 0.15, 0.05])
    r = [0.0438, 0.391, 1.0]
    # the authors' ramp min(r_e, (t+1)/T), T = 100: equal for t ≤ 3
    np.testing.assert_allclose(flops_weights(r, 3, 100), [1 / 3] * 3)
    # t = 10: min(r, 0.11) = (0.0438, 0.11, 0.11)
    np.testing.assert_allclose(flops_weights(r, 10, 100), np.array([0.0438, 0.11, 0.11]) / 0.2638)
    # last round: ∝ r; no ramp: ∝ r
    np.testing.assert_allclose(flops_weights(r, 99, 100), np.array(r) / sum(r))
    np.testing.assert_allclose(flops_weights(r, 0, None), np.array(r) / sum(r))


def test_balanced_adj_is_the_authors_formula() -> None:
    """reference-implementations.md §3.3: CIFAR-10 σ, equal split, 80-15-5 → Λ̃ =
    [0.486, 0.195, 0.319] (o normalised [0.1718, 0.2394, 0.5888])."""
    tree = TREES["4-2-1"]
    sizes = [15000, 7500, 7500, 3750, 3750, 3750, 3750]
    sigma = [0.00374, 0.00224, 0.00101]
    w = balanced_weights([8.0, 1.5, 0.5], sigma, tree, sizes)
    np.testing.assert_allclose(w, [0.486, 0.195, 0.319], atol=5e-4)
    o = 2 * w - np.array([0.8, 0.15, 0.05])  # ½(s + o) with both normalised, Σ = 1
    np.testing.assert_allclose(o, [0.1718, 0.2394, 0.5888], atol=2e-4)
    # CIFAR-100's σ: o normalised [0.2768, 0.4067, 0.3165]
    w100 = balanced_weights([1.0, 1.0, 1.0], [0.00216, 0.00126, 0.00101], tree, sizes)
    np.testing.assert_allclose(2 * w100 - 1 / 3, [0.2768, 0.4067, 0.3165], atol=2e-4)


def test_cosine_schedule() -> None:
    assert cosine_lr_scale(0, 100, 0.1, 0.001) == pytest.approx(1.0)
    assert cosine_lr_scale(50, 100, 0.1, 0.001) == pytest.approx(0.0505 / 0.1)
    assert cosine_lr_scale(100, 100, 0.1, 0.001) == pytest.approx(0.01)
    assert cosine_lr_scale(7, None, 0.1, 0.001) == 1.0


# ----------------------------------------------------------------------------- server update
def _contribution(client: int, e: int, holds: int, delta: dict, base: ModelVersion,
                  buffers: dict | None = None) -> Contribution:  # fmt: skip
    plan = TaskPlan(1, 1, 1, shape=Exit(e, holds))
    task = Task(0, client, 0, base, plan, TaskCost(0, 0, 0), TaskTiming(0, 0, 0), 0.0)
    own = {"trunk": True, "head1": e == 1, "head2": e == 2}
    return Contribution(task, delta, buffers or {}, 1, 0.0, coverage=own)


def test_server_update_two_nodes_hand_computed() -> None:
    """Root 0 (exit 2, 30 samples) ← leaf 1 (exit 1, 10 samples); Λ̃ = (0.75, 0.25); ε = 0.5
    (paper rule: the root trains exit 1 w.p. 0.5, exit 2 w.p. 0.5; the leaf exit 1 w.p. 1).
    S_{1,p} = 40, S_{2,p} = 30. This round the root trained exit 2, the leaf exit 1.

    paper:  trunk  ← 1 + 0.25·(30/30)/0.5·2 + 0.75·(10/40)/1·4 = 1 + 1 + 0.75 = 2.75
            head2  ← 1 + 0.25·1/0.5·3 = 2.5;  head1 ← 1 + 0.75·0.25·5 = 1.9375
    reference (root absorbs, p multiplied): the root's model 1 + Δ_R, then + c_leaf·(Δ_leaf −
            Δ_root) with c_leaf = 0.75·0.25·1 = 0.1875:
            trunk  ← 3 + 0.1875·(4 − 2) = 3.375;  head2 ← 4 (the root's);
            head1  ← a lower exit's head: the root's (1, it did not train it)."""
    tree = Tree((-1, 0), (2, 1), (0.0, 1.0), (INF, INF))
    p = p_matrix(tree, 0.5)
    np.testing.assert_allclose(p, [[0.5, 0.5], [1.0, 0.0]])
    one = torch.ones(2, dtype=torch.float64)
    base = ModelVersion(0, {"trunk": one.clone(), "head1": one.clone(), "head2": one.clone()})
    z = torch.zeros(2, dtype=torch.float64)
    root = _contribution(0, 2, 2, {"trunk": 2 * one, "head1": z, "head2": 3 * one}, base)
    leaf = _contribution(1, 1, 1, {"trunk": 4 * one, "head1": 5 * one, "head2": z}, base)
    kw = {"tree": tree, "p": p, "sizes": np.array([30.0, 10.0]),
          "weights": lambda t: np.array([0.75, 0.25]), "server": ServerOptimizer(lr=1.0),
          "head_params": [("head1",), ("head2",)]}  # fmt: skip
    new = cis_update(mode="paper", **kw).aggregate(None, base, [root, leaf])  # type: ignore[arg-type]
    assert new.version == 1
    torch.testing.assert_close(new.params["trunk"], 2.75 * one)
    torch.testing.assert_close(new.params["head2"], 2.5 * one)
    torch.testing.assert_close(new.params["head1"], 1.9375 * one)
    assert root.weight == pytest.approx(0.5) and leaf.weight == pytest.approx(0.1875)
    ref = cis_update(mode="reference", **kw).aggregate(None, base, [root, leaf])  # type: ignore[arg-type]
    torch.testing.assert_close(ref.params["trunk"], 3.375 * one)
    torch.testing.assert_close(ref.params["head2"], 4.0 * one)
    torch.testing.assert_close(ref.params["head1"], 1.0 * one)
    # η_s scales the step
    half = cis_update(mode="paper", **{**kw, "server": ServerOptimizer(lr=0.5)}).aggregate(
        None, base, [root, leaf]
    )  # type: ignore[arg-type]
    torch.testing.assert_close(half.params["trunk"], 1.875 * one)


# ----------------------------------------------------------------------------- routing
def test_cis_route_hand_made_table() -> None:
    """Leaf 1 (exit 1, arrival 1) → root 0 (exit 2). Serving 50-50: the leaf serves the half
    of the 4 points with the lowest exit-1 entropy, the root the rest.
    exit-1 entropy (0.1, 0.9, 0.2, 0.5): the leaf serves points 0 and 2 (hits 1, 0);
    the root serves 1 and 3 with exit 2 (hits 1, 1) → (1 + 0 + 1 + 1)/4 = 0.75."""
    tree = Tree((-1, 0), (2, 1), (0.0, 1.0), (INF, 0.5))
    ent = np.array([[0.1, 0.9, 0.2, 0.5], [0.0, 0.0, 0.0, 0.0]])
    hit = np.array([[1, 1, 0, 0], [0, 1, 0, 1]], dtype=float)
    acc, served = cis_route(tree, ent, hit)
    assert acc == pytest.approx(0.75)
    np.testing.assert_allclose(served, [0.5, 0.5])
    # a fractional boundary: the leaf serves 0.6 = points 0 and 2 (0.25 each) and 0.1 of
    # point 3 (a miss at exit 1); the root gets 0.15 of point 3 and point 1 (hits at exit 2):
    # 0.25 + 0.15 + 0.25 = 0.65
    tree6 = Tree((-1, 0), (2, 1), (0.0, 1.0), (INF, 0.4))
    acc6, served6 = cis_route(tree6, ent, hit)
    assert acc6 == pytest.approx(0.65)
    np.testing.assert_allclose(served6, [0.6, 0.4])


def test_cis_route_is_a_cascade_on_the_papers_tree() -> None:
    """All leaves (and both edges) hold the same model, so routing = a 3-level cascade."""
    rng = np.random.default_rng(0)
    ent = rng.random((3, 200))
    hit = (rng.random((3, 200)) < 0.7).astype(float)
    tree = TREES["4-2-1"].with_serving((60, 30, 10))
    acc, served = cis_route(tree, ent, hit)
    np.testing.assert_allclose(served, [0.6, 0.3, 0.1])
    first = np.argsort(ent[0], kind="stable")[:120]
    rest = np.setdiff1d(np.arange(200), first)
    second = rest[np.argsort(ent[1][rest], kind="stable")][:60]
    third = np.setdiff1d(rest, second)
    want = (hit[0][first].sum() + hit[1][second].sum() + hit[2][third].sum()) / 200
    assert acc == pytest.approx(want)


# ----------------------------------------------------------------------------- the model
@pytest.fixture(scope="module")
def een() -> torch.nn.Module:
    torch.manual_seed(0)
    return ee_cnn((1, 8, 8), 10, (4, 4, 8))


def test_early_exit_model_and_losses(een: torch.nn.Module) -> None:
    x, y = torch.randn(5, 1, 8, 8), torch.tensor([0, 1, 2, 3, 4])
    out = een(x)
    assert out.shape == (5, 3, 10)
    torch.testing.assert_close(een(x, upto=2), out[:, :2])
    f = torch.nn.functional.cross_entropy
    torch.testing.assert_close(ExitLoss(2)(out, y), f(out[:, 1], y))
    torch.testing.assert_close(MultiExitLoss()(out, y), sum(f(out[:, e], y) for e in range(3)) / 3)
    assert een.exit_params(1) == ("entries.0.0.weight", "entries.0.0.bias",
                                  "heads.0.2.weight", "heads.0.2.bias")  # fmt: skip


def test_exit_view_flops_grow_with_the_exit(een: torch.nn.Module) -> None:
    info = exit_view(een, (1, 8, 8))
    # exit 1: stem conv 1→4, 3×3, stride 2 on 8×8 → 4×4 outputs: 2·1·4·9·16 = 1152; head
    # linear 16 → 10: 320 → 1472 FLOPs per sample forward; backward: the conv's weight
    # gradient (its input is the data) and the linear's weight and input gradients: 1792
    assert info.fwd_flops[0] == pytest.approx(1472)
    assert info.bwd_flops[0] == pytest.approx(1792)
    assert info.fwd_flops[0] < info.fwd_flops[1] < info.fwd_flops[2]
    assert info.flops_ratio[-1] == 1.0
    params = dict(een.named_parameters())
    assert info.param_bytes[0] == sum(params[n].numel() * 4 for n in info.params[0])


def test_exit_shape_program_and_cost(een: torch.nn.Module) -> None:
    from fedclock.models import layer_view, param_bytes

    info = exit_view(een, (1, 8, 8))
    layout = Layout.of(een, build_units(een, layer_view(een, (1, 8, 8)), "paper"),
                       param_bytes(een), exits=info)  # fmt: skip
    prog = Exit(2, 3).program(layout)
    assert set(prog.trains) == set(een.exit_params(2))
    assert prog.loss == ExitLoss(2)
    assert prog.coverage is not None and prog.coverage["heads.0.2.weight"] is False
    cost = Exit(1, 3).cost(layout, 10)
    assert cost.flops == pytest.approx(10 * (info.fwd_flops[0] + info.bwd_flops[0]))
    assert cost.bytes_down == info.param_bytes[2] and cost.bytes_up == info.param_bytes[0]
    with pytest.raises(ValueError, match=r"exits 1\.\.2"):
        Exit(3, 2)


def test_gradient_variance_matches_a_loop(een: torch.nn.Module) -> None:
    info = exit_view(een, (1, 8, 8))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 1, 8, 8, generator=g), torch.randint(0, 10, (6,), generator=g)
    got = gradient_variance(een, x, y, info)
    params = dict(een.named_parameters())
    for e in (1, 3):
        own = [params[n] for n in info.params[e - 1]]
        rows = []
        for i in range(6):
            loss = torch.nn.functional.cross_entropy(een(x[i : i + 1])[:, e - 1], y[i : i + 1])
            rows.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, own)]))
        want = torch.stack(rows).double().var(0, unbiased=True).mean()
        assert got[e - 1] == pytest.approx(float(want), rel=1e-4)


# ----------------------------------------------------------------------------- config and runs
def _cis_raw(**over: object) -> dict:
    raw = tiny_raw(
        partition={"num_clients": 7, "sizes": "tree"},
        model={"arch": "ee_cnn", "channels": [4, 4, 8]},
        strategy={"name": "cis-serving"},
        cis={"tree": "4-2-1", "serving": "80-15-5"},
        budget={"aggregations": 3},
        executor={"threads": 1},
    )
    raw.update(over)
    return raw


def test_config_errors_are_one_sentence() -> None:
    with pytest.raises(ConfigError, match="num_clients is 6 but the cis tree 4-2-1 has 7"):
        load_config(raw=_cis_raw(partition={"num_clients": 6}))
    with pytest.raises(ConfigError, match=r"set cis\.tree"):
        load_config(raw=_cis_raw(cis={}, partition={"num_clients": 7}))
    with pytest.raises(ConfigError, match="ee_cnn or ee_resnet18"):
        load_config(raw=_cis_raw(model={"arch": "mlp"}))
    with pytest.raises(ConfigError, match="exactly 3 channel counts"):
        load_config(raw=_cis_raw(model={"arch": "ee_cnn", "channels": [4, 8]}))


def test_custom_tree_from_config() -> None:
    cfg = load_config(raw=_cis_raw(
        partition={"num_clients": 3, "sizes": "tree"},
        cis={"tree": "custom", "nodes": [
            {"parent": -1, "exit": 3}, {"parent": 0, "exit": 2, "capacity": 1.0},
            {"parent": 1, "exit": 1, "arrival": 4.0, "capacity": 2.0}]},
    ))  # fmt: skip
    tree = build_tree(cfg.cis)
    assert tree is not None
    np.testing.assert_allclose(tree.serving_rates(), [2.0, 1.0, 1.0])


def test_cis_run_records_exit_and_cis_accuracy(tmp_path) -> None:
    from fedclock.experiment import run_experiment

    cfg = load_config(raw=_cis_raw())
    a = run_experiment(cfg, run_dir=tmp_path / "a")
    assert a.summary["status"] == "completed"
    assert {"exit1_accuracy", "exit2_accuracy", "exit3_accuracy", "cis_accuracy"} <= set(a.summary)
    header = (tmp_path / "a" / "metrics.csv").read_text().splitlines()[0]
    assert header.endswith("exit1_accuracy,exit2_accuracy,exit3_accuracy,cis_accuracy")
    assert a.summary["updates_used"] == 21  # 7 nodes × 3 rounds
    b = run_experiment(cfg, run_dir=tmp_path / "b")
    assert [r["cis_accuracy"] for r in a.history] == [r["cis_accuracy"] for r in b.history]


def test_exit_tasks_serial_equals_vectorized(tmp_path) -> None:
    """The same CIS round on the serial and the vectorized executor, with the cosine
    schedule's learning-rate scale and momentum: equal contributions (float tolerance)."""
    from fedclock.experiment import run_experiment

    hist = {}
    for kind in ("serial", "vectorized"):
        raw = _cis_raw(executor={"threads": 1, "kind": kind})
        raw["train"] = {**raw["train"], "momentum": 0.5}
        res = run_experiment(load_config(raw=raw), run_dir=tmp_path / kind)
        hist[kind] = res.history
    for a, b in zip(hist["serial"], hist["vectorized"], strict=True):
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-4)
        assert a["exit1_accuracy"] == pytest.approx(b["exit1_accuracy"], abs=2e-3)


def test_lr_scale_is_the_tasks_learning_rate(tmp_path) -> None:
    """constant schedule at lr 0.1 ≡ a plan scaled by 0.5 at lr 0.2 (serial executor)."""
    from fedclock.experiment import run_experiment

    raw = _cis_raw(executor={"threads": 1, "kind": "serial"})
    raw["strategy"] = {"name": "cis-serving", "lr_schedule": "constant"}
    one = run_experiment(load_config(raw=raw), run_dir=tmp_path / "one")
    import fedclock.strategies.cis as cis

    orig = cis.cosine_lr_scale
    try:
        cis.cosine_lr_scale = lambda *a, **k: 0.5  # type: ignore[assignment]
        raw2 = _cis_raw(executor={"threads": 1, "kind": "serial"})
        raw2["train"] = {**raw2["train"], "lr": 0.2}
        two = run_experiment(load_config(raw=raw2), run_dir=tmp_path / "two")
    finally:
        cis.cosine_lr_scale = orig
    for a, b in zip(one.history, two.history, strict=True):
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-5)


def test_build_tree_none_without_a_tree() -> None:
    assert build_tree(SimpleNamespace(tree=None)) is None


def test_cli_run_and_exit_plot(tmp_path) -> None:
    """A new user's path: a CIS config from the CLI, then the per-exit plot of the run."""
    import yaml
    from typer.testing import CliRunner

    from fedclock.cli import app

    cfg = tmp_path / "cis.yaml"
    cfg.write_text(yaml.safe_dump(_cis_raw(budget={"aggregations": 2})))
    runner = CliRunner()
    res = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "run"), "-q"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["plot", str(tmp_path / "run"), "--metric", "exits"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "run" / "exits.png").stat().st_size > 0
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "metrics.csv").write_text("virtual_time,aggregation,test_accuracy\n0,0,0.1\n")
    res = runner.invoke(app, ["plot", str(plain), "--metric", "exits"])
    assert res.exit_code != 0 and "no exit columns" in res.output


def test_exit_plot_honours_y_min(tmp_path, ylims) -> None:
    """`plot --metric exits --y-min Y` starts every panel's axis at Y (it was ignored) and
    ends it 5 % of the drawn span above the panel's highest point (the autoscaled top came
    from the whole curve and could pass 1): exit 1 tops at 0.8, exit 2 at 0.9, CIS at 0.85."""
    import numpy as np
    from typer.testing import CliRunner

    from fedclock.cli import app

    run = tmp_path / "run"
    run.mkdir()
    rows = ["virtual_time,aggregation,exit1_accuracy,exit2_accuracy,cis_accuracy"]
    rows += [f"{t},{t},{0.5 + 0.1 * t},{0.6 + 0.1 * t},{0.55 + 0.1 * t}" for t in range(4)]
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")
    limits = ylims
    res = CliRunner().invoke(app, ["plot", str(run), "--metric", "exits", "--y-min", "0.7"])
    assert res.exit_code == 0, res.output
    assert len(limits) == 3 and np.allclose([lo for lo, _ in limits], 0.7)
    tops = [hi + 0.05 * (hi - 0.7) for hi in (0.8, 0.9, 0.85)]
    assert np.allclose([hi for _, hi in limits], tops)


# ----------------------------------------------------------------------------- second pass
# (issue 29: the exit draw, the paper's local work, momentum, the reference-mode departures
# one at a time, η_s on buffers, σ in summary.json, the headline metric, the shrunk-schedule note)
@pytest.mark.parametrize(("eps", "rule"), [(0.2, "paper"), (0.3, "code"), (0.0, "paper")])
def test_exit_draws_follow_the_p_matrix(eps: float, rule: str) -> None:
    """ExitWork.draw over 20,000 rounds (the simulator's own random streams): every (node,
    exit) pair is drawn n·p_{i,e} times within 5 binomial standard deviations (a pair with
    p = 0 never), each round's draws independent of the others' nodes."""
    from fedclock.rng import stream
    from fedclock.strategies.cis import ExitWork

    tree = TREES["4-2-1"]
    p = p_matrix(tree, eps, rule)
    work = ExitWork.__new__(ExitWork)
    work.tree, work.p = tree, p
    ctx = SimpleNamespace(rng=lambda purpose, *ids: stream(9, purpose, *ids))
    n = 20_000
    counts = np.zeros_like(p)
    for r in range(n):
        drawn = work.draw(ctx, r)  # type: ignore[arg-type]
        counts[np.arange(tree.size), drawn - 1] += 1
    bound = 5 * np.sqrt(n * p * (1 - p))
    assert np.all(np.abs(counts - n * p) <= bound), (counts / n, p)
    assert np.all(counts[p == 0] == 0)
    assert counts.sum(1).tolist() == [n] * tree.size


def test_the_papers_local_work_is_an_epoch_of_the_largest_node() -> None:
    """``strategy.local_work: epoch-of-largest``: every node runs ⌈max|S_i|/B⌉ steps (MNIST's
    equal split: root 20,000 → 157 at B = 128; the highly biased one: 46,020 → 360), a
    fractional train.local_epochs scales it; train.local_steps with it is one sentence."""
    from fedclock.strategies.cis import epoch_of_largest

    assert epoch_of_largest([20_000, 10_000, 5_000], 128, None, None) == 157
    assert epoch_of_largest([46_020, 5_970, 510], 128, None, 1.0) == 360
    assert epoch_of_largest([15_000, 7_500, 3_750], 128, None, 1.0) == 118  # CIFAR: 117 + partial
    assert epoch_of_largest([20_000, 10_000], 128, None, 0.5) == 79
    with pytest.raises(FedclockConfigError, match=r"drop train\.local_steps"):
        epoch_of_largest([20_000], 128, 10, None)


def test_local_work_and_momentum_reach_the_tasks() -> None:
    """Built from a config: epoch-of-largest gives every node's task the largest node's
    epoch of steps, and momentum_state picks the executor's per-node momentum (null: task
    in paper mode, node in reference mode)."""
    from fedclock.strategies.base import BuildInfo
    from fedclock.strategies.cis import build_cis

    def build(train: dict | None = None, **strategy: object):
        raw = _cis_raw(strategy={"name": "cis-serving", **strategy})
        if train is not None:
            raw["train"] = train
        model = ee_cnn((1, 8, 8), 10, [4, 4, 8])
        sizes = np.array([300, 100, 100, 40, 40, 40, 40])
        info = BuildInfo(client_sizes=sizes, layer_fwd_flops=(), layer_bwd_flops=(),
                         model_bytes=0, model=model)  # fmt: skip
        return build_cis(load_config(raw=raw), info)

    s = build({"batch_size": 16, "lr": 0.05}, local_work="epoch-of-largest")
    assert [s.planner._plans[i].local_steps for i in range(7)] == [19] * 7  # ⌈300/16⌉
    # epochs of ⌈n/16⌉ batches, the last partial: 100 → 2 epochs + 5 batches, 40 → 6 + 1
    assert [s.planner._plans[i].samples for i in (0, 1, 3)] == [300, 2 * 100 + 5 * 16, 6 * 40 + 16]
    s = build({"batch_size": 16, "lr": 0.05, "local_steps": 4})
    assert {s.planner._plans[i].local_steps for i in range(7)} == {4}
    with pytest.raises(FedclockConfigError, match=r"drop train\.local_steps"):
        build({"batch_size": 16, "lr": 0.05, "local_steps": 4}, local_work="epoch-of-largest")
    assert build().needs.momentum_per_client is False
    assert build(mode="reference").needs.momentum_per_client is True
    assert build(momentum_state="node").needs.momentum_per_client is True
    assert build(mode="reference", momentum_state="task").needs.momentum_per_client is False


def _two_nodes() -> tuple[dict, ModelVersion, list, torch.Tensor]:
    """The round of test_server_update_two_nodes_hand_computed, with a float and an integer
    buffer (root 3 / leaf 2, counts 7 / 5)."""
    tree = Tree((-1, 0), (2, 1), (0.0, 1.0), (INF, INF))
    one = torch.ones(2, dtype=torch.float64)
    z = torch.zeros(2, dtype=torch.float64)
    bufs = {"bn": one.clone(), "count": torch.tensor(1)}
    base = ModelVersion(0, {"trunk": one.clone(), "head1": one.clone(), "head2": one.clone()},
                        bufs)  # fmt: skip
    root = _contribution(0, 2, 2, {"trunk": 2 * one, "head1": z, "head2": 3 * one}, base,
                         {"bn": 3 * one, "count": torch.tensor(7)})  # fmt: skip
    leaf = _contribution(1, 1, 1, {"trunk": 4 * one, "head1": 5 * one, "head2": z}, base,
                         {"bn": 2 * one, "count": torch.tensor(5)})  # fmt: skip
    kw = {"tree": tree, "p": p_matrix(tree, 0.5), "sizes": np.array([30.0, 10.0]),
          "weights": lambda t: np.array([0.75, 0.25]), "server": ServerOptimizer(lr=1.0),
          "head_params": [("head1",), ("head2",)]}  # fmt: skip
    return kw, base, [root, leaf], one


@pytest.mark.parametrize(
    ("switch", "trunk", "head2", "head1"),
    [
        # Λ̃·|S_i|/|S_{e,p}| = 0.25 (root, exit 2) and 0.1875 (leaf, exit 1); p = 0.5 / 1
        ({}, 2.75, 2.5, 1.9375),  # line 8: root 0.25/0.5 = 0.5, leaf 0.1875
        ({"p_factor": "none"}, 1 + 0.25 * 2 + 0.75, 1 + 0.25 * 3, 1.9375),
        ({"p_factor": "multiply"}, 1 + 0.125 * 2 + 0.75, 1 + 0.125 * 3, 1.9375),
        # the root's model (1 + Δ_root), the leaf's update against it: + 0.1875·(4 − 2)
        ({"root_in_place": True}, 3 + 0.1875 * 2, 4.0, 1 + 0.1875 * 5),
        ({"lower_heads": "root"}, 2.75, 2.5, 1.0),  # head1: the root's (untrained: w)
    ],
)
def test_each_reference_departure_alone(switch: dict, trunk: float, head2: float,
                                        head1: float) -> None:  # fmt: skip
    """Paper mode with one of the authors' departures turned on (hand-computed)."""
    kw, base, contribs, one = _two_nodes()
    new = cis_update(mode="paper", **kw, **switch).aggregate(None, base, contribs)  # type: ignore[arg-type]
    torch.testing.assert_close(new.params["trunk"], trunk * one)
    torch.testing.assert_close(new.params["head2"], head2 * one)
    torch.testing.assert_close(new.params["head1"], head1 * one)


def test_reference_mode_is_the_three_departures_together() -> None:
    """mode reference ≡ mode paper with p multiplied, the root in place and the lower heads
    the root's — tensor for tensor on a random round of the 4-2-1 tree at ε = 0.2, buffers
    included; and mode paper ≡ mode reference with the three switched back."""
    tree = TREES["4-2-1"]
    p = p_matrix(tree, 0.2)
    g = torch.Generator().manual_seed(3)
    names = ("stem", "block1", "block2", "heads.0", "heads.1", "heads.2")
    base = ModelVersion(4, {n: torch.randn(3, generator=g, dtype=torch.float64) for n in names},
                        {"bn": torch.randn(3, generator=g, dtype=torch.float64)})  # fmt: skip
    exits = (2, 1, 2, 1, 1, 1, 1)
    contribs = []
    for i, e in enumerate(exits):
        delta = {n: torch.randn(3, generator=g, dtype=torch.float64) for n in names}
        plan = TaskPlan(1, 1, 1, shape=Exit(e, tree.exit[i]))
        task = Task(0, i, 0, base, plan, TaskCost(0, 0, 0), TaskTiming(0, 0, 0), 0.0)
        cover = {n: n in names[:e] or n == f"heads.{e - 1}" for n in names}
        bufs = {"bn": base.buffers["bn"] + torch.randn(3, generator=g, dtype=torch.float64)}
        contribs.append(Contribution(task, delta, bufs, 1, 0.0, coverage=cover))
    kw = {"tree": tree, "p": p, "sizes": np.array([20.0, 10, 10, 5, 5, 5, 5]),
          "weights": lambda t: np.array([0.8, 0.15, 0.05]), "server": ServerOptimizer(lr=0.7),
          "head_params": [("heads.0",), ("heads.1",), ("heads.2",)]}  # fmt: skip
    three = {"p_factor": "multiply", "root_in_place": True, "lower_heads": "root"}
    back = {"p_factor": "divide", "root_in_place": False, "lower_heads": "aggregate"}
    for a, b in (({"mode": "reference"}, {"mode": "paper", **three}),
                 ({"mode": "paper"}, {"mode": "reference", **back})):  # fmt: skip
        x = cis_update(**kw, **a).aggregate(None, base, contribs)  # type: ignore[arg-type]
        y = cis_update(**kw, **b).aggregate(None, base, contribs)  # type: ignore[arg-type]
        for n in names:
            torch.testing.assert_close(x.params[n], y.params[n], rtol=0, atol=0)
        torch.testing.assert_close(x.buffers["bn"], y.buffers["bn"], rtol=0, atol=0)
    ref = cis_update(**kw, mode="reference").aggregate(None, base, contribs)  # type: ignore[arg-type]
    pap = cis_update(**kw, mode="paper").aggregate(None, base, contribs)  # type: ignore[arg-type]
    assert not torch.equal(ref.params["stem"], pap.params["stem"])


def test_server_lr_moves_float_buffers_too() -> None:
    """η_s = 0.5 halves the step of every parameter and floating-point buffer (BatchNorm
    statistics): bn ← 1 + 0.5·(0.5·(3 − 1) + 0.1875·(2 − 1)) = 1.59375; the integer count is
    the deepest task's (the root's 7) whatever η_s."""
    kw, base, contribs, one = _two_nodes()
    full = cis_update(mode="paper", **kw).aggregate(None, base, contribs)  # type: ignore[arg-type]
    torch.testing.assert_close(full.buffers["bn"], (1 + 0.5 * 2 + 0.1875) * one)
    half = cis_update(mode="paper", **{**kw, "server": ServerOptimizer(lr=0.5)}).aggregate(
        None, base, contribs
    )  # type: ignore[arg-type]
    torch.testing.assert_close(half.params["trunk"], 1.875 * one)
    torch.testing.assert_close(half.buffers["bn"], 1.59375 * one)
    assert int(half.buffers["count"]) == 7
    ref = cis_update(mode="reference", **{**kw, "server": ServerOptimizer(lr=0.5)}).aggregate(
        None, base, contribs
    )  # type: ignore[arg-type]
    # reference: the root's bn (3), the leaf's against it (coef 0.1875·1): 3 − 0.1875; halved
    torch.testing.assert_close(ref.buffers["bn"], (1 + 0.5 * (2 - 0.1875)) * one)


def test_balanced_sigma_in_summary_and_table(tmp_path) -> None:
    """cis-balanced writes the σ it measured (and its Λ̃) to summary.json, the values
    gradient_variance gives on the same samples of the initial model, and the CLI's summary
    table shows them; a given σ is written as given."""
    import json

    import yaml
    from typer.testing import CliRunner

    from fedclock.cli import app
    from fedclock.experiment import run_experiment

    raw = _cis_raw(strategy={"name": "cis-balanced", "sigma_samples": 16},
                   budget={"aggregations": 1})  # fmt: skip
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "m")
    sigma = res.summary["cis_sigma"]
    assert len(sigma) == 3 and all(s > 0 for s in sigma)
    assert json.loads((tmp_path / "m" / "summary.json").read_text())["cis_sigma"] == sigma
    assert sum(res.summary["cis_lambda_tilde"]) == pytest.approx(1.0)
    raw["strategy"]["sigma"] = [0.00374, 0.00224, 0.00101]
    cfg = tmp_path / "b.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / "g")])
    assert out.exit_code == 0, out.output
    assert "cis_sigma" in out.output and "0.00374 / 0.00224 / 0.00101" in out.output
    assert "0.486 / 0.195 / 0.319" in out.output  # the spec's CIFAR-10 example at 80-15-5
    got = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert got["cis_sigma"] == [0.00374, 0.00224, 0.00101]


def test_measured_sigma_is_gradient_variance_of_the_initial_model() -> None:
    """The σ build_cis reports is gradient_variance on the seed's sigma_samples draw."""
    from fedclock.models.early_exit import exit_view
    from fedclock.strategies.base import BuildInfo
    from fedclock.strategies.cis import build_cis

    cfg = load_config(raw=_cis_raw(strategy={"name": "cis-balanced", "sigma_samples": 12}))
    model = ee_cnn((1, 8, 8), 10, [4, 4, 8])
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 1, 8, 8, generator=g), torch.randint(0, 10, (40,), generator=g)
    info = BuildInfo(client_sizes=np.full(7, 40), layer_fwd_flops=(), layer_bwd_flops=(),
                     model_bytes=0, model=model, train=(x, y))  # fmt: skip
    got = build_cis(cfg, info).summary["cis_sigma"]
    pick = torch.randperm(40, generator=torch.Generator().manual_seed(cfg.seed))[:12]
    want = gradient_variance(model, x[pick], y[pick], exit_view(model, (1, 8, 8)))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_progress_bar_shows_the_headline_metric() -> None:
    """The bar shows cis_accuracy (not the last exit's accuracy) where the run has one."""
    from rich.console import Console

    from fedclock.cli import _Bar, _progress

    cfg = load_config(raw=_cis_raw())
    with _progress(Console(quiet=True), quiet=False) as progress:
        bar = _Bar(progress, cfg, "cis")
        sim = SimpleNamespace(now=3.0, stop_reason="done", counters=SimpleNamespace(
            aggregations=2, updates_used=14),
            history=[{"test_accuracy": 0.094, "cis_accuracy": 0.248}])  # fmt: skip
        bar(sim)
        status = progress.tasks[0].fields["status"]
        assert "cis=0.248" in status and "0.094" not in status
        sim.history = [{"test_accuracy": 0.5}]
        bar._last = 0.0
        bar(sim)
        assert "acc=0.500" in progress.tasks[0].fields["status"]


def test_a_shorter_budget_than_the_configs_is_noted(tmp_path) -> None:
    """--set budget.aggregations below the config's: one line says the cosine schedule (and
    cis-flops's ramp) shrink with it; the same budget, a longer one, or a constant schedule
    say nothing."""
    import yaml
    from typer.testing import CliRunner

    from fedclock.cli import _shrunk_schedule, app

    raw = _cis_raw(budget={"aggregations": 3})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["run", str(cfg), "--set", "budget.aggregations=1",
                                   "--out", str(tmp_path / "r")])  # fmt: skip
    assert res.exit_code == 0, res.output
    notes = [line for line in res.output.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "shorter than the 3" in notes[0], res.output
    assert "lr_min at round 1" in notes[0]
    shorter = load_config(raw=raw, overrides=["budget.aggregations=2"])
    assert _shrunk_schedule(raw, shorter) is not None
    assert _shrunk_schedule(raw, load_config(raw=raw)) is None
    assert _shrunk_schedule(raw, load_config(raw=raw, overrides=["budget.aggregations=9"])) is None
    const = load_config(raw=raw, overrides=["budget.aggregations=2",
                                            "strategy.lr_schedule=constant"])  # fmt: skip
    assert _shrunk_schedule(raw, const) is None
    flops = load_config(raw=raw, overrides=["budget.aggregations=2", "strategy.name=cis-flops",
                                            "strategy.lr_schedule=constant"])  # fmt: skip
    assert "ramp ends at round 2" in (_shrunk_schedule(raw, flops) or "")
    res = CliRunner().invoke(app, ["run", str(cfg), "--set", "budget.aggregations=1", "-q",
                                   "--out", str(tmp_path / "q")])  # fmt: skip
    assert res.exit_code == 0 and "note:" not in res.output


def test_also_serving_routes_the_same_models_again(tmp_path) -> None:
    """cis.also_serving: a cis-equal run at 80-15-5 with also_serving [5-15-80] records
    cis_accuracy_5-15-80, equal at every evaluation to the cis_accuracy of the same run made
    at 5-15-80 (Equal Weight trains the same whatever the serving rates); a bad setting is
    one sentence."""
    from fedclock.experiment import run_experiment

    raw = _cis_raw(strategy={"name": "cis-equal"}, eval={"every_aggregations": 1})
    raw["cis"] = {**raw["cis"], "also_serving": ["5-15-80"]}
    a = run_experiment(load_config(raw=raw), run_dir=tmp_path / "a")
    raw2 = _cis_raw(strategy={"name": "cis-equal"}, eval={"every_aggregations": 1})
    raw2["cis"] = {**raw2["cis"], "serving": "5-15-80"}
    b = run_experiment(load_config(raw=raw2), run_dir=tmp_path / "b")
    got = [r["cis_accuracy_5-15-80"] for r in a.history]
    assert got == [r["cis_accuracy"] for r in b.history] and len(got) == 4
    assert got != [r["cis_accuracy"] for r in a.history]
    assert a.summary["cis_accuracy_5-15-80"] == b.summary["cis_accuracy"]
    raw["cis"]["also_serving"] = ["a-b"]
    with pytest.raises(FedclockConfigError, match="not a list of shares"):
        run_experiment(load_config(raw=raw), run_dir=tmp_path / "c")


def test_a_cis_comparison_plots_its_headline_metric(tmp_path, monkeypatch) -> None:
    """compare's accuracy.png shows routed CIS accuracy for early-exit runs (test_accuracy
    there is the last exit's alone, which Serving trains least), and test accuracy else."""
    from fedclock.runs import compare

    seen: list[tuple[str, str]] = []
    real = compare.plot_groups

    def spy(groups, out, **kw):
        seen.append((kw["metric"], kw["title"]))
        return real(groups, out, **kw)

    monkeypatch.setattr(compare, "plot_groups", spy)
    cfg = load_config(raw=_cis_raw(budget={"aggregations": 2}))
    compare.run_compare(cfg, ["cis-serving", "cis-equal"], [1], tmp_path / "cis")
    cfg = load_config(raw=tiny_raw(budget={"aggregations": 2}, executor={"threads": 1}))
    compare.run_compare(cfg, ["fedavg"], [1], tmp_path / "plain")
    assert seen[0][0] == "cis_accuracy" and "CIS accuracy (seed 1)" in seen[0][1]
    assert seen[1][0] == "test_accuracy" and "test accuracy (seed 1)" in seen[1][1]
    assert (tmp_path / "cis" / "accuracy.png").stat().st_size > 1000
    # table.md names the early-exit run's test accuracy for what it is: the last exit's
    head = (tmp_path / "cis" / "table.md").read_text().splitlines()[0]
    assert "CIS acc" in head and "last-exit acc" in head and "final acc" not in head
    assert "final acc" in (tmp_path / "plain" / "table.md").read_text().splitlines()[0]
    from fedclock.report import write_report

    page = write_report(tmp_path / "cis").read_text()  # the report's table says it too
    assert "last-exit acc" in page and "final acc" not in page
