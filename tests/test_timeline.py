"""The device timeline (metrics/timeline.py) and its drawing (report/timeline.py): the file
agrees with the run's own counts, survives a kill and resume, stays bounded, and the figure
draws what the file holds."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fedclock.metrics.timeline as timeline_mod
from fedclock.config import load_config
from fedclock.experiment import run_experiment
from fedclock.metrics.timeline import OUTCOMES, TIMELINE_FILE, read_timeline
from fedclock.report import build_report
from fedclock.report import timeline as draw
from tests.conftest import tiny_raw

# (overrides) → a run whose tasks end in each outcome between them
CASES: dict[str, tuple[str, ...]] = {
    # the deadline cuts the slow class's tasks: discarded
    "drop-stragglers": ("strategy.name=drop-stragglers", "strategy.t_max=1.5"),
    # layer suffixes (depth on hover) and the cut ones
    "salf": (
        "strategy.name=salf",
        "salf.scenario=deadline",
        "strategy.t_max=1.5",
        "budget.aggregations=6",
    ),
    # stale updates, an arrival left in the buffer, tasks in flight at the end
    "fedbuff": (
        "strategy.name=fedbuff",
        "strategy.buffer_size=3",
        "budget.aggregations=null",
        "budget.virtual_time=8",
    ),
    # the guard refuses the faulty clients' updates
    "guarded": (
        "strategy.name=fedasync",
        "budget.aggregations=30",
        "population.faults.fraction=0.34",
        "population.faults.kind=scale",
        "guard.max_update_norm=1000",
    ),
    # Fed-RAA's fragments
    "fedraa": ("strategy.name=fed-raa", "budget.aggregations=12"),
}


# outcomes each case must have (so that every outcome's count is checked against a non-zero)
EXPECTED = {
    "drop-stragglers": {"used", "discarded"}, "salf": {"used", "discarded"},
    "fedbuff": {"used", "stale", "unaggregated", "unfinished"},
    "guarded": {"stale", "rejected", "unfinished"}, "fedraa": {"stale", "unfinished"},
}  # fmt: skip


def _read_line_by_line(path: Path) -> timeline_mod.Timeline:
    saved = timeline_mod._columns_at_once
    timeline_mod._columns_at_once = lambda *a: None  # type: ignore[assignment]
    try:
        return read_timeline(path)
    finally:
        timeline_mod._columns_at_once = saved


def _run(tmp_path: Path, case: str, *more: str) -> tuple[Path, dict[str, Any]]:
    cfg = load_config(raw=tiny_raw(executor={"threads": 1}), overrides=[*CASES[case], *more])
    res = run_experiment(cfg, run_dir=tmp_path / case)
    return res.run_dir, res.summary


@pytest.mark.parametrize("case", list(CASES))
def test_the_timeline_agrees_with_the_runs_counts(case: str, tmp_path: Path) -> None:
    run_dir, s = _run(tmp_path, case)
    tl = read_timeline(run_dir / TIMELINE_FILE)
    assert tl.complete and len(tl) == tl.meta["tasks_dispatched"]
    n = tl.counts()
    assert {o for o, k in n.items() if k} >= EXPECTED[case]
    assert n["used"] + n["stale"] == s["updates_used"]
    # the columns read at once equal the line-by-line check's (blanks, every outcome)
    slow = _read_line_by_line(run_dir / TIMELINE_FILE)
    for c, v in tl.tasks.items():
        assert (
            np.array_equal(v, slow.tasks[c], equal_nan=True)
            if isinstance(v, np.ndarray)
            else v == slow.tasks[c]
        )
    assert np.array_equal(tl.agg_t, slow.agg_t) and np.array_equal(tl.agg_v, slow.agg_v)
    assert n["discarded"] == s["updates_discarded"]
    assert n["rejected"] == s["updates_rejected"]
    assert n["used"] + n["stale"] + n["rejected"] + n["unaggregated"] == s["updates_received"]
    assert len(tl.agg_t) == s["aggregations"] == tl.meta["aggregations"]
    # every aggregated task's staleness, as summary.json's histogram counts them
    t = tl.tasks
    used = [i for i, o in enumerate(t["outcome"]) if o in ("used", "stale")]
    hist = Counter(int(t["staleness"][i]) for i in used)
    assert {str(k): v for k, v in sorted(hist.items())} == s["staleness_histogram"]
    assert all((t["staleness"][i] == 0) == (t["outcome"][i] == "used") for i in used)
    # each bar: dispatch ≤ end; dispatch order; arrived tasks end at dispatch + their phases
    assert (t["t_end"] >= t["t_start"]).all() and (np.diff(t["t_start"]) >= 0).all()
    assert (np.diff(t["task_id"]) == 1).all() and t["task_id"][0] == 0
    arrived = np.array([o in ("used", "stale", "rejected", "unaggregated") for o in t["outcome"]])
    phases = t["download_s"] + t["compute_s"] + t["upload_s"]
    np.testing.assert_allclose(
        t["t_end"][arrived], (t["t_start"] + phases)[arrived], rtol=1e-8, atol=1e-8
    )  # (the file keeps 9 significant digits)
    assert (t["t_end"] <= s["virtual_time"] * (1 + 1e-8)).all()
    # compute wasted (summary.json's counter) from the file's rows: discarded and unfinished
    # tasks' compute up to where their bars stop, rejected ones' in full
    done = np.clip(t["t_end"] - t["t_start"] - t["download_s"], 0.0, t["compute_s"])
    cut = np.array([o in ("discarded", "unfinished") for o in t["outcome"]])
    rejected = np.array([o == "rejected" for o in t["outcome"]])
    wasted = done[cut].sum() + t["compute_s"][rejected].sum()
    assert wasted == pytest.approx(s["compute_s_wasted"], rel=1e-6, abs=1e-6)


def test_the_work_shapes_are_labelled(tmp_path: Path) -> None:
    salf, _ = _run(tmp_path, "salf")
    works = set(read_timeline(salf / TIMELINE_FILE).tasks["work"])
    assert any(w.startswith("layer-suffix (depth ") for w in works)
    raa, _ = _run(tmp_path, "fedraa")
    works = set(read_timeline(raa / TIMELINE_FILE).tasks["work"])
    assert any(w.startswith("fragment 1 of ") for w in works), works


def test_the_file_is_bounded_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline_mod, "MAX_TASKS", 7)
    monkeypatch.setattr(timeline_mod, "MAX_AGGREGATIONS", 3)
    run_dir, s = _run(tmp_path, "fedbuff")
    path = run_dir / TIMELINE_FILE
    tl = read_timeline(path)
    assert len(tl) == 7 and list(tl.tasks["task_id"]) == list(range(7))  # the first 7
    assert len(tl.agg_t) == 3 and tl.meta["aggregations"] == s["aggregations"] > 3
    assert tl.meta["tasks_dispatched"] > 7 and not tl.complete
    assert len(path.read_text().splitlines()) == 3 + 7 + 3  # meta, words, header, rows
    # the report says what the file holds
    page = build_report(run_dir)
    assert f"the first 7 of {tl.meta['tasks_dispatched']} tasks" in page


def test_a_long_run_keeps_the_default_bound(tmp_path: Path) -> None:
    """About 1 MB at most: MAX_TASKS rows of well under 100 bytes (the file of a run with more
    tasks than the bound has exactly the bound)."""
    run_dir, _ = _run(tmp_path, "fedbuff", "budget.virtual_time=40")
    text = (run_dir / TIMELINE_FILE).read_text()
    rows = text.splitlines()[3:]
    assert max(len(r) for r in rows) < 100
    assert timeline_mod.MAX_TASKS * 100 + timeline_mod.MAX_AGGREGATIONS * 40 <= 1_500_000


class _Crash(Exception):
    pass


def test_a_killed_and_resumed_run_writes_the_same_timeline(tmp_path: Path) -> None:
    raw = tiny_raw(executor={"threads": 1})
    cfg = load_config(raw=raw, overrides=[*CASES["salf"], "checkpoint.every_aggregations=1"])
    whole = run_experiment(cfg, run_dir=tmp_path / "whole").run_dir
    seen = [0]

    def crash(sim: Any) -> None:
        seen[0] += 1
        if seen[0] == 40:
            raise _Crash

    with pytest.raises(_Crash):
        run_experiment(cfg, run_dir=tmp_path / "killed", progress=crash, resume=True)
    assert not (tmp_path / "killed" / TIMELINE_FILE).exists()
    killed = run_experiment(cfg, run_dir=tmp_path / "killed", resume=True).run_dir
    assert json.loads((killed / "meta.json").read_text())["resumed"]
    assert (killed / TIMELINE_FILE).read_text() == (whole / TIMELINE_FILE).read_text()


# ----------------------------------------------------------------------------- drawing
def _synthetic(tmp_path: Path, clients: int, tasks_per_client: int) -> Path:
    """A timeline file: each client's tasks back to back, outcomes in turn."""
    rec = timeline_mod.TimelineRecorder()
    rows = []
    for k in range(tasks_per_client):
        for c in range(clients):
            t0 = 2.0 * k
            out = k % len(OUTCOMES)
            end = t0 + 1.5 if OUTCOMES[out] in ("discarded", "unfinished", "offline") else t0 + 1.9
            rows.append([c, t0, 0.2, 1.5, 0.2, end, out, k, k % 2 if out < 2 else np.nan,
                         end if out < 2 else np.nan, 0, 3])  # fmt: skip
    rec.rows, rec.labels = rows, ["full-model"]
    rec.aggregations = [(2.0 * k + 1.9, k + 1) for k in range(tasks_per_client)]
    tmp_path.mkdir(parents=True, exist_ok=True)
    return rec.write(tmp_path, 2.0 * tasks_per_client, len(rows), tasks_per_client)


