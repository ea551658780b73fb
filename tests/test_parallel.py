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
    assert "cells (local, 2 at a time)" in res.output and "done 4" in res.output
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
    assert res.exit_code == 2 and "--jobs must be at least 1." in res.stderr
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
