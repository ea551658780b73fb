"""``report.html``: one self-contained page per run, comparison, sweep or tour.

:func:`write_report` reads a folder that fedclock wrote (nothing is re-run) and writes
``report.html`` into it: the headline table (mean ± std over seeds, and for a comparison the
paired differences against its first strategy), the config (for a comparison: what differs
between its cells), accuracy and loss against virtual time and against aggregations per
strategy with a band of ± one standard deviation over seeds, every exit's accuracy and the
routed CIS accuracy for early-exit runs, and a sweep's metric against the swept value.

The page opens offline: the plotting library (plotly.js as the ``plotly`` package ships it,
gzip-compressed and base64-encoded inline, about 2 MB, unpacked by the browser's
``DecompressionStream``) and every style are inline, the data is one JSON block. See
docs/report.md for why.

The device timeline (who computed, waited, was cut at the deadline or arrived stale) is drawn
from each run's :data:`TIMELINE_FILE` (:mod:`fedclock.metrics.timeline` records it,
:mod:`fedclock.report.timeline` draws it): a run's page shows its run's; a comparison's and
a sweep's show one per cell, of the cell's first seed.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import functools
import gzip
import html
import json
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedclock.errors import DataError
from fedclock.metrics.timeline import TIMELINE_FILE
from fedclock.outputs import HTML_GENERATOR, check_writable, write_atomic

REPORT_FILE = "report.html"
#: what a tour (``fedclock tour``) records in its folder: its steps and their conclusions
TOUR_FILE = "tour.json"

_PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
_MAX_POINTS = 1500  # points per curve (long runs are thinned evenly; the ends are kept)


# ----------------------------------------------------------------------------- reading
def folder_kind(folder: Path) -> str:
    """``run``, ``compare``, ``sweep`` or ``tour``; one sentence if ``folder`` is none."""
    if (folder / TOUR_FILE).is_file():
        return "tour"
    if (folder / "table.csv").is_file():
        return "sweep" if (folder / "pivot.md").is_file() else "compare"
    if (folder / "metrics.csv").is_file() or (folder / "summary.json").is_file():
        return "run"
    raise DataError(
        f"{folder} holds no fedclock run, comparison, sweep or tour (no metrics.csv, "
        "table.csv or tour.json)."
    )


#: the sentences of the damaged files met while one report is built (build_report lists
#: them on the page and hands them to its caller)
_DAMAGED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "fedclock_report_damaged", default=None
)


class _Run:
    """One run folder: summary, metrics, config text. A damaged summary or metrics file is
    read as empty and its sentence kept (``damage``; the report lists it and leaves the run
    out of its tables and curves)."""

    def __init__(self, folder: Path) -> None:
        from fedclock.metrics.readers import read_metrics
        from fedclock.metrics.recorder import read_summary

        self.folder = folder
        self.damage: list[str] = []
        self.summary: dict[str, Any] = {}
        self.metrics: dict[str, Any] = {}
        try:
            self.summary = read_summary(folder) or {}
        except DataError as exc:
            self.damage.append(str(exc))
        try:
            if (folder / "metrics.csv").is_file():
                self.metrics = read_metrics(folder)
        except DataError as exc:
            self.damage.append(str(exc))
        seen = _DAMAGED.get()
        if seen is not None:
            seen.extend(d for d in self.damage if d not in seen)
        cfg = folder / "config.yaml"
        self.config_text = (
            cfg.read_text(encoding="utf-8", errors="replace") if cfg.is_file() else ""
        )

    @property
    def seed(self) -> int | None:
        s = self.summary.get("seed")
        return s if isinstance(s, int) else None

    def config(self) -> dict[str, Any]:
        import yaml

        try:
            data = yaml.safe_load(self.config_text) if self.config_text else {}
        except yaml.YAMLError:
            return {}
        return data if isinstance(data, dict) else {}


def _seed_runs(folder: Path, seeds: Sequence[int] | None) -> list[_Run]:
    """The finished runs ``folder/seed-N`` (those of ``seeds`` if given), by seed."""
    runs = []
    for d in sorted(folder.glob("seed-*")):
        if not (d / "summary.json").is_file():
            continue
        try:
            seed = int(d.name[len("seed-") :])
        except ValueError:
            continue
        if seeds is not None and seed not in seeds:
            continue
        run = _Run(d)
        if not run.damage:  # (a damaged run is listed on the page, not averaged)
            runs.append(run)
    runs.sort(key=lambda r: r.seed if r.seed is not None else 0)
    return runs


def _read_table(folder: Path) -> list[dict[str, Any]]:
    from fedclock.metrics.readers import read_table

    rows: list[dict[str, Any]] = []
    for r in read_table(folder):
        row: dict[str, Any] = {}
        for k, v in r.items():
            if k.endswith(("_mean", "_std")):
                try:
                    row[k] = float(v) if v != "" else math.nan
                except ValueError:
                    row[k] = math.nan
            else:
                row[k] = v
        rows.append(row)
    return rows


def _seeds_of(row: dict[str, Any]) -> int:
    """A table row's ``n_seeds`` (1 if it is not a count)."""
    try:
        return max(1, int(float(row.get("n_seeds") or 1)))
    except (TypeError, ValueError, OverflowError):
        return 1


