"""scripts/cis_authors_loop.py, the independent cross-check of CIS reference mode."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.conftest import load_script, require_data


def _module():
    return load_script("cis_authors_loop")


def test_the_hand_written_cnn_is_fedclocks_ee_cnn() -> None:
    """Same tensors in the same order, and with fedclock's weights loaded the same logits:
    the script's CNN is ``ee_cnn`` with channels [16, 16, 32] written out by hand."""
    from fedclock.models.early_exit import ee_cnn

    ours = _module().EECNN()
    theirs = ee_cnn((1, 28, 28), 10, [16, 16, 32])
    a, b = list(ours.state_dict().items()), list(theirs.state_dict().items())
    assert [v.shape for _, v in a] == [v.shape for _, v in b] and len(a) == 20
    ours.load_state_dict({k: v for (k, _), (_, v) in zip(a, b, strict=True)})
    x = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(torch.stack(ours(x), 1), theirs(x), rtol=0, atol=0)
        assert len(ours(x, upto=1)) == 1


def test_data_split_per_layer() -> None:
    m = _module()
    assert m.split_sizes(60_000, "equal") == [20_000, 10_000, 10_000, 5_000, 5_000, 5_000, 5_000]
    assert m.split_sizes(60_000, "highly-biased")[:4] == [46_020, 5_970, 5_970, 510]


def _tree_round(m, exits: dict[int, int]):
    """Hand-set local results on the 4-2-1 tree (float64): node i trained exit exits[i] from
    w, changing the entries up to it and its head by Δ_i (other tensors it holds stay w)."""
    g = torch.Generator().manual_seed(0)
    w = {k: v.double() for k, v in m.EECNN((2, 3, 4)).state_dict().items()}
    delta, nodes = {}, {}
    for i, e in exits.items():
        trained = (*m.ENTRIES[:e], m.HEADS[e - 1])
        delta[i] = {k: torch.randn(v.shape, generator=g, dtype=torch.float64) * k.startswith(trained)
                    for k, v in w.items()}  # fmt: skip
        nodes[i] = {k: w[k] + delta[i][k] for k in w if m.held(k, m.EXIT[i])}
    return w, delta, nodes


def test_aggregation_on_the_tree_at_epsilon_0() -> None:
    """The authors' update, worked out (spec §3.4): stem (shared by all exits) w + Λ̃1·mean
    Δ_leaf + Λ̃2·mean Δ_mid + Λ̃3·Δ_root (Algorithm 1's line 8 too); block 1 w + Λ̃2·mean
    Δ_mid + (1 − Λ̃2)·Δ_root; block 2 and the exit-3 head w + Δ_root; the exit-1 and exit-2
    heads stay w although leaves and mid nodes trained them."""
    m = _module()
    exits = {i: top for i, top in enumerate(m.EXIT)}
    w, d, nodes = _tree_round(m, exits)
    lam = m.lambda_tilde("serving", [80, 15, 5])
    np.testing.assert_allclose(lam, [0.8, 0.15, 0.05])
    coef = m.coefficients(exits, m.split_sizes(60_000, "equal"), lam, 0.0)
    assert coef == pytest.approx({0: 0.05, 1: 0.075, 2: 0.075, 3: 0.2, 4: 0.2, 5: 0.2, 6: 0.2})
    out = m.aggregate(nodes[0], nodes, exits, coef)  # the cloud is the root's trained model
    leaf = {k: sum(d[i][k] for i in (3, 4, 5, 6)) / 4 for k in w}
    mid = {k: (d[1][k] + d[2][k]) / 2 for k in w}
    for k in w:
        if k.startswith("stem."):
            want = w[k] + 0.8 * leaf[k] + 0.15 * mid[k] + 0.05 * d[0][k]
        elif k.startswith("block1."):
            want = w[k] + 0.15 * mid[k] + 0.85 * d[0][k]
        elif k.startswith(("block2.", "head3.")):
            want = w[k] + d[0][k]
        else:
            want = w[k]
            assert leaf[k].abs().sum() + mid[k].abs().sum() > 0  # they did train them
        torch.testing.assert_close(out[k], want, rtol=1e-12, atol=1e-12)


