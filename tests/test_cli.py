"""The command line as a user meets it: run, compare, plot, presets, errors."""

from __future__ import annotations

import csv
import gc
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedclock.cli import app
from tests.conftest import REPO, tiny_raw

runner = CliRunner()


def _write(tmp_path, raw, name="exp.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def test_run_writes_a_complete_run_directory(tmp_path):
    cfg = _write(tmp_path, tiny_raw())
    out = tmp_path / "run"
    res = runner.invoke(
        app, ["run", str(cfg), "--out", str(out), "--json", "-q", "--set", "budget.aggregations=2"]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    for key in (
        "strategy", "seed", "final_test_accuracy", "best_test_accuracy", "final_test_loss",
        "virtual_time", "aggregations", "updates_used", "updates_discarded", "compute_s_spent",
        "compute_s_wasted", "wall_s",
    ):  # fmt: skip
        assert key in summary
    assert summary["aggregations"] == 2 and summary["strategy"] == "fedavg" and summary["seed"] == 3
    assert json.loads((out / "summary.json").read_text())["aggregations"] == 2
    stored = yaml.safe_load((out / "config.yaml").read_text())
    assert stored["budget"]["aggregations"] == 2 and stored["seed"] == 3  # the resolved config
    meta = json.loads((out / "meta.json").read_text())
    assert meta["seed"] == 3 and "torch" in meta["versions"]
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [r["aggregation"] for r in rows] == ["0", "1", "2"]
    assert set(rows[0]) >= {
        "virtual_time",
        "wall_time",
        "test_accuracy",
        "bytes_up",
        "compute_s_wasted",
    }


def test_presets_lists_every_preset():
    res = runner.invoke(app, ["presets"])
    assert res.exit_code == 0
    for name in ("demo", "digits-fedavg", "mnist-fedavg"):
        assert name in res.stdout
    shown = runner.invoke(app, ["presets", "demo"])
    assert "name: demo" in shown.stdout


def test_compare_writes_the_table_contract_and_a_plot(tmp_path):
    raw = tiny_raw(strategy={"name": "fedavg", "t_max": 1.5}, budget={"aggregations": 2})
    cfg = _write(tmp_path, raw)
    out = tmp_path / "cmp"
    args = [
        "compare",
        str(cfg),
        "--strategies",
        "fedavg,drop-stragglers",
        "--seeds",
        "1,2",
        "--out",
        str(out),
        "-q",
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert [r["strategy"] for r in rows] == ["fedavg", "drop-stragglers"]
    header = list(rows[0])
    assert header[0] == "strategy" and header[-1] == "n_seeds"
    for metric in (
        "final_test_accuracy",
        "best_test_accuracy",
        "final_test_loss",
        "updates_discarded",
    ):
        assert f"{metric}_mean" in header and f"{metric}_std" in header
    assert rows[0]["n_seeds"] == "2"
    assert (out / "table.md").read_text().startswith("| strategy |")
    assert (out / "accuracy.png").stat().st_size > 1000
    # paired: both strategies of a seed started from the same model and data, so
    # their evaluations at t = 0 are identical
    first = [
        next(csv.DictReader((out / "runs" / s / "seed-1" / "metrics.csv").open()))
        for s in ("fedavg", "drop-stragglers")
    ]
    assert first[0]["test_loss"] == first[1]["test_loss"]
    # a second call reuses the finished cells
    again = runner.invoke(app, args[:-1])  # without -q: the notes are printed
    assert again.exit_code == 0 and "reused finished run" in again.output


def test_compare_tables_merge_the_strategies_of_earlier_commands(tmp_path):
    """Strategies run into one --out by two commands give one table; a strategy whose
    finished runs do not match the current config or seeds is left out."""
    raw = tiny_raw(strategy={"name": "fedavg", "t_max": 1.5}, budget={"aggregations": 2})
    cfg = _write(tmp_path, raw)
    out = tmp_path / "cmp"

    def compare(strategies: str, *extra: str):
        args = ["compare", str(cfg), "--strategies", strategies, "--seeds", "1,2"]
        res = runner.invoke(app, [*args, "--out", str(out), *extra])  # no -q: notes printed
        assert res.exit_code == 0, res.output
        return res, [r["strategy"] for r in csv.DictReader((out / "table.csv").open())]

    compare("drop-stragglers")
    res, names = compare("fedavg")
    assert names == ["fedavg", "drop-stragglers"]
    assert "the table also lists drop-stragglers" in res.output
    assert "drop-stragglers" in (out / "table.md").read_text()
    # other seeds: drop-stragglers' seed 3 never ran, so it is not in the table
    res = runner.invoke(app, ["compare", str(cfg), "--strategies", "fedavg", "--seeds", "1,3",
                              "--out", str(out), "-q"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert [r["strategy"] for r in csv.DictReader((out / "table.csv").open())] == ["fedavg"]
    # another config: the earlier runs are not this experiment's (and the console says why
    # fedavg's finished runs are re-run)
    res, names = compare("fedavg", "--set", "train.lr=0.02")
    assert names == ["fedavg"]
    assert "re-running fedavg seed 1: its config differs" in res.output


def test_sweep_runs_fedavg_once_over_t_max(tmp_path):
    """FedAvg has no deadline: a sweep over strategy.t_max runs it at the first value only,
    and that run's metrics equal a FedAvg run at another t_max."""
    from fedclock.config import load_config
    from fedclock.experiment import run_experiment
    from fedclock.runs import cell_config, reads, run_sweep

    cfg = load_config(raw=tiny_raw(budget={"aggregations": 2}))
    assert not reads(cfg, "fedavg", "strategy.t_max") and reads(cfg, "fedavg", "train.lr")
    assert reads(cfg, "drop-stragglers", "strategy.t_max")
    ran: list[object] = []
    rows, err = run_sweep(cfg, "strategy.t_max", [2.0, 5.0], ["fedavg"], [1], tmp_path / "s",
                          on_result=lambda c, seed, r: ran.append(r))  # fmt: skip
    assert err is None and [r is not None for r in ran] == [True, False]
    assert rows[0]["final_test_loss_mean"] == rows[1]["final_test_loss_mean"]
    other = cell_config(load_config(raw=tiny_raw(budget={"aggregations": 2},
                                                 strategy={"name": "fedavg", "t_max": 5.0}),
                                    grid=True),
                        "fedavg", 1)  # fmt: skip
    direct = run_experiment(other, run_dir=tmp_path / "direct")
    assert direct.summary["final_test_loss"] == rows[1]["final_test_loss_mean"]


def test_stale_reason_names_why_a_finished_run_is_not_reused(tmp_path):
    from fedclock.config import load_config
    from fedclock.experiment import run_experiment
    from fedclock.runs import reusable, stale_reason

    cfg = load_config(raw=tiny_raw(budget={"aggregations": 1}))
    run_dir = tmp_path / "r"
    assert stale_reason(run_dir, cfg) is None  # nothing there yet
    run_experiment(cfg, run_dir=run_dir)
    assert reusable(run_dir, cfg) is not None and stale_reason(run_dir, cfg) is None
    other = load_config(raw=tiny_raw(budget={"aggregations": 2}))
    assert stale_reason(run_dir, other) == "its config differs"

    def edit(name: str, **changes) -> None:
        data = json.loads((run_dir / name).read_text())
        (run_dir / name).write_text(json.dumps({**data, **changes}))

    summary = (run_dir / "summary.json").read_text()
    edit("summary.json", status="interrupted")
    assert stale_reason(run_dir, cfg) == "it ended interrupted"
    (run_dir / "summary.json").write_text(summary)
    meta = json.loads((run_dir / "meta.json").read_text())
    edit("meta.json", versions={**meta["versions"], "fedclock": "0.0.1"})
    assert stale_reason(run_dir, cfg) == "it was made by fedclock 0.0.1"
    assert reusable(run_dir, cfg) is None


def test_plot_overlays_runs(tmp_path):
    cfg = _write(tmp_path, tiny_raw(budget={"aggregations": 2}))
    for name in ("a", "b"):
        assert (
            runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / name), "-q"]).exit_code
            == 0
        )
    png = tmp_path / "both.png"
    res = runner.invoke(app, ["plot", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(png)])
    assert res.exit_code == 0, res.output
    assert png.stat().st_size > 1000
    # the first evaluations only, from a lower bound of the accuracy axis
    cropped = tmp_path / "cropped.png"
    args = ["plot", str(tmp_path / "a"), "--until", "1e-9", "--y-min", "0.5", "--out", str(cropped)]
    assert runner.invoke(app, args).exit_code == 0 and cropped.stat().st_size > 1000
    res = runner.invoke(app, ["plot", str(tmp_path / "a"), "--until", "-1"])
    assert res.exit_code == 2 and "--until must be a positive virtual time" in res.stderr


def test_plot_y_min_ends_the_axis_above_what_is_drawn(tmp_path, ylims):
    """`plot --y-min Y`: both panels start at Y and end 5 % of the drawn span above the
    highest point drawn, by hand: one run topping at 0.9 → 0.9 + 0.05·(0.9 − 0.6); two runs
    of one group, 0.8 and 0.9 at the end → mean 0.85 + std 0.05 = 0.9 as well (the
    autoscaled top came from the whole curve's range and could pass 1)."""
    import numpy as np

    limits = ylims
    dirs = []
    for name, last in (
        ("one/fedavg/seed-1", 0.9),
        ("two/fedavg/seed-1", 0.8),
        ("two/fedavg/seed-2", 0.9),
    ):
        d = tmp_path / name
        d.mkdir(parents=True)
        rows = ["virtual_time,aggregation,test_accuracy", "0,0,0.1", "1,1,0.5", f"2,2,{last}"]
        (d / "metrics.csv").write_text("\n".join(rows) + "\n")
        dirs.append(d)
    top = 0.9 + 0.05 * (0.9 - 0.6)
    for picked in (dirs[:1], dirs[1:]):
        limits.clear()
        args = ["plot", *map(str, picked), "--y-min", "0.6", "--out", str(tmp_path / "z.png")]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        assert len(limits) == 2 and np.allclose(limits, [(0.6, top)] * 2), limits


def test_plot_keeps_runs_of_the_same_strategy_and_seed_apart(tmp_path, monkeypatch):
    """Two comparisons' fedavg/seed-1 cells are two lines, labelled by the folder that
    tells them apart (the second used to overwrite the first)."""
    from fedclock.metrics import plots

    seen: list[list[str]] = []
    monkeypatch.setattr(
        plots, "plot_groups", lambda groups, out, **kw: seen.append(list(groups)) or out
    )
    cfg = _write(tmp_path, tiny_raw(budget={"aggregations": 1}))
    dirs = [tmp_path / c / "fedavg" / "seed-1" for c in ("a", "b")]
    for d in dirs:
        assert runner.invoke(app, ["run", str(cfg), "--out", str(d), "-q"]).exit_code == 0
    res = runner.invoke(app, ["plot", *map(str, dirs), "--out", str(tmp_path / "x.png")])
    assert res.exit_code == 0, res.output
    assert seen == [[f"fedavg (seed 3) · {c}" for c in "ab"]]  # (tiny_raw: seed 3)


def test_plot_labels_leave_out_what_every_run_shares():
    """A line's label names what tells its folder apart, not the parts all share nor the
    strategy's name again."""
    from fedclock.cli import _distinct_names, _run_label

    cells = (("fedavg", "0.1"), ("fedfix-delta_t=0.5", "0.1"), ("async-time-based", "0.001"))
    dirs = [Path(f"/x/cmp/runs/{s}/lr-{lr}/seed-0") for s, lr in cells]
    names = _distinct_names(dirs)
    assert list(names.values()) == [f"{s}/lr-{lr}" for s, lr in cells]
    assert _run_label("fedfix", 0, names[dirs[1]]) == "fedfix (seed 0) · delta_t=0.5/lr-0.1"
    assert _run_label("fedavg", 0, names[dirs[0]]) == "fedavg (seed 0) · lr-0.1"
    # a folder named only by its strategy (one cell per comparison) adds nothing to the label
    two = [Path(f"/x/t-{s}/runs/{s}/seed-1") for s in ("fed-raa", "fedavg")]
    names = _distinct_names(two)
    assert [
        _run_label(s, 1, names[d]) for s, d in zip(("fed-raa", "fedavg"), two, strict=True)
    ] == [
        "fed-raa (seed 1)",
        "fedavg (seed 1)",
    ]
    assert _distinct_names([dirs[0]]) == {dirs[0]: "seed-0"}


def test_plot_draws_sweep_folders_side_by_side(tmp_path):
    cfg = _write(tmp_path, tiny_raw(budget={"aggregations": 2}))
    for name, lrs in (("lr-low", "0.02,0.05"), ("lr-high", "0.1,0.2")):
        res = runner.invoke(app, ["sweep", str(cfg), "--over", f"train.lr={lrs}",
                                  "--strategies", "fedavg", "--seeds", "1,2",
                                  "--out", str(tmp_path / name), "-q"])  # fmt: skip
        assert res.exit_code == 0, res.output
    png = tmp_path / "sweeps.png"
    both = [str(tmp_path / "lr-low"), str(tmp_path / "lr-high")]
    res = runner.invoke(app, ["plot", *both, "--out", str(png)])
    assert res.exit_code == 0, res.output
    assert png.stat().st_size > 1000
    res = runner.invoke(app, ["plot", *both, "--metric", "aggregations", "--log-x",
                              "--out", str(png)])  # fmt: skip
    assert res.exit_code == 0, res.output
    # one clear sentence for a metric the tables lack, and for a run mixed with sweeps
    res = runner.invoke(app, ["plot", *both, "--metric", "nonsense"])
    assert res.exit_code != 0 and "has no metric 'nonsense'" in res.output
    run_dir = tmp_path / "run"
    assert runner.invoke(app, ["run", str(cfg), "--out", str(run_dir), "-q"]).exit_code == 0
    res = runner.invoke(app, ["plot", both[0], str(run_dir)])
    assert res.exit_code != 0 and "has no table.csv" in res.output


def test_plot_sweeps_numeric_and_categorical_values(tmp_path, monkeypatch):
    """Numeric swept values are the x axis; others (model.arch=mlp,cnn) one tick each, in
    sweep order; a missing (NaN) cell is left out of its line."""
    import matplotlib.pyplot as plt

    from fedclock.metrics.plots import plot_sweeps

    drawn = {}
    monkeypatch.setattr(plt, "close", lambda fig: drawn.setdefault("fig", fig))

    def rows(path, values, means):
        return [{"strategy": "salf", path: v, "acc_mean": m, "acc_std": 0.01, "n_seeds": 2}
                for v, m in zip(values, means, strict=True)]  # fmt: skip

    tables = {
        "ratio": rows("population.straggler_ratio", [0.9, 0.3, 0.5], [0.5, 0.9, float("nan")]),
        "arch": rows("model.arch", ["mlp", "cnn"], [0.8, 0.9]),
    }
    plot_sweeps(tables, tmp_path / "s.png", metric="acc")
    ax_ratio, ax_arch = drawn["fig"].axes
    (bars,) = ax_ratio.containers  # errorbar: (data line, caps, bars)
    line = bars.lines[0]
    assert list(line.get_xdata()) == [0.3, 0.9] and list(line.get_ydata()) == [0.9, 0.5]
    (bars,) = ax_arch.containers
    assert list(bars.lines[0].get_xdata()) == [0.0, 1.0]
    assert [t.get_text() for t in ax_arch.get_xticklabels()] == ["mlp", "cnn"]


def test_impossible_deadline_is_refused(tmp_path):
    raw = tiny_raw(strategy={"name": "drop-stragglers", "t_max": 0.001})
    res = runner.invoke(
        app, ["run", str(_write(tmp_path, raw)), "--out", str(tmp_path / "r"), "-q"]
    )
    assert res.exit_code == 2
    assert "strategy.t_max = 0.001 s is impossible" in res.output


def test_drop_stragglers_needs_a_deadline(tmp_path):
    raw = tiny_raw(strategy={"name": "drop-stragglers"})
    res = runner.invoke(app, ["run", str(_write(tmp_path, raw)), "-q"])
    assert res.exit_code == 2 and "set strategy.t_max" in res.output


def test_divergence_keeps_what_was_computed(tmp_path):
    raw = tiny_raw(
        train={"local_epochs": 1, "batch_size": 8, "lr": 1.0e6}, budget={"aggregations": 6}
    )
    out = tmp_path / "div"
    res = runner.invoke(app, ["run", str(_write(tmp_path, raw)), "--out", str(out), "-q"])
    assert res.exit_code == 3
    assert "Training diverged" in res.output and "lower train.lr" in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged"
    assert len((out / "metrics.csv").read_text().splitlines()) >= 2  # t = 0 row kept


def _cli(*args, env=None):
    """``python -m fedclock ARGS`` in a new process, on this checkout's source."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "fedclock", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


# ------------------------------------------------------------------ -q and --json


def _quiet_args(command: str, tmp_path) -> list[str]:
    """A tiny run, comparison or sweep of the digits config (a comparison's base: fedavg,
    and the t_max of the drop-stragglers it is compared with)."""
    cfg = str(_write(tmp_path, tiny_raw(strategy={"name": "fedavg", "t_max": 1.5},
                                        compare={"strategies": ["fedavg", "drop-stragglers"]},
                                        budget={"aggregations": 2})))  # fmt: skip
    out = ["--out", str(tmp_path / command)]
    if command == "run":
        return ["run", cfg, *out]
    if command == "compare":
        return ["compare", cfg, "--strategies", "fedavg,drop-stragglers", "--seeds", "1", *out]
    return ["sweep", cfg, "--over", "train.lr=0.05,0.1", "--strategies", "fedavg", "--seeds",
            "1", *out]  # fmt: skip


@pytest.mark.parametrize("command", ["run", "compare", "sweep"])
def test_quiet_prints_nothing_and_json_quiet_only_the_object(tmp_path, command: str) -> None:
    args = _quiet_args(command, tmp_path)
    loud = runner.invoke(app, args)
    assert loud.exit_code == 0, loud.output
    assert "─" in loud.stdout  # the table (box drawing) when not quiet
    for _ in range(2):  # the second time every cell is reused: no note either
        quiet = runner.invoke(app, [*args, "-q"])
        assert quiet.exit_code == 0 and quiet.stdout == "" and quiet.stderr == ""
    both = runner.invoke(app, [*args, "--json", "-q"])
    assert both.exit_code == 0 and both.stderr == ""
    (line,) = both.stdout.splitlines()
    result = json.loads(line)
    if command == "run":
        assert result["status"] == "completed" and result["run_dir"] == args[-1]
    else:
        assert result["out"] == args[-1] and result["rows"]
    # --json without -q: progress, notes and table go to stderr, stdout stays one object
    json_only = runner.invoke(app, [*args, "--json"])
    assert json_only.exit_code == 0 and json.loads(json_only.stdout)
    assert "─" in json_only.stderr


def test_json_quiet_in_a_real_process_prints_only_the_object(tmp_path) -> None:
    """Warnings or log lines of the libraries would reach stderr too: none do."""
    res = _cli(*_quiet_args("compare", tmp_path), "--json", "-q")
    assert res.returncode == 0 and res.stderr == ""
    (line,) = res.stdout.splitlines()
    assert [r["strategy"] for r in json.loads(line)["rows"]] == ["fedavg", "drop-stragglers"]


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_compare_and_sweep_free_each_finished_run(tmp_path, command: str) -> None:
    """A finished run's models are freed before the next cell runs, not left for Python's
    rare full collection (a sweep over MNIST grew by about 200 MB a run, to 16 GB)."""
    from fedclock.models.zoo import Classifier

    def alive() -> int:  # gc.get_objects() lists unreachable objects not yet collected too
        return sum(type(o) is Classifier for o in gc.get_objects())

    gc.collect()
    before = alive()
    res = runner.invoke(app, [*_quiet_args(command, tmp_path), "-q"])
    assert res.exit_code == 0, res.stderr
    assert alive() == before


def test_quiet_still_prints_errors(tmp_path) -> None:
    raw = tiny_raw(train={"local_epochs": 1, "batch_size": 8, "lr": 1.0e6})
    res = runner.invoke(app, ["run", str(_write(tmp_path, raw)), "--json", "-q",
                              "--out", str(tmp_path / "div")])  # fmt: skip
    assert res.exit_code == 3
    assert json.loads(res.stdout)["status"] == "diverged"
    assert res.stderr.startswith("error: Training diverged") and len(res.stderr.splitlines()) == 1
    res = runner.invoke(app, ["run", "--preset", "nope", "-q"])
    assert res.exit_code == 2 and res.stdout == "" and "Unknown preset 'nope'" in res.stderr


# ------------------------------------------------------------------ compare.lr_grid


def test_compare_uses_the_configs_lr_grid_unless_told_not_to(tmp_path) -> None:
    """A config (a preset) whose train.lr diverges but whose compare.lr_grid holds a good rate
    compares as given: the grid is the default; --no-lr-grid runs train.lr, and diverges."""
    raw = tiny_raw(train={"local_epochs": 1, "batch_size": 8, "lr": 1.0e6},
                   budget={"aggregations": 3}, compare={"lr_grid": [0.05, 1.0e6]})  # fmt: skip
    cfg = str(_write(tmp_path, raw))
    args = ["compare", cfg, "--strategies", "fedavg", "--seeds", "1"]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "grid")])
    assert res.exit_code == 0, res.output
    assert "learning-rate grid from compare.lr_grid: 0.05, 1e+06" in res.stdout
    (row,) = csv.DictReader((tmp_path / "grid" / "table.csv").open())
    assert row["lr"] == "0.05"
    grid = list(csv.DictReader((tmp_path / "grid" / "lr_grid.csv").open()))
    assert [(g["lr"], g["status"]) for g in grid] == [
        ("0.05", "completed"),
        ("1000000.0", "diverged"),
    ]
    # an explicit grid, or 'preset', is used as before
    res = runner.invoke(app, [*args, "--lr-grid", "preset", "--out", str(tmp_path / "grid"), "-q"])
    assert res.exit_code == 0 and res.stdout == ""
    res = runner.invoke(app, [*args, "--lr-grid", "0.02", "--out", str(tmp_path / "g2"), "-q"])
    assert res.exit_code == 0
    assert [r["lr"] for r in csv.DictReader((tmp_path / "g2" / "table.csv").open())] == ["0.02"]
    # --no-lr-grid: train.lr alone, which diverges
    res = runner.invoke(app, [*args, "--no-lr-grid", "--out", str(tmp_path / "plain"), "-q"])
    assert res.exit_code == 3 and "Training diverged" in res.stderr
    assert not (tmp_path / "plain" / "lr_grid.csv").exists()
    res = runner.invoke(app, [*args, "--no-lr-grid", "--lr-grid", "0.1", "-q"])
    assert res.exit_code == 2
    assert res.stderr.strip() == "error: Give --lr-grid or --no-lr-grid, not both."


def test_user_errors_are_one_sentence_without_traceback(tmp_path):
    bad = _write(tmp_path, {"strategy": {"name": "fedavg", "deadline": 3}})
    res = _cli("run", str(bad))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Unknown config field 'strategy.deadline'" in lines[0]


def test_corrupt_idx_file_is_named(tmp_path):
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    names = [
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ]
    for name in names:  # headers that announce data that is not there
        magic = 2051 if "images" in name else 2049
        header = magic.to_bytes(4, "big") + (10).to_bytes(4, "big")
        if magic == 2051:
            header += (28).to_bytes(4, "big") * 2
        (mnist / f"{name}.gz").write_bytes(gzip.compress(header + b"\x00" * 5))
    res = _cli("run", "--preset", "mnist-fedavg", "--data-dir", str(mnist), "-q")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "train-images-idx3-ubyte.gz" in lines[0] and "truncated" in lines[0]


@pytest.mark.slow
def test_mnist_fedavg_preset_reaches_95_percent(tmp_path, mnist_data):
    res = runner.invoke(
        app,
        [
            "run",
            "--preset",
            "mnist-fedavg",
            "--data-dir",
            str(mnist_data),
            "--out",
            str(tmp_path / "m"),
            "--json",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["final_test_accuracy"] >= 0.95


def test_strategies_lists_the_fields_each_strategy_reads() -> None:
    from fedclock.cli import app

    res = runner.invoke(app, ["strategies"], env={"COLUMNS": "400"})
    assert res.exit_code == 0
    rows = {line.split("│")[1].strip(): line for line in res.output.splitlines() if "│" in line}
    assert "strategy.mu" in rows["fedprox"] and "strategy.mu" not in rows["fedavg"]
    assert "strategy.buffer_size" in rows["fedbuff"]


def test_progress_bars_show_the_headline_and_the_time_left() -> None:
    """A run's bar: virtual time, server steps and its headline (the federated loss where the
    clients' losses are measured, as in Fraboni et al.'s presets); a grid's bar: cells done,
    running, failed and the time left from the finished cells' pace."""
    from types import SimpleNamespace

    from rich.console import Console

    from fedclock.cli import _Bar, _Eta, _GridBar, _progress, headline_column
    from fedclock.config import load_config

    assert headline_column({"test_accuracy": 0.5, "federated_loss": 0.7}) == (
        "federated_loss", "loss")  # fmt: skip
    assert headline_column({"test_accuracy": 0.5})[0] == "test_accuracy"
    cfg = load_config(raw=tiny_raw())
    with _progress(Console(quiet=True), quiet=False) as progress:
        bar = _Bar(progress, cfg, "fedavg")
        sim = SimpleNamespace(now=12.5, stop_reason="done", counters=SimpleNamespace(
            aggregations=3, updates_used=9),
            history=[{"test_accuracy": 0.61, "federated_loss": 1.2345678}])  # fmt: skip
        bar(sim)
        assert progress.tasks[0].fields["status"] == "t=12.5s  agg=3  loss=1.235"
        grid = _GridBar(progress, 4)
        grid.start()
        grid.eta._t0 = grid.eta._t0 - 30.0  # (as if the first cell had taken 30 s)
        grid.result(SimpleNamespace(summary={"status": "completed"}))
        grid.start()
        status = progress.tasks[1].fields["status"]
        assert status.startswith("done 1 · running 1 · failed 0 · ~1m") and "left" in status
        grid.result(None)  # a reused cell is no work: 2 left, not 3
        assert "· reused 1 · ~1m0" in progress.tasks[1].fields["status"]
    eta = _Eta(None)
    eta.started()
    assert eta.left(1) == ""  # (no total, no estimate)


@pytest.fixture
def _log_env(monkeypatch):
    """Each test starts with fedclock's log messages hidden and leaves them so."""
    from fedclock import logs

    monkeypatch.setenv(logs.ENV, "")
    yield logs
    logs.hide()


def test_verbose_shows_what_a_run_decides_on_its_own(tmp_path, _log_env) -> None:
    """-v prints fedclock's INFO records on stderr (here Fed-RAA's delay bound K) and sets
    $FEDCLOCK_LOG_LEVEL for compare/sweep workers; without it nothing is logged."""
    args = ["run", "--preset", "tour-fedraa", "--set", "budget.virtual_time=2", "-q"]
    plain = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert plain.exit_code == 0, plain.output
    assert plain.stderr == ""
    loud = runner.invoke(app, ["-v", *args, "--out", str(tmp_path / "b")])
    assert loud.exit_code == 0, loud.output
    assert "fedclock: info: fedraa: delay bound K = " in loud.stderr
    assert os.environ[_log_env.ENV] == "INFO"


def test_a_bad_log_level_is_one_sentence(monkeypatch, _log_env) -> None:
    monkeypatch.setenv(_log_env.ENV, "loud")
    res = runner.invoke(app, ["presets"])
    assert res.exit_code == 2
    assert "FEDCLOCK_LOG_LEVEL='loud' is not a log level: use one of DEBUG, INFO" in res.stderr
    monkeypatch.setenv(_log_env.ENV, "debug")  # any case
    assert _log_env.show() and os.environ[_log_env.ENV] == "DEBUG"


def test_compare_workers_inherit_the_log_level(_log_env) -> None:
    """A compare/sweep worker process shows the records its command asked for: it calls
    logs.show() on start, which reads the inherited $FEDCLOCK_LOG_LEVEL."""
    code = (
        "import logging, os; os.environ['FEDCLOCK_LOG_LEVEL'] = 'INFO'; "
        "from fedclock.runs.parallel import _worker_init; _worker_init(os.getppid()); "
        "logging.getLogger('fedclock.x').info('hello from a worker')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr == "fedclock: info: hello from a worker\n"


def test_an_ascii_console_prints_the_table_instead_of_crashing(tmp_path) -> None:
    """PYTHONIOENCODING=ascii: characters the console cannot write become '?', the run
    finishes and prints its table (it ended in a UnicodeEncodeError)."""
    cfg = _write(tmp_path, tiny_raw(budget={"aggregations": 2}))
    res = _cli("run", str(cfg), "--out", str(tmp_path / "r"),
               env={**os.environ, "PYTHONIOENCODING": "ascii"})  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "final_test_accuracy" in res.stdout
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["status"] == "completed"
