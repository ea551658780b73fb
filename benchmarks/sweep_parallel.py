"""A sweep's cells in parallel: the SALF MLP Table II sweep (1 seed) run by `fedclock sweep`
with ``--jobs 1`` (cells one after another), ``--jobs 2`` (two local processes) and
``--backend ray --jobs 2`` (a local Ray with 2 CPUs), each a fresh command in a fresh folder,
timed from start to exit; the three ``table.csv`` must be identical (wall-time columns aside).

Also measured: the **ceiling** of ``--jobs 2`` on this machine for this workload. ``--jobs 1``
gives each cell both cores' threads, ``--jobs 2`` one each, so two cells at once can be at most
``2 × T(2 threads) / T(1 thread)`` times faster than one after another, even with no
contention at all: one cell (SALF at straggler ratio 0.5) run alone with 1 and with 2 threads,
alternately, ``repeats`` times each (its own ``wall_s``: process start and data loading not
included; the medians).

Needs MNIST (``$FEDCLOCK_DATA`` or ``../shared/data/mnist``); ``--quick`` runs 20 rounds
instead of 250.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {  # (--batch-runs 1: one run per process at a time; sweep-table2 measures batching)
    "jobs 1": ["--jobs", "1", "--batch-runs", "1"],
    "jobs 2 (local processes)": ["--jobs", "2", "--batch-runs", "1"],
    "ray, jobs 2": ["--backend", "ray", "--jobs", "2", "--batch-runs", "1"],
}


def _mnist() -> Path:
    for candidate in (os.environ.get("FEDCLOCK_DATA"), REPO.parent / "shared" / "data"):
        if candidate:
            for p in (Path(candidate), Path(candidate) / "mnist"):
                if (p / "train-images-idx3-ubyte.gz").exists():
                    return p
    raise SystemExit("sweep-parallel needs MNIST: set FEDCLOCK_DATA to its folder")


def _table(out: Path) -> list[list[str]]:
    with (out / "table.csv").open(newline="") as fh:
        rows = list(csv.reader(fh))
    keep = [i for i, h in enumerate(rows[0]) if "wall" not in h]
    return [[r[i] for i in keep] for r in rows]


def run(*, quick: bool = False, repeats: int = 1) -> dict[str, object]:
    from benchmarks.common import machine

    data = _mnist()
    common = ["--preset", "salf-table2-mlp", "--data-dir", str(data), "-q"]
    if quick:
        common += ["--set", "budget.aggregations=20"]
    base = [sys.executable, "-m", "fedclock", "sweep", *common, "--seeds", "1234"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    times: dict[str, float] = {}
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in VARIANTS.items():
            out = Path(tmp) / name.replace(" ", "-").replace(",", "")
            t0 = time.perf_counter()
            subprocess.run([*base, *extra, "--out", str(out)], check=True, env=env)
            times[name] = round(time.perf_counter() - t0, 1)
            tables[name] = _table(out)
        cells = len(list((Path(tmp) / "jobs-1" / "runs").rglob("summary.json")))
        alone = [sys.executable, "-m", "fedclock", "run", *common]
        ceiling = thread_ceiling(alone, env, Path(tmp) / "alone", repeats=max(3, repeats))
    out = result(times, tables, cells, 20 if quick else 250, machine())
    out["ceiling"] = ceiling
    return out


def thread_ceiling(
    run: list[str], env: dict[str, str], out: Path, *, repeats: int
) -> dict[str, float]:
    """One cell (the ``fedclock run`` command ``run``) alone with 1 and 2 threads (alternately;
    its own ``wall_s``, medians) and the most ``--jobs 2`` can gain over ``--jobs 1`` from it:
    ``2 × T(2) / T(1)``."""
    walls: dict[int, list[float]] = {1: [], 2: []}
    for k in range(repeats):
        for threads in (1, 2):
            folder = out / f"{threads}-{k}"
            subprocess.run(
                [*run, "--set", "population.straggler_ratio=0.5", "--set",
                 f"executor.threads={threads}", "--out", str(folder)],
                check=True, env=env,
            )  # fmt: skip
            summary = json.loads((folder / "summary.json").read_text())
            walls[threads].append(float(summary["wall_s"]))
    one, two = statistics.median(walls[1]), statistics.median(walls[2])
    return {
        "cell_s_1_thread": round(one, 2),
        "cell_s_2_threads": round(two, 2),
        "max_speedup_jobs_2": round(2 * two / one, 2),
    }


def result(
    times: dict[str, float], tables: dict[str, object], cells: int, rounds: int,
    machine: dict[str, object],
) -> dict[str, object]:  # fmt: skip
    """The figures of timed sweep variants, against the first one (also ``sweep-table2``)."""
    first = next(iter(times))
    return {
        "machine": machine,
        "cells": cells,
        "rounds": rounds,
        "seconds": times,
        "speedup": {k: round(times[first] / v, 2) for k, v in times.items()},
        "tables_identical": all(t == tables[first] for t in tables.values()),
    }


def rows(r: dict[str, object]) -> list[tuple[str, str]]:
    seconds: dict[str, float] = r["seconds"]  # type: ignore[assignment]
    speedup: dict[str, float] = r["speedup"]  # type: ignore[assignment]
    out = [(name, f"{s} s  ({speedup[name]}×)") for name, s in seconds.items()]
    out.append(("cells", str(r["cells"])))
    c: dict[str, float] | None = r.get("ceiling")  # type: ignore[assignment]
    if c:
        out.append((
            "ceiling of --jobs 2",
            f"{c['max_speedup_jobs_2']}× (a cell alone: {c['cell_s_1_thread']} s with 1 thread, "
            f"{c['cell_s_2_threads']} s with 2)",
        ))  # fmt: skip
    out.append(("tables identical", str(r["tables_identical"])))
    return out