def test_the_figure_draws_every_task_split_into_its_phases(tmp_path: Path) -> None:
    tl = read_timeline(_synthetic(tmp_path, clients=4, tasks_per_client=7))
    data, layout, _, clients, window, drawn = draw.figure(tl)
    assert clients == [0, 1, 2, 3] and drawn == 28 and window == (0.0, 14.0)
    bars = [d for d in data if d["type"] == "bar"]
    assert {d["legendgroup"] for d in bars} == set(OUTCOMES)
    # per task, its segments tile [dispatch, end]: download, compute, upload (cut ones shorter)
    total = sum(sum(d["x"]) for d in bars)
    assert total == pytest.approx(float((tl.tasks["t_end"] - tl.tasks["t_start"]).sum()))
    cut = [d for d in bars if d["legendgroup"] == "discarded"]
    assert sorted(d["x"][0] for d in cut) == pytest.approx([0.2, 1.3])  # no upload
    assert layout["yaxis"]["categoryarray"] == [f"client {c}" for c in range(4)]
    (lines,) = [d for d in data if d["type"] == "scatter"]
    assert len([x for x in lines["x"] if x is not None]) == 2 * 7  # (a line per server step)


def test_the_figure_shows_at_most_50_clients_and_a_window(tmp_path: Path) -> None:
    tl = read_timeline(_synthetic(tmp_path, clients=60, tasks_per_client=10))
    _, _, _, clients, window, drawn = draw.figure(tl)
    assert clients == list(range(50)) and drawn == 500 and window == (0.0, 20.0)
    _, _, _, clients, window, drawn = draw.figure(tl, max_bars=120)
    # the window ends at the dispatch of the 121st task of those clients: 2 rounds of 50
    assert window == (0.0, 4.0) and drawn == 100
    _, _, _, clients, window, drawn = draw.figure(tl, window=(5.0, 9.0))
    assert drawn == 50 * 3 and window == (5.0, 9.0)  # dispatched at 4 (ending after 5), 6, 8


