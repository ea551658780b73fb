"""No command writes over a file it did not make (fedclock.outputs), run folders stay inside
output_dir, and damaged run folders given to plot and run --resume are one sentence each."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedclock.cli import app
from fedclock.errors import ConfigError
from fedclock.outputs import made_by_fedclock
from fedclock.runs.grid import entry_dir, value_dir
from tests.conftest import tiny_raw

runner = CliRunner()


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def _cfg(tmp: Path, **sections: object) -> str:
    path = tmp / "exp.yaml"
    path.write_text(yaml.safe_dump(tiny_raw(budget={"aggregations": 1}, **sections)))
    return str(path)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _refused(res, *words: str) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "Traceback" not in res.output and all(w in lines[0] for w in words), lines[0]
    return lines[0]


def test_compare_and_sweep_write_only_over_their_own_files(tmp_path: Path) -> None:
    """A comparison's table is rewritten by the next comparison into the same folder, but a
    table.csv, table.md, plot or grid.json put there (or edited) by someone else is never
    written over: the command stops before any compute, naming the file."""
    cfg = _cfg(tmp_path)
    out = tmp_path / "cmp"
    argv = ["compare", cfg, "--strategies", "fedavg", "--seeds", "1", "--out", str(out), "-q"]
    assert runner.invoke(app, argv).exit_code == 0
    assert runner.invoke(app, argv).exit_code == 0  # its own files: rewritten
    for name, content in [
        ("table.csv", b"mine,1\n"),
        ("table.md", b"# my notes\n"),
        ("accuracy.png", b"\x89PNG\r\n\x1a\nnot fedclock's"),
        ("grid.json", b'{"mine": 1}'),
    ]:
        own = (out / name).read_bytes()
        (out / name).write_bytes(content)
        before = _snapshot(tmp_path)
        _refused(runner.invoke(app, argv), name, "did not make")
        assert _snapshot(tmp_path) == before
        (out / name).write_bytes(own)
    # an edited table counts as the user's
    (out / "table.csv").write_bytes((out / "table.csv").read_bytes() + b"# edited\n")
    _refused(runner.invoke(app, argv), "table.csv")
    # a foreign file in a cell's run folder
    (out / "table.csv").unlink()
    cell = out / "runs" / "fedavg" / "seed-1"
    (cell / "metrics.csv").write_text("mine\n")
    (cell / "notes.txt").write_text("mine\n")
    before = _snapshot(tmp_path)
    _refused(runner.invoke(app, argv), str(cell))
    assert _snapshot(tmp_path) == before
    # sweep: the same
    sweep_out = tmp_path / "sw"
    sweep_out.mkdir()
    (sweep_out / "pivot.md").write_text("mine\n")
    before = _snapshot(tmp_path)
    sweep = ["sweep", cfg, "--over", "train.lr=0.1,0.2", "--strategies", "fedavg",
             "--out", str(sweep_out), "-q"]  # fmt: skip
    _refused(runner.invoke(app, sweep), "pivot.md")
    assert _snapshot(tmp_path) == before
    (sweep_out / "pivot.md").unlink()
    assert runner.invoke(app, sweep).exit_code == 0
    assert runner.invoke(app, sweep).exit_code == 0
    assert made_by_fedclock(sweep_out / "pivot.md") and made_by_fedclock(sweep_out / "sweep.png")


def test_a_folder_from_before_the_record_is_still_fedclocks(tmp_path: Path) -> None:
    """grid.json without 'files' (written by fedclock 0.7 and earlier): tables whose first
    line is fedclock's are rewritten, others are not."""
    (tmp_path / "grid.json").write_text('{"entries": ["fedavg"]}')
    (tmp_path / "table.csv").write_text("strategy,final_test_accuracy_mean,n_seeds\n")
    (tmp_path / "table.md").write_text("my notes\n")
    assert made_by_fedclock(tmp_path / "table.csv")
    assert not made_by_fedclock(tmp_path / "table.md")
    assert made_by_fedclock(tmp_path / "pivot.md")  # not there
    import matplotlib.pyplot as plt

    fig = plt.figure()
    fig.savefig(tmp_path / "accuracy.png")  # matplotlib's own tag
    plt.close(fig)
    assert made_by_fedclock(tmp_path / "accuracy.png")
    (tmp_path / "grid.json").write_text('{"entries": [], "files": {}}')
    assert not made_by_fedclock(tmp_path / "accuracy.png")


