"""The bad-input corpus: every case exits non-zero with one sentence on stderr, no traceback,
and deletes nothing already written (docs/reliability.md)."""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from fedclock.cli import app
from tests.conftest import tiny_raw

runner = CliRunner()

# a case: (id, setup) where setup(tmp) writes what the case needs and returns the argv
Setup = Callable[[Path], list[str]]


def _cfg(tmp: Path, raw: dict | str | bytes, name: str = "bad.yaml") -> str:
    path = tmp / name
    if isinstance(raw, bytes):
        path.write_bytes(raw)
    else:
        path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw))
    return str(path)


def _run_raw(**sections: object) -> Setup:
    """`fedclock run` of the tiny digits config with these sections merged in."""
    return lambda tmp: ["run", _cfg(tmp, tiny_raw(**sections))]


def _run_with(raw: dict, command: str = "run") -> Setup:
    return lambda tmp: [command, _cfg(tmp, raw)]


def _sets(*sets: str, command: str = "run") -> Setup:
    def setup(tmp: Path) -> list[str]:
        argv = [command, _cfg(tmp, tiny_raw(), "ok.yaml")]
        for s in sets:
            argv += ["--set", s]
        return argv

    return setup


def _tiny(**top: object) -> dict:
    raw = tiny_raw()
    raw.update(top)
    return raw


