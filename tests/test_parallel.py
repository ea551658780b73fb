"""Cells of compare / sweep in parallel (fedclock.runs.parallel): local processes and Ray give
the tables of a sequential run; a failing cell is retried once, reported, and the others go on."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedclock.cli import app
from tests.conftest import tiny_raw

runner = CliRunner()


def _table(out: Path) -> list[list[str]]:
    """table.csv without the wall-clock columns (the only ones a backend may change)."""
    with (out / "table.csv").open(newline="") as fh:
        rows = list(csv.reader(fh))
    keep = [i for i, h in enumerate(rows[0]) if "wall" not in h]
    return [[r[i] for i in keep] for r in rows]


def _config(tmp_path: Path, **sections: object) -> str:
    raw = tiny_raw(strategy={"name": "fedavg", "t_max": 1.5}, budget={"aggregations": 3})
    raw.update(sections)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _compare(cfg: str, out: Path, *extra: str) -> object:
    args = ["compare", cfg, "--strategies", "fedavg,drop-stragglers", "--seeds", "1,2"]
    return runner.invoke(app, [*args, "--out", str(out), *extra])


def test_compare_with_two_local_jobs_writes_the_sequential_table(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    res = _compare(cfg, tmp_path / "seq", "-q")
    assert res.exit_code == 0, res.output
    res = _compare(cfg, tmp_path / "par", "--jobs", "2")
    assert res.exit_code == 0, res.output
    assert "cells (local, 2 at a time" in res.output and "done 4" in res.output
    assert _table(tmp_path / "par") == _table(tmp_path / "seq")
    again = _compare(cfg, tmp_path / "par", "--jobs", "2")  # finished cells are reused
    assert again.exit_code == 0 and "reused finished run fedavg seed 1" in again.output


def test_sweep_with_two_local_jobs_writes_the_sequential_table(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    args = ["sweep", cfg, "--strategies", "fedavg,drop-stragglers", "--seeds", "1",
            "--over", "strategy.t_max=1.0,2.0"]  # fmt: skip
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "seq"), "-q"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "par"), "--jobs", "2"])
    assert res.exit_code == 0, res.output
    # fedavg does not read t_max: one run of it, three cells in all
    assert "done 3" in res.output
    assert _table(tmp_path / "par") == _table(tmp_path / "seq")
    assert (tmp_path / "par" / "pivot.md").read_text() == (
        tmp_path / "seq" / "pivot.md"
    ).read_text()


def test_a_failing_cell_is_retried_reported_and_the_others_finish(tmp_path: Path) -> None:
    # a deadline no device meets: drop-stragglers fails in its worker, fedavg does not read it
    cfg = _config(tmp_path, strategy={"name": "fedavg", "t_max": 1e-6})
    res = _compare(cfg, tmp_path / "out", "--jobs", "2")
    assert res.exit_code == 3
    text = " ".join(res.output.split())
    assert "retrying drop-stragglers seed 1: strategy.t_max = 1e-06 s is impossible" in text
    assert "failed drop-stragglers seed 1" in text
    assert [r[0] for r in _table(tmp_path / "out")[1:]] == ["fedavg"]
    assert res.stderr.startswith("error: drop-stragglers seed 1: strategy.t_max")


def test_backend_options_are_checked(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    res = _compare(cfg, tmp_path / "o", "--backend", "spark")
    assert res.exit_code == 2 and "Unknown backend 'spark'; allowed: local, ray." in res.stderr
    res = _compare(cfg, tmp_path / "o", "--jobs", "0")
    assert res.exit_code == 2 and "--jobs must be from 1 to 4096." in res.stderr
    res = _compare(cfg, tmp_path / "o", "--address", "ray://x:1")
    assert res.exit_code == 2 and "give it with --backend ray" in res.stderr


@pytest.mark.slow
def test_compare_on_ray_writes_the_local_table(tmp_path: Path) -> None:
    """`--backend ray` (a local Ray with 2 CPUs, started and shut down by the command)."""
    pytest.importorskip("ray")
    cfg = _config(tmp_path)
    assert _compare(cfg, tmp_path / "local", "-q").exit_code == 0
    res = _compare(cfg, tmp_path / "ray", "--backend", "ray", "--jobs", "2", "-q")
    assert res.exit_code == 0, res.output
    assert _table(tmp_path / "ray") == _table(tmp_path / "local")
    import ray

    assert not ray.is_initialized()


# ------------------------------------------------------------------ executor.kind: ray


@pytest.mark.slow
def test_ray_executor_contributions_equal_the_serial_executors() -> None:
    """Tasks on two model versions, in mixed order, cut into blocks on two actors: the
    contributions are the serial executor's (to float32 tolerance: the actors run the
    vectorized executor), attached to the driver's own tasks, in task order."""
    pytest.importorskip("ray")
    import functools

    import torch

    from fedclock.train.executor import SerialExecutor
    from fedclock.train.factory import make_executor
    from fedclock.train.local import LocalTraining, Needs
    from tests.test_vectorized import _data, _tasks, _two_versions

    sizes = [20, 11, 30, 16, 25]
    data = _data(sizes, (1, 8, 8))
    m, v0, v1 = _two_versions()
    a = _tasks(v0, sizes, 8, epochs=1.0)
    b = _tasks(v1, sizes, 4, epochs=1.0, first_id=10)
    mixed = [a[0], b[1], a[2], b[3], a[1], b[0], a[3], b[2], a[4], b[4]]
    serial = SerialExecutor(m, data, seed=1, local=LocalTraining(lr=0.1)).run(mixed)
    build = functools.partial(
        make_executor, Needs(), m, data, seed=1, local=LocalTraining(lr=0.1), kind="auto"
    )
    from fedclock.train.ray_executor import RayExecutor

    ray_exec = RayExecutor(build, workers=2)
    try:
        got = ray_exec.run(mixed)
        again = ray_exec.run(mixed[:3])  # versions put once, reused by the next batch
    finally:
        ray_exec.close()
    assert len(got) == len(mixed)
    assert all(c.task is t for c, t in zip(got, mixed, strict=True))  # the driver's own tasks
    tol = 50 * torch.finfo(torch.float32).eps
    for s, r in zip(serial, got, strict=True):
        assert s.num_samples == r.num_samples and s.delta.keys() == r.delta.keys()
        for k in s.delta:
            torch.testing.assert_close(r.delta[k], s.delta[k], atol=tol, rtol=tol)
        assert r.train_loss == pytest.approx(s.train_loss, rel=tol, abs=tol)
    for s, r in zip(serial[:3], again, strict=True):
        for k in s.delta:
            torch.testing.assert_close(r.delta[k], s.delta[k], atol=tol, rtol=tol)