def test_plot_writes_only_over_its_own_plots(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert runner.invoke(app, ["run", _cfg(tmp_path), "--out", str(run), "-q"]).exit_code == 0
    assert runner.invoke(app, ["plot", str(run)]).exit_code == 0
    assert runner.invoke(app, ["plot", str(run)]).exit_code == 0  # its own plot: rewritten
    for target, content in [(run / "accuracy.png", b"mine"), (tmp_path / "mine.png", b"mine")]:
        target.write_bytes(content)
        before = _snapshot(tmp_path)
        argv = ["plot", str(run)] + ([] if target.parent == run else ["--out", str(target)])
        _refused(runner.invoke(app, argv), target.name)
        assert _snapshot(tmp_path) == before
    (tmp_path / "adir.png").mkdir()
    _refused(runner.invoke(app, ["plot", str(run), "--out", str(tmp_path / "adir.png")]))
    _refused(runner.invoke(app, ["plot", str(run), "--out", str(tmp_path / "x.txt")]), ".png")


@pytest.mark.parametrize("name", ["../../x", "..", "a/b", "/abs", "x\\y", "a\0b", "", "x" * 300])
def test_a_run_name_cannot_leave_output_dir(tmp_path: Path, name: str) -> None:
    raw = tiny_raw(name=name)
    (tmp_path / "exp.yaml").write_text(json.dumps(raw))
    before = _snapshot(tmp_path.parent)
    _refused(runner.invoke(app, ["run", str(tmp_path / "exp.yaml")]), "name")
    assert _snapshot(tmp_path.parent) == before


def test_grid_folder_names_stay_inside_the_grid() -> None:
    for text in ["../../x", "..", "a/b", "/abs", "x\\y", "x" * 300]:
        for name in (entry_dir(text), value_dir("data.data_dir", text)):
            assert "/" not in name and "\\" not in name and name not in (".", "..")
            assert len(name) <= 100
    assert entry_dir("fedfix:delta_t=0.2") == "fedfix-delta_t=0.2"
    assert value_dir("strategy.t_max", 2.0) == "strategy.t_max=2.0"


def _finished_run(tmp: Path) -> Path:
    run = tmp / "run"
    assert runner.invoke(app, ["run", _cfg(tmp), "--out", str(run), "-q"]).exit_code == 0
    return run


@pytest.mark.parametrize(
    ("damage", "command"),
    [
        ("summary not JSON", "plot"),
        ("summary not JSON", "resume"),
        ("summary binary", "resume"),
        ("summary a list", "plot"),
        ("summary missing fields", "plot"),
        ("summary missing fields", "resume"),
        ("summary unreadable", "resume"),
        ("summary a folder", "plot"),
        ("metrics binary", "plot"),
        ("metrics ragged", "plot"),
        ("metrics not numbers", "plot"),
        ("metrics without virtual_time", "plot"),
        ("until nan", "plot"),
        ("until inf", "plot"),
        ("y-min inf", "plot"),
        ("y-min nan", "plot"),
    ],
)
def test_damaged_run_folders_are_one_sentence(tmp_path: Path, damage: str, command: str) -> None:
    import os

    run = _finished_run(tmp_path)
    extra: list[str] = []
    summary, metrics = run / "summary.json", run / "metrics.csv"
    if damage == "summary not JSON":
        summary.write_text("{not json")
    elif damage == "summary binary":
        summary.write_bytes(b"\xff\xfe\x00\x01" * 10)
    elif damage == "summary a list":
        summary.write_text("[1, 2]")
    elif damage == "summary missing fields":
        summary.write_text('{"status": "completed"}')
    elif damage == "summary unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads every file")
        summary.chmod(0)
    elif damage == "summary a folder":
        summary.unlink()
        summary.mkdir()
    elif damage == "metrics binary":
        metrics.write_bytes(bytes(range(256)) * 4)
    elif damage == "metrics ragged":
        metrics.write_text(metrics.read_text() + "1,2\n")
    elif damage == "metrics not numbers":
        text = metrics.read_text().splitlines()
        metrics.write_text("\n".join([text[0], ",".join("x" * len(text[0].split(",")))]) + "\n")
    elif damage == "metrics without virtual_time":
        metrics.write_text("test_accuracy\n0.5\n")
    else:
        flag, value = damage.split()
        extra = [f"--{flag}", value]
    argv = ["plot", str(run), *extra] if command == "plot" else ["run", "--resume", str(run)]
    before = _snapshot(tmp_path) if damage != "summary unreadable" else {}
    res = runner.invoke(app, argv)
    summary.chmod(0o644) if summary.is_file() else None
    _refused(res)
    if before:
        assert _snapshot(tmp_path) == before