def _id_cols(rows: list[dict[str, Any]]) -> list[str]:
    return [
        k for k in (rows[0] if rows else {}) if not k.endswith(("_mean", "_std")) and k != "n_seeds"
    ]


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


# ----------------------------------------------------------------------------- formatting
def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return _esc(v)
    if isinstance(v, int):
        return str(v)
    return f"{v:.{digits}g}"


def _mean_std(m: float, s: float, n: int, digits: int) -> str:
    if not math.isfinite(m):
        return "—"
    if math.isfinite(s) and abs(s) < 1e-9 * max(1.0, abs(m)):
        s = 0.0  # float noise of equal values (1.4e-16): shown as 0
    return f"{m:.{digits}g}" if n <= 1 or not math.isfinite(s) else f"{m:.{digits}g} ± {s:.2g}"


def _table(head: Sequence[str], body: Sequence[Sequence[str]], cls: str = "") -> str:
    """An HTML table; cells are HTML already (escape text with :func:`_esc`)."""
    th = "".join(f"<th>{h}</th>" for h in head)
    rows = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in body)
    table = f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{rows}</tbody></table>'
    return f'<div class="tw">{table}</div>'


# ----------------------------------------------------------------------------- figures
class _Figures:
    """Plotly figures of one page, as JSON specs rendered by the page's script."""

    def __init__(self) -> None:
        self.specs: list[dict[str, Any]] = []

    def add(
        self, data: list[dict[str, Any]], layout: dict[str, Any], height: int = 360, attrs: str = ""
    ) -> str:
        fid = f"fig{len(self.specs)}"
        base = {
            "height": height,
            "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
            "hovermode": "closest",
            "legend": {"orientation": "h", "y": -0.28},
            "template": None,
        }
        self.specs.append({"id": fid, "data": data, "layout": {**base, **layout}})
        return f'<div class="fig" id="{fid}" data-fig="{fid}"{attrs}></div>'


def _clean(a: np.ndarray) -> list[float | None]:
    """JSON numbers (5 significant digits), NaN as null."""
    return [None if not math.isfinite(float(x)) else float(f"{float(x):.5g}") for x in a]


def _thin(n: int) -> np.ndarray:
    if n <= _MAX_POINTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, _MAX_POINTS).round().astype(int))


def _band(
    runs: Sequence[dict[str, np.ndarray]], x: str, y: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(grid, mean, std) of ``y`` against ``x`` over seeds: every seed's value in force at
    each point of the longest seed's ``x`` (evaluations of one config are at the same virtual
    times or aggregation indices, so this is exact there)."""
    from fedclock.metrics.readers import step_interp

    have = [r for r in runs if x in r and y in r and len(r[x])]
    if not have:
        return None
    grid = max((r[x] for r in have), key=len)
    ys = np.vstack([step_interp(r[x], r[y], grid) for r in have])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a point where no seed has a value
        mean = np.nanmean(ys, axis=0)
        std = np.nanstd(ys, axis=0, ddof=1) if len(have) > 1 else np.zeros_like(mean)
    return grid, mean, std


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _curve_traces(
    groups: dict[str, list[dict[str, np.ndarray]]], x: str, y: str, axis: str, legend: bool
) -> list[dict[str, Any]]:
    """Per group: a mean line and (over several seeds) a ± one-std band."""
    traces: list[dict[str, Any]] = []
    ax = {"xaxis": f"x{axis}", "yaxis": f"y{axis}"}
    for i, (label, runs) in enumerate(groups.items()):
        b = _band(runs, x, y)
        if b is None:
            continue
        grid, mean, std = b
        keep = _thin(len(grid))
        grid, mean, std = grid[keep], mean[keep], std[keep]
        col = _PALETTE[i % len(_PALETTE)]
        n = sum(1 for r in runs if y in r)
        if n > 1:
            traces.append({"type": "scatter", "mode": "lines", "x": _clean(grid),
                           "y": _clean(mean + std), "line": {"width": 0}, "hoverinfo": "skip",
                           "showlegend": False, "legendgroup": label, **ax})  # fmt: skip
            traces.append({"type": "scatter", "mode": "lines", "x": _clean(grid),
                           "y": _clean(mean - std), "line": {"width": 0}, "fill": "tonexty",
                           "fillcolor": _rgba(col, 0.18), "hoverinfo": "skip",
                           "showlegend": False, "legendgroup": label, **ax})  # fmt: skip
        name = label if n <= 1 else f"{label} (mean of {n} seeds)"
        traces.append({"type": "scatter", "mode": "lines", "name": name, "x": _clean(grid),
                       "y": _clean(mean), "line": {"color": col, "width": 2},
                       "legendgroup": label, "showlegend": legend, **ax,
                       "hovertemplate": f"{_esc(label)}<br>{x}=%{{x}}<br>{y}=%{{y:.4g}}<extra></extra>"})  # fmt: skip
    return traces


def _pair_figure(
    figs: _Figures, groups: dict[str, list[dict[str, np.ndarray]]], y: str, title: str
) -> str | None:
    """``y`` against virtual time (left) and against aggregations (right)."""
    data = _curve_traces(groups, "virtual_time", y, "", True)
    data += _curve_traces(groups, "aggregation", y, "2", False)
    if not data:
        return None
    layout = {
        "title": {"text": title},
        "grid": {"rows": 1, "columns": 2, "pattern": "independent"},
        "xaxis": {"title": {"text": "virtual time (s)"}},
        "xaxis2": {"title": {"text": "aggregations (server steps)"}},
        "yaxis": {"title": {"text": y}},
        "yaxis2": {"title": {"text": y}},
    }
    return figs.add(data, layout)


def _exit_figure(figs: _Figures, groups: dict[str, list[dict[str, np.ndarray]]]) -> str | None:
    """Every exit's test accuracy against aggregations, one panel per exit."""
    keys: list[str] = []
    for runs in groups.values():
        for r in runs:
            keys += [
                k for k in r if k.startswith("exit") and k.endswith("_accuracy") and k not in keys
            ]
    keys.sort(key=lambda k: int("".join(c for c in k if c.isdigit()) or 0))
    if not keys:
        return None
    data: list[dict[str, Any]] = []
    layout: dict[str, Any] = {
        "title": {"text": "Test accuracy of every exit"},
        "grid": {"rows": 1, "columns": len(keys), "pattern": "independent"},
    }
    for j, k in enumerate(keys):
        axis = "" if j == 0 else str(j + 1)
        data += _curve_traces(groups, "aggregation", k, axis, j == 0)
        layout[f"xaxis{axis}"] = {
            "title": {"text": f"{k.split('_')[0].replace('exit', 'exit ')}: aggregations"}
        }
        layout[f"yaxis{axis}"] = {"range": [0, 1]}
    return figs.add(data, layout)


