"""Plots of accuracy against virtual time and aggregation index, of Fraboni et al.'s loss
panels, and of sweeps (a metric against the swept value)."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes

from fedclock.metrics.readers import step_interp


def colour(i: int, n: int) -> Any:
    """The colour of line ``i`` of ``n``: matplotlib's 10-colour cycle, tab20 beyond 10."""
    return f"C{i}" if n <= 10 else plt.get_cmap("tab20")(i % 20)


def _save(fig: Any, out: Path) -> Path:
    """Write ``fig`` to ``out`` (its folder made if needed; never over a file fedclock did
    not make: :mod:`fedclock.outputs`) and free it."""
    from fedclock.outputs import check_writable, png_metadata, write_atomic

    try:
        check_writable([out])
        out.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        fig.savefig(buf, dpi=120, format="png", metadata=png_metadata())
        write_atomic(out, buf.getvalue())
    finally:
        plt.close(fig)
    return out


def _highest(values: np.ndarray) -> float:
    """The highest finite value (-inf when none: a metric never recorded)."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    return float(finite.max()) if finite.size else -np.inf


def _zoom(ax: Axes, y_min: float, top: float) -> None:
    """The axis from ``y_min`` to 5 % of the drawn span above ``top``, the highest point
    drawn (the autoscaled top follows the whole curve's range and can pass 1)."""
    span = top - y_min if np.isfinite(top) and top > y_min else 0.0
    ax.set_ylim(bottom=y_min, top=(top + 0.05 * span) if span else None)


def plot_groups(
    groups: Mapping[str, Sequence[dict[str, np.ndarray]]],
    out: Path,
    *,
    title: str = "",
    metric: str = "test_accuracy",
    y_min: float | None = None,
) -> Path:
    """One line per group (mean over its runs, ±std band when several) vs time and vs
    aggregations; ``y_min``: the lower end of the metric's axis (default: matplotlib's)."""
    many = len(groups) > 4  # (a legend of many lines goes below the panels, not over them)
    rows = -(-len(groups) // 2) if many else 0
    height = 4.2 + 0.2 * rows
    fig, (ax_t, ax_a) = plt.subplots(1, 2, figsize=(11, height))
    ends: list[float] = []  # each group's last server step
    top = -np.inf  # the highest point drawn (mean + std)
    for i, (label, runs) in enumerate(groups.items()):
        runs = [r for r in runs if r]
        if not runs:
            continue
        color = colour(i, len(groups))
        ends.append(max(float(r["aggregation"][-1]) for r in runs if len(r["aggregation"])))
        for ax, xkey in ((ax_t, "virtual_time"), (ax_a, "aggregation")):
            if len(runs) == 1:
                # a metric holds until the next evaluation
                ax.plot(
                    runs[0][xkey],
                    runs[0][metric],
                    color=color,
                    label=label,
                    lw=1.6,
                    drawstyle="steps-post",
                )
                top = max(top, _highest(runs[0][metric]))
                continue
            end = min(r[xkey][-1] for r in runs)
            grid = np.linspace(0.0, end, 400)
            ys = np.stack([step_interp(r[xkey], r[metric], grid) for r in runs])
            mean, std = np.nanmean(ys, 0), np.nanstd(ys, 0)
            ax.plot(grid, mean, color=color, label=f"{label} (mean ± std of {len(runs)})", lw=1.6)
            ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.2, lw=0)
            top = max(top, _highest(mean + std))
    pretty = metric.replace("_", " ")
    ax_t.set_xlabel("virtual time (s)")
    ax_a.set_xlabel("aggregation (server step)")
    for ax in (ax_t, ax_a):
        ax.set_ylabel(pretty)
        ax.grid(alpha=0.3)
        if y_min is not None:
            _zoom(ax, y_min, top)
    if ends and max(ends) > 50 * max(1.0, min(ends)):
        # server steps that differ by orders of magnitude (asynchronous against rounds): a
        # log scale shows both
        ax_a.set_xscale("symlog", linthresh=1.0)
        ax_a.set_xlim(left=0.0)
        ax_a.set_xlabel("aggregation (server step, log scale)")
    if many:
        handles, labels = ax_t.get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    else:
        ax_t.legend(loc="best", fontsize=9)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0.0, (0.1 + 0.19 * rows) / height if many else 0.0, 1.0, 1.0))
    return _save(fig, out)


