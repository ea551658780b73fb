"""Whole-process cost of `fedclock run` against a plain-PyTorch floor process.

For the w1-fedavg and w2-small shapes, each run is a fresh process timed from the parent:

- **fedclock**: ``fedclock run benchmarks/configs/<shape>.yaml --out DIR -q`` (the console
  script; synthetic MNIST-shaped data, 10,000 test samples, the vectorized executor, 2 torch
  threads);
- **floor**: ``python -m benchmarks.startup_floor <shape>`` (torch, the same amount of
  MNIST-shaped random data, a plain ``nn.Sequential`` MLP and the ``run_handwritten`` loop of
  ``benchmarks.common``).

Figures per run: **wall** (from just before the process is spawned to its exit, reaped),
**first round** (from the spawn to the start of the first round: for fedclock, when the
initial evaluation's row appears in ``metrics.csv``, which the parent polls every 2 ms; for
the floor, the ``perf_counter()`` the floor prints just before its loop — the system-wide
monotonic clock on Linux), **peak RSS** (``ru_maxrss`` of the reaped child, ``os.wait4``) and
the seconds per round of rounds 2…R (fedclock's from ``metrics.csv``, the floor's from its
loop). Runs alternate fedclock / floor; each figure is the median over ``--repeats``, and
each repeat's fedclock / floor ratio (its two runs side by side) is reported too: their
spread is the machine's noise.
Before the first run, fedclock's package (and the baseline's) and ``benchmarks/`` are
byte-compiled (:func:`_compile_sources`): both sides start with their modules' bytecode
cached, as an installed package does (pip compiles at install; an editable install writes
the cache at its first import). Without it, a machine that sets ``PYTHONDONTWRITEBYTECODE``
— ours do — compiled fedclock's modules from source at every start (a W2 run's median
first round and wall 0.08–0.12 s later, docs/benchmarks.md), a cost no user's second run
pays.
Targets (issue 18): fedclock's wall ≤ 1.1× the floor's, peak RSS ≤ 1.2× the floor's.
``--quick`` runs 2 rounds of w1 and 20 of w2 (the whole data is still generated).

``STARTUP_BASELINE_SRC=/path/to/other/checkout/src`` adds a third runner per shape,
``fedclock-baseline``: the same command with that source first on ``PYTHONPATH`` (e.g. a
``git worktree`` of an older commit), interleaved with the others, so two versions are
compared under the same conditions.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.common import machine, measure, median

NAME = "startup"
REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "benchmarks" / "configs"
ROUNDS = {"w1-fedavg": 10, "w2-small": 250}
QUICK_ROUNDS = {"w1-fedavg": 2, "w2-small": 20}
FIGURES = ("wall_s", "first_round_s", "peak_rss_mb", "s_per_round")
TARGETS = {"wall_s": 1.1, "peak_rss_mb": 1.2}


def _fedclock_command() -> list[str]:
    script = Path(sys.executable).parent / "fedclock"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "fedclock"]


def _spawn(
    cmd: list[str],
    first_row: Path | None = None,
    stdout: int | None = subprocess.DEVNULL,
    env: dict[str, str] | None = None,
) -> tuple[float, float, float, subprocess.Popen[bytes]]:
    """Run ``cmd`` to its end: (wall s, s to the first data row of ``first_row`` or nan,
    peak RSS MB, the process)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=stdout, env=env)
    first = math.nan
    while first_row is not None:  # poll until the first row is there, or the process ended
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            if first_row.read_bytes().count(b"\n") >= 2:  # the header, then a row
                first = time.perf_counter() - t0
                first_row = None
        except FileNotFoundError:
            pass
        time.sleep(0.002)
    else:
        pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with status {proc.returncode}")
    return wall, first, usage.ru_maxrss / 1024, proc


def _compile_sources(baseline: str | None) -> None:
    """Byte-compile the fedclock package the command imports (and the baseline's), and
    ``benchmarks/`` (the floor's modules), into their ``__pycache__`` folders."""
    import compileall

    import fedclock

    roots = [Path(fedclock.__file__).parent, REPO / "benchmarks"]
    if baseline:
        roots.append(Path(baseline) / "fedclock")
    for root in roots:
        if not compileall.compile_dir(root, quiet=1):
            raise RuntimeError(f"{root} does not byte-compile")


def _rounds_s(metrics: Path) -> float:
    """Median seconds per round of rounds 2…R, from metrics.csv's wall_time column."""
    lines = metrics.read_text().splitlines()
    col = lines[0].split(",").index("wall_time")
    times = [float(line.split(",")[col]) for line in lines[1:]]
    return float(np.median(np.diff(times[1:]))) if len(times) > 2 else math.nan