def _curve_sections(
    figs: _Figures, groups: dict[str, list[dict[str, np.ndarray]]]
) -> list[tuple[str, str]]:
    out = []
    first = next((r for runs in groups.values() for r in runs if r), {})
    if "cis_accuracy" in first:
        fig = _pair_figure(figs, groups, "cis_accuracy", "Routed CIS accuracy")
        if fig:
            out.append(("CIS accuracy", fig))
        fig = _exit_figure(figs, groups)
        if fig:
            out.append(("Accuracy per exit", fig))
    for y, title in (("test_accuracy", "Test accuracy"), ("test_loss", "Test loss"),
                     ("federated_loss", "Federated loss (Fraboni et al., eq. 2)")):  # fmt: skip
        if y in first:
            fig = _pair_figure(figs, groups, y, title)
            if fig:
                out.append((title, fig))
    return out


# ----------------------------------------------------------------------------- sections
def timeline_section(
    run_dir: Path,
    figs: _Figures,
    *,
    window: tuple[float, float] | None = None,
    max_bars: int | None = None,
) -> str | None:
    """The device timeline of one run (:mod:`fedclock.report.timeline`) as HTML: its figure
    and caption; None when the run folder has no :data:`TIMELINE_FILE`."""
    from fedclock.metrics.timeline import read_timeline
    from fedclock.report import timeline as draw

    path = run_dir / TIMELINE_FILE
    if not path.is_file():
        return None
    try:
        tl = read_timeline(path)
    except (OSError, ValueError) as exc:
        seen = _DAMAGED.get()  # (listed first on the page, and said on the terminal)
        if seen is not None and str(exc) not in seen:
            seen.append(str(exc))
        return f"<p class=figerr>{_esc(exc)}</p>"
    if not len(tl):
        return "<p class=note>No task was dispatched in this run.</p>"
    data, layout, height, clients, win, drawn = draw.figure(
        tl, window=window, max_bars=draw.MAX_BARS if max_bars is None else max_bars
    )
    if not clients:
        return f"<p class=note>No task in the window [{win[0]:.4g}, {win[1]:.4g}] s.</p>"
    attrs = f' data-timeline-clients="{len(clients)}" style="min-height:{height}px"'
    fig = figs.add(data, layout, height, attrs)
    return fig + draw.caption(tl, clients, win, drawn)


