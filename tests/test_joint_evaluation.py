"""Joint evaluation (run batching): the versions of several runs evaluated in one stacked pass
over a shared test set give each version the accuracy and loss it gets alone; data reuse:
the cells of one command load their data once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

import fedclock.experiment as experiment
from fedclock.cli import app
from fedclock.config import validate
from fedclock.models import build_model
from fedclock.train.evaluate import Evaluator, _stack_structure, evaluate_joint
from fedclock.train.executor import snapshot
from tests.conftest import tiny_raw


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def _model(arch: str, seed: int, **kw: Any) -> torch.nn.Module:
    return build_model(arch, input_shape=(1, 8, 8), num_classes=10, seed=seed, **kw)


@pytest.mark.parametrize(("arch", "kw"), [("mlp", {"hidden": [16, 12]}), ("logreg", {})])
def test_stacked_versions_get_their_own_accuracy_and_loss(arch: str, kw: dict[str, Any]) -> None:
    x, y = _data(300)  # batch size 128: three batches, the last one short
    other_x, other_y = _data(50, seed=1)
    evs = [Evaluator(_model(arch, 0, **kw), x, y, batch_size=128) for _ in range(4)]
    evs.append(Evaluator(_model(arch, 0, **kw), other_x, other_y, batch_size=128))  # other data
    evs.append(Evaluator(_model("cnn", 0), x, y, batch_size=128))  # not stackable: alone
    versions = [snapshot(_model(arch, s, **kw), s) for s in range(5)]
    versions.append(snapshot(_model("cnn", 5), 5))
    requests = list(zip(evs, versions, strict=True))
    got = evaluate_joint(requests)
    for (ev, version), (acc, loss) in zip(requests, got, strict=True):
        want_acc, want_loss = ev.measure(version)
        assert acc == pytest.approx(want_acc, abs=1 / len(ev.y))  # an argmax tie at most
        assert loss == pytest.approx(want_loss, rel=1e-5)  # float32 sums
    # versions that differ give different figures (the stack does not mix them up)
    assert len({round(loss, 6) for _, loss in got[:4]}) == 4


@pytest.mark.parametrize("n", [1, 127, 128])
def test_one_batch_evaluation_is_the_batch_loop_with_one_batch(n: int) -> None:
    """A test set within one batch skips the accumulators: the same figures, bit for bit, as
    the sums the loop keeps (an int64 count, the float64 sum of the float32 batch loss)."""
    x, y = _data(n)
    model = _model("mlp", 0, hidden=[16, 12])
    version = snapshot(_model("mlp", 3, hidden=[16, 12]), 3)
    with torch.no_grad():
        logits = torch.func.functional_call(model, version.params, (x,))
        correct = torch.zeros((), dtype=torch.int64) + (logits.argmax(1) == y).sum()
        loss = (
            torch.zeros((), dtype=torch.float64)
            + torch.nn.functional.cross_entropy(logits, y, reduction="sum").double()
        )
    want = (int(correct) / n, float(loss) / n)
    assert Evaluator(model, x, y, batch_size=128).measure(version) == want


@pytest.mark.parametrize(("arch", "kw"), [("mlp", {"hidden": [16, 12]}), ("logreg", {})])
def test_an_mlp_is_evaluated_layer_by_layer_as_its_forward_pass(arch: str, kw: dict) -> None:
    """The direct path (the layers' functions on the version's tensors) gives
    ``functional_call``'s logits bit for bit; a forward hook sends the call through
    ``functional_call``, so the hook runs."""
    x, y = _data(300)
    ev = Evaluator(_model(arch, 0, **kw), x, y, batch_size=128)
    assert ev._layers is not None
    version = snapshot(_model(arch, 4, **kw), 4)
    with torch.no_grad():
        want = torch.func.functional_call(ev.model, version.params, (x,))
        assert torch.equal(ev._logits(dict(version.params), x), want)
    before = ev.measure(version)
    seen: list[int] = []
    handle = ev.model.net[-1].register_forward_hook(lambda m, i, o: seen.append(len(o)))
    try:
        assert ev.measure(version) == before and seen == [128, 128, 44]
    finally:
        handle.remove()
    assert Evaluator(_model("cnn", 0), x, y)._layers is None  # not an MLP: functional_call


def test_stacked_pass_leaves_the_test_data_alone() -> None:
    # a ReLU before the first Linear (on a view of the data) must not run in place
    x, y = _data(64)
    model = _model("mlp", 0, hidden=[16])
    model.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.ReLU(), *list(model.net)[1:])
    assert _stack_structure(model) is not None
    before = x.clone()
    evs = [Evaluator(model, x, y, batch_size=32) for _ in range(2)]
    other = _model("mlp", 1, hidden=[16])
    other.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.ReLU(), *list(other.net)[1:])
    versions = [snapshot(model, 0), snapshot(other, 1)]
    got = evaluate_joint(list(zip(evs, versions, strict=True)))
    assert torch.equal(x, before)
    for ev, version, (acc, loss) in zip(evs, versions, got, strict=True):
        assert (acc, loss) == pytest.approx(ev.measure(version), rel=1e-5, abs=1 / len(y))


def test_only_linear_relu_classifiers_stack() -> None:
    assert _stack_structure(_model("mlp", 0, hidden=[16])) is not None
    assert _stack_structure(_model("logreg", 0)) is not None
    assert _stack_structure(_model("cnn", 0)) is None
    a = _stack_structure(_model("mlp", 0, hidden=[16]))
    assert a != _stack_structure(_model("mlp", 0, hidden=[12]))  # other widths: other key


def test_evaluator_hands_its_call_to_submit() -> None:
    x, y = _data(40)
    ev = Evaluator(_model("logreg", 0), x, y)
    version = snapshot(_model("logreg", 1), 1)
    seen: list[Any] = []
    ev.submit = lambda e, v: seen.append((e, v)) or (0.5, 1.0)  # type: ignore[func-returns-value]
    assert ev(version) == (0.5, 1.0) and seen == [(ev, version)]


def _count_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    loads: list[int] = []
    load = experiment._load_data

    def spy(cfg: Any) -> Any:
        loads.append(cfg.seed)
        return load(cfg)

    monkeypatch.setattr(experiment, "_load_data", spy)
    return loads


def test_data_reuse_is_off_by_default_and_scoped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = _count_loads(monkeypatch)
    cfg = validate(tiny_raw(budget={"aggregations": 1}))
    experiment.run_experiment(cfg, run_dir=tmp_path / "a")
    experiment.run_experiment(cfg, run_dir=tmp_path / "b")
    assert loads == [3, 3]  # a library caller's runs read their files each time
    with experiment.reusing_data():
        experiment.run_experiment(cfg, run_dir=tmp_path / "c")
        reused = experiment.run_experiment(cfg, run_dir=tmp_path / "d")  # same data: reused
        experiment.run_experiment(validate(tiny_raw(seed=4)), run_dir=tmp_path / "e")
    assert loads == [3, 3, 3, 4]  # digits draws its split from the seed: loaded again
    assert not experiment.DATA_REUSE.enabled and experiment.DATA_REUSE._last is None
    again = experiment.run_experiment(cfg, run_dir=tmp_path / "f")
    assert loads == [3, 3, 3, 4, 3]
    for key in ("final_test_accuracy", "final_test_loss", "virtual_time"):
        assert reused.summary[key] == again.summary[key], key  # one computation, same data


def test_cells_of_a_sequential_compare_load_their_data_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = _count_loads(monkeypatch)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(tiny_raw(budget={"aggregations": 2})))
    res = CliRunner().invoke(app, [
        "compare", str(path), "--strategies", "fedavg,fedasync", "--seeds", "3",
        "--batch-runs", "1", "--out", str(tmp_path / "out"), "-q",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert loads == [3]
    assert not experiment.DATA_REUSE.enabled  # only while the command ran


def test_seeds_share_a_dataset_not_drawn_from_the_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_data import write_fake_mnist

    write_fake_mnist(tmp_path / "mnist", n_train=60, n_test=20)
    loads = _count_loads(monkeypatch)
    raw = tiny_raw(
        data={"name": "mnist", "data_dir": str(tmp_path / "mnist")},
        eval={"every_aggregations": 1, "val_holdout": 10},
        budget={"aggregations": 1},
    )
    summaries = []
    with experiment.reusing_data():
        for k, seed in enumerate((1, 2, 1)):  # a sweep's seeds alternate
            cfg = validate({**raw, "seed": seed})
            run = experiment.run_experiment(cfg, run_dir=tmp_path / f"run{k}")
            assert run.summary["status"] == "completed"
            summaries.append({k: v for k, v in run.summary.items() if k != "wall_s"})
    assert loads == [1]  # MNIST does not depend on the seed; each run splits its own hold-out
    assert summaries[2] == summaries[0]  # the reused copy: the same run
    assert summaries[1] != summaries[0]
