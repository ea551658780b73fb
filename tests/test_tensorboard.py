"""--tensorboard (metrics/tensorboard.py): the scalars read back with TensorBoard's own reader
equal metrics.csv, one TensorBoard run per cell, a resumed run's none doubled."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from fedclock.cli import app
from tests.conftest import tiny_raw

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (
    EventAccumulator,
)

runner = CliRunner()


def _events(log_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """tag → [(step, wall time, value)] as TensorBoard reads them."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {
        tag: [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def _agree(log_dir: Path, run_dir: Path) -> None:
    """Every metrics.csv column but the step is a tag with one scalar per row: step =
    aggregations, time stamp = virtual time, value = the column's (float32)."""
    ev, rows = _events(log_dir), _metrics(run_dir)
    assert set(ev) == set(rows[0]) - {"aggregation"}
    for tag, scalars in ev.items():
        want = [r for r in rows if r[tag] != ""]
        assert len(scalars) == len(want), tag
        for (step, t, value), r in zip(scalars, want, strict=True):
            assert step == int(r["aggregation"])
            assert t == pytest.approx(float(r["virtual_time"]), rel=1e-9, abs=1e-9)
            x = float(r[tag])
            assert (math.isnan(value) and math.isnan(x)) or value == pytest.approx(
                x, rel=2**-23, abs=1e-30
            ), tag


def _config(tmp_path: Path, **sections: Any) -> Path:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw(executor={"threads": 1}, **sections)))
    return cfg


def test_a_comparison_writes_one_tensorboard_run_per_cell(tmp_path: Path) -> None:
    cfg, tb, out = _config(tmp_path), tmp_path / "tb", tmp_path / "cmp"
    res = runner.invoke(app, ["compare", str(cfg), "--strategies", "fedavg,fedbuff:buffer_size=2",
                              "--seeds", "1,2", "--out", str(out), "--tensorboard", str(tb),
                              "-q"])  # fmt: skip
    assert res.exit_code == 0, res.output
    runs = sorted(str(p.parent.relative_to(tb)) for p in tb.rglob("events.out.tfevents.*"))
    assert runs == [
        "fedavg/seed-1",
        "fedavg/seed-2",
        "fedbuff-buffer_size=2/seed-1",
        "fedbuff-buffer_size=2/seed-2",
    ]
    for name in runs:
        _agree(tb / name, out / "runs" / name)
    # a second command reuses the finished cells: their scalars come from metrics.csv
    tb2 = tmp_path / "tb2"
    res = runner.invoke(app, ["compare", str(cfg), "--strategies", "fedavg,fedbuff:buffer_size=2",
                              "--seeds", "1,2", "--out", str(out), "--tensorboard", str(tb2),
                              "-q"])  # fmt: skip
    assert res.exit_code == 0, res.output
    for name in runs:
        _agree(tb2 / name, out / "runs" / name)
    # nothing is written without the option (the setting does not outlive its command)
    res = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "plain"), "-q"])
    assert res.exit_code == 0 and not (tb / "plain").exists()


def test_a_run_and_its_resume_write_each_scalar_once(tmp_path: Path) -> None:
    from fedclock.config import load_config
    from fedclock.experiment import run_experiment
    from fedclock.metrics import tensorboard

    raw = tiny_raw(executor={"threads": 1})
    cfg = load_config(raw=raw, overrides=["checkpoint.every_aggregations=1"])
    tb = tmp_path / "tb"
    tensorboard.enable(tb, None)
    try:
        seen = [0]

        def crash(sim: Any) -> None:
            seen[0] += 1
            if seen[0] == 12:
                raise KeyboardInterrupt

        first = run_experiment(cfg, run_dir=tmp_path / "run", progress=crash)
        assert first.summary["status"] == "interrupted"
        run = run_experiment(cfg, run_dir=tmp_path / "run", resume=True)
    finally:
        tensorboard.disable()
    assert run.summary["status"] == "completed"
    assert len(list((tb / "run").glob("events.out.tfevents.*"))) == 1
    _agree(tb / "run", tmp_path / "run")


def test_a_run_from_the_command_line_names_its_tensorboard_run_after_its_folder(
    tmp_path: Path,
) -> None:
    cfg, tb = (
        _config(tmp_path, strategy={"name": "salf", "t_max": 1.5}, salf={"scenario": "deadline"}),
        tmp_path / "tb",
    )
    res = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "r1"), "--tensorboard",
                              str(tb), "-q"])  # fmt: skip
    assert res.exit_code == 0, res.output
    _agree(tb / "r1", tmp_path / "r1")


def test_without_tensorboard_the_option_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    real = builtins.__import__

    def no_tb(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tb)
    res = runner.invoke(app, ["run", str(_config(tmp_path)), "--out", str(tmp_path / "r"),
                              "--tensorboard", str(tmp_path / "tb")])  # fmt: skip
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "needs the tensorboard package: pip install tensorboard" in res.output
    assert not (tmp_path / "r" / "metrics.csv").exists()
