"""The device timeline: what every device did, one row per task, in a run's ``timeline.csv``.

:class:`TimelineRecorder` is an observer (:mod:`fedclock.sim.observers`). For each task it
keeps the client, the dispatch time, the download / compute / upload split of its
:class:`~fedclock.devices.cost.TaskTiming`, when it ended (arrived, was cut, or the run
ended), its outcome, its base model version, its staleness when aggregated and its work
shape (SALF's layer suffix, Fed-RAA's fragment, a CIS exit); and the time of every server
step. It only reads: no metric changes with it.

Outcomes (:data:`OUTCOMES`), each counted like summary.json counts it:

- ``used``: aggregated with staleness 0 and ``stale``: aggregated with staleness ≥ 1
  (staleness as in summary.json: versions made since its base); together ``updates_used``;
- ``discarded``: cancelled before it arrived — cut at the deadline (``updates_discarded``);
- ``rejected``: arrived and refused by the update guard (``updates_rejected``);
- ``unaggregated``: arrived, never aggregated before the run ended (e.g. in FedBuff's buffer);
- ``unfinished``: still in flight when the run ended (its bar stops at the end);
- ``offline``: lost when its device went offline (a trace's availability; ``updates_lost``),
  its bar ending then.

``used + stale + rejected + unaggregated`` is ``updates_received``.

Bounded: the file holds the first :data:`MAX_TASKS` tasks in dispatch order (task ids
0 … MAX_TASKS − 1) and the first :data:`MAX_AGGREGATIONS` server steps; its first line says
how many there were in all, so a reader knows whether it holds the whole run. Between events
the rows are checkpoint state (:meth:`TimelineRecorder.checkpoint_state`), so a resumed run
writes the file an uninterrupted run writes.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedclock.outputs import write_atomic
from fedclock.sim.types import Contribution, ModelVersion, Task

TIMELINE_FILE = "timeline.csv"
#: tasks and server steps kept (the first ones): about 1 MB of CSV at most
MAX_TASKS = 10_000
MAX_AGGREGATIONS = 10_000
OUTCOMES = ("used", "stale", "discarded", "rejected", "unaggregated", "unfinished", "offline")
MAGIC = "# fedclock device timeline "
COLUMNS = (
    "event", "task_id", "client", "t_start", "download_s", "compute_s", "upload_s", "t_end",
    "outcome", "base_version", "staleness", "t_server", "work", "local_steps",
)  # fmt: skip

# a row in memory: a list of numbers, indexed by task id (dispatch order)
_CLIENT, _START, _DOWN, _COMPUTE, _UP, _END, _OUTCOME, _BASE, _STALE, _SERVER, _WORK, _STEPS = (
    range(12)
)
_WIDTH = 12
# outcome codes: the final ones index OUTCOMES; two more while the task is open
_O_USED, _O_STALE, _O_DISCARDED, _O_REJECTED, _O_UNAGGREGATED, _O_UNFINISHED, _O_OFFLINE = range(7)
_O_IN_FLIGHT, _O_ARRIVED = _O_UNFINISHED, _O_UNAGGREGATED  # (what they are if the run ends so)


class TimelineRecorder:
    """The observer that writes :data:`TIMELINE_FILE` (see the module docstring)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (checkpoint_state: arrays)

    def __init__(self, max_tasks: int | None = None, max_aggregations: int | None = None) -> None:
        self.max_tasks = MAX_TASKS if max_tasks is None else max_tasks
        self.max_aggregations = MAX_AGGREGATIONS if max_aggregations is None else max_aggregations
        self.rows: list[list[float]] = []
        self.aggregations: list[tuple[float, int]] = []  # (virtual time, new version)
        self._open = 0  # recorded tasks without their final outcome yet
        self.labels: list[str] = []  # work-shape labels, by first use
        self._label_of: dict[Any, int] = {}  # work shape → its label's index

    # ---- observer hooks
    def on_dispatch(self, sim: Any, task: Task) -> None:
        if task.task_id >= self.max_tasks:
            return
        self._open += 1
        work = self._work(task.plan.shape)
        down, compute, up = task.timing
        t = task.t_start
        self.rows.append([
            task.client, t, down, compute, up, t + (down + compute + up), _O_IN_FLIGHT,
            task.base.version, math.nan, math.nan, work, task.plan.local_steps,
        ])  # fmt: skip

    def on_measured(self, sim: Any, task: Task) -> None:
        """A deployment measured the task's phases (fedclock.deploy.driver): its bar as timed."""
        if task.task_id < len(self.rows):
            row = self.rows[task.task_id]
            row[_DOWN], row[_COMPUTE], row[_UP] = task.timing
            row[_END] = task.t_start + task.timing.duration
            row[_WORK] = self._work(task.plan.shape)  # (what the device did: it may cut)
            row[_STEPS] = task.plan.local_steps

    def on_arrival(self, sim: Any, contribution: Contribution) -> None:
        tid = contribution.task.task_id
        if tid < len(self.rows):
            self.rows[tid][_OUTCOME] = _O_ARRIVED

    def on_cancel(self, sim: Any, task: Task) -> None:
        if task.task_id < len(self.rows):
            row = self.rows[task.task_id]
            row[_OUTCOME], row[_END] = _O_DISCARDED, sim.now
            self._open -= 1

    def on_lost(self, sim: Any, task: Task) -> None:
        if task.task_id < len(self.rows):
            row = self.rows[task.task_id]
            row[_OUTCOME], row[_END] = _O_OFFLINE, sim.now
            self._open -= 1

    def on_reject(self, sim: Any, contribution: Contribution) -> None:
        tid = contribution.task.task_id
        if tid < len(self.rows):
            row = self.rows[tid]
            row[_OUTCOME], row[_SERVER] = _O_REJECTED, sim.now
            self._open -= 1

    def on_commit(self, sim: Any, contributions: Sequence[Contribution]) -> None:
        if not self._open:  # (past the bound, every recorded task settled: nothing to do)
            return
        current, now, rows = sim.model.version, sim.now, self.rows
        n = len(rows)
        for c in contributions:
            task = c.task
            if task.task_id < n:
                row = rows[task.task_id]
                stale = current - task.base.version  # as the simulator counts it
                row[_OUTCOME] = _O_USED if stale == 0 else _O_STALE
                row[_STALE], row[_SERVER] = stale, now
                self._open -= 1

    def on_aggregation(self, sim: Any, version: ModelVersion) -> None:
        if len(self.aggregations) < self.max_aggregations:
            self.aggregations.append((sim.now, version.version))

    def _work(self, shape: Any) -> int:
        """The index of a work shape's label."""
        work = self._label_of.get(shape)
        if work is None:
            work = self._label(shape.describe())
            self._label_of[shape] = work
        return work

    def _label(self, text: str) -> int:
        if text in self.labels:  # (a shape seen before a resume: the same label)
            return self.labels.index(text)
        self.labels.append(text)
        return len(self.labels) - 1

    # ---- checkpoints: the rows as one float64 array (ids, counts and versions are exact)
    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "rows": np.array(self.rows, dtype=np.float64).reshape(-1, _WIDTH),
            "aggregations": np.array(self.aggregations, dtype=np.float64).reshape(-1, 2),
            "open": self._open,
            "labels": list(self.labels),
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        self.rows = state["rows"].tolist()
        self.aggregations = [(t, int(v)) for t, v in state["aggregations"].tolist()]
        self._open = state["open"]
        self.labels = list(state["labels"])
        self._label_of = {}  # (rebuilt as shapes come: _label finds their labels)

    # ---- the file
    def write(self, run_dir: Path, end: float, dispatched: int, aggregations: int) -> Path:
        """Write ``run_dir/timeline.csv`` (atomically); ``end``: the virtual time the run ended
        at (where the bars of unfinished tasks stop); ``dispatched``, ``aggregations``: the
        run's tasks and server steps in all (the simulator's counts)."""
        meta = {
            "tasks_dispatched": dispatched,
            "tasks_recorded": len(self.rows),
            "max_tasks": self.max_tasks,
            "aggregations": aggregations,
            "aggregations_recorded": len(self.aggregations),
            "max_aggregations": self.max_aggregations,
            "end": end,
        }
        path = run_dir / TIMELINE_FILE
        fh = io.StringIO(newline="")
        fh.write(MAGIC + json.dumps(meta) + "\n")
        fh.write(
            f"# one row per task (event=task) in dispatch order, the first {self.max_tasks}; "
            f"then the server steps (event=aggregation), the first {self.max_aggregations}. "
            "Outcomes: used / stale = aggregated with staleness 0 / >= 1; discarded = cut at "
            "the deadline; rejected = refused by the update guard; unaggregated = arrived, "
            "never aggregated; unfinished = in flight when the run ended. See "
            "docs/report.md.\n"
        )
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(COLUMNS)
        for tid, r in enumerate(self.rows):
            unfinished = r[_OUTCOME] == _O_IN_FLIGHT
            w.writerow([
                "task", tid, int(r[_CLIENT]), _f(r[_START]), _f(r[_DOWN]), _f(r[_COMPUTE]),
                _f(r[_UP]), _f(min(r[_END], end) if unfinished else r[_END]),
                OUTCOMES[int(r[_OUTCOME])], int(r[_BASE]),
                "" if math.isnan(r[_STALE]) else int(r[_STALE]), _f(r[_SERVER]),
                self.labels[int(r[_WORK])], int(r[_STEPS]),
            ])  # fmt: skip
        for t, v in self.aggregations:
            w.writerow(["aggregation", "", "", _f(t), "", "", "", _f(t), "", v, "", "", "", ""])
        write_atomic(path, fh.getvalue())
        return path