def test_coefficients_and_aggregation_with_epsilon() -> None:
    """ε = 0.4 (the authors' p: 1 − ε own exit, ε/(E_i − 1) each lower one, multiplied):
    a mid node training exit 1 (S_{1,p} = all 60k) moves only the stem, the root training
    exit 2 (S_{2,p} = mid nodes + root, 40k) the stem and block 1."""
    m = _module()
    assert [m.p_exit(3, e, 0.4) for e in (1, 2, 3)] == pytest.approx([0.2, 0.2, 0.6])
    assert [m.p_exit(2, e, 0.4) for e in (1, 2, 3)] == pytest.approx([0.4, 0.6, 0.0])
    assert m.p_exit(1, 1, 0.4) == 1.0
    exits = {0: 2, 1: 1, 3: 1}
    sizes = m.split_sizes(60_000, "equal")
    lam = [0.5, 0.3, 0.2]
    coef = m.coefficients(exits, sizes, lam, 0.4)
    assert coef == pytest.approx(
        {0: 0.3 * 20_000 / 40_000 * 0.2, 1: 0.5 * 10_000 / 60_000 * 0.4, 3: 0.5 * 5_000 / 60_000}
    )
    w, d, nodes = _tree_round(m, exits)
    out = m.aggregate(nodes[0], nodes, exits, coef)
    for k in w:
        if k.startswith("stem."):
            want = w[k] + d[0][k] + coef[1] * (d[1][k] - d[0][k]) + coef[3] * (d[3][k] - d[0][k])
        else:  # block 1: the root's; block 2 and every head: untouched by the mid and the leaf
            want = w[k] + d[0][k]
        torch.testing.assert_close(out[k], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("epsilon", "exits"),
    [(0.0, dict(enumerate((3, 2, 2, 1, 1, 1, 1)))), (0.4, {0: 2, 1: 1, 2: 2, 3: 1, 6: 1})],
)
def test_aggregation_equals_fedclocks_reference_mode(epsilon: float, exits: dict) -> None:
    """The same hand-set round through fedclock's ``cis_update`` in reference mode
    (p_rule code, the 4-2-1 tree at serving 80-15-5, the tensors renamed by position): the
    same new model, tensor for tensor."""
    from fedclock.devices.topology import TREES
    from fedclock.models.early_exit import ee_cnn
    from fedclock.models.shapes import Exit
    from fedclock.sim.types import ModelVersion
    from fedclock.strategies.cis import cis_update, lambda_tilde, p_matrix
    from fedclock.strategies.server import ServerOptimizer

    m = _module()
    w, d, nodes = _tree_round(m, exits)
    names = dict(zip(w, ee_cnn((1, 28, 28), 10, [2, 3, 4]).state_dict(), strict=True))
    sizes = m.split_sizes(60_000, "equal")
    lam = m.lambda_tilde("serving", [80, 15, 5])
    ours = m.aggregate(nodes[0], nodes, exits, m.coefficients(exits, sizes, lam, epsilon))

    class Contribution:  # the fields the CIS update reads
        def __init__(self, i: int, e: int) -> None:
            self.client, self.weight, self.buffers = i, None, {}
            self.task = SimpleNamespace(plan=SimpleNamespace(shape=Exit(e, m.EXIT[i])))
            self.delta = {names[k]: v for k, v in d[i].items()}
            trained = (*m.ENTRIES[:e], m.HEADS[e - 1])
            self.coverage = {names[k]: k.startswith(trained) for k in w}

        def covers(self, name: str) -> bool:
            return self.coverage[name]

    tree = TREES["4-2-1"].with_serving((80, 15, 5))
    fixed = lambda_tilde("serving", serving=tree.serving_rates())
    np.testing.assert_allclose(fixed, lam)
    agg = cis_update(
        tree=tree, p=p_matrix(tree, epsilon, "code"), sizes=np.asarray(sizes, float),
        weights=lambda t: fixed, server=ServerOptimizer(lr=1.0), mode="reference",
        head_params=[tuple(n for n in names.values() if n.startswith(f"heads.{e}."))
                     for e in range(3)],
    )  # fmt: skip
    base = ModelVersion(version=0, params={names[k]: v for k, v in w.items()})
    theirs = agg.aggregate(None, base, [Contribution(i, e) for i, e in exits.items()])  # type: ignore[arg-type]
    for k in w:
        torch.testing.assert_close(theirs.params[names[k]], ours[k], rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- paper mode
def test_paper_p_and_coefficients_hand_computed() -> None:
    """The paper's p (ε per lower exit) and line 8's Λ̃_e·|S_i|/|S_{e,p}|/p_{i,e}: ε = 0.2,
    Λ̃ = (0.5, 0.3, 0.2), equal split. The root training exit 1 (p 0.2, S_{1,p} = 60k):
    0.5·20k/60k/0.2; a mid node its own exit 2 (p 0.8, S_{2,p} = mid + root = 40k):
    0.3·10k/40k/0.8; a leaf exit 1 (p 1): 0.5·5k/60k."""
    m = _module()
    assert [m.p_paper(3, e, 0.2) for e in (1, 2, 3)] == pytest.approx([0.2, 0.2, 0.6])
    assert [m.p_paper(2, e, 0.2) for e in (1, 2, 3)] == pytest.approx([0.2, 0.8, 0.0])
    assert m.p_paper(1, 1, 0.2) == 1.0
    coef = m.paper_coefficients({0: 1, 1: 2, 3: 1}, m.split_sizes(60_000, "equal"),
                                [0.5, 0.3, 0.2], 0.2)  # fmt: skip
    assert coef == pytest.approx(
        {0: 0.5 * 20_000 / 60_000 / 0.2, 1: 0.3 * 10_000 / 40_000 / 0.8, 3: 0.5 * 5_000 / 60_000}
    )
    w, d, _ = _tree_round(m, {0: 1, 1: 2, 3: 1})
    full = {i: {k: w[k] + d[i][k] for k in w} for i in d}
    out = m.paper_aggregate(w, full, {0: 1, 1: 2, 3: 1}, coef, server_lr=0.5)
    for k in w:
        want = w[k].clone()
        if k.startswith(("stem.", "head1.")):
            want += 0.5 * (coef[0] * d[0][k] + coef[3] * d[3][k])
        if k.startswith(("stem.", "block1.", "head2.")):
            want += 0.5 * coef[1] * d[1][k]
        torch.testing.assert_close(out[k], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("epsilon", "exits"),
    [(0.0, dict(enumerate((3, 2, 2, 1, 1, 1, 1)))),
     (0.2, {0: 1, 1: 1, 2: 2, 3: 1, 4: 1, 5: 1, 6: 1}),
     (0.3, {0: 2, 1: 2, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1})],
)  # fmt: skip
def test_paper_aggregation_equals_fedclocks_paper_mode(epsilon: float, exits: dict) -> None:
    """A hand-set round (every node, exits as given) through the script's line 8 and through
    fedclock's ``cis_update`` in paper mode (p_rule paper, serving 80-15-5, η_s 0.7, the
    tensors renamed by position): the same new model, tensor for tensor — heads included,
    which paper mode aggregates like every other tensor."""
    from fedclock.devices.topology import TREES
    from fedclock.models.early_exit import ee_cnn
    from fedclock.models.shapes import Exit
    from fedclock.sim.types import ModelVersion
    from fedclock.strategies.cis import cis_update, lambda_tilde, p_matrix
    from fedclock.strategies.server import ServerOptimizer

    m = _module()
    w, d, _ = _tree_round(m, exits)
    names = dict(zip(w, ee_cnn((1, 28, 28), 10, [2, 3, 4]).state_dict(), strict=True))
    sizes = m.split_sizes(60_000, "highly-biased")
    lam = m.lambda_tilde("serving", [80, 15, 5])
    full = {i: {k: w[k] + d[i][k] for k in w} for i in exits}
    ours = m.paper_aggregate(w, full, exits, m.paper_coefficients(exits, sizes, lam, epsilon),
                             server_lr=0.7)  # fmt: skip

    class Contribution:  # the fields the CIS update reads
        def __init__(self, i: int, e: int) -> None:
            self.client, self.weight, self.buffers = i, None, {}
            self.task = SimpleNamespace(plan=SimpleNamespace(shape=Exit(e, m.EXIT[i])))
            self.delta = {names[k]: v for k, v in d[i].items()}
            trained = (*m.ENTRIES[:e], m.HEADS[e - 1])
            self.coverage = {names[k]: k.startswith(trained) for k in w}

        def covers(self, name: str) -> bool:
            return self.coverage[name]

    tree = TREES["4-2-1"].with_serving((80, 15, 5))
    fixed = lambda_tilde("serving", serving=tree.serving_rates())
    agg = cis_update(
        tree=tree, p=p_matrix(tree, epsilon, "paper"), sizes=np.asarray(sizes, float),
        weights=lambda t: fixed, server=ServerOptimizer(lr=0.7), mode="paper",
        head_params=[tuple(n for n in names.values() if n.startswith(f"heads.{e}."))
                     for e in range(3)],
    )  # fmt: skip
    base = ModelVersion(version=0, params={names[k]: v for k, v in w.items()})
    theirs = agg.aggregate(None, base, [Contribution(i, e) for i, e in exits.items()])  # type: ignore[arg-type]
    for k in w:
        torch.testing.assert_close(theirs.params[names[k]], ours[k], rtol=1e-12, atol=1e-12)


def test_a_tiny_paper_run_moves_every_head() -> None:
    """Two paper-mode rounds on random data at ε = 0: every tensor moved (the lower heads
    too, unlike the authors' loop), and the run is a function of the seed."""
    m = _module()
    args = m.parser().parse_args(
        ["--data-dir", "-", "--rounds", "2", "--local-steps", "2", "--batch-size", "8",
         "--mode", "paper", "--weight-decay", "5e-4"]
    )  # fmt: skip
    args.shares = [80.0, 15.0, 5.0]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(140, 1, 28, 28, generator=g), torch.randint(0, 10, (140,), generator=g)
    server, init = m.train_paper(args, x, y)
    for k, v in server.state_dict().items():
        assert not torch.equal(v, init[k]), k
    again, _ = m.train_paper(args, x, y)
    for k, v in server.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k


def test_cascade_on_a_hand_made_table() -> None:
    """4 test points. Exit 1 serves the lowest-entropy points 0 and 2 (hits: 0); exit 2 the
    lower of the rest, 3 (a hit, though point 0 has the lowest exit-2 entropy: already
    served); exit 3 point 1 (a hit): 0.75. At 30-30-40 the boundary points are split:
    exit 1: 0.25 of point 0 (hit) + 0.05 of point 2; exit 2: 0.2 of point 2 + 0.1 of point 3
    (hit); exit 3: 0.15 of point 3 + 0.25 of point 1 (hit): 0.6."""
    m = _module()
    entropy = np.array([[0.1, 0.9, 0.3, 0.5], [0.0, 0.7, 0.2, 0.4], [0.5, 0.5, 0.5, 0.5]])
    correct = np.array([[1, 1, 0, 1], [0, 0, 0, 1], [0, 1, 1, 0]], dtype=float)
    assert m.cascade(entropy, correct, [50, 25, 25]) == pytest.approx(0.75)
    assert m.cascade(entropy, correct, [30, 30, 40]) == pytest.approx(0.6)
    assert m.cascade(entropy, correct, [0, 0, 1]) == pytest.approx(0.5)  # exit 3 alone


def test_a_tiny_run_keeps_the_lower_heads_and_broadcasts() -> None:
    """Two rounds on random data at ε = 0: the cloud's exit-1/2 heads are still the initial
    ones, every node holds the cloud's tensors, the rest moved; the learning rate followed
    the cosine schedule (torch's, stepped once per round)."""
    m = _module()
    args = m.parser().parse_args(
        ["--data-dir", "-", "--rounds", "2", "--local-steps", "2", "--batch-size", "8"]
    )
    args.shares = [80.0, 15.0, 5.0]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(140, 1, 28, 28, generator=g), torch.randint(0, 10, (140,), generator=g)
    cloud, models, init = m.train(args, x, y)
    assert cloud is models[m.ROOT]
    for k, v in cloud.state_dict().items():
        assert torch.equal(v, init[k]) == k.startswith(("head1.", "head2.")), k
        for i, node in enumerate(models):
            if m.held(k, m.EXIT[i]):
                assert torch.equal(node.state_dict()[k], v)


@pytest.mark.slow
def test_agrees_with_fedclock_reference_mode(tmp_path, capsys) -> None:
    """10 rounds, serving 80-15-5, Serving Rate, seed 9: the script and fedclock's
    ``cis-table1`` preset in reference mode. The runs draw differently (data split, init,
    batches), so only the distribution is compared. Measured over seeds 9/42/67 at 10 rounds:
    exit 3 — script 0.875/0.860/0.861, fedclock 0.828/0.836/0.879 (largest gap between any
    two runs 0.05); exit 1 (a trunk fitted to a head left at its initialisation) — script
    0.24/0.12/0.10, fedclock 0.20/0.10/0.15, exit 2 0.10–0.13 for both (chance ≈ 0.1; an exit 1
    trained by Algorithm 1 at these settings reaches 0.3–0.4: the cis-loop table of
    docs/reproductions/cis.md); CIS accuracy — script
    0.25/0.15/0.14, fedclock 0.22/0.12/0.18: it hinges on which random exit-1 head the seed
    drew, so it spreads by 0.13 across seeds. Tolerances: exit 3 within 0.08 of each other
    (the largest gap plus margin) and both above 0.75; exits 1 and 2 below 0.35 for both;
    CIS accuracy within 0.15 of each other and both in 0.06–0.35."""
    from fedclock.config import load_config
    from fedclock.experiment import run_experiment
    from fedclock.presets import load_preset

    mnist = require_data("mnist")  # skip, or fail under CI=true, without the shared MNIST
    rounds = 10
    m = _module()
    argv = ["--data-dir", str(mnist), "--rounds", str(rounds), "--seed", "9"]
    assert m.main([*argv, "--strategy", "serving", "--serving", "80-15-5"]) == 0
    ours = json.loads(capsys.readouterr().out)
    raw = load_preset("cis-table1")
    for key in ("compare", "name", "description"):
        raw.pop(key, None)
    raw.update(
        seed=9, strategy={"name": "cis-serving", "mode": "reference"},
        budget={"aggregations": rounds}, eval={"every_aggregations": rounds},
        # the script's defaults (and the preset's before the paper's local work)
        train={"local_steps": 10, "batch_size": 64, "lr": 0.1, "momentum": 0.9},
    )  # fmt: skip
    raw["cis"]["serving"] = "80-15-5"
    raw["data"]["data_dir"] = str(mnist)
    theirs = run_experiment(load_config(raw=raw), run_dir=tmp_path / "fedclock").summary
    assert abs(ours["exit3_accuracy"] - theirs["exit3_accuracy"]) < 0.08, (ours, theirs)
    assert min(ours["exit3_accuracy"], theirs["exit3_accuracy"]) > 0.75
    for run in (ours, theirs):
        assert run["exit1_accuracy"] < 0.35 and run["exit2_accuracy"] < 0.35, (ours, theirs)
        assert 0.06 < run["cis_accuracy"] < 0.35, (ours, theirs)
    assert abs(ours["cis_accuracy"] - theirs["cis_accuracy"]) < 0.15, (ours, theirs)


def test_cis_tables_means_and_paired_differences(tmp_path, capsys) -> None:
    """scripts/cis_tables.py: mean ± sample sd over the finished seeds of each cell, and
    A − B seed by seed over the seeds both cells have (an unfinished run is left out)."""
    tables = load_script("cis_tables")
    for strategy, cis in (("cis-serving", (0.60, 0.70, 0.65)), ("cis-equal", (0.50, 0.62, 0.0))):
        for seed, v in zip((9, 42, 67), cis, strict=True):
            d = tmp_path / "t1" / "runs" / strategy / "cis.serving=80-15-5" / f"seed-{seed}"
            d.mkdir(parents=True)
            status = "completed" if v else "interrupted"
            d.joinpath("summary.json").write_text(json.dumps({
                "status": status, "cis_accuracy": v, "exit1_accuracy": 0.5,
                "exit2_accuracy": 0.6, "exit3_accuracy": 0.7}))  # fmt: skip
    assert tables.main([str(tmp_path / "t1"), "--diff", "cis-serving/cis.serving=80-15-5",
                        "cis-equal/cis.serving=80-15-5"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert (
        "| t1:cis-serving/cis.serving=80-15-5 | 9,42,67 | 65.0 ± 5.0 | 60.0 / 70.0 / 65.0 |" in out
    )
    assert "| t1:cis-equal/cis.serving=80-15-5 | 9,42 | 56.0 ± 8.5 |" in out
    assert "(seeds 9,42): +10.0 / +8.0" in out


@pytest.mark.slow
def test_paper_loop_agrees_with_fedclock_paper_mode(tmp_path, capsys) -> None:
    """10 rounds of 10 steps (batch 64, no weight decay), serving 80-15-5, Serving Rate,
    seed 9: the script's ``--mode paper`` and fedclock's ``cis-table1`` preset in paper mode.
    The runs draw differently, so only the distribution is compared. Measured over seeds
    9/42/67: exit 1 — script 0.396/0.381/0.370, fedclock 0.399/0.306/0.387; exits 2 and 3
    (Λ̃ 0.15 and 0.05, 100 steps: barely trained) 0.095–0.177 for both; CIS accuracy —
    script 0.377/0.362/0.334, fedclock 0.370/0.283/0.376 (largest gap between any two runs
    0.09). Tolerances: exit 1 within 0.12 of each other and both in 0.25–0.5; exits 2 and 3
    below 0.25; CIS accuracy within 0.12 of each other and both in 0.2–0.45."""
    from fedclock.config import load_config
    from fedclock.experiment import run_experiment
    from fedclock.presets import load_preset

    mnist = require_data("mnist")
    rounds = 10
    m = _module()
    argv = ["--data-dir", str(mnist), "--rounds", str(rounds), "--seed", "9", "--mode", "paper"]
    assert m.main([*argv, "--strategy", "serving", "--serving", "80-15-5"]) == 0
    ours = json.loads(capsys.readouterr().out)
    raw = load_preset("cis-table1")
    for key in ("compare", "name", "description"):
        raw.pop(key, None)
    raw.update(
        seed=9, strategy={"name": "cis-serving"}, budget={"aggregations": rounds},
        eval={"every_aggregations": rounds},
        train={"local_steps": 10, "batch_size": 64, "lr": 0.1, "momentum": 0.9},
    )  # fmt: skip
    raw["cis"]["serving"] = "80-15-5"
    raw["data"]["data_dir"] = str(mnist)
    theirs = run_experiment(load_config(raw=raw), run_dir=tmp_path / "fedclock").summary
    assert abs(ours["exit1_accuracy"] - theirs["exit1_accuracy"]) < 0.12, (ours, theirs)
    assert abs(ours["cis_accuracy"] - theirs["cis_accuracy"]) < 0.12, (ours, theirs)
    for run in (ours, theirs):
        assert 0.25 < run["exit1_accuracy"] < 0.5, (ours, theirs)
        assert run["exit2_accuracy"] < 0.25 and run["exit3_accuracy"] < 0.25, (ours, theirs)
        assert 0.2 < run["cis_accuracy"] < 0.45, (ours, theirs)