def _mnist_dir(tmp: Path, mutate: str) -> str:
    """A folder of four MNIST IDX files (10 images), one of them broken as ``mutate`` says."""
    folder = tmp / "mnist"
    folder.mkdir()
    for name, magic, dims in [
        ("train-images-idx3-ubyte", 2051, (10, 28, 28)),
        ("train-labels-idx1-ubyte", 2049, (10,)),
        ("t10k-images-idx3-ubyte", 2051, (10, 28, 28)),
        ("t10k-labels-idx1-ubyte", 2049, (10,)),
    ]:
        header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims)
        body = bytes(int(np.prod(dims)))
        raw = header + body
        if name.startswith("train-images"):
            if mutate == "truncated":
                raw = raw[: len(raw) // 2]
            elif mutate == "magic":
                raw = (1234).to_bytes(4, "big") + raw[4:]
            elif mutate == "not-gzip":
                (folder / f"{name}.gz").write_bytes(b"plain bytes, not gzip")
                continue
            elif mutate == "empty":
                raw = b""
            elif mutate == "absurd size":  # the header announces 2³¹ − 1 images
                raw = header[:4] + (2**31 - 1).to_bytes(4, "big") + header[8:] + body[:100]
        (folder / f"{name}.gz").write_bytes(gzip.compress(raw))
    return str(folder)


def _mnist(mutate: str) -> Setup:
    return lambda tmp: ["run", "--preset", "mnist-fedavg", "--data-dir", _mnist_dir(tmp, mutate)]


def _cifar(batch: object) -> Setup:
    def setup(tmp: Path) -> list[str]:
        folder = tmp / "data" / "cifar-10-batches-py"
        folder.mkdir(parents=True)
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
        for name in names:
            (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        raw = tiny_raw(data={"name": "cifar10"}, model={"arch": "mlp", "hidden": [8]})
        return ["run", _cfg(tmp, raw), "--data-dir", str(tmp / "data")]

    return setup


def _text(content: bytes) -> Setup:
    def setup(tmp: Path) -> list[str]:
        folder = tmp / "text"
        folder.mkdir()
        (folder / "tinyshakespeare.txt").write_bytes(content)
        raw = tiny_raw(data={"name": "shakespeare"}, model={"arch": "lstm"})
        return ["run", _cfg(tmp, raw), "--data-dir", str(folder)]

    return setup


def _existing_out(tmp: Path) -> list[str]:
    out = tmp / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    return ["run", _cfg(tmp, tiny_raw(), "ok.yaml"), "--out", str(out)]


def _other_config_out(tmp: Path) -> list[str]:
    out = tmp / "taken"
    raw = tiny_raw(budget={"aggregations": 1})
    assert (
        runner.invoke(app, ["run", _cfg(tmp, raw, "first.yaml"), "--out", str(out), "-q"]).exit_code
        == 0
    )
    return ["run", _cfg(tmp, tiny_raw(), "ok.yaml"), "--out", str(out)]


def _out_is_file(tmp: Path) -> list[str]:
    (tmp / "afile").write_text("mine")
    return ["run", _cfg(tmp, tiny_raw(), "ok.yaml"), "--out", str(tmp / "afile")]


def _out_under_file(tmp: Path) -> list[str]:
    (tmp / "afile").write_text("mine")
    return ["run", _cfg(tmp, tiny_raw(), "ok.yaml"), "--out", str(tmp / "afile" / "run")]


def _data_dir_is_file(tmp: Path) -> list[str]:
    (tmp / "afile").write_text("mine")
    return ["run", "--preset", "mnist-fedavg", "--data-dir", str(tmp / "afile")]


CASES: list[tuple[str, Setup]] = [
    # unknown fields, at every level
    ("unknown top-level field", _run_with(_tiny(colour="red"))),
    ("unknown data field", _run_raw(data={"name": "digits", "nme": 1})),
    ("unknown partition field", _run_raw(partition={"num_clients": 6, "sheme": "iid"})),
    ("unknown model field", _run_raw(model={"arch": "mlp", "hiden": [3]})),
    ("unknown population field", _run_raw(population={"sped": 1.0})),
    ("unknown device-class field", _run_raw(population={"classes": [{"fraction": 1, "speed": 1, "x": 1}]})),
    ("unknown slowdown field", _run_raw(population={"slowdown": {"kind": "none", "s": 1}})),
    ("unknown faults field", _run_raw(population={"faults": {"share": 0.1}})),
    ("unknown train field", _run_raw(train={"lr": 0.1, "epochs": 2})),
    ("unknown strategy field", _run_raw(strategy={"name": "fedavg", "deadline": 3})),
    ("unknown budget field", _run_raw(budget={"rounds": 3})),
    ("unknown eval field", _run_raw(eval={"every": 3})),
    ("unknown guard field", _run_raw(guard={"nan": True})),
    ("unknown executor field", _run_raw(executor={"nodes": 3})),
    ("unknown compare field", _run_raw(compare={"seed": [1]})),
    ("unknown salf field", _run_raw(salf={"ratio": 0.5})),
    # mistyped values
    ("seed not a number", _run_with(_tiny(seed="abc"))),
    ("lr not a number", _run_raw(train={"lr": "fast"})),
    ("hidden not a list", _run_raw(model={"arch": "mlp", "hidden": "wide"})),
    ("section not a mapping", _run_with(_tiny(train=[1, 2]))),
    ("classes not a list", _run_raw(population={"scenario": "classes", "classes": 3})),
    ("unknown dataset", _run_raw(data={"name": "imagenet"})),
    ("unknown architecture", _run_raw(model={"arch": "transformer"})),
    ("unknown strategy", _run_raw(strategy={"name": "fedmagic"})),
    ("unknown scenario", _run_raw(population={"scenario": "cloud"})),
    # out-of-range values
    ("zero clients", _run_raw(partition={"num_clients": 0})),
    ("negative clients", _run_raw(partition={"num_clients": -3})),
    ("more clients than samples", _run_raw(partition={"num_clients": 100_000})),
    ("zero batch size", _run_raw(train={"batch_size": 0})),
    ("negative lr", _run_raw(train={"lr": -0.1})),
    ("momentum of 1", _run_raw(train={"momentum": 1.0})),
    ("client fraction above 1", _run_raw(strategy={"name": "fedavg", "client_fraction": 1.5})),
    ("straggler ratio above 1", _run_raw(population={"straggler_ratio": 2})),
    ("fault share above 1", _run_raw(population={"faults": {"fraction": 1.5}})),
    ("target accuracy above 1", _run_raw(eval={"target_accuracy": 1.5})),
    ("test fraction of 1", _run_raw(data={"name": "digits", "test_fraction": 1.0})),
    ("zero-width hidden layer", _run_raw(model={"arch": "mlp", "hidden": [0]})),
    ("negative norm bound", _run_raw(guard={"max_update_norm": -1})),
    ("budget that never ends", _run_raw(budget={"aggregations": None})),
    ("negative time budget", _run_raw(budget={"virtual_time": -5})),
    ("zero evaluation period", _run_raw(eval={"every_virtual_seconds": 0})),
    ("empty class list", _run_raw(population={"scenario": "classes", "classes": []})),
    ("class fractions not summing to 1", _run_raw(population={"scenario": "classes", "classes": [{"fraction": 0.3, "speed": 1.0}, {"fraction": 0.3, "speed": 2.0}]})),
    ("more concurrent clients than clients", _run_raw(strategy={"name": "fedbuff", "buffer_size": 2, "concurrency": 50})),
    ("fed-raa delay bound no device meets", _run_raw(strategy={"name": "fed-raa", "k": 1e-9})),
    ("fed-raa on a model without hidden layer", _run_raw(strategy={"name": "fed-raa"}, model={"arch": "mlp", "hidden": []})),
    ("deadline no device can meet", _run_raw(strategy={"name": "drop-stragglers", "t_max": 1e-9})),
    # NaN and inf
    ("NaN learning rate", _sets("train.lr=.nan")),
    ("infinite learning rate", _sets("train.lr=.inf")),
    ("infinite device speed", _sets("population.speed=.inf")),
    ("NaN deadline", _sets("strategy.name=drop-stragglers", "strategy.t_max=.nan")),
    # strategy options that belong to another strategy
    ("fedavg given a deadline", _run_raw(strategy={"name": "fedavg", "t_max": 3})),
    ("fedbuff given FedAsync's alpha", _run_raw(strategy={"name": "fedbuff", "alpha": 0.5})),
    ("fed-raa-random given a scheduler", _run_raw(strategy={"name": "fed-raa-random", "scheduler": "mp-raa"})),
    ("salf field for fedavg", _run_raw(salf={"scenario": "ratio"})),
    # config files
    ("config file missing", lambda tmp: ["run", str(tmp / "nope.yaml")]),
    ("config not YAML", lambda tmp: ["run", _cfg(tmp, "train: [1, 2\nseed: :")]),
    ("config a list", lambda tmp: ["run", _cfg(tmp, "- 1\n- 2\n")]),
    ("config not UTF-8", lambda tmp: ["run", _cfg(tmp, b"seed: \xff\xfe\n")]),
    ("config a folder", lambda tmp: ["run", str(tmp)]),
    ("unknown preset", lambda tmp: ["run", "--preset", "nope"]),
    # --set
    ("--set without =", _sets("train.lr")),
    ("--set with an empty key", _sets("=3")),
    ("--set through a value", _sets("train.lr.x=1")),
    ("--set unknown field", _sets("train.foo=1")),
    ("--set bad YAML", _sets("train.lr=[")),
    ("--set wrong type", _sets("partition.num_clients=many")),
    # data files
    ("MNIST folder missing", lambda tmp: ["run", "--preset", "mnist-fedavg", "--data-dir", str(tmp / "none")]),
    ("data dir is a file", _data_dir_is_file),
    ("truncated IDX", _mnist("truncated")),
    ("wrong IDX magic", _mnist("magic")),
    ("IDX not gzip", _mnist("not-gzip")),
    ("empty IDX", _mnist("empty")),
    ("IDX announcing an absurd size", _mnist("absurd size")),
    ("CIFAR batch of the wrong shape", _cifar({b"data": np.zeros((4, 100), np.uint8), b"labels": [0] * 4})),
    ("CIFAR batch not a dict", _cifar([1, 2, 3])),
    ("CIFAR folder missing", lambda tmp: ["run", _cfg(tmp, tiny_raw(data={"name": "cifar10"})), "--data-dir", str(tmp)]),
    ("empty text data", _text(b"")),
    ("non-UTF-8 text data", _text(b"First Citizen:\n\xff\xfe\xfa speak.\n")),
    # output folders
    ("run folder exists with other content", _existing_out),
    ("run folder holds a run of another config", _other_config_out),
    ("run folder is a file", _out_is_file),
    ("run folder under a file", _out_under_file),
    # commands
    ("compare: seeds not numbers", lambda tmp: ["compare", _cfg(tmp, tiny_raw()), "--seeds", "a,b"]),
    ("compare: --seeds empty", lambda tmp: ["compare", _cfg(tmp, tiny_raw()), "--seeds", ""]),
    ("sweep: --seeds only commas", lambda tmp: ["sweep", _cfg(tmp, tiny_raw()), "--over", "train.lr=0.1,0.2", "--strategies", "fedavg", "--seeds", ",,,"]),
    ("compare: --strategies empty", lambda tmp: ["compare", _cfg(tmp, tiny_raw()), "--strategies", " , "]),
    ("compare: unknown strategy", lambda tmp: ["compare", _cfg(tmp, tiny_raw()), "--strategies", "nope"]),
    ("compare: lr grid not numbers", lambda tmp: ["compare", _cfg(tmp, tiny_raw()), "--strategies", "fedavg", "--lr-grid", "x"]),
    ("sweep: --over without values", lambda tmp: ["sweep", _cfg(tmp, tiny_raw()), "--over", "train.lr", "--strategies", "fedavg"]),
    ("sweep: --over unknown field", lambda tmp: ["sweep", _cfg(tmp, tiny_raw()), "--over", "train.nope=1,2", "--strategies", "fedavg"]),
    ("plot: no run folders", lambda tmp: ["plot", str(tmp / "none")]),
]  # fmt: skip


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a case that wrongly ran writes its runs/ here


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 50
    assert len({name for name, _ in CASES}) == len(CASES)


@pytest.mark.parametrize(("name", "setup"), CASES, ids=[name for name, _ in CASES])
def test_bad_input_is_one_sentence(tmp_path: Path, name: str, setup: Setup) -> None:
    argv = setup(tmp_path)
    before = _snapshot(tmp_path)
    res = runner.invoke(app, argv)
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        f"{name}: uncaught {res.exception!r}"
    )
    assert res.exit_code not in (0, 1), f"{name}: exit {res.exit_code}\n{res.output}"
    assert "Traceback" not in res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"{name}: {res.stderr!r}"
    assert lines[0].startswith("error: ") and lines[0].rstrip().endswith((".", ".)")), lines[0]
    print(f"{name}: {lines[0]}")
    after = _snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before, f"{name} changed a file"


def test_a_full_disk_mid_run_is_one_sentence_and_keeps_the_metrics(tmp_path, monkeypatch) -> None:
    """The disk fills up after the fourth evaluation: one sentence naming the file, exit 2,
    and the rows written before it stay in metrics.csv."""
    import errno

    from fedclock.metrics.recorder import RunRecorder

    real = RunRecorder.record
    calls = {"n": 0}

    def record(self, row):
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(
                errno.ENOSPC, "No space left on device", str(self.run_dir / "metrics.csv")
            )
        return real(self, row)

    monkeypatch.setattr(RunRecorder, "record", record)
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", _cfg(tmp_path, tiny_raw()), "--out", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert lines == [
        f"error: Could not use {out / 'metrics.csv'}: no space left on device; free some space "
        "(or raise the file-size limit) and run the command again (`fedclock run --resume DIR` "
        "goes on with a run)."
    ]
    assert len((out / "metrics.csv").read_text().splitlines()) == 1 + 3  # header + 3 rows


@pytest.mark.parametrize(
    "value", ["garbage", "[1, 2]", '{"root": 3}', '{"root": "x", "base": 1}', '{"root": ""}']
)
def test_a_foreign_tensorboard_channel_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """$FEDCLOCK_TENSORBOARD is fedclock's channel to its workers: a value fedclock did not
    write is refused in one sentence (it crashed every run with a traceback)."""
    monkeypatch.setenv("FEDCLOCK_TENSORBOARD", value)
    res = runner.invoke(app, ["run", _cfg(tmp_path, tiny_raw()), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "$FEDCLOCK_TENSORBOARD is fedclock's channel" in lines[0], lines


def test_ctrl_c_during_the_report_write_keeps_the_run_and_says_how_to_get_the_report(
    tmp_path, monkeypatch
) -> None:
    """A Ctrl-C while report.html is written (a second one, after the run ended): the run's
    files stay whole, no traceback, and one note says how to write the report."""
    import json

    import fedclock.report

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fedclock.report, "write_report", interrupted)
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", _cfg(tmp_path, tiny_raw()), "--out", str(out)])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    text = " ".join(res.output.split())
    assert f"no report written (Ctrl-C); `fedclock report {out}` writes it." in text
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
