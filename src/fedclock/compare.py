"""Paired comparisons: several strategies × seeds on one config, one table, one plot.

Every strategy runs with the same seed, hence the same keyed random streams:
the same device slowdown draws, client samples, data partition, initial model
and batch orders (common random numbers). Finished cells whose stored config
matches are reused, so an interrupted comparison resumes where it stopped.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedclock.config import ExperimentConfig, to_yaml
from fedclock.experiment import RunResult, run_experiment
from fedclock.metrics.plots import plot_groups, read_metrics

# summary.json fields that identify a run rather than measure it
_NOT_METRICS = {"seed", "num_clients", "target_accuracy"}


def cell_config(cfg: ExperimentConfig, strategy: str, seed: int) -> ExperimentConfig:
    data = cfg.model_dump()
    data["strategy"]["name"] = strategy
    data["seed"] = seed
    return ExperimentConfig.model_validate(data)


def reusable(run_dir: Path, cfg: ExperimentConfig) -> dict[str, Any] | None:
    """The stored summary of a finished run with exactly this config, else None."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        same = (run_dir / "config.yaml").read_text() == to_yaml(cfg)
    except (OSError, ValueError):
        return None
    return summary if same and summary.get("status") == "completed" else None


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


def write_table(rows: Sequence[dict[str, Any]], out: Path, *, id_cols: Sequence[str]) -> None:
    """table.csv (every column) and table.md (headline metrics as mean ± std)."""
    out.mkdir(parents=True, exist_ok=True)
    cols = list(rows[0])
    with (out / "table.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow(
                {k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            )
    headline = [
        ("final_test_accuracy", "final acc", 3),
        ("best_test_accuracy", "best acc", 3),
        ("final_test_loss", "final loss", 3),
        ("time_to_target", "time to target (s)", 4),
        ("virtual_time", "virtual time (s)", 4),
        ("aggregations", "aggregations", 4),
        ("updates_discarded", "discarded", 4),
        ("useful_work_ratio", "useful work", 3),
    ]
    present = [h for h in headline if f"{h[0]}_mean" in rows[0]]
    lines = [
        "| " + " | ".join([*id_cols, *(h[1] for h in present), "seeds"]) + " |",
        "|" + "---|" * (len(id_cols) + len(present) + 1),
    ]
    for r in rows:
        cells = [str(r[c]) for c in id_cols]
        for key, _, digits in present:
            m, s = r[f"{key}_mean"], r[f"{key}_std"]
            cells.append("—" if math.isnan(m) else f"{m:.{digits}g} ± {s:.2g}")
        cells.append(str(r["n_seeds"]))
        lines.append("| " + " | ".join(cells) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")


def run_compare(
    cfg: ExperimentConfig,
    strategies: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    *,
    progress_factory: Callable[[str], Callable[[Any], None] | None] = lambda label: None,
    on_result: Callable[[str, int, RunResult | None], None] = lambda s, seed, r: None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Run the grid; return (table rows, error sentence of a cell that stopped early)."""
    summaries: dict[str, list[dict[str, Any]]] = {s: [] for s in strategies}
    curves: dict[str, list[dict[str, np.ndarray]]] = {s: [] for s in strategies}
    error = None
    for strategy in strategies:
        for seed in seeds:
            ccfg = cell_config(cfg, strategy, seed)
            run_dir = out / "runs" / strategy / f"seed-{seed}"
            summary = reusable(run_dir, ccfg)
            if summary is None:
                result = run_experiment(
                    ccfg, run_dir=run_dir, progress=progress_factory(f"{strategy} seed {seed}")
                )
                on_result(strategy, seed, result)
                summary = result.summary
                if result.summary["status"] != "completed":
                    error = result.error
            else:
                on_result(strategy, seed, None)
            summaries[strategy].append(summary)
            curves[strategy].append(read_metrics(run_dir))
            if error:
                break
        if error:
            break
    rows = [aggregate_rows(v, {"strategy": k}) for k, v in summaries.items() if v]
    write_table(rows, out, id_cols=["strategy"])
    plot_groups(
        curves,
        out / "accuracy.png",
        title=f"{cfg.name}: test accuracy (seeds {', '.join(map(str, seeds))})",
    )
    return rows, error