def _f(x: float) -> str:
    """A time in the file: 9 significant digits (a relative error below 10⁻⁸)."""
    return "" if math.isnan(x) else f"{x:.9g}"


# ----------------------------------------------------------------------------- reading
class Timeline:
    """A run's timeline file, read back: ``meta`` (the first line's counts), ``tasks`` (a
    column name → array / list, one entry per task row) and ``aggregations`` (virtual times
    and the versions they made)."""

    def __init__(
        self, meta: dict[str, Any], tasks: dict[str, Any], agg_t: np.ndarray, agg_v: np.ndarray
    ) -> None:
        self.meta, self.tasks, self.agg_t, self.agg_v = meta, tasks, agg_t, agg_v

    def __len__(self) -> int:
        return len(self.tasks["task_id"])

    @property
    def complete(self) -> bool:
        """Whether the file holds every task and server step of the run."""
        m = self.meta
        return bool(
            m.get("tasks_recorded") == m.get("tasks_dispatched")
            and m.get("aggregations_recorded") == m.get("aggregations")
        )

    def counts(self) -> dict[str, int]:
        """Tasks per outcome (every outcome, 0 where none)."""
        out = dict.fromkeys(OUTCOMES, 0)
        for o in self.tasks["outcome"]:
            out[o] = out.get(o, 0) + 1
        return out