def run_fedclock(shape: str, rounds: int, work: Path, src: str | None = None) -> dict[str, float]:
    """``fedclock run`` of the shape's config (``src``: that fedclock source instead)."""
    out = work / f"{shape}-{time.monotonic_ns()}"
    cmd = [*_fedclock_command(), "run", str(CONFIGS / f"{shape}.yaml"), "--out", str(out), "-q"]
    if rounds != ROUNDS[shape]:
        cmd += ["--set", f"budget.aggregations={rounds}"]
    env = None
    if src is not None:
        path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}
    wall, first, rss, _ = _spawn(cmd, first_row=out / "metrics.csv", env=env)
    return {"wall_s": wall, "first_round_s": first, "peak_rss_mb": rss,
            "s_per_round": _rounds_s(out / "metrics.csv")}  # fmt: skip


def run_floor(shape: str, rounds: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "benchmarks.startup_floor", shape, str(rounds)]
    t0 = time.perf_counter()
    wall, _, rss, proc = _spawn(cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    out = json.loads(proc.stdout.read().decode().strip().splitlines()[-1])
    return {"wall_s": wall, "first_round_s": out["first_round_at"] - t0, "peak_rss_mb": rss,
            "s_per_round": out["s_per_round"]}  # fmt: skip


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    rounds = QUICK_ROUNDS if quick else ROUNDS
    runners: dict[str, Callable[[Path], dict[str, float]]] = {}
    baseline = os.environ.get("STARTUP_BASELINE_SRC")
    for shape, r in rounds.items():
        runners[f"{shape}/fedclock"] = lambda w, s=shape, r=r: run_fedclock(s, r, w)
        if baseline:
            runners[f"{shape}/fedclock-baseline"] = lambda w, s=shape, r=r: run_fedclock(
                s, r, w, src=baseline
            )
        runners[f"{shape}/floor"] = lambda w, s=shape, r=r: run_floor(s, r)
    _compile_sources(baseline)
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in runners}
    load: dict[str, list[float]] = {k: [] for k in runners}
    with tempfile.TemporaryDirectory(prefix="fedclock-startup-") as tmp:
        for _ in range(repeats):
            for name, fn in runners.items():
                got: dict[str, float] = {}

                def once(
                    fn: Callable[[Path], dict[str, float]] = fn, got: dict[str, float] = got
                ) -> float:
                    got.clear()
                    got.update(fn(Path(tmp)))
                    return got["wall_s"]

                _, other, _ = measure(once)
                runs[name].append({k: round(v, 4) for k, v in got.items()})
                load[name].append(round(other, 3))
    med = {name: {f: median([r[f] for r in rs]) for f in FIGURES} for name, rs in runs.items()}
    ratios = {
        shape: {f: med[f"{shape}/fedclock"][f] / med[f"{shape}/floor"][f] for f in FIGURES}
        for shape in rounds
    }
    # each repeat's fedclock run against the floor run beside it: the spread of the ratio
    # shows how much of a difference between medians the machine's noise could make
    pairs = {
        shape: {
            f: [a[f] / b[f] for a, b in zip(runs[f"{shape}/fedclock"], runs[f"{shape}/floor"],
                                             strict=True)]
            for f in ("wall_s", "s_per_round")
        }
        for shape in rounds
    }  # fmt: skip
    if baseline:
        for shape in rounds:
            ratios[f"{shape} baseline"] = {
                f: med[f"{shape}/fedclock-baseline"][f] / med[f"{shape}/floor"][f] for f in FIGURES
            }
    return {
        "benchmark": NAME,
        "quick": quick,
        "rounds": rounds,
        "median": med,
        "fedclock_over_floor": ratios,
        "pair_ratios": pairs,
        "targets": TARGETS,
        "met": {s: {f: ratios[s][f] <= t for f, t in TARGETS.items()} for s in rounds},
        "baseline_src": baseline,
        "runs": runs,
        "other_processes_cores": load,
        "uptime_load_average": os.getloadavg(),
        "machine": machine(),
    }


def rows(r: dict[str, object]) -> list[tuple[str, str]]:
    med: dict[str, dict[str, float]] = r["median"]  # type: ignore[assignment]
    ratios: dict[str, dict[str, float]] = r["fedclock_over_floor"]  # type: ignore[assignment]
    out = []
    for name, m in med.items():
        out.append(
            (
                name,
                f"wall {m['wall_s']:.2f} s, first round at {m['first_round_s']:.2f} s, "
                f"peak RSS {m['peak_rss_mb']:.0f} MB, {m['s_per_round']:.4f} s/round",
            )
        )
    for shape, q in ratios.items():
        out.append(
            (
                f"{shape}: fedclock / floor",
                f"wall {q['wall_s']:.2f}× (≤ 1.1), peak RSS {q['peak_rss_mb']:.2f}× (≤ 1.2), "
                f"first round {q['first_round_s']:.2f}×",
            )
        )
    for shape, q in r.get("pair_ratios", {}).items():  # type: ignore[union-attr]
        out.append(
            (
                f"{shape}: fedclock / floor per repeat",
                f"wall {min(q['wall_s']):.2f}–{max(q['wall_s']):.2f}×, s/round "
                f"{min(q['s_per_round']):.2f}–{max(q['s_per_round']):.2f}×",
            )
        )
    out.append(("other processes (cores) per run", json.dumps(r["other_processes_cores"])))
    return out
