"""fedraa-fragments: wall and CPU time of ``fedclock compare --preset fedraa-ablation-mnist
--seeds 1`` (Fed-RAA's Table 3: fed-raa, fed-raa-random, fed-raa-mp, fed-raa-sync on MNIST),
the command of issue 28's speed target.

``FEDRAA_BASELINE_SRC=/path/to/other/checkout/src`` adds a first variant, the same command
on that source (e.g. a ``git worktree`` of ``932431d``, the code before fragment blocks
stepped by hand), measured in the same session, so the speedup is against it. Each variant
is one subprocess; its CPU time (user + system of the whole process tree) is recorded
beside its wall time, since a shared machine stretches the wall time of both variants but
hardly their CPU time. ``FEDRAA_VIRTUAL_TIME=T`` shortens the preset's 300 virtual
seconds (both variants alike); ``--quick``: 20 virtual seconds. ``FEDRAA_ALSO="ARGS;ARGS"``
adds variants of this source with those command-line arguments appended (e.g. ``--jobs 4
--batch-runs 1``: how the cells are spread over processes).

Needs MNIST (``$FEDCLOCK_DATA`` or ``../shared/data/mnist``).
"""

from __future__ import annotations

import csv
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.sweep_parallel import REPO, _mnist


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def _cells(out: Path) -> dict[str, dict[str, str]]:
    with (out / "table.csv").open(newline="") as fh:
        return {
            row["strategy"]: {
                k: row[k] for k in ("time_to_target_mean", "final_test_accuracy_mean") if k in row
            }
            for row in csv.DictReader(fh)
        }


def run(*, quick: bool = False, repeats: int = 1) -> dict[str, object]:
    from benchmarks.common import machine

    t_virtual = 20.0 if quick else float(os.environ.get("FEDRAA_VIRTUAL_TIME", "300"))
    base = [sys.executable, "-m", "fedclock", "compare", "--preset", "fedraa-ablation-mnist",
            "--seeds", "1", "--data-dir", str(_mnist()), "-q"]  # fmt: skip
    if t_virtual != 300:
        base += ["--set", f"budget.virtual_time={t_virtual:g}"]
    here = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    variants: dict[str, dict[str, str]] = {"this source": here}
    extra: dict[str, list[str]] = {"this source": [], "baseline": []}
    for args in filter(None, (a.strip() for a in os.environ.get("FEDRAA_ALSO", "").split(";"))):
        variants[f"this source {args}"] = here
        extra[f"this source {args}"] = args.split()
    baseline = os.environ.get("FEDRAA_BASELINE_SRC")
    if baseline:
        variants = {"baseline": {**os.environ, "PYTHONPATH": baseline}, **variants}
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    load: dict[str, float] = {}
    cells: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, env in variants.items():
            out = Path(tmp) / "-".join(name.replace("-", "").split())
            c0, t0 = _children_cpu(), time.perf_counter()
            subprocess.run([*base, *extra[name], "--out", str(out)], check=True, env=env)
            wall[name] = round(time.perf_counter() - t0, 1)
            cpu[name] = round(_children_cpu() - c0, 1)
            load[name] = _loadavg()
            cells[name] = _cells(out)
    first = next(iter(wall))
    return {
        "machine": machine(),
        "virtual_time": t_virtual,
        "seconds": wall,
        "cpu_s": cpu,
        "load_after": load,
        "wall_speedup": {k: round(wall[first] / v, 2) for k, v in wall.items()},
        "cpu_speedup": {k: round(cpu[first] / v, 2) for k, v in cpu.items()},
        "cells": cells,
    }


def rows(result: dict[str, object]) -> list[tuple[str, str]]:
    out = [("virtual seconds per run", f"{result['virtual_time']:g}")]
    wall, cpu = result["seconds"], result["cpu_s"]
    ws, cs = result["wall_speedup"], result["cpu_speedup"]
    for name in wall:  # type: ignore[union-attr]
        out.append(
            (name, f"{wall[name]} s wall ({ws[name]}x), {cpu[name]} s CPU ({cs[name]}x)")  # type: ignore[index]
        )
    return out