def _timelines(
    cells: list[tuple[str, Path]], figs: _Figures, window: tuple[float, float] | None
) -> tuple[str, str] | None:
    """One timeline per cell (``(label, its first seed's run folder)``): the section."""
    from fedclock.report.timeline import MAX_BARS

    # a page with many cells draws fewer bars per cell (≈ 6,000 in all)
    max_bars = max(200, min(MAX_BARS, 6000 // max(1, len(cells))))
    parts = []
    for label, run_dir in cells:
        body = timeline_section(run_dir, figs, window=window, max_bars=max_bars)
        if body is not None:
            parts.append(f"<h3>{_esc(label)} · {_esc(run_dir.name)}</h3>{body}")
    if not parts:
        return None
    return ("Device timelines", "<p>Each cell's first seed.</p>" + "".join(parts))


def _headline_rows(rows: list[dict[str, Any]]) -> str:
    from fedclock.runs.tables import HEADLINE, metric_label

    ids = _id_cols(rows)
    cis = any(math.isfinite(r.get("cis_accuracy_mean", math.nan)) for r in rows)
    present = [
        m for m in HEADLINE
        if m.table and any(math.isfinite(r.get(f"{m.key}_mean", math.nan)) for r in rows)
    ]  # fmt: skip
    body = []
    for r in rows:
        n = _seeds_of(r)
        cells = [_esc(r[c]) if r[c] != "" else "—" for c in ids]
        cells += [
            _mean_std(r.get(f"{m.key}_mean", math.nan), r.get(f"{m.key}_std", math.nan), n,
                      m.digits)
            for m in present
        ]  # fmt: skip
        cells.append(str(n))
        body.append(cells)
    labels = [_esc(metric_label(m.key, m.label, cis=cis)) for m in present]
    return _table([*map(_esc, ids), *labels, "seeds"], body, "num")


def paired_differences(
    groups: dict[str, list[dict[str, Any]]], metrics: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Per-seed differences of each group against the first (same seed = same devices, data
    and draws): for every metric present, mean and sample std of (group − first) over the
    seeds both have, and in how many seeds the group is better. ``metrics``: the headline
    metrics marked ``paired`` by default (the rest are descriptive)."""
    names = list(groups)
    if len(names) < 2:
        return []
    from fedclock.runs.tables import HEADLINE

    if metrics is None:
        metrics = [m.key for m in HEADLINE if m.paired]
    base = {s["seed"]: s for s in groups[names[0]] if isinstance(s.get("seed"), int)}
    better = {m.key: m.higher_better for m in HEADLINE}
    out = []
    for name in names[1:]:
        mine = {s["seed"]: s for s in groups[name] if isinstance(s.get("seed"), int)}
        seeds = sorted(set(base) & set(mine))
        for key in metrics:
            pairs = [(mine[s].get(key), base[s].get(key)) for s in seeds]
            if not pairs or all(a is None and b is None for a, b in pairs):
                continue
            if key == "time_to_target":  # never reached: worse than any time
                pairs = [
                    (math.inf if a is None else a, math.inf if b is None else b) for a, b in pairs
                ]
            if any(not isinstance(v, int | float) for p in pairs for v in p):
                continue
            nums = [(float(a or 0), float(b or 0)) for a, b in pairs]  # (numbers: checked above)
            diffs = np.array([a - b for a, b in nums], dtype=float)
            finite = diffs[np.isfinite(diffs)]
            hi = better.get(key, True)
            wins = sum(1 for a, b in nums if (a > b if hi else a < b))
            out.append({
                "group": name, "baseline": names[0], "metric": key, "n": len(pairs),
                "mean": float(finite.mean()) if len(finite) == len(diffs) else math.nan,
                "std": float(finite.std(ddof=1)) if len(finite) == len(diffs) and len(finite) > 1 else math.nan,
                "wins": wins, "higher_is_better": hi,
            })  # fmt: skip
    return out


def _paired_html(diffs: list[dict[str, Any]]) -> str:
    if not diffs:
        return ""
    body = []
    for d in diffs:
        n = d["n"]
        m = "—" if not math.isfinite(d["mean"]) else f"{d['mean']:+.3g}"
        if math.isfinite(d["std"]):
            m += f" ± {d['std']:.2g}"
        body.append([_esc(d["group"]), _esc(d["metric"]), m,
                     f"{d['wins']}/{n}", "higher" if d["higher_is_better"] else "lower"])  # fmt: skip
    base = _esc(diffs[0]["baseline"])
    return (
        f"<h3>Paired differences against {base}</h3>"
        "<p>Each seed gives both strategies the same devices, data and random draws, so the "
        f"difference is taken seed by seed (strategy − {base}; mean ± sample std over the "
        "seeds both have). <i>better in</i>: seeds where the strategy is better (a time to "
        "target never reached counts as worse than any time).</p>"
        + _table(["strategy", "metric", "difference", "better in", "better is"], body, "num")
    )


def _config_diff(cells: dict[str, _Run]) -> str:
    flat = {name: _flatten(run.config()) for name, run in cells.items()}
    keys = sorted({k for f in flat.values() for k in f} - {"seed", "description"})
    differ = [
        k
        for k in keys
        if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flat.values()}) > 1
    ]
    if not differ:
        return "<p>Every cell has the same config (but its seed).</p>"
    body = [[_esc(k), *(_esc(flat[n].get(k, "—")) for n in cells)] for k in differ]
    return (
        "<p>Fields whose value differs between the cells (all other fields are the same; the "
        "first cell's full config is below).</p>"
        + _table(["field", *map(_esc, cells)], body, "cfg")
    )


def _config_block(text: str, summary: str = "Full config (config.yaml)") -> str:
    return f"<details><summary>{_esc(summary)}</summary><pre>{_esc(text)}</pre></details>"


# ----------------------------------------------------------------------------- pages
def _run_page(
    folder: Path, figs: _Figures, window: tuple[float, float] | None = None
) -> tuple[str, list[tuple[str, str]]]:
    run = _Run(folder)  # (a damaged summary or metrics: the page shows the rest, and says so)
    s = run.summary
    title = f"{s.get('name', folder.name)} · {s.get('strategy', '?')} · seed {s.get('seed', '?')}"
    keys = ["status", "cis_accuracy", "final_test_accuracy", "best_test_accuracy",
            "final_test_loss", "time_to_target", "virtual_time", "aggregations", "updates_used",
            "updates_discarded", "updates_rejected", "mean_staleness", "compute_s_spent",
            "compute_s_wasted", "useful_work_ratio", "wall_s"]  # fmt: skip
    body = [[_esc(k), _num(s.get(k))] for k in keys if k in s]
    sections = [("Summary", _table(["metric", "value"], body, "num"))]
    sections += _curve_sections(figs, {str(s.get("strategy", folder.name)): [run.metrics]})
    tl = timeline_section(folder, figs, window=window)
    if tl:
        sections.append(("Device timeline", tl))
    sections.append(("Config", _config_block(run.config_text) if run.config_text else "<p>—</p>"))
    return title, sections


def _cell_groups(
    folder: Path, rows: list[dict[str, Any]], seeds: Sequence[int] | None
) -> dict[str, list[_Run]]:
    """Each table row's runs: its strategy entry's folder under ``runs/`` (for a learning-rate
    grid, the selected rate's)."""
    ids = [c for c in _id_cols(rows) if c != "lr"]
    runs_root = folder / "runs"
    candidates: list[Path] = []
    if runs_root.is_dir():
        for d in sorted(runs_root.iterdir()):
            if not d.is_dir():
                continue
            if any(d.glob("seed-*")):
                candidates.append(d)
            candidates += sorted(p for p in d.glob("lr-*") if p.is_dir())
    out: dict[str, list[_Run]] = {}
    for row in rows:
        label = row["strategy"] + "".join(
            f" {c}={row[c]}" for c in ids if c != "strategy" and row.get(c, "") != ""
        )
        for d in candidates:
            if "lr" in row and row["lr"] != "" and d.name != f"lr-{float(row['lr']):g}":
                continue
            runs = _seed_runs(d, seeds)
            if not runs or runs[0].summary.get("strategy") != row["strategy"]:
                continue
            strat = runs[0].config().get("strategy") or {}
            given = [c for c in ids if c != "strategy" and row.get(c, "") != ""]
            blank = [c for c in ids if c != "strategy" and row.get(c, "") == ""]
            if all(_same(strat.get(c), row[c]) for c in given) and not any(
                _overridden(d, c) for c in blank
            ):
                out[label] = runs
                break
    return out


def _overridden(d: Path, field: str) -> bool:
    """Whether the entry folder ``d`` names ``field`` as an override (``fedbuff-buffer_size=5``)."""
    name = d.parent.name if d.name.startswith("lr-") else d.name
    return f"{field}=" in name


def _same(a: Any, b: Any) -> bool:
    if str(a) == str(b):
        return True
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def _compare_page(
    folder: Path, figs: _Figures, seeds: Sequence[int] | None,
    window: tuple[float, float] | None = None,
) -> tuple[str, list[tuple[str, str]]]:  # fmt: skip
    rows = _read_table(folder)
    groups = _cell_groups(folder, rows, seeds)
    first = next(iter(groups.values()), [])
    name = first[0].summary.get("name", folder.name) if first else folder.name
    all_seeds = sorted({r.seed for runs in groups.values() for r in runs if r.seed is not None})
    title = f"{name}: {len(rows)} strategies × {len(all_seeds) or '?'} seed(s)"
    head = _headline_rows(rows) + (
        f"<p class=note>seeds: {', '.join(map(str, all_seeds))} · mean ± sample std over seeds · "
        f"{_esc(folder / 'table.csv')} has every metric</p>"
    )
    diffs = paired_differences({k: [r.summary for r in v] for k, v in groups.items()})
    sections = [("Results", head + _paired_html(diffs))]
    sections += _curve_sections(figs, {k: [r.metrics for r in v] for k, v in groups.items()})
    tl = _timelines([(k, v[0].folder) for k, v in groups.items() if v], figs, window)
    if tl:
        sections.append(tl)
    if groups:
        cells = {k: v[0] for k, v in groups.items()}
        sections.append(("Config", _config_diff(cells) + _config_block(first[0].config_text)))
    return title, sections


def _sweep_page(
    folder: Path, figs: _Figures, window: tuple[float, float] | None = None
) -> tuple[str, list[tuple[str, str]]]:
    from fedclock.runs.tables import headline_metric

    rows = _read_table(folder)
    ids = _id_cols(rows)
    path = ids[1] if len(ids) > 1 else "value"
    metric = headline_metric(rows)
    values = list(dict.fromkeys(r.get(path, "") for r in rows))
    numeric = all(_is_float(v) for v in values)
    data = []
    for i, strat in enumerate(dict.fromkeys(r["strategy"] for r in rows)):
        mine = [r for r in rows if r["strategy"] == strat]
        xs: list[Any] = (
            _clean(np.array([float(r[path]) for r in mine]))
            if numeric
            else [str(r[path]) for r in mine]
        )
        col = _PALETTE[i % len(_PALETTE)]
        data.append({
            "type": "scatter", "mode": "lines+markers", "name": strat, "x": xs,
            "y": _clean(np.array([r.get(f"{metric}_mean", math.nan) for r in mine])),
            "error_y": {"type": "data", "visible": True,
                        "array": _clean(np.array([r.get(f"{metric}_std", math.nan) for r in mine]))},
            "line": {"color": col}, "marker": {"color": col},
            "hovertemplate": f"{_esc(strat)}<br>{_esc(path)}=%{{x}}<br>{metric}=%{{y:.4g}}<extra></extra>",
        })  # fmt: skip
    fig = figs.add(data, {"title": {"text": f"{metric} against {path} (mean ± std over seeds)"},
                          "xaxis": {"title": {"text": path}, "type": "linear" if numeric else "category"},
                          "yaxis": {"title": {"text": metric}}})  # fmt: skip
    n = max((_seeds_of(r) for r in rows), default=1)
    first = next(iter(sorted((folder / "runs").glob("*/*/seed-*/config.yaml"))), None)
    name = folder.name
    results = _headline_rows(rows)
    if n > 1:
        results += _sweep_pairs(folder, path, values, metric)
    sections = [("Results", results), (f"{metric} against {path}", fig)]
    cells = []
    for cell in sorted(p for p in (folder / "runs").glob("*/*") if p.is_dir()):
        runs = _seed_runs(cell, None)
        if runs:
            cells.append((f"{cell.parent.name} {cell.name}", runs[0].folder))
    tl = _timelines(cells, figs, window)
    if tl:
        sections.append(tl)
    if first is not None:
        run = _Run(first.parent)
        name = run.summary.get("name", name)
        sections.append(("Config", "<p>The first cell's config; the cells differ in the "
                         f"strategy and {_esc(path)}.</p>" + _config_block(run.config_text)))  # fmt: skip
    return f"{name}: sweep over {path} ({len(values)} values × {n} seed(s))", sections


def _sweep_pairs(folder: Path, path: str, values: list[Any], metric: str) -> str:
    """At each swept value, the headline metric's paired differences of every strategy entry
    against the first (a strategy that does not read the swept field ran at one value only:
    its runs stand for every value, as in the table)."""
    root = folder / "runs"
    entries = sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
    body = []
    base = ""
    for v in values:
        groups: dict[str, list[dict[str, Any]]] = {}
        for e in entries:
            at = {p.name.split("=", 1)[1]: p for p in e.iterdir() if p.is_dir() and "=" in p.name}
            match = next((d for k, d in at.items() if _same(k, v)), None)
            if match is None and len(at) == 1:
                match = next(iter(at.values()))
            runs = _seed_runs(match, None) if match is not None else []
            if runs:
                groups[e.name] = [r.summary for r in runs]
        for d in paired_differences(groups, [metric]):
            base = d["baseline"]
            diff = "—" if not math.isfinite(d["mean"]) else f"{d['mean']:+.3g}"
            if math.isfinite(d["std"]):
                diff += f" ± {d['std']:.2g}"
            body.append([_esc(v), _esc(d["group"]), diff, f"{d['wins']}/{d['n']}"])
    if not body:
        return ""
    return (
        f"<h3>Paired differences against {_esc(base)}, at each value</h3>"
        f"<p>{_esc(metric)} of the strategy − {_esc(base)}, seed by seed (same seed = same "
        "devices, data and draws); mean ± sample std over the seeds both have.</p>"
        + _table([_esc(path), "strategy", "difference", "better in"], body, "num")
    )


def _is_float(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def _tour_page(folder: Path) -> tuple[str, list[tuple[str, str]]]:
    try:
        tour = json.loads((folder / TOUR_FILE).read_text(encoding="utf-8"))
        steps = list(tour["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        raise DataError(f"{folder / TOUR_FILE} is damaged: it is not a tour's record.") from None
    sections = []
    intro = [
        "<p>Four short paired comparisons on scikit-learn's digits (no downloads), each a "
        "shipped preset. Each conclusion is computed from that comparison's own numbers.</p>",
        "<ul>",
    ]
    for st in steps:
        sub = folder / str(st["folder"])
        link = f"{st['folder']}/{REPORT_FILE}"
        intro.append(
            f'<li><a href="{_esc(link)}">{_esc(st["title"])}</a> — <code>{_esc(st["preset"])}</code></li>'
        )
        claims = st.get("claims") or [{"text": st["conclusion"], "supported": True}]
        body = "".join(
            f'<p class="concl {"ok" if c.get("supported") else "no"}">{_esc(c["text"])}</p>'
            for c in claims
        )
        if (sub / "table.csv").is_file():
            body += _headline_rows(_read_table(sub))
        body += (f'<p><a href="{_esc(link)}">Full report: curves, paired differences, config</a>'
                 f" · <code>fedclock compare --preset {_esc(st['preset'])}</code></p>")  # fmt: skip
        sections.append((str(st["title"]), body))
    intro.append("</ul>")
    wall = tour.get("wall_s")
    if isinstance(wall, int | float):
        intro.append(
            f"<p class=note>The last <code>fedclock tour</code> into this folder took {wall:.0f} s "
            "of wall time (runs it found finished there were reused, not re-run).</p>"
        )
    return "fedclock tour", [("The tour", "".join(intro)), *sections]


# ----------------------------------------------------------------------------- the page
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header .meta{opacity:.75;font-size:12px}nav{padding:6px 24px;background:#eceff1;font-size:13px}
nav a{margin-right:14px;color:#1a4f7a;text-decoration:none}main{padding:8px 24px 40px;max-width:1400px}
section{background:#fff;border:1px solid #e0e0e0;border-radius:6px;padding:10px 16px;margin:14px 0}
h2{font-size:17px;margin:4px 0 8px}h3{font-size:15px}table{border-collapse:collapse;margin:6px 0}
th,td{border-bottom:1px solid #e6e6e6;padding:3px 9px;text-align:left;vertical-align:top}
th{background:#f3f5f7;font-weight:600}table.num td:not(:first-child){text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td:first-child{white-space:nowrap}.tw{overflow-x:auto}
pre{background:#f6f8fa;padding:8px;overflow:auto;max-height:480px;font-size:12px}.note{color:#666;font-size:12px}
.concl{font-size:15px;font-weight:600;margin:6px 0}.concl.ok{color:#1b5e20}.concl.no{color:#b71c1c}.fig{width:100%;min-height:360px}
.figerr{color:#b71c1c;font-weight:600}
"""

# Renders every figure; a figure that fails says so in its place. The page records how many
# figures rendered and the errors it saw (data-rendered, data-errors on <body>), which the
# headless-browser test reads.
_JS = """
function fedclockDraw(){
var errors=[];window.addEventListener('error',function(e){errors.push(String(e.message));
document.body.setAttribute('data-errors',errors.length);});
var specs=JSON.parse(document.getElementById('fedclock-figures').textContent);var done=0;
function drawn(el){return el.querySelector('.main-svg')&&el.querySelectorAll('.scatterlayer .trace,.barlayer .trace').length>0;}
function finish(){done+=1;if(done===specs.length){var n=0;specs.forEach(function(s){var el=document.getElementById(s.id);if(drawn(el))n+=1;
if(el.hasAttribute('data-timeline-clients'))el.setAttribute('data-rows-drawn',el.querySelectorAll('.yaxislayer-above .ytick').length);});
document.body.setAttribute('data-rendered',String(n));}}
document.body.setAttribute('data-figures',specs.length);document.body.setAttribute('data-errors',0);
if(!specs.length){document.body.setAttribute('data-rendered','0');}
specs.forEach(function(s){var el=document.getElementById(s.id);
try{Plotly.newPlot(el,s.data,s.layout,{responsive:true,displaylogo:false}).then(finish,function(e){
el.innerHTML='<p class=figerr>This plot could not be drawn: '+e+'</p>';errors.push(String(e));finish();});}
catch(e){el.innerHTML='<p class=figerr>This plot could not be drawn: '+e+'</p>';errors.push(String(e));
document.body.setAttribute('data-errors',errors.length);finish();}});
}
"""

# Unpacks the inline library (gzip, base64) with the browser's DecompressionStream, runs it,
# then draws; a browser without DecompressionStream gets one sentence in place of the plots.
_LOADER = """
(function(){
function fail(e){document.body.setAttribute('data-errors','1');document.querySelectorAll('.fig').forEach(
function(el){el.innerHTML='<p class=figerr>The plotting library could not be unpacked in this browser: '+e+'</p>';});}
try{var b=atob(document.getElementById('fedclock-plotly').textContent);var u=new Uint8Array(b.length);
for(var i=0;i<b.length;i++){u[i]=b.charCodeAt(i);}
new Response(new Blob([u]).stream().pipeThrough(new DecompressionStream('gzip'))).text().then(function(t){
var s=document.createElement('script');s.textContent=t;document.head.appendChild(s);fedclockDraw();},fail);}
catch(e){fail(e);}
})();
"""


@functools.cache
def _plotly_js_packed() -> str:
    """plotly.js from the ``plotly`` package, gzip-compressed (mtime 0: the same bytes on
    every call) and base64-encoded: 4.8 MB of script in about 2 MB of page. Packing takes
    about 0.1 s, so the packed text is kept in the user's cache folder (``cache_dir()``), one
    file per plotly version, and used when its gzip trailer matches the script's length."""
    import plotly
    from plotly.offline import get_plotlyjs

    script = get_plotlyjs().encode("utf-8")
    cached = cache_dir() / f"plotly-{plotly.__version__}.js.gz.b64"
    try:
        text = cached.read_text(encoding="ascii")
        # (gzip's last four bytes: the unpacked length mod 2^32 — a torn or foreign file fails)
        if int.from_bytes(base64.b64decode(text[-8:])[-4:], "little") == len(script) % 2**32:
            return text
    except (OSError, ValueError):
        pass
    packed = gzip.compress(script, compresslevel=6, mtime=0)
    text = base64.b64encode(packed).decode("ascii")
    tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    try:  # (whole or not at all; no cache where none can be written: the report needs none)
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="ascii")
        os.replace(tmp, cached)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return text


def cache_dir() -> Path:
    """Where fedclock keeps what it can recompute: ``$FEDCLOCK_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/fedclock``, else ``~/.cache/fedclock``."""
    if os.environ.get("FEDCLOCK_CACHE_DIR"):
        return Path(os.environ["FEDCLOCK_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedclock"


def build_report(
    folder: Path,
    *,
    seeds: Sequence[int] | None = None,
    window: tuple[float, float] | None = None,
    damaged: list[str] | None = None,
) -> str:
    """The HTML of ``folder``'s report (a run, comparison, sweep or tour folder);
    ``window``: the device timelines' virtual-time window (default: from 0, see
    :mod:`fedclock.report.timeline`); ``damaged`` gets one sentence per damaged run file
    the page leaves out."""
    from fedclock import __version__

    kind = folder_kind(folder)
    figs = _Figures()
    seen: list[str] = []
    token = _DAMAGED.set(seen)
    try:
        if kind == "run":
            title, sections = _run_page(folder, figs, window)
        elif kind == "compare":
            title, sections = _compare_page(folder, figs, seeds, window)
        elif kind == "sweep":
            title, sections = _sweep_page(folder, figs, window)
        else:
            title, sections = _tour_page(folder)
    finally:
        _DAMAGED.reset(token)
    if seen:  # first: what the page leaves out, and why
        items = "".join(f"<li>{_esc(d)}</li>" for d in seen)
        sections.insert(0, ("Damaged files", "<p>These files could not be read: what "
                            "they hold is left out of the page (a comparison's or sweep's "
                            f"runs with such a file are left out of its tables and curves).</p><ul>{items}</ul>"))  # fmt: skip
        if damaged is not None:
            damaged.extend(seen)
    nav = "".join(f'<a href="#s{i}">{_esc(t)}</a>' for i, (t, _) in enumerate(sections))
    body = "".join(
        f'<section id="s{i}"><h2>{_esc(t)}</h2>{h}</section>' for i, (t, h) in enumerate(sections)
    )
    data = json.dumps(figs.specs, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    script = ""
    if figs.specs:  # (a tour's page links the others and has no plots: no library)
        script = (f'<script type="application/octet-stream" id="fedclock-plotly">'
                  f"{_plotly_js_packed()}</script>"
                  f'<script type="application/json" id="fedclock-figures">{data}</script>'
                  f"<script>{_JS}{_LOADER}</script>")  # fmt: skip
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        f'{HTML_GENERATOR}{_esc(__version__)}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head>"
        f'<body data-kind="{kind}"><header><h1>{_esc(title)}</h1>'
        f"<div class=meta>fedclock {_esc(__version__)} · {kind} · {_esc(folder.resolve())}</div></header>"
        f"<nav>{nav}</nav><main>{body}</main>{script}</body></html>\n"
    )


def write_report(
    folder: Path,
    *,
    seeds: Sequence[int] | None = None,
    window: tuple[float, float] | None = None,
    damaged: list[str] | None = None,
) -> Path:
    """Write ``folder/report.html`` (never over a file fedclock did not make); its path.
    ``damaged``: as :func:`build_report`."""
    out = folder / REPORT_FILE
    check_writable([out])
    text = build_report(folder, seeds=seeds, window=window, damaged=damaged)
    write_atomic(out, text)
    return out
