"""The run directory: resolved config, versions, metrics.csv (flushed row by row), summary.json.

metrics.csv is written as the run goes, so an interrupted or diverged run keeps
every evaluation it made; summary.json records how the run ended (``status``).
"""

from __future__ import annotations

import csv
import json
import math
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

METRIC_COLUMNS = (
    "virtual_time",
    "wall_time",
    "aggregation",
    "updates_received",
    "updates_discarded",
    "test_accuracy",
    "test_loss",
    "bytes_up",
    "bytes_down",
    "compute_s_spent",
    "compute_s_wasted",
)


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for pkg in ("fedclock", "torch", "numpy", "scikit-learn", "pydantic", "typer", "matplotlib"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


class RunRecorder:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("metrics.csv", "summary.json"):
            (run_dir / stale).unlink(missing_ok=True)
        self._fh = (run_dir / "metrics.csv").open("w", newline="")
        self._writer = csv.DictWriter(self._fh, fieldnames=list(METRIC_COLUMNS))
        self._writer.writeheader()
        self._fh.flush()

    def write_config(self, config_yaml: str, seed: int, argv: Sequence[str] | None = None) -> None:
        (self.run_dir / "config.yaml").write_text(config_yaml)
        meta = {
            "seed": seed,
            "versions": versions(),
            "argv": list(argv if argv is not None else sys.argv),
        }
        (self.run_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")

    def record(self, row: dict[str, Any]) -> None:
        self._writer.writerow({k: _fmt(row[k]) for k in METRIC_COLUMNS})
        self._fh.flush()

    def write_summary(self, summary: dict[str, Any]) -> None:
        (self.run_dir / "summary.json").write_text(json.dumps(json_safe(summary), indent=2) + "\n")

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def json_safe(obj: Any) -> Any:
    """NaN/inf become null so summary.json is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return repr(v)  # shortest round-trip text: identical runs give identical files
    return v


def time_to_target(history: Sequence[dict[str, Any]], target: float | None) -> float | None:
    """First virtual time at which the test accuracy reached ``target`` (None if never)."""
    if target is None:
        return None
    for row in history:
        if row["test_accuracy"] >= target:
            return float(row["virtual_time"])
    return None


def summarize(
    *,
    name: str,
    strategy: str,
    seed: int,
    status: str,
    stop_reason: str | None,
    history: Sequence[dict[str, Any]],
    counters: Any,
    wall_s: float,
    virtual_time: float,
    target_accuracy: float | None,
    num_clients: int,
) -> dict[str, Any]:
    """summary.json: the headline numbers of one run."""
    accs = [r["test_accuracy"] for r in history]
    last = history[-1] if history else None
    spent = float(counters.compute_s_spent)
    wasted = float(counters.compute_s_wasted)
    part = counters.participation
    return {
        "name": name,
        "strategy": strategy,
        "seed": seed,
        "status": status,
        "stop_reason": stop_reason,
        "final_test_accuracy": last["test_accuracy"] if last else math.nan,
        "best_test_accuracy": max(accs) if accs else math.nan,
        "final_test_loss": last["test_loss"] if last else math.nan,
        "virtual_time": virtual_time,
        "aggregations": int(counters.aggregations),
        "updates_used": int(counters.updates_used),
        "updates_discarded": int(counters.updates_discarded),
        "compute_s_spent": spent,
        "compute_s_wasted": wasted,
        "useful_work_ratio": (spent - wasted) / spent if spent > 0 else math.nan,
        "bytes_up": float(counters.bytes_up),
        "bytes_down": float(counters.bytes_down),
        "clients_participated": len(part),
        "num_clients": num_clients,
        "target_accuracy": target_accuracy,
        "time_to_target": time_to_target(history, target_accuracy),
        "wall_s": wall_s,
    }