def test_check_writable_names_the_file(tmp_path: Path) -> None:
    from fedclock.outputs import check_writable

    (tmp_path / "table.csv").write_text("mine")
    with pytest.raises(ConfigError, match=r"table\.csv"):
        check_writable([tmp_path / "table.csv"])


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ: Linux")
def test_a_full_disk_is_one_sentence_naming_the_file_and_the_run_goes_on(tmp_path: Path) -> None:
    """A file-size limit stands for a full disk (EFBIG like ENOSPC): `run` stops with one
    sentence naming the file that could not be written, keeps what it wrote (no summary.json:
    the run is not complete), and the same run finishes with --resume once space is back."""
    import resource
    import signal
    import subprocess

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))

    run = tmp_path / "run"
    args = [sys.executable, "-m", "fedclock", "run", "--set", "budget.aggregations=30", "-q"]
    got = subprocess.run([*args, "--out", str(run)], preexec_fn=limit, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    lines = [x for x in got.stderr.splitlines() if x.strip()]
    assert got.returncode == 2 and len(lines) == 1, got.stderr
    assert f"Could not use {run}" in lines[0] and "file too large" in lines[0]
    assert "--resume" in lines[0] and "Traceback" not in got.stderr
    assert not (run / "summary.json").exists() and (run / "metrics.csv").stat().st_size > 0
    again = subprocess.run([sys.executable, "-m", "fedclock", "run", "--resume", str(run), "-q"],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert (run / "clients.csv").stat().st_size > 0 and (run / "timeline.csv").is_file()


def test_no_file_is_written_through_a_link(tmp_path: Path) -> None:
    """A run folder's config.yaml or meta.json that is a symbolic link to a file elsewhere is
    refused in one sentence; the file it points to is left as it was."""
    from fedclock.metrics.recorder import RunRecorder
    from fedclock.outputs import is_temporary, write_atomic

    outside = tmp_path / "mine.yaml"
    outside.write_text("the user's own file\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").symlink_to(outside)
    with pytest.raises(ConfigError, match=r"config\.yaml is a symbolic link"):
        RunRecorder(run).write_config("seed: 1\n", seed=1, argv=[])
    assert outside.read_text() == "the user's own file\n"
    assert not [p for p in run.iterdir() if is_temporary(p.name)]
    write_atomic(run / "new.txt", "whole\n")  # an ordinary file: written, no temporary left
    assert (run / "new.txt").read_text() == "whole\n"
    assert not [p for p in run.iterdir() if is_temporary(p.name)]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("json_out", [True, False])
def test_a_full_stdout_ends_in_one_sentence_and_the_run_folder_is_whole(
    tmp_path: Path, json_out: bool
) -> None:
    import subprocess

    run = tmp_path / "run"
    args = [sys.executable, "-m", "fedclock", "run", "--set", "budget.aggregations=2",
            "--out", str(run), *(["--json", "-q"] if json_out else [])]  # fmt: skip
    with open("/dev/full", "w") as full:
        got = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    lines = [x for x in got.stderr.splitlines() if x.strip()]
    assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr
    assert lines == ["error: Could not write to standard output: no space left on device."]
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """The reader of `fedclock strategies` goes away before it prints (its pipe is closed
    while the process is still importing): no traceback, a non-zero status."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "fedclock", "strategies"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) != 0 and "Traceback" not in err, err


def test_a_finished_cell_is_reused_only_while_its_files_match(tmp_path: Path) -> None:
    """meta.json records each result file's size and SHA-256 when the run finishes (just
    before summary.json); a cell whose clients.csv was edited, or whose metrics.csv was cut
    short, is run again, and the command says why."""
    cfg = _cfg(tmp_path)
    out = tmp_path / "cmp"
    argv = ["compare", cfg, "--strategies", "fedavg", "--seeds", "1", "--out", str(out)]
    assert runner.invoke(app, argv).exit_code == 0
    cell = out / "runs" / "fedavg" / "seed-1"
    files = json.loads((cell / "meta.json").read_text())["files"]
    assert set(files) == {"config.yaml", "metrics.csv", "clients.csv", "timeline.csv"}
    want = (cell / "clients.csv").read_bytes()
    res = runner.invoke(app, argv)  # untouched: reused
    assert res.exit_code == 0 and "re-running" not in res.output
    for name, damage in [("clients.csv", b"edited\n"), ("metrics.csv", None)]:
        path = cell / name
        path.write_bytes(path.read_bytes() + damage if damage else path.read_bytes()[:-20])
        res = runner.invoke(app, argv)
        assert res.exit_code == 0 and f"its {name} changed since it finished" in res.output
        assert (cell / "clients.csv").read_bytes() == want  # run again: the same files


def test_damaged_files_of_fedclocks_own_are_said_to_be_damaged(tmp_path: Path) -> None:
    """A grid.json or a cell's meta.json cut short: one sentence naming the file, its line
    and what to do (not "a file fedclock did not make"); nothing is written."""
    cfg = _cfg(tmp_path)
    out = tmp_path / "cmp"
    argv = ["compare", cfg, "--strategies", "fedavg", "--seeds", "1", "--out", str(out), "-q"]
    assert runner.invoke(app, argv).exit_code == 0
    grid = out / "grid.json"
    grid.write_bytes(grid.read_bytes()[:40])
    before = _snapshot(tmp_path)
    _refused(runner.invoke(app, argv), "grid.json is damaged", "line", "move it away")
    grid.unlink()
    for name in ("table.csv", "table.md", "accuracy.png", "report.html"):
        (out / name).unlink(missing_ok=True)
    meta = out / "runs" / "fedavg" / "seed-1" / "meta.json"
    meta.write_bytes(meta.read_bytes()[:30])
    before = _snapshot(tmp_path)
    _refused(runner.invoke(app, argv), "meta.json is damaged", "line", "move it away")
    assert _snapshot(tmp_path) == before


def test_an_io_error_is_one_sentence_naming_the_file(tmp_path: Path, monkeypatch) -> None:
    """EIO (a failing disk or network share): the file, the error and what to do."""
    import errno

    from fedclock import outputs

    def fail(path: Path, stage: str) -> None:
        if path.name == "summary.json" and stage == "temporary":
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(outputs, "fault_hook", fail)
    res = runner.invoke(app, ["run", _cfg(tmp_path), "--out", str(tmp_path / "r"), "-q"])
    line = _refused(res, "summary.json", "input/output error", "check it", "--resume")
    assert line.endswith(".")


def test_a_linked_folder_under_out_is_refused_and_nothing_outside_changes(
    tmp_path: Path,
) -> None:
    """A strategy's or a cell's folder under a comparison's ``--out`` that is a symbolic link
    (to a fedclock run elsewhere, or to any folder) is refused in one sentence before any
    compute; the linked folder's files are left exactly as they were. A linked ``--out``
    itself is the user's choice and is written into."""
    cfg = _cfg(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    argv = ["compare", cfg, "--strategies", "fedavg", "--seeds", "1", "-q"]
    assert runner.invoke(app, [*argv, "--out", str(elsewhere)]).exit_code == 0
    outside = elsewhere / "runs" / "fedavg"  # a whole fedclock strategy folder
    for linked in ("runs/fedavg", "runs/fedavg/seed-1", "runs"):
        out = tmp_path / f"cmp-{linked.replace('/', '-')}"
        target = (
            outside
            if linked.endswith("fedavg")
            else (outside / "seed-1" if linked.endswith("seed-1") else elsewhere / "runs")
        )
        (out / linked).parent.mkdir(parents=True, exist_ok=True)
        (out / linked).symlink_to(target, target_is_directory=True)
        before = _snapshot(elsewhere)
        line = _refused(runner.invoke(app, [*argv, "--out", str(out)]), "symbolic link")
        assert str(out / linked.split("/")[0]) in line or str(out / linked) in line, line
        assert _snapshot(elsewhere) == before
        sweep = ["sweep", cfg, "--over", "train.lr=0.1", "--strategies", "fedavg", "-q",
                 "--out", str(out)]  # fmt: skip
        if linked == "runs":
            _refused(runner.invoke(app, sweep), "symbolic link")
            assert _snapshot(elsewhere) == before
    # --out itself a link: the user's choice, written through
    link_out = tmp_path / "link-out"
    link_out.symlink_to(tmp_path / "real-out", target_is_directory=True)
    (tmp_path / "real-out").mkdir()
    assert runner.invoke(app, [*argv, "--out", str(link_out)]).exit_code == 0
    assert (tmp_path / "real-out" / "runs" / "fedavg" / "seed-1" / "summary.json").is_file()
    # a linked run folder given to `run --out`: its own sentence, not "is a file"
    res = runner.invoke(app, ["run", cfg, "--out", str(out / "runs")])
    _refused(res, "symbolic link")