_INT = ("task_id", "client", "base_version", "local_steps")
_FLOAT = ("t_start", "download_s", "compute_s", "upload_s", "t_end", "staleness", "t_server")
_BLANKS = ("staleness", "t_server")  # (blank where the task was never aggregated)


def read_timeline(path: Path) -> Timeline:
    """Read a :data:`TIMELINE_FILE`, checking every line; ``ValueError`` (one sentence naming
    the file and the line) if it is not one or is damaged — a row without the timeline's
    columns, a blank line, a number that is not a finite number, an outcome it does not know,
    a first line that is not the counts object (a 10,000-task file in about 60 ms)."""
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            first = fh.readline()
            if not first.startswith(MAGIC):
                raise ValueError(
                    f"{path} is not a fedclock device timeline (its first line differs)."
                )
            meta = _read_counts(path, first[len(MAGIC) :])
            if not fh.readline().startswith("#"):  # (the line of words)
                raise ValueError(f"{path}, line 2: not the timeline's description line.")
            rows = list(csv.reader(fh))
    except UnicodeDecodeError:
        raise ValueError(
            f"{path} is not a fedclock device timeline: it is not UTF-8 text."
        ) from None
    except csv.Error as exc:
        raise ValueError(f"{path} is not a fedclock device timeline ({str(exc)[:60]}).") from None
    if not rows or tuple(rows[0]) != COLUMNS:
        raise ValueError(f"{path}, line 3: not the timeline's column names.")
    task_rows, agg_rows = [], []
    for line, r in enumerate(rows[1:], start=4):
        kind = r[0] if len(r) == len(COLUMNS) else None
        if kind == "task":
            task_rows.append((line, r))
        elif kind == "aggregation":
            agg_rows.append((line, r))
        else:
            raise ValueError(f"{path}, line {line}: not a row of the timeline's columns.")
    index = {c: COLUMNS.index(c) for c in (*_FLOAT, *_INT, "outcome", "work")}
    fast = _columns_at_once([r for _, r in task_rows], [r for _, r in agg_rows], index)
    if fast is not None:
        return Timeline(meta, *fast)
    tasks: dict[str, Any] = {c: [] for c in index}
    agg_t, agg_v = [], []
    for line, r in task_rows:
        for c in _FLOAT:
            tasks[c].append(_number(path, line, c, r[index[c]], blank=c in _BLANKS))
        for c in _INT:
            tasks[c].append(int(_number(path, line, c, r[index[c]], integer=True)))
        if r[index["outcome"]] not in OUTCOMES:
            raise ValueError(f"{path}, line {line}: unknown outcome {r[index['outcome']]!r}.")
        tasks["outcome"].append(r[index["outcome"]])
        tasks["work"].append(r[index["work"]])
    for line, r in agg_rows:
        agg_t.append(_number(path, line, "t_start", r[3]))
        agg_v.append(int(_number(path, line, "base_version", r[9], integer=True)))
    out: dict[str, Any] = {c: np.array(tasks[c], dtype=np.float64) for c in _FLOAT}
    out.update({c: np.array(tasks[c], dtype=np.int64) for c in _INT})
    out["outcome"], out["work"] = tasks["outcome"], tasks["work"]
    return Timeline(meta, out, np.array(agg_t, dtype=np.float64), np.array(agg_v, dtype=np.int64))