# every way issue 46 found to crash `fedclock report` through timeline.csv, and a few more:
# (what is done to the file, the words of the sentence the page shows instead of the figure)
DAMAGES = {
    "non-finite": (lambda lines: _cell(lines, 3, 5, "inf"), "compute_s is not a finite number"),
    "nan": (lambda lines: _cell(lines, 3, 3, "nan"), "t_start is not a finite number"),
    "blank line": (lambda lines: [*lines[:4], "", *lines[4:]], "not a row of the timeline"),
    "unknown outcome": (lambda lines: _cell(lines, 3, 8, "lost"), "unknown outcome 'lost'"),
    "counts not an object": (lambda lines: [timeline_mod.MAGIC + "[1, 2]", *lines[1:]],
                             "not the timeline's counts"),
    "end not a number": (lambda lines: [lines[0].replace('"end": ', '"end": "x", "e": '),
                                        *lines[1:]], "count 'end' is not a finite number"),
    "short row": (lambda lines: [*lines[:4], "task,1,2", *lines[4:]], "not a row of the timeline"),
    "bad client": (lambda lines: _cell(lines, 3, 2, "x"), "client is not a finite number"),
}  # fmt: skip


def _cell(lines: list[str], row: int, col: int, value: str) -> list[str]:
    cells = lines[row].split(",")
    cells[col] = value
    return [*lines[:row], ",".join(cells), *lines[row + 1 :]]


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_report_on_a_damaged_timeline_names_the_line_and_writes_the_rest(
    damage: str, tmp_path: Path
) -> None:
    """`fedclock report` on a run whose timeline.csv was damaged: no traceback, the page is
    written with one sentence (the file and its line) where the timeline would be."""
    from typer.testing import CliRunner

    from fedclock.cli import app

    run_dir, _ = _run(tmp_path, "drop-stragglers")
    path = run_dir / TIMELINE_FILE
    change, words = DAMAGES[damage]
    path.write_text("\n".join(change(path.read_text().splitlines())) + "\n")
    with pytest.raises(ValueError, match=rf"{TIMELINE_FILE}, line \d+: .*{words}"):
        read_timeline(path)
    res = CliRunner().invoke(app, ["report", str(run_dir)])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert len([x for x in res.output.splitlines() if x.strip()]) <= 6
    page = (run_dir / "report.html").read_text()
    assert words in page.replace("&#x27;", "'") and "test accuracy" in page.lower()
    assert "Damaged files" in page  # listed first, and said on the terminal
    assert any(TIMELINE_FILE in x and "left out" in x for x in res.output.splitlines()), res.output


@pytest.mark.parametrize(
    ("content", "words"),
    [(b"\xff\xfe\x00garbage", "not UTF-8 text"), (b"", "its first line differs")],
)
def test_a_timeline_that_is_not_text_is_one_sentence(
    content: bytes, words: str, tmp_path: Path
) -> None:
    """A timeline.csv that is not UTF-8 (or empty): the reader's sentence names the file, not
    the codec; `report` still writes the page and lists the file as damaged."""
    from typer.testing import CliRunner

    from fedclock.cli import app

    run_dir, _ = _run(tmp_path, "drop-stragglers")
    path = run_dir / TIMELINE_FILE
    path.write_bytes(content)
    with pytest.raises(ValueError, match=words) as err:
        read_timeline(path)
    assert str(path) in str(err.value) and "codec" not in str(err.value)
    res = CliRunner().invoke(app, ["report", str(run_dir)])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    page = (run_dir / "report.html").read_text()
    assert "Damaged files" in page and words in page