@pytest.mark.slow
def test_a_run_with_the_ray_executor_has_the_local_metrics(tmp_path: Path) -> None:
    """The virtual clock and every count are unchanged; accuracy and loss to float32
    tolerance (here they are bit for bit, the actors run the same vectorized code)."""
    pytest.importorskip("ray")
    from fedclock.config import load_config
    from fedclock.experiment import run_experiment

    raw = tiny_raw(strategy={"name": "fedbuff", "buffer_size": 2}, budget={"aggregations": 8})
    local = run_experiment(load_config(raw=raw), run_dir=tmp_path / "local")
    raw["executor"] = {"kind": "ray", "workers": 2}
    on_ray = run_experiment(load_config(raw=raw), run_dir=tmp_path / "ray")
    for a, b in zip(local.history, on_ray.history, strict=True):
        for k in a:
            if k in ("test_accuracy", "test_loss"):
                assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-5)
            elif k != "wall_time":
                assert b[k] == a[k], k
    import ray

    assert not ray.is_initialized()


def _children(pid: int) -> list[int]:
    """The live pool workers whose parent is ``pid`` (from /proc; not multiprocessing's
    resource tracker)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and b"spawn_main" in cmd:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # (a zombie has ended; nobody may reap it in a container)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_workers_end_when_the_command_is_killed(tmp_path: Path) -> None:
    """SIGTERM reaches the command, not its worker processes: they notice their parent is
    gone and end instead of computing cells nobody collects (they used to go on)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg = _config(tmp_path, budget={"aggregations": 100_000})  # cells that outlast the test
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    args = ["compare", cfg, "--strategies", "fedavg,drop-stragglers", "--seeds", "1,2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedclock", *args, "--jobs", "2", "-q", "--out", str(tmp_path / "o")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
            workers = _children(proc.pid)
        assert len(workers) == 2, "the command did not start its two workers"
        time.sleep(3)  # the workers are past their start-up (the watcher runs)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(_alive(w) for w in workers)
    finally:
        if proc.poll() is None:
            proc.kill()
        for w in _children(proc.pid):
            os.kill(w, signal.SIGKILL)
