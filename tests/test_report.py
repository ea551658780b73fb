"""report.html (fedclock.report) and the tour's conclusions (fedclock.tour).

Synthetic run folders for the page's contents (paired differences, config differences,
exits, sweeps, the tour's page), one small real comparison on digits through the CLI, and a
headless-Chromium check that the pages render without errors (skipped without ``chromium``).
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from fedclock.cli import app
from fedclock.errors import ConfigError, DataError
from fedclock.report import (
    REPORT_FILE,
    TIMELINE_FILE,
    build_report,
    folder_kind,
    paired_differences,
    write_report,
)
from fedclock.tour import STEPS, Claim, Step, conclusions, verdict, write_tour_record
from tests.conftest import tiny_raw

runner = CliRunner()
MAX_BYTES = 5 * 2**20


# ----------------------------------------------------------------------------- helpers
def _run(
    folder: Path,
    *,
    strategy: str,
    seed: int,
    acc: list[float],
    summary: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    extra: dict[str, list[float]] | None = None,
) -> None:
    folder.mkdir(parents=True)
    n = len(acc)
    cols: dict[str, list[float]] = {
        "virtual_time": [2.0 * i for i in range(n)],
        "aggregation": list(range(n)),
        "test_accuracy": acc,
        "test_loss": [2.3 * (1 - a) for a in acc],
        **(extra or {}),
    }
    with (folder / "metrics.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        w.writerows(zip(*cols.values(), strict=True))
    s = {"name": "syn", "strategy": strategy, "seed": seed, "status": "completed",
         "final_test_accuracy": acc[-1], "final_test_loss": 2.3 * (1 - acc[-1]),
         "time_to_target": None, "aggregations": n - 1}  # fmt: skip
    s.update(summary or {})
    (folder / "summary.json").write_text(json.dumps(s))
    cfg = {"name": "syn", "seed": seed, "strategy": {"name": strategy}, "train": {"lr": 0.1}}
    cfg.update(config or {})
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))


def _table(folder: Path, rows: list[dict[str, Any]]) -> None:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with (folder / "table.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, restval="")
        w.writeheader()
        w.writerows(rows)
    (folder / "grid.json").write_text(json.dumps({"entries": [r["strategy"] for r in rows]}))


def _compare_folder(root: Path) -> Path:
    """fedavg and fedbuff (an override column) over seeds 1, 2, 3."""
    out = root / "cmp"
    finals = {"fedavg": [0.80, 0.82, 0.90], "fedbuff": [0.85, 0.86, 0.88]}
    for name, folder in (("fedavg", "fedavg"), ("fedbuff", "fedbuff-buffer_size=5")):
        for seed, final in zip((1, 2, 3), finals[name], strict=True):
            _run(out / "runs" / folder / f"seed-{seed}", strategy=name, seed=seed,
                 acc=[0.1, 0.5, final],
                 config={"strategy": {"name": name, **({"buffer_size": 5} if name == "fedbuff" else {})}})  # fmt: skip
    rows = []
    for name in ("fedavg", "fedbuff"):
        v = finals[name]
        m = sum(v) / 3
        sd = math.sqrt(sum((x - m) ** 2 for x in v) / 2)
        rows.append({"strategy": name, "buffer_size": 5 if name == "fedbuff" else "",
                     "final_test_accuracy_mean": m, "final_test_accuracy_std": sd, "n_seeds": 3})  # fmt: skip
    _table(out, rows)
    return out


def _figures(page: str) -> list[dict[str, Any]]:
    m = re.search(
        r'<script type="application/json" id="fedclock-figures">(.*?)</script>', page, re.S
    )
    assert m, "no figure data"
    specs: list[dict[str, Any]] = json.loads(m.group(1).replace("<\\/", "</"))
    return specs


def _self_contained(page: str) -> None:
    """Nothing the page loads comes from elsewhere: no external script, style, font, image."""
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert not re.search(r"<link\b", page)
    assert not re.search(r"<img[^>]*\bsrc=\"?https?:", page)
    assert "@import" not in page.split("<script", 1)[0]


# ----------------------------------------------------------------------------- contents
def test_compare_report_has_table_paired_differences_config_and_seed_bands(tmp_path: Path) -> None:
    out = _compare_folder(tmp_path)
    assert folder_kind(out) == "compare"
    page = build_report(out)
    _self_contained(page)
    assert len(page.encode()) < MAX_BYTES
    assert "fedavg" in page and "fedbuff buffer_size=5" in page
    # fedbuff − fedavg per seed: +0.05, +0.04, −0.02 → mean +0.0233, better in 2/3
    assert "+0.0233 ± 0.038" in page and "2/3" in page
    # what differs between the cells: the strategy and its buffer size, not the seed
    cfg = page.split(">Config<", 1)[1]
    assert (
        "strategy.name" in cfg
        and "strategy.buffer_size" in cfg
        and "train.lr" not in cfg.split("<details>")[0]
    )
    specs = _figures(page)
    titles = [s["layout"]["title"]["text"] for s in specs]
    assert titles == ["Test accuracy", "Test loss"]
    acc = specs[0]["data"]
    # per strategy and panel: band upper, band lower (filled), mean line
    means = [t for t in acc if t.get("name")]
    assert [t["name"] for t in means if t["xaxis"] == "x"] == [
        "fedavg (mean of 3 seeds)", "fedbuff buffer_size=5 (mean of 3 seeds)"]  # fmt: skip
    assert any(t.get("fill") == "tonexty" for t in acc)
    assert means[0]["y"][-1] == pytest.approx(0.84, abs=1e-4)


def test_seeds_given_restrict_the_runs(tmp_path: Path) -> None:
    out = _compare_folder(tmp_path)
    page = build_report(out, seeds=[1, 2])
    assert "seeds: 1, 2 " in page and "mean of 2 seeds" in page


def test_paired_differences_count_never_reaching_the_target_as_worse() -> None:
    a = [{"seed": 1, "time_to_target": 10.0}, {"seed": 2, "time_to_target": 12.0}]
    b = [{"seed": 1, "time_to_target": 8.0}, {"seed": 2, "time_to_target": None}]
    (d,) = paired_differences({"a": a, "b": b}, metrics=["time_to_target"])
    # b is sooner in seed 1 and never got there in seed 2: better in 1 of 2, no finite mean
    assert d["wins"] == 1 and d["n"] == 2 and math.isnan(d["mean"])


def test_run_report_with_exits_has_cis_and_per_exit_curves_and_no_timeline(tmp_path: Path) -> None:
    run = tmp_path / "run"
    exits = {"exit1_accuracy": [0.1, 0.6, 0.7], "exit2_accuracy": [0.1, 0.5, 0.8],
             "exit3_accuracy": [0.1, 0.4, 0.9], "cis_accuracy": [0.1, 0.55, 0.75]}  # fmt: skip
    _run(run, strategy="cis-serving", seed=9, acc=[0.1, 0.4, 0.9], extra=exits,
         summary={"cis_accuracy": 0.75})  # fmt: skip
    assert folder_kind(run) == "run"
    page = build_report(run)
    titles = [s["layout"]["title"]["text"] for s in _figures(page)]
    assert titles[:2] == ["Routed CIS accuracy", "Test accuracy of every exit"]
    per_exit = _figures(page)[1]
    assert {t["yaxis"] for t in per_exit["data"]} == {"y", "y2", "y3"}
    assert "Device timeline" not in page and "cis_accuracy" in page
    (run / TIMELINE_FILE).write_text("task\n")  # the section appears only with the file
    page = build_report(run)
    assert "Device timeline" in page and "is not a fedclock device timeline" in page


def test_sweep_report_plots_the_metric_against_the_swept_value(tmp_path: Path) -> None:
    out = tmp_path / "sw"
    out.mkdir()
    rows = [{"strategy": s, "strategy.t_max": v, "final_test_accuracy_mean": a,
             "final_test_accuracy_std": 0.01, "n_seeds": 3}
            for s, v, a in [("salf", 1.0, 0.8), ("salf", 2.0, 0.9), ("vanilla", 1.0, 0.7), ("vanilla", 2.0, 0.7)]]  # fmt: skip
    _table(out, rows)
    (out / "pivot.md").write_text("final_test_accuracy (mean ± std over seeds)\n")
    _run(
        out / "runs" / "salf" / "strategy.t_max=1.0" / "seed-1",
        strategy="salf",
        seed=1,
        acc=[0.1, 0.8],
    )
    assert folder_kind(out) == "sweep"
    page = build_report(out)
    (spec,) = _figures(page)
    assert [t["name"] for t in spec["data"]] == ["salf", "vanilla"]
    assert spec["data"][0]["x"] == [1.0, 2.0] and spec["data"][0]["y"] == [0.8, 0.9]
    assert spec["layout"]["xaxis"]["title"]["text"] == "strategy.t_max"


def test_report_writes_only_over_its_own_file(tmp_path: Path) -> None:
    out = _compare_folder(tmp_path)
    path = write_report(out)
    write_report(out)  # its own: rewritten
    path.write_text("<html>my notes</html>")
    with pytest.raises(ConfigError, match="did not make"):
        write_report(out)
    with pytest.raises(DataError, match="holds no fedclock run"):
        write_report(tmp_path)


# ----------------------------------------------------------------------------- the tour
def test_verdict_says_not_supported_when_the_numbers_do_not_support_it() -> None:
    assert verdict([0.9, 0.9, 0.9], [0.8, 0.8, 0.8], False) == ("better in all 3 seeds", True)
    assert verdict([0.9, 0.7, 0.9], [0.8, 0.8, 0.8], False) == ("better in 2 of 3 seeds", True)
    assert verdict([0.81, 0.5, 0.81], [0.8, 0.8, 0.8], False)[1] is False  # most, not on average
    assert verdict([5.0, 6.0], [4.0, 4.0], True) == ("better in none of the 2 seeds", False)
    assert verdict([5.0, 6.0], [math.inf, math.inf], True)[1] is True  # they never got there


def test_conclusions_are_computed_from_the_summaries() -> None:
    step = Step(
        "x", "tour-x", "x", (Claim("a", ("b", "c"), "final_test_accuracy", "final accuracy"),)
    )
    runs = {
        "a": [{"seed": s, "final_test_accuracy": v} for s, v in [(1, 0.9), (2, 0.91)]],
        "b": [{"seed": s, "final_test_accuracy": v} for s, v in [(1, 0.8), (2, 0.85)]],
        "c": [{"seed": s, "final_test_accuracy": v} for s, v in [(1, 0.95), (2, 0.96)]],
    }
    ((text, ok),) = conclusions(step, runs, None)
    assert not ok and "not supported" in text and "than c" in text and "0.905" in text
    runs["c"] = runs["b"]
    ((text, ok),) = conclusions(step, runs, None)
    assert ok and text.endswith("supported: a ends higher than b and c")


def test_tour_steps_name_shipped_presets_and_their_strategies() -> None:
    from fedclock.presets import load_preset

    assert len(STEPS) == 4
    for step in STEPS:
        raw = load_preset(step.preset)
        assert raw["data"]["name"] == "digits" and len(raw["compare"]["seeds"]) >= 2
        for claim in step.claims:
            assert {claim.method, *claim.baselines} <= set(raw["compare"]["strategies"])


def test_tour_page_links_every_step(tmp_path: Path) -> None:
    out = tmp_path / "tour"
    steps = []
    for i, name in enumerate(("a", "b")):
        sub = _compare_folder(tmp_path / f"s{i}")
        shutil.move(sub, out / name)
        steps.append({"folder": name, "preset": f"tour-{name}", "title": f"step {name}",
                      "conclusion": "c.", "claims": [{"text": f"claim {name}", "supported": i == 0}]})  # fmt: skip
    write_tour_record(out, steps, 12.0)
    assert folder_kind(out) == "tour"
    page = build_report(out)
    assert 'href="a/report.html"' in page and 'href="b/report.html"' in page
    assert 'class="concl ok">claim a' in page and 'class="concl no">claim b' in page
    assert "plotly" not in page.lower()  # (a page without plots carries no library)


# ----------------------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def real_compare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small paired comparison on digits through the CLI (fedavg vs drop-stragglers, 2
    seeds) and a CIS run on the 4-2-1 tree."""
    root = tmp_path_factory.mktemp("real")
    cfg = root / "exp.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw(strategy={"name": "fedavg", "t_max": 1.5})))
    out = root / "cmp"
    res = runner.invoke(app, ["compare", str(cfg), "--strategies", "fedavg,drop-stragglers",
                              "--seeds", "1,2", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert f"report: {out / REPORT_FILE}" in res.output
    cis = root / "cis"
    res = runner.invoke(app, ["run", "--preset", "tour-cis", "--set", "budget.aggregations=2",
                              "--set", "eval.every_aggregations=1", "--out", str(cis), "-q"])  # fmt: skip
    assert res.exit_code == 0, res.output
    return root


def test_compare_writes_its_report(real_compare: Path) -> None:
    out = real_compare / "cmp"
    page = (out / REPORT_FILE).read_text()
    _self_contained(page)
    assert (out / REPORT_FILE).stat().st_size < MAX_BYTES
    assert (
        "Paired differences against fedavg" in page
        and "strategy.t_max" not in page.split("Config")[0]
    )
    specs = _figures(page)
    curves = [s for s in specs if "barmode" not in s["layout"]]
    names = {t["name"] for s in curves for t in s["data"] if t.get("name")}
    assert names == {"fedavg (mean of 2 seeds)", "drop-stragglers (mean of 2 seeds)"}
    # a device timeline per cell, of its first seed; drop-stragglers discards late updates
    timelines = page.split(">Device timelines<", 1)[1]
    assert (
        "<h3>fedavg · seed-1</h3>" in timelines and "<h3>drop-stragglers · seed-1</h3>" in timelines
    )
    groups = [{t.get("legendgroup") for t in s["data"]} for s in specs if s not in curves]
    assert len(groups) == 2 and "discarded" in groups[1] and "discarded" not in groups[0]
    # `fedclock report` writes the same page again from the folder, re-running nothing
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.csv")}
    res = runner.invoke(app, ["report", str(out), str(out / "runs" / "fedavg" / "seed-1")])
    assert res.exit_code == 0, res.output
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.csv")} == before
    assert (out / "runs" / "fedavg" / "seed-1" / REPORT_FILE).is_file()


def test_the_timeline_window_is_chosen_on_the_command_line(real_compare: Path) -> None:
    run = real_compare / "cmp" / "runs" / "drop-stragglers" / "seed-2"
    res = runner.invoke(app, ["report", str(run), "--timeline-window", "1:3"])
    assert res.exit_code == 0, res.output
    (tl,) = [s for s in _figures((run / REPORT_FILE).read_text()) if "barmode" in s["layout"]]
    assert tl["layout"]["xaxis"]["range"] == [1.0, 3.0]
    bars = [t for t in tl["data"] if t["type"] == "bar"]
    downloads = [b for t in bars if t["marker"]["opacity"] == 0.35 for b in t["base"]]
    assert downloads and max(downloads) < 3.0  # each task dispatched before the end
    res = runner.invoke(app, ["report", str(run), "--timeline-window", "3:1"])
    assert res.exit_code == 2 and "is not START:END" in res.output


def test_run_writes_its_report(real_compare: Path) -> None:
    page = (real_compare / "cis" / REPORT_FILE).read_text()
    assert "Routed CIS accuracy" in page and "Test accuracy of every exit" in page


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
@pytest.mark.parametrize("page", ["cmp", "cis", "tour"])
def test_reports_render_in_headless_chromium(real_compare: Path, tmp_path: Path, page: str) -> None:
    """The page loads with no network, logs nothing to the console, and draws every plot; a
    screenshot is left in the test's temp dir for a person to look at."""
    if page == "tour":
        out = real_compare / "tour"
        if not out.exists():
            shutil.copytree(real_compare / "cmp", out / "cmp")
            write_tour_record(
                out, [{"folder": "cmp", "preset": "demo", "title": "t", "conclusion": "c."}], 1.0
            )
            write_report(out)
        html = out / REPORT_FILE
    else:
        html = real_compare / page / REPORT_FILE
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
            "--disable-background-networking", "--proxy-server=127.0.0.1:9",  # no network
            f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=10000", "--window-size=1280,2400"]  # fmt: skip
    shot = tmp_path / f"{page}.png"
    dump = subprocess.run(
        [*args, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120
    )
    subprocess.run([*args, "--hide-scrollbars", f"--screenshot={shot}", html.as_uri()],
                   capture_output=True, timeout=120)  # fmt: skip
    assert dump.returncode == 0, dump.stderr[-2000:]
    console = [line for line in dump.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    body = re.search(r"<body([^>]*)>", dump.stdout)
    assert body, dump.stdout[:500]
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    if page == "tour":
        assert attrs["data-kind"] == "tour" and 'href="cmp/report.html"' in dump.stdout
    else:
        n = int(attrs["data-figures"])
        assert n >= 2 and attrs["data-errors"] == "0" and attrs["data-rendered"] == str(n)
        assert dump.stdout.count('class="main-svg"') >= n  # (plotly's own svg, per figure)
        # the device timelines (one per cell): one drawn row per client shown
        tags = re.findall(r"<div [^>]*data-timeline-clients[^>]*>", dump.stdout)
        assert len(tags) == (2 if page == "cmp" else 1)
        for tag in tags:
            shown = re.search(r'data-timeline-clients="(\d+)"', tag)
            rows = re.search(r'data-rows-drawn="(\d+)"', tag)
            assert shown and rows and int(rows.group(1)) == int(shown.group(1)) > 0, tag
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_a_report_of_8_cells_by_3_seeds_takes_under_5_seconds(tmp_path: Path) -> None:
    """Reading 24 runs of 300 evaluations each, and each cell's full-size device timeline
    (the bound: 10,000 tasks), and writing the page re-runs nothing and is quick (the
    acceptance bound is 5 s; here it is about 2 s)."""
    import time

    from fedclock.metrics.timeline import MAX_TASKS, TimelineRecorder

    out = tmp_path / "grid"
    rows = []
    for i in range(8):
        name = f"s{i}"
        for seed in (1, 2, 3):
            acc = [min(0.95, 0.1 + 0.003 * k * (1 + 0.1 * i)) for k in range(300)]
            _run(out / "runs" / name / f"seed-{seed}", strategy=name, seed=seed, acc=acc)
        rec = TimelineRecorder()  # 40 clients, a task each per second, all used
        rec.rows = [[k % 40, float(k // 40), 0.1, 0.6, 0.1, k // 40 + 0.8, 0, k // 40, 0.0,
                     k // 40 + 0.8, 0, 5] for k in range(MAX_TASKS)]  # fmt: skip
        rec.labels = ["full-model"]
        rec.aggregations = [(k + 0.8, k + 1) for k in range(MAX_TASKS // 40)]
        rec.write(out / "runs" / name / "seed-1", 300.0, 12_000, 300)
        rows.append({"strategy": name, "final_test_accuracy_mean": 0.9,
                     "final_test_accuracy_std": 0.01, "n_seeds": 3})  # fmt: skip
    _table(out, rows)
    start = time.perf_counter()
    path = write_report(out)
    assert time.perf_counter() - start < 5.0
    page = path.read_text()
    # a mean line per strategy in each of 4 panels (accuracy and loss, by time and by steps)
    assert page.count("(mean of 3 seeds)") == 4 * 8 and path.stat().st_size < MAX_BYTES
    assert page.count("data-timeline-clients=") == 8 and "the first 10000 of 12000 tasks" in page


def test_sweep_writes_its_report(tmp_path: Path) -> None:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw(strategy={"name": "drop-stragglers", "t_max": 1.5})))
    out = tmp_path / "sw"
    res = runner.invoke(app, ["sweep", str(cfg), "--over", "strategy.t_max=1.5,3.0",
                              "--strategies", "drop-stragglers", "--out", str(out), "-q"])  # fmt: skip
    assert res.exit_code == 0, res.output
    page = (out / REPORT_FILE).read_text()
    spec, *timelines = _figures(page)
    assert spec["data"][0]["x"] == [1.5, 3.0] and "sweep over strategy.t_max" in page
    # a device timeline per cell (its first seed); the later deadline discards fewer updates
    assert len(timelines) == 2 and "<h3>drop-stragglers strategy.t_max=3.0 · seed-" in page
    cut = [sum(len(t["x"]) for t in s["data"] if t.get("legendgroup") == "discarded"
               and t["showlegend"]) for s in timelines]  # fmt: skip
    assert cut[0] > cut[1]


def test_a_learning_rate_grid_shows_each_strategys_selected_rate(tmp_path: Path) -> None:
    out = tmp_path / "lr"
    for lr, final in ((0.01, 0.6), (0.1, 0.9)):
        _run(out / "runs" / "fedavg" / f"lr-{lr:g}" / "seed-1", strategy="fedavg", seed=1,
             acc=[0.1, final], config={"train": {"lr": lr}})  # fmt: skip
    _table(out, [{"strategy": "fedavg", "lr": 0.1, "final_test_accuracy_mean": 0.9,
                  "final_test_accuracy_std": 0.0, "n_seeds": 1}])  # fmt: skip
    (spec, _) = _figures(build_report(out))
    (line,) = [t for t in spec["data"] if t.get("name") and t["xaxis"] == "x"]
    assert line["name"] == "fedavg" and line["y"] == [0.1, 0.9]


def test_sweep_report_pairs_the_strategies_at_each_value(tmp_path: Path) -> None:
    """vanilla does not read t_max: its runs at the first value stand for both values."""
    out = tmp_path / "sw"
    finals = {
        ("salf", 1.0): [0.80, 0.84],
        ("salf", 2.0): [0.90, 0.86],
        ("vanilla", 1.0): [0.7, 0.9],
    }
    for (name, v), accs in finals.items():
        for seed, a in zip((1, 2), accs, strict=True):
            _run(out / "runs" / name / f"strategy.t_max={v}" / f"seed-{seed}", strategy=name,
                 seed=seed, acc=[0.1, a])  # fmt: skip
    rows = [{"strategy": s, "strategy.t_max": v, "final_test_accuracy_mean": 0.8,
             "final_test_accuracy_std": 0.01, "n_seeds": 2}
            for s in ("salf", "vanilla") for v in (1.0, 2.0)]  # fmt: skip
    _table(out, rows)
    (out / "pivot.md").write_text("final_test_accuracy (mean ± std over seeds)\n")
    page = build_report(out).split("<script", 1)[0]  # (the text, not the library)
    assert "Paired differences against salf, at each value" in page
    # vanilla − salf: at 1.0 (−0.1, +0.06) → −0.02, better in 1/2; at 2.0 (−0.2, +0.04) → −0.08
    assert "-0.02 ± 0.11" in page and "-0.08 ± 0.17" in page and page.count("1/2") == 2


@pytest.mark.parametrize(
    ("damage", "words", "left_out"),
    [
        ("table.csv", "not UTF-8", False),
        ("runs/fedavg/seed-1/summary.json", "is damaged", True),
        ("runs/fedavg/seed-1/metrics.csv", "line 2 holds 'x'", True),
        ("runs/fedavg/seed-1/config.yaml", None, False),  # the config is shown as it is
        ("n_seeds", None, False),
    ],
)
def test_a_damaged_folder_is_one_sentence_or_still_a_report(
    tmp_path: Path, damage: str, words: str | None, left_out: bool
) -> None:
    """The comparison's own table damaged: one sentence, no report. One run's summary or
    metrics damaged: the report is written without that run, its first section names the
    file and line, and the command says so in a note (≤ 6 lines, no traceback)."""
    out = _compare_folder(tmp_path)
    if damage == "n_seeds":
        text = (out / "table.csv").read_text().replace(",3\n", ",x\n")
        (out / "table.csv").write_text(text)
    elif damage.endswith("metrics.csv"):
        (out / damage).write_text("virtual_time,aggregation\nx,y\n")
    else:
        (out / damage).write_bytes(b"\xff\xfe{: :")
    res = runner.invoke(app, ["report", str(out)])
    assert "Traceback" not in res.output
    if words is None:
        assert res.exit_code == 0 and (out / REPORT_FILE).is_file(), res.output
    elif left_out:
        assert res.exit_code == 0, res.output
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert len(lines) <= 6 and any("left out" in x and words in x for x in lines), lines
        page = (out / REPORT_FILE).read_text().split("<script", 1)[0]
        assert "Damaged files" in page and words.replace("'", "&#x27;") in page
        assert "fedbuff" in page  # (the rest is there)
    else:
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and words in lines[0], res.output


def test_a_diverged_run_still_has_its_report(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _run(run, strategy="fedavg", seed=1, acc=[0.1, 0.3, math.nan],
         summary={"status": "diverged", "final_test_loss": math.inf})  # fmt: skip
    metrics = (run / "metrics.csv").read_text().replace("nan", "inf", 1)
    (run / "metrics.csv").write_text(metrics)
    page = build_report(run)
    specs = _figures(page)  # (strict JSON: no NaN or Infinity in it)
    assert specs and "diverged" in page


def test_table_md_and_the_report_show_the_same_headline_metrics(tmp_path) -> None:
    """One list (runs.tables.HEADLINE) makes both: a Fraboni-style row's surrogate loss and
    client loss spread are in table.md and in report.html's table, lower-is-better in the
    paired differences."""
    from fedclock.report import _headline_rows, paired_differences
    from fedclock.runs.tables import HEADLINE, write_table

    row = {"strategy": "fedavg", "n_seeds": 2}
    for key in ("final_test_accuracy", "surrogate_loss_tail", "client_loss_std_tail"):
        row |= {f"{key}_mean": 0.5, f"{key}_std": 0.1}
    write_table([row], tmp_path, id_cols=["strategy"])
    md = (tmp_path / "table.md").read_text()
    html = _headline_rows([row])
    for key in ("final_test_accuracy", "surrogate_loss_tail", "client_loss_std_tail"):
        label = next(m.label for m in HEADLINE if m.key == key)
        assert label in md and label in html
    groups = {
        "a": [{"seed": 1, "surrogate_loss_tail": 2.0}],
        "b": [{"seed": 1, "surrogate_loss_tail": 1.0}],
    }
    (diff,) = paired_differences(groups, metrics=("surrogate_loss_tail",))
    assert diff["mean"] == -1.0 and diff["wins"] == 1 and not diff["higher_is_better"]


def test_every_view_takes_its_headline_metrics_from_the_one_list(tmp_path, monkeypatch) -> None:
    """Dropping a metric from runs.tables.HEADLINE drops it from table.md, report.html's
    table and the console's comparison table; the progress bar, a sweep's pivot and the
    comparison plot follow runs.tables.lead."""
    from types import SimpleNamespace

    from fedclock import cli
    from fedclock.report import _headline_rows
    from fedclock.runs import tables
    from fedclock.runs.tables import HEADLINE, headline_metric, lead, write_table

    row: dict[str, Any] = {"strategy": "fedavg", "n_seeds": 1}
    for m in HEADLINE:
        row |= {f"{m.key}_mean": 0.5, f"{m.key}_std": 0.0}
    del row["federated_loss_tail_mean"]  # (an accuracy run)
    cfg = SimpleNamespace(name="x", budget=SimpleNamespace(virtual_time=None),
                          eval=SimpleNamespace(target_accuracy=0.9))  # fmt: skip

    def views() -> tuple[str, str, list[str]]:
        write_table([row], tmp_path, id_cols=["strategy"])
        console = cli._compare_table(cfg, [row], ["fedavg"], [1], tmp_path)
        return (
            (tmp_path / "table.md").read_text(),
            _headline_rows([row]),
            [str(c.header) for c in console.columns],
        )

    md, html, console = views()
    assert "useful work" in md and "useful work" in html and "useful work" in console
    assert console == ["strategy", "CIS acc", "last-exit acc", "last-exit best", "time to 0.9 (s)",
                       "server steps", "discarded", "lost offline", "useful work",
                       "clients heard"]  # fmt: skip
    # a metric no run has (offline losses without a trace's availability) is left out
    offline = {k: row.pop(k) for k in ("updates_lost_mean", "updates_lost_std")}
    assert "lost offline" not in views()[2]
    row.update(offline)
    monkeypatch.setattr(
        tables, "HEADLINE", tuple(m for m in HEADLINE if m.key != "useful_work_ratio")
    )
    md, html, console = views()
    assert "useful work" not in md and "useful work" not in html and "useful work" not in console
    # one rule picks the lead metric for every view
    assert headline_metric([row]) == lead({"cis_accuracy"}).key == "cis_accuracy"
    assert cli.headline_column({"test_accuracy": 1, "federated_loss": 2}) == (
        "federated_loss", "loss")  # fmt: skip
    assert lead({"test_accuracy", "federated_loss"}, curves=True, accuracy=True).curve == (
        "test_accuracy"
    )


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("summary.json", b"\xff\xfe", "is damaged"),
        ("metrics.csv", bytes(range(256)), "not a run's metrics table"),
        ("metrics.csv", b"virtual_time,aggregation,test_accuracy\n0,0,0.1\n1,1,nan?\n", "line 3"),
        ("metrics.csv", b"", "it is empty"),
        ("metrics.csv", b"virtual_time,aggregation\nnan,0\n", "not a finite number"),
        ("metrics.csv", b"aggregation,test_accuracy\n0,0.1\n", "no column 'virtual_time'"),
    ],
)
def test_a_run_folder_with_a_damaged_file_still_has_the_rest_of_its_report(
    tmp_path: Path, name: str, content: bytes, words: str
) -> None:
    """`report` on one run whose summary or metrics is damaged: status 0, no traceback, at
    most 6 lines, the page written with what can be read (its config) and a first section
    naming the damaged file."""
    run = tmp_path / "run"
    _run(run, strategy="fedavg", seed=1, acc=[0.1, 0.5, 0.8])
    (run / name).write_bytes(content)
    res = runner.invoke(app, ["report", str(run)])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 0 and "Traceback" not in res.output and len(lines) <= 6, res.output
    assert any("left out" in x and words in x for x in lines), lines
    page = (run / REPORT_FILE).read_text().split("<script", 1)[0]
    assert "Damaged files" in page and "Config" in page


def test_the_packed_plotting_library_is_cached_and_a_damaged_cache_is_not_used(
    tmp_path, monkeypatch
):
    """The report's plotly.js is packed once per plotly version into the cache folder; a
    torn or foreign cache file is packed again and replaced; an unwritable cache folder
    costs only the packing."""
    import base64
    import gzip

    from plotly.offline import get_plotlyjs

    from fedclock import report

    pack = report._plotly_js_packed.__wrapped__
    monkeypatch.setenv("FEDCLOCK_CACHE_DIR", str(tmp_path / "cache"))
    fresh = pack()
    assert gzip.decompress(base64.b64decode(fresh)).decode("utf-8") == get_plotlyjs()
    (cached,) = (tmp_path / "cache").glob("plotly-*.js.gz.b64")
    assert cached.read_text() == fresh
    cached.write_text(fresh[: len(fresh) // 2])  # (a write cut short)
    assert pack() == fresh and cached.read_text() == fresh
    cached.write_text("not base64 at all!")
    assert pack() == fresh and cached.read_text() == fresh
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("FEDCLOCK_CACHE_DIR", str(blocked / "cache"))  # (a file in the way)
    assert pack() == fresh