def _columns_at_once(
    task_rows: list[list[str]], agg_rows: list[list[str]], index: dict[str, int]
) -> tuple[dict[str, Any], np.ndarray, np.ndarray] | None:
    """The columns of a sound file, each converted by ``float``/``int`` in one pass (the
    same conversions as the line-by-line check, without a call per field); None if any
    field is not a finite number or an outcome is unknown — the line-by-line check then
    names the first bad line."""
    try:
        cols = list(zip(*task_rows, strict=True)) if task_rows else [()] * len(COLUMNS)
        out: dict[str, Any] = {}
        for c in _FLOAT:
            col = cols[index[c]]
            blank = [x == "" for x in col] if c in _BLANKS else None
            values = np.array(
                [math.nan if b else float(x) for x, b in zip(col, blank, strict=True)]
                if blank is not None and any(blank)
                else list(map(float, col)),
                dtype=np.float64,
            )
            finite = np.isfinite(values)
            if blank is not None:
                finite |= np.array(blank, dtype=bool)
            if not finite.all():
                return None
            out[c] = values
        for c in _INT:
            out[c] = np.array(list(map(int, cols[index[c]])), dtype=np.int64)
        outcomes = list(cols[index["outcome"]])
        if not set(outcomes) <= set(OUTCOMES):
            return None
        out["outcome"], out["work"] = outcomes, list(cols[index["work"]])
        agg_t = np.array([float(r[3]) for r in agg_rows], dtype=np.float64)
        agg_v = np.array([int(r[9]) for r in agg_rows], dtype=np.int64)
    except (ValueError, OverflowError):
        return None
    if not np.isfinite(agg_t).all():
        return None
    return out, agg_t, agg_v


