"""Tables of a comparison or sweep: one row per strategy entry (and swept value), the
identifying columns first, then ``<metric>_mean``/``_std`` over seeds and ``n_seeds``
(``table.csv``, ``table.md``); a sweep adds ``pivot.md``, its headline metric as a
strategy × value grid (SALF's Table II layout), and ``sweep.png``. Each is written only
over a file fedclock made (:mod:`fedclock.outputs`)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
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


#: the headline metrics of table.md and report.html, in their order: (summary key, label,
#: significant digits, higher is better); each is shown where some row has it (the console's
#: comparison table picks a narrower set, cli._compare_table)
HEADLINE: tuple[tuple[str, str, int, bool], ...] = (
    ("cis_accuracy", "CIS acc", 3, True),
    ("final_test_accuracy", "final acc", 3, True),
    ("best_test_accuracy", "best acc", 3, True),
    ("final_test_loss", "final loss", 3, False),
    ("federated_loss_tail", "federated loss (last 10%)", 3, False),
    ("participation_loss_tail", "participation loss (last 10%)", 3, False),
    ("surrogate_loss_tail", "surrogate loss (last 10%)", 3, False),
    ("client_loss_std_tail", "client loss std (last 10%)", 3, False),
    ("mean_staleness", "mean staleness", 3, False),
    ("time_to_target", "time to target (s)", 4, False),
    ("virtual_time", "virtual time (s)", 4, True),
    ("aggregations", "aggregations", 4, True),
    ("updates_discarded", "discarded", 4, False),
    ("useful_work_ratio", "useful work", 3, True),
)

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
    headline = [(k, metric_label(k, lab, cis=cis), d) for k, lab, d, _ in HEADLINE]
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
    """The Table II metric: best-validation checkpoint's test accuracy if recorded (CIS
    accuracy for early-exit runs)."""
    for key in ("cis_accuracy", "val_best_test_accuracy", "final_test_accuracy"):
        if rows and f"{key}_mean" in rows[0]:
            return key
    return "final_test_accuracy"
