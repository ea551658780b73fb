"""The gap between a deployment and its simulation (docs/deploy.md): for each run folder given,
final and best accuracy, server steps, and the time between server steps (mean, median) and
each client's mean task time from timeline.csv.

    python scripts/deploy_gap.py runs/deploy-threads runs/deploy-sim
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path


def _rows(run: Path) -> list[dict[str, str]]:
    lines = [x for x in (run / "timeline.csv").read_text().splitlines() if not x.startswith("#")]
    return list(csv.DictReader(lines))


def describe(run: Path) -> dict[str, object]:
    summary = json.loads((run / "summary.json").read_text())
    rows = _rows(run)
    steps = [float(r["t_start"]) for r in rows if r["event"] == "aggregation"]
    gaps = [b - a for a, b in zip([0.0, *steps], steps, strict=False)]
    tasks: dict[str, list[float]] = {}
    for r in rows:
        if r["event"] == "task" and r["outcome"] in ("used", "stale"):
            tasks.setdefault(r["client"], []).append(float(r["t_end"]) - float(r["t_start"]))
    return {
        "run": str(run),
        "engine": summary.get("deployment", {}).get("engine", "simulation"),
        "final_accuracy": round(summary["final_test_accuracy"], 4),
        "best_accuracy": round(summary["best_test_accuracy"], 4),
        "aggregations": summary["aggregations"],
        "round_s_mean": round(statistics.fmean(gaps), 4) if gaps else None,
        "round_s_median": round(statistics.median(gaps), 4) if gaps else None,
        "task_s_by_client": {c: round(statistics.fmean(v), 4) for c, v in sorted(tasks.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    for run in ap.parse_args().runs:
        print(json.dumps(describe(run)))


if __name__ == "__main__":
    main()