def _read_counts(path: Path, text: str) -> dict[str, Any]:
    """The first line's counts: a JSON object of non-negative integers and a finite ``end``."""
    bad = ValueError(f"{path}, line 1: not the timeline's counts.")
    try:
        meta = json.loads(text)
    except ValueError:
        raise bad from None
    if not isinstance(meta, dict):
        raise bad
    for key, value in meta.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or (key != "end" and value != int(value)):
            raise ValueError(f"{path}, line 1: the count {key!r} is not a finite number.")
    return meta


def _number(
    path: Path, line: int, column: str, text: str, *, blank: bool = False, integer: bool = False
) -> float:
    """A finite number of the file (NaN for a blank where ``blank``); one sentence if not."""
    if blank and text == "":
        return math.nan
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{path}, line {line}: {column} is not a finite number ({text!r}).")
    return value


# ----------------------------------------------------------------------------- Perfetto
CHROME_TRACE_FILE = "timeline.json"
_PHASES = ("download", "compute", "upload")


def chrome_trace(tl: Timeline) -> dict[str, Any]:
    """The timeline in Chrome's Trace Event Format (opens in Perfetto and chrome://tracing):
    process 1 "devices" with one thread per client, each task's download, compute and upload
    as complete ``X`` events (ts and dur in µs of virtual time; a task cut short, lost
    offline or unfinished ends at its end time), its outcome, staleness, base version and
    work as args; process 0 "server" with each server step as an instant ``i`` event."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 0, "tid": 0, "name": "process_name", "args": {"name": "server"}},
        {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": "devices"}},
    ]
    t = tl.tasks
    for client in sorted(set(int(c) for c in t["client"])):
        events.append({"ph": "M", "pid": 1, "tid": client, "name": "thread_name",
                       "args": {"name": f"client {client}"}})  # fmt: skip
    for i in range(len(tl)):
        start, end = float(t["t_start"][i]), float(t["t_end"][i])
        stale = float(t["staleness"][i])
        args = {
            "task_id": int(t["task_id"][i]), "outcome": t["outcome"][i],
            "base_version": int(t["base_version"][i]),
            "staleness": None if math.isnan(stale) else int(stale), "work": t["work"][i],
        }  # fmt: skip
        at = start
        for phase in _PHASES:
            dur = float(t[f"{phase}_s"][i])
            stop = min(at + dur, end)
            if stop > at or (dur == 0 and phase == "compute" and at <= end):
                events.append({
                    "ph": "X", "pid": 1, "tid": int(t["client"][i]), "name": phase,
                    "cat": t["outcome"][i], "ts": at * 1e6, "dur": max(0.0, stop - at) * 1e6,
                    "args": args,
                })  # fmt: skip
            at += dur
            if at >= end:
                break
    for when, version in zip(tl.agg_t.tolist(), tl.agg_v.tolist(), strict=True):
        events.append({"ph": "i", "pid": 0, "tid": 0, "s": "p", "name": f"server step → v{int(version)}",
                       "ts": float(when) * 1e6})  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "fedclock timeline.csv", **{k: v for k, v in tl.meta.items()
                                                               if isinstance(v, int | float | str)}}}  # fmt: skip


def write_chrome_trace(run_dir: Path) -> Path:
    """``run_dir/timeline.json`` from its timeline.csv (:func:`chrome_trace`)."""
    tl = read_timeline(run_dir / TIMELINE_FILE)
    out = run_dir / CHROME_TRACE_FILE
    if out.exists() and not (out.is_file() and out.read_bytes()[:16] == b'{"traceEvents":['):
        from fedclock.errors import ConfigError

        raise ConfigError(
            f"{out} is a file fedclock did not make; fedclock never writes over it, so move "
            "it away."
        )
    write_atomic(out, json.dumps(chrome_trace(tl), separators=(",", ":"), allow_nan=False))
    return out
