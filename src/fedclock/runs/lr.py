"""Learning-rate selection over a grid of ``train.lr`` values.

With a learning-rate grid (``--lr-grid`` / ``compare.lr_grid``) every entry runs
at every ``train.lr`` of the grid on every seed, and the table keeps, per entry,
the learning rate whose runs end with the lowest federated loss (eq. 2): the
mean over seeds of ``federated_loss_tail``, the federated loss averaged over the
last 10% of the virtual time — or of ``final_test_loss`` when client losses are
not evaluated. A learning rate with a diverged seed is never selected. With
``lr_tune_on`` every entry uses the rate selected for that one entry (Fraboni et
al. tune η_l on *Identical* and run *Time-based* at the same rate). Every
(entry, lr) cell is listed in ``lr_grid.csv`` and plotted in ``lr_grid.png``.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedclock.metrics.plots import colour


def selection_loss(summaries: Sequence[dict[str, Any]]) -> tuple[str, float]:
    """(metric, mean over seeds) used to pick the best learning rate; inf if any seed failed."""
    key = "final_test_loss"
    for candidate in ("federated_loss_tail", "federated_loss"):
        if all(candidate in s for s in summaries):
            key = candidate
            break
    vals = [s.get(key) for s in summaries]
    bad = any(
        s.get("status") != "completed" or v is None or not math.isfinite(float(v))
        for s, v in zip(summaries, vals, strict=True)
    )
    return key, (math.inf if bad or not vals else float(np.mean(np.asarray(vals, dtype=float))))


def write_lr_grid(rows: Sequence[dict[str, Any]], out: Path, title: str) -> None:
    """lr_grid.csv (every entry × learning rate) and lr_grid.png (selection loss vs lr)."""
    import matplotlib.pyplot as plt

    from fedclock.metrics.plots import _save
    from fedclock.outputs import write_output

    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=list(rows[0]))
    w.writeheader()
    for r in rows:
        w.writerow(
            {k: ("" if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
        )
    write_output(out / "lr_grid.csv", text.getvalue().encode())
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    labels: dict[str, list[tuple[float, float]]] = {}
    skip = {"lr", "selected_by", "selection_loss", "selected", "status", "n_seeds"}
    for r in rows:
        label = " ".join(
            f"{v}" if k == "strategy" else f"{k}={v}"
            for k, v in r.items()
            if k not in skip and v != ""
        )
        labels.setdefault(label, []).append((float(r["lr"]), float(r["selection_loss"])))
    for i, (label, pts) in enumerate(labels.items()):
        xs = [x for x, y in pts if math.isfinite(y)]
        ys = [y for x, y in pts if math.isfinite(y)]
        ax.plot(xs, ys, "o-", color=colour(i, len(labels)), label=label)
    ax.set_xscale("log")
    ax.set_xlabel("local learning rate η_l")
    ax.set_ylabel(f"final {rows[0]['selected_by'].replace('_', ' ')} (mean over seeds)")
    ax.set_title(f"{title}: learning-rate grid (diverged rates omitted)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, out / "lr_grid.png")
