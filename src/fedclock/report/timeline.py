"""The device timeline's figure: each task a horizontal bar from dispatch to arrival (or to
where it was cut), split into download / compute / upload, coloured by outcome, with the
server steps as vertical lines; the data is a run's ``timeline.csv``
(:mod:`fedclock.metrics.timeline`). A plotly spec (data, layout) and the words around it.

What is drawn: the first :data:`MAX_CLIENTS` clients (by id) that have a task in the window;
the window is the one asked for (``fedclock report --timeline-window``), or else starts at 0
and ends at the dispatch of the ``max_bars``-th task of those clients (the whole run when it
has fewer), so a page stays small and quick however long the run.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np

from fedclock.metrics.timeline import OUTCOMES, Timeline

MAX_CLIENTS = 50
MAX_BARS = 3000  # tasks per timeline (each is up to three bar segments)
ROW_PX = 18

OUTCOME_COLOURS = {
    "used": "#2ca02c", "stale": "#ff7f0e", "discarded": "#d62728", "rejected": "#9467bd",
    "unaggregated": "#8c564b", "unfinished": "#7f7f7f", "offline": "#17becf",
}  # fmt: skip
OUTCOME_WORDS = {
    "used": "used (aggregated, staleness 0)",
    "stale": "stale (aggregated, staleness ≥ 1)",
    "discarded": "discarded (cut at the deadline)",
    "rejected": "rejected by the update guard",
    "unaggregated": "arrived, never aggregated",
    "unfinished": "in flight when the run ended",
    "offline": "lost when its device went offline",
}
# (phase, opacity): the phases of one task share its outcome's colour
PHASES = (("download", 0.35), ("compute", 1.0), ("upload", 0.6))


def _r(x: float) -> float:
    return float(f"{x:.6g}")


def select(
    tl: Timeline, window: tuple[float, float] | None, max_bars: int
) -> tuple[np.ndarray, list[int], tuple[float, float]]:
    """(indices of the tasks drawn, the clients shown, the window)."""
    t = tl.tasks
    start, end_t = t["t_start"], t["t_end"]
    run_end = float(tl.meta.get("end", float(end_t.max()) if len(end_t) else 0.0))
    if window is None:
        lo, hi = 0.0, run_end
    else:
        lo, hi = window
    idx = np.flatnonzero((start < hi) & (end_t >= lo)) if len(start) else np.zeros(0, int)
    clients = sorted(set(t["client"][idx].tolist()))[:MAX_CLIENTS]
    idx = idx[np.isin(t["client"][idx], clients)]
    if window is None and len(idx) > max_bars:  # the window ends where the bars run out
        hi = float(start[idx[max_bars]])
        idx = idx[start[idx] < hi]
        clients = sorted(set(t["client"][idx].tolist()))
    return idx, clients, (lo, hi)


def figure(
    tl: Timeline, *, window: tuple[float, float] | None = None, max_bars: int = MAX_BARS
) -> tuple[list[dict[str, Any]], dict[str, Any], int, list[int], tuple[float, float], int]:
    """(plotly data, layout, height in px, clients shown, window, tasks drawn)."""
    t = tl.tasks
    idx, clients, (lo, hi) = select(tl, window, max_bars)
    rows = [f"client {c}" for c in clients]
    data: list[dict[str, Any]] = []
    outcome = np.array(t["outcome"], dtype=object)
    work = t["work"]
    for o in OUTCOMES:
        mine = idx[outcome[idx] == o]
        if not len(mine):
            continue
        t0, t1 = t["t_start"][mine], t["t_end"][mine]
        dur = np.maximum(t1 - t0, 0.0)
        down = np.minimum(t["download_s"][mine], dur)
        comp = np.minimum(t["compute_s"][mine], dur - down)
        up = np.maximum(dur - down - comp, 0.0)
        widths = {"download": down, "compute": comp, "upload": up}
        bases = {"download": t0, "compute": t0 + down, "upload": t0 + down + comp}
        # the long hover text goes on each task's compute segment (its download if it was
        # cut before computing)
        main = np.where(comp > 0, "compute", np.where(down > 0, "download", "upload"))
        for phase, opacity in PHASES:
            keep = (widths[phase] > 0) | (main == phase)
            if not keep.any():
                continue
            text = []
            for j in np.flatnonzero(keep):
                i = mine[j]
                if main[j] == phase:
                    text.append(_hover(t, i, o, work[i], down[j], comp[j], up[j]))
                else:
                    text.append(f"{phase} {widths[phase][j]:.3g} s")
            data.append({
                "type": "bar", "orientation": "h", "name": f"{o} ({len(mine)})",
                "legendgroup": o, "showlegend": phase == "compute",
                "y": [f"client {c}" for c in t["client"][mine[keep]].tolist()],
                "x": [_r(x) for x in widths[phase][keep].tolist()],
                "base": [_r(x) for x in bases[phase][keep].tolist()],
                "marker": {"color": OUTCOME_COLOURS[o], "opacity": opacity,
                           "line": {"width": 0}},
                "text": text, "textposition": "none",
                "hovertemplate": "%{text}<extra></extra>",
            })  # fmt: skip
    agg = tl.agg_t[(tl.agg_t >= lo) & (tl.agg_t <= hi)]
    if len(agg):
        xs: list[float | None] = []
        ys: list[float | None] = []
        for a in agg.tolist():
            xs += [_r(a), _r(a), None]
            ys += [0.0, 1.0, None]
        data.append({
            "type": "scatter", "mode": "lines", "name": f"server step ({len(agg)})",
            "x": xs, "y": ys, "yaxis": "y2", "line": {"color": "rgba(38,50,56,0.55)",
            "width": 1, "dash": "dot"}, "hovertemplate": "server step at %{x:.4g} s<extra></extra>",
        })  # fmt: skip
    height = 130 + ROW_PX * max(len(rows), 3)
    layout = {
        "barmode": "overlay", "bargap": 0.25,
        "xaxis": {"title": {"text": "virtual time (s)"}, "range": [lo, hi], "zeroline": False},
        "yaxis": {"type": "category", "categoryorder": "array", "categoryarray": rows,
                  "autorange": "reversed", "dtick": 1, "tickfont": {"size": 10}},
        "yaxis2": {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
        "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
        "margin": {"l": 70, "r": 20, "t": 50, "b": 50},
        "hovermode": "closest",
    }  # fmt: skip
    return data, layout, height, clients, (lo, hi), len(idx)


def _hover(
    t: dict[str, Any], i: int, outcome: str, work: str, down: float, comp: float, up: float
) -> str:
    lines = [
        f"task {int(t['task_id'][i])} · client {int(t['client'][i])}",
        f"dispatched {t['t_start'][i]:.4g} s, {_end_words(outcome)} {t['t_end'][i]:.4g} s",
        html.escape(OUTCOME_WORDS[outcome]),
        f"base version {int(t['base_version'][i])}"
        + ("" if math.isnan(t["staleness"][i]) else f", staleness {int(t['staleness'][i])}")
        + ("" if math.isnan(t["t_server"][i]) else f", at the server {t['t_server'][i]:.4g} s"),
        f"{html.escape(work)}, {int(t['local_steps'][i])} local steps",
        f"download {down:.3g} s · compute {comp:.3g} s · upload {up:.3g} s",
    ]
    return "<br>".join(lines)


def _end_words(outcome: str) -> str:
    if outcome == "discarded":
        return "cut at"
    if outcome == "unfinished":
        return "run ended at"
    if outcome == "offline":
        return "device went offline at"
    return "arrived"


def caption(tl: Timeline, clients: list[int], window: tuple[float, float], drawn: int) -> str:
    """The words under the figure: what it shows and what the file holds (HTML)."""
    m = tl.meta
    counts = tl.counts()
    parts = ", ".join(f"{OUTCOME_WORDS[o]}: {n}" for o, n in counts.items() if n)
    held = (
        f"the first {m.get('tasks_recorded')} of {m.get('tasks_dispatched')} tasks and "
        f"{m.get('aggregations_recorded')} of {m.get('aggregations')} server steps "
        "(a run's file keeps the first tasks only)"
        if not tl.complete
        else f"all {m.get('tasks_dispatched')} tasks and {m.get('aggregations')} server steps"
    )
    return (
        f"<p class=note>{drawn} tasks of {len(clients)} clients, dispatched in "
        f"[{window[0]:.4g}, {window[1]:.4g}] s; each bar runs from dispatch to arrival (or "
        "to where it was cut), light = download, solid = compute, mid = upload; dotted lines "
        "are server steps. Hover a bar for its work (SALF's depth, Fed-RAA's fragment), "
        "staleness and base version; drag to zoom. The file holds "
        f"{held}; in it: {html.escape(parts)}.</p>"
    )
