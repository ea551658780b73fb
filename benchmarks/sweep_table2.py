"""Run batching on a researcher's real workload: the SALF MLP reference Table II grid (5
strategies × 4 straggler ratios, 250 rounds; 3 seeds, 51 runs: vanilla reads no straggler
ratio) by ``fedclock sweep``, with ``--batch-runs 1`` (one run after another, the sweep before
run batching) against the automatic default (8 runs in lockstep) and the default with
``--jobs 2`` (two processes, each with its group); each a fresh command in a fresh folder,
timed from start to exit. The ``table.csv`` files must be identical (wall-time columns aside).

Needs MNIST (``$FEDCLOCK_DATA`` or ``../shared/data/mnist``); ``--quick``: 20 rounds, 1 seed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.sweep_parallel import REPO, _mnist, _table, result, rows

VARIANTS = {
    "batch-runs 1 (sequential)": ["--batch-runs", "1"],
    "batch-runs auto": [],
    "batch-runs auto, jobs 2": ["--jobs", "2"],
}
SEEDS = "1234,1,2"


def run(*, quick: bool = False, repeats: int = 1) -> dict[str, object]:
    from benchmarks import common
    from benchmarks.common import machine

    data = _mnist()
    base = [
        sys.executable, "-m", "fedclock", "sweep", "--preset", "salf-table2-mlp",
        "--data-dir", str(data), "--seeds", "1234" if quick else SEEDS, "-q",
    ]  # fmt: skip
    if quick:
        base += ["--set", "budget.aggregations=20"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    times: dict[str, float] = {}
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in VARIANTS.items():
            if common.WAIT_FOR_QUIET:
                common.wait_quiet()
            out = Path(tmp) / _folder(name)
            t0 = time.perf_counter()
            subprocess.run([*base, *extra, "--out", str(out)], check=True, env=env)
            times[name] = round(time.perf_counter() - t0, 1)
            tables[name] = _table(out)
        first = next(iter(VARIANTS))
        cells = len(list((Path(tmp) / _folder(first)).rglob("summary.json")))
    return result(times, tables, cells, 20 if quick else 250, machine())


def _folder(variant: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in variant)


__all__ = ["rows", "run"]
