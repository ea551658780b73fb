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
--batch-runs 1``: how the cells are spread over processes). ``FEDRAA_ROUNDS=N`` runs every
variant N times, alternating the order from round to round; times are medians and each
speedup is the median of the ratios within a round — on a virtual machine whose speed
drifts by a third over half an hour, only a ratio taken at one moment is a measurement.

Needs MNIST (``$FEDCLOCK_DATA`` or ``../shared/data/mnist``).
"""

from __future__ import annotations

import csv
import os
import resource
import statistics
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
    rounds = int(os.environ.get("FEDRAA_ROUNDS", "1"))
    if rounds < 1:
        raise SystemExit("FEDRAA_ROUNDS must be at least 1")
    names = list(variants)
    per_round: list[dict[str, dict[str, float]]] = []
    cells: dict[str, object] = {}
    load: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            # every round runs each variant once; odd rounds in reverse order, so a drift of
            # the machine's speed over the call weighs on both sides of a ratio alike
            order = names if r % 2 == 0 else names[::-1]
            timed: dict[str, dict[str, float]] = {}
            for name in order:
                out = Path(tmp) / f"{r}-{'-'.join(name.replace('-', '').split())}"
                c0, t0 = _children_cpu(), time.perf_counter()
                subprocess.run(
                    [*base, *extra[name], "--out", str(out)], check=True, env=variants[name]
                )
                timed[name] = {
                    "wall": round(time.perf_counter() - t0, 1),
                    "cpu": round(_children_cpu() - c0, 1),
                }
                load[name] = _loadavg()
                cells[name] = _cells(out)
            per_round.append({n: timed[n] for n in names})
    first = names[0]
    wall = {n: round(statistics.median(t[n]["wall"] for t in per_round), 1) for n in names}
    cpu = {n: round(statistics.median(t[n]["cpu"] for t in per_round), 1) for n in names}
    # speedups are paired within a round (the same moment of the machine), then the median
    paired = {n: [round(t[first]["wall"] / t[n]["wall"], 2) for t in per_round] for n in names}
    paired_cpu = {n: [round(t[first]["cpu"] / t[n]["cpu"], 2) for t in per_round] for n in names}
    return {
        "machine": machine(),
        "virtual_time": t_virtual,
        "rounds": per_round,
        "seconds": wall,
        "cpu_s": cpu,
        "load_after": load,
        "wall_speedups_per_round": paired,
        "wall_speedup": {n: round(statistics.median(v), 2) for n, v in paired.items()},
        "cpu_speedup": {n: round(statistics.median(v), 2) for n, v in paired_cpu.items()},
        "cells": cells,
    }


def rows(result: dict[str, object]) -> list[tuple[str, str]]:
    out = [("virtual seconds per run", f"{result['virtual_time']:g}")]
    wall, cpu = result["seconds"], result["cpu_s"]
    ws, cs = result["wall_speedup"], result["cpu_speedup"]
    per_round = result.get("wall_speedups_per_round", {})
    rounds = len(result.get("rounds", [])) or 1  # type: ignore[arg-type]
    median = "median of " if rounds > 1 else ""
    for name in wall:  # type: ignore[union-attr]
        each = per_round.get(name, [])  # type: ignore[union-attr]
        also = f"; per round {', '.join(f'{r}x' for r in each)}" if rounds > 1 else ""
        out.append(
            (
                name,
                f"{median}{wall[name]} s wall ({ws[name]}x), {cpu[name]} s CPU ({cs[name]}x)"  # type: ignore[index]
                + also,
            )
        )
    return out