def plot_exits(
    groups: Mapping[str, Sequence[dict[str, np.ndarray]]],
    out: Path,
    *,
    title: str = "",
    y_min: float | None = None,
) -> Path:
    """An early-exit network's accuracy per exit (``exit<e>_accuracy``, one panel each, and
    ``cis_accuracy`` when recorded) vs the aggregation index: one line per group (mean over
    its runs, ±std band when several); ``y_min``: the lower end of every panel's axis."""
    first = next((r for runs in groups.values() for r in runs if r), {})
    keys = sorted((k for k in first if k.startswith("exit") and k.endswith("_accuracy")),
                  key=lambda k: int(k[4:-9]))  # fmt: skip
    keys += ["cis_accuracy"] if "cis_accuracy" in first else []
    fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3.6), squeeze=False)
    for j, key in enumerate(keys):
        ax = axes[0, j]
        top = -np.inf  # the highest point drawn (mean + std)
        for i, (label, runs) in enumerate(groups.items()):
            runs = [r for r in runs if r and key in r]
            if not runs:
                continue
            end = min(r["aggregation"][-1] for r in runs)
            grid = np.linspace(0.0, end, 200)
            ys = np.stack([step_interp(r["aggregation"], r[key], grid) for r in runs])
            mean, std = np.nanmean(ys, 0), np.nanstd(ys, 0)
            color = colour(i, len(groups))
            ax.plot(grid, mean, color=color, label=label, lw=1.5)
            if len(runs) > 1:
                ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.2, lw=0)
            top = max(top, _highest(mean + std))
        ax.set_title(key.replace("_accuracy", "").replace("exit", "exit ").replace("cis", "CIS"))
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        if y_min is not None:
            _zoom(ax, y_min, top)
    axes[0, 0].set_ylabel("test accuracy")
    axes[0, -1].legend(loc="lower right", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out)


LOSS_PANELS = (
    ("federated_loss", "federated loss, eq. (2)"),
    ("participation_loss", "participation-weighted loss (authors' surrogate)"),
    ("surrogate_loss", "surrogate loss, eq. (10), own q"),
    ("client_loss_std", "std of the client losses"),
)


def plot_loss_panels(
    groups: dict[str, list[dict[str, np.ndarray]]], out: Path, *, title: str
) -> Path:
    """Fraboni et al.'s Fig. 2 panels vs virtual time (log scale): mean ± std over seeds."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for (metric, label), ax in zip(LOSS_PANELS, axes.flat, strict=True):
        for i, (name, runs) in enumerate(groups.items()):
            runs = [r for r in runs if r]
            if not runs:
                continue
            end = min(r["virtual_time"][-1] for r in runs)
            grid = np.linspace(0.0, end, 600)
            ys = np.stack([step_interp(r["virtual_time"], r[metric], grid) for r in runs])
            mean, std = np.nanmean(ys, 0), np.nanstd(ys, 0)
            color = colour(i, len(groups))
            ax.plot(grid, mean, color=color, lw=1.4, label=f"{name} ({len(runs)} seeds)")
            if len(runs) > 1:
                ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.2, lw=0)
        ax.set_yscale("log")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    for ax in axes[1]:
        ax.set_xlabel("virtual time (s)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out)


def plot_sweeps(
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    out: Path,
    *,
    metric: str,
    log_x: bool = False,
) -> Path:
    """One panel per sweep table: ``metric`` (mean, ±std bars over seeds) against the swept
    value, one line per strategy; the same strategy keeps its colour in every panel."""
    n = len(tables)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.2), sharey=True, squeeze=False)
    names = list(dict.fromkeys(r["strategy"] for rows in tables.values() for r in rows))
    seeds = {int(float(r["n_seeds"])) for rows in tables.values() for r in rows if r.get("n_seeds")}
    for ax, (title, rows) in zip(axes[0], tables.items(), strict=True):
        swept = list(rows[0])[1]  # table contract: strategy, the swept path, then metrics
        values = list(dict.fromkeys(r[swept] for r in rows))
        numeric = all(_is_number(v) for v in values)
        if not numeric:  # e.g. model.arch=mlp,cnn: one tick per value, in sweep order
            ax.set_xticks(range(len(values)), [str(v) for v in values])
        x_of = {v: float(v) if numeric else float(i) for i, v in enumerate(values)}
        for name in dict.fromkeys(r["strategy"] for r in rows):
            pts = [
                (x_of[r[swept]], float(r[f"{metric}_mean"]), float(r[f"{metric}_std"] or 0))
                for r in rows
                if r["strategy"] == name and _is_number(r.get(f"{metric}_mean"))
            ]
            if not pts:
                continue
            x, y, sd = (np.array(v) for v in zip(*sorted(pts), strict=True))
            c = colour(names.index(name), len(names))
            ax.errorbar(x, y, yerr=sd if sd.any() else None, fmt="o-", color=c,
                        label=name, capsize=3, lw=1.5, ms=4)  # fmt: skip
        if log_x and numeric:  # ticks at the swept values, written plainly
            ax.set_xscale("log")
            ax.set_xticks([float(v) for v in values], [f"{float(v):g}" for v in values])
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            if len(values) > 5:  # close values on a log axis: slanted labels do not collide
                ax.tick_params(axis="x", labelrotation=45)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(swept)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    label = metric.replace("_", " ")
    if seeds and max(seeds) > 1:  # say what the bars are
        count = f"{min(seeds)}–{max(seeds)}" if min(seeds) != max(seeds) else str(max(seeds))
        label += f" (mean ± std over {count} seeds)"
    axes[0][0].set_ylabel(label)
    fig.tight_layout()
    return _save(fig, out)


def _is_number(text: Any) -> bool:
    try:
        return math.isfinite(float(text))
    except (TypeError, ValueError):
        return False
