"""Tables of a comparison or sweep: one row per strategy entry (and swept value), the
identifying columns first, then ``<metric>_mean``/``_std`` over seeds and ``n_seeds``
(``table.csv``, ``table.md``); a sweep adds ``pivot.md``, its headline metric as a
strategy × value grid (SALF's Table II layout), and ``sweep.png``. Each is written only
over a file fedclock made (:mod:`fedclock.outputs`)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: every file a comparison or sweep writes into its folder (besides runs/)
GRID_OUTPUTS = (
    "grid.json", "table.csv", "table.md", "pivot.md", "accuracy.png", "losses.png",
    "sweep.png", "lr_grid.csv", "lr_grid.png", "report.html",
)  # fmt: skip

# summary.json fields that identify a run rather than measure it
_NOT_METRICS = {"seed", "num_clients", "target_accuracy"}


def aggregate_rows(summaries: Sequence[dict[str, Any]], keys: dict[str, Any]) -> dict[str, Any]:
    """One table row: identifying ``keys``, then <metric>_mean/_std over seeds, then n_seeds.

    std is the sample standard deviation (0 for one seed). A metric missing in
    any seed (e.g. time_to_target when a seed never reached it) has mean NaN.
    """
    row: dict[str, Any] = dict(keys)
    names = [
        k for k, v in summaries[0].items()
        if k not in _NOT_METRICS and (isinstance(v, int | float) or v is None) and not isinstance(v, bool)
    ]  # fmt: skip
    for k in names:
        vals = [s.get(k) for s in summaries]
        if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in vals):
            mean = std = math.nan
        else:
            arr = np.asarray(vals, dtype=float)
            mean = float(arr.mean())
            std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
        row[f"{k}_mean"] = mean
        row[f"{k}_std"] = std
    row["n_seeds"] = len(summaries)
    return row


@dataclass(frozen=True)
class Metric:
    """A headline metric: its summary.json key (and table column ``<key>_mean``/``_std``),
    label, significant digits, direction, the metrics.csv column whose curve it summarises
    (the progress bar's value, the plots' y) with that curve's short and long names, and
    which console tables show it: ``always``, ``accuracy`` (runs without measured client
    losses), ``losses`` (runs with them: Fraboni et al.'s problems) or ``""`` (tables and
    the report only)."""

    key: str
    label: str
    digits: int
    higher_better: bool
    curve: str | None = None
    short: str = ""
    curve_label: str = ""
    console: str = ""
    table: bool = True  # table.md and report.html (False: the console only)
    paired: bool = False  # the report's paired differences against the first strategy


#: THE list of headline metrics, in their order: table.md, report.html, the console's
#: comparison table (those with ``console``), `fedclock run`'s summary table, and — through
#: :func:`lead` — the progress bars, a sweep's pivot and plots, and the comparison's plot
HEADLINE: tuple[Metric, ...] = (
    Metric("cis_accuracy", "CIS acc", 3, True, curve="cis_accuracy", short="cis",
           curve_label="CIS accuracy", console="always", paired=True),
    Metric("final_test_accuracy", "final acc", 3, True, curve="test_accuracy", short="acc",
           curve_label="test accuracy", console="always", paired=True),
    Metric("val_best_test_accuracy", "val-best acc", 3, True, curve="test_accuracy",
           short="acc", curve_label="test accuracy"),
    Metric("best_test_accuracy", "best acc", 3, True, console="accuracy"),
    Metric("final_test_loss", "final loss", 3, False, paired=True),
    Metric("federated_loss_tail", "federated loss (last 10%)", 3, False,
           curve="federated_loss", short="loss", curve_label="federated loss",
           console="losses", paired=True),
    Metric("participation_loss_tail", "participation loss (last 10%)", 3, False,
           console="losses"),
    Metric("surrogate_loss_tail", "surrogate loss (last 10%)", 3, False),
    Metric("client_loss_std_tail", "client loss std (last 10%)", 3, False, console="losses"),
    Metric("mean_staleness", "mean staleness", 3, False, console="losses"),
    Metric("time_to_target", "time to target (s)", 4, False, console="accuracy", paired=True),
    Metric("virtual_time", "virtual time (s)", 4, True),
    Metric("aggregations", "aggregations", 4, True, console="always"),
    Metric("updates_discarded", "discarded", 4, False, console="accuracy"),
    Metric("updates_lost", "lost offline", 4, False, console="accuracy"),
    Metric("useful_work_ratio", "useful work", 3, True, console="accuracy"),
    Metric("clients_participated", "clients heard", 4, True, console="accuracy", table=False),
)  # fmt: skip
BY_KEY = {m.key: m for m in HEADLINE}

#: which metric a run leads with, first match: the routed CIS accuracy (early exits: the
#: test accuracy is the last exit's alone), the federated loss where clients' losses are
#: measured (Fraboni et al.'s headline is a loss), the test accuracy at the best validation
#: checkpoint (SALF's Table II), else the final test accuracy
LEAD = ("cis_accuracy", "federated_loss_tail", "val_best_test_accuracy", "final_test_accuracy")


def lead(keys: Collection[str], *, curves: bool = False, accuracy: bool = False) -> Metric:
    """The headline metric of runs whose summaries (or, ``curves``: metrics.csv rows) hold
    ``keys``; ``accuracy``: the first that is an accuracy (a plot of accuracy)."""
    for k in LEAD:
        m = BY_KEY[k]
        if accuracy and not m.higher_better:
            continue
        if (m.curve if curves else m.key) in keys:
            return m
    return BY_KEY["final_test_accuracy"]


#: an early-exit run's test accuracy is its last exit's alone (its headline is the routed
#: CIS accuracy): the labels tables, the console and the report give it there
LAST_EXIT_LABELS = {"final_test_accuracy": "last-exit acc", "best_test_accuracy": "last-exit best"}


def metric_label(key: str, label: str, *, cis: bool) -> str:
    """``label`` of summary metric ``key``, or its last-exit name in a table with CIS runs."""
    return LAST_EXIT_LABELS.get(key, label) if cis else label


def write_table(rows: Sequence[dict[str, Any]], out: Path, *, id_cols: Sequence[str]) -> None:
    """table.csv (every column) and table.md (headline metrics as mean ± std)."""
    from fedclock.outputs import write_output

    cols = list(dict.fromkeys(k for r in rows for k in r))  # rows merged from earlier commands
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=cols, restval="")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()})
    write_output(out / "table.csv", text.getvalue().encode())
    cis = "cis_accuracy_mean" in cols
    headline = [
        (m.key, metric_label(m.key, m.label, cis=cis), m.digits) for m in HEADLINE if m.table
    ]
    present = [h for h in headline if f"{h[0]}_mean" in cols]
    lines = [
        "| " + " | ".join([*id_cols, *(h[1] for h in present), "seeds"]) + " |",
        "|" + "---|" * (len(id_cols) + len(present) + 1),
    ]
    for r in rows:
        cells = [str(r[c]) for c in id_cols]
        for key, _, digits in present:
            m, s = r.get(f"{key}_mean", math.nan), r.get(f"{key}_std", math.nan)
            cells.append("—" if math.isnan(m) else f"{m:.{digits}g} ± {s:.2g}")
        cells.append(str(r["n_seeds"]))
        lines.append("| " + " | ".join(cells) + " |")
    write_output(out / "table.md", ("\n".join(lines) + "\n").encode())


def write_pivot(rows: Sequence[dict[str, Any]], out: Path, path: str, values: list[Any]) -> None:
    """pivot.md (strategy × value, mean ± std of the headline metric) and sweep.png."""
    from fedclock.metrics.plots import plot_sweeps
    from fedclock.outputs import write_output

    metric = headline_metric(rows)
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    lines = [
        f"{metric} (mean ± std over seeds)",
        "",
        "| strategy | " + " | ".join(f"{path}={v}" for v in values) + " |",
        "|---|" + "---|" * len(values),
    ]
    for s in strategies:
        by_v = {r[path]: r for r in rows if r["strategy"] == s}
        cells = []
        for v in values:
            r = by_v.get(v)
            m = r[f"{metric}_mean"] if r else math.nan
            sd = r[f"{metric}_std"] if r else math.nan
            n = r["n_seeds"] if r else 0
            cells.append("—" if m != m else (f"{m:.3f}" if n == 1 else f"{m:.3f} ± {sd:.3f}"))
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    write_output(out / "pivot.md", ("\n".join(lines) + "\n").encode())
    plot_sweeps({out.name: rows}, out / "sweep.png", metric=metric)


def headline_metric(rows: Sequence[dict[str, Any]]) -> str:
    """The key of a table's headline metric (:func:`lead` of its first row's columns)."""
    keys = {k.removesuffix("_mean") for k in rows[0]} if rows else set()
    return lead(keys).key
