"""Crash test: kill `fedclock run` at random moments, resume it, and compare with a run never
interrupted.

For each trial a strategy is taken in turn (synchronous rounds under a deadline, FedBuff,
SALF under a deadline; the default experiment's digits data, a checkpoint every 1, 2 or 5
server steps), `fedclock run` starts in a fresh folder and, once its first checkpoint is on
disk, is killed with SIGKILL after a random further delay (every ``--sigint-every``-th trial
is interrupted with SIGINT instead, as Ctrl-C would, and must exit with status 130); half of
the resumed runs are killed once more. `fedclock run --resume` then finishes it. The trial
passes when metrics.csv (the wall-time column aside), summary.json (``wall_s`` aside) and
clients.csv equal those of the uninterrupted run of the same config.

    python scripts/crash_resume.py --trials 20          # docs/reliability.md
    python scripts/crash_resume.py --trials 2 --strategies fedbuff   # the fast test
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CASES: dict[str, list[str]] = {
    "drop-stragglers": ["strategy.name=drop-stragglers", "strategy.t_max=3.0"],
    "fedbuff": ["strategy.name=fedbuff", "strategy.buffer_size=4", "budget.virtual_time=120"],
    "salf": ["strategy.name=salf", "salf.scenario=deadline", "strategy.t_max=3.0"],
}
COMMON = ["--preset", "demo", "--set", "executor.threads=1", "-q"]


def command(case: str, out: Path, every: int) -> list[str]:
    sets = [*CASES[case], f"checkpoint.every_aggregations={every}"]
    return [
        sys.executable, "-m", "fedclock", "run", *COMMON,
        *(x for s in sets for x in ("--set", s)), "--out", str(out),
    ]  # fmt: skip


def outputs(run_dir: Path) -> tuple[Any, ...]:
    with (run_dir / "metrics.csv").open(newline="") as fh:
        rows = list(csv.reader(fh))
    keep = [i for i, h in enumerate(rows[0]) if h != "wall_time"]
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.pop("wall_s")
    timeline = run_dir / "timeline.csv"
    return (
        [[r[i] for i in keep] for r in rows],
        summary,
        (run_dir / "clients.csv").read_text(),
        timeline.read_text() if timeline.is_file() else None,
    )


def interrupt(cmd: list[str], run_dir: Path, delay: float, sig: int) -> tuple[int, bool]:
    """Start ``cmd``; once its first checkpoint is on disk, wait ``delay`` seconds more and
    send ``sig``. (exit status, whether it was still running when the signal came)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None and not (run_dir / "checkpoint.pt").exists():
        time.sleep(0.01)
    try:
        proc.wait(timeout=delay)
        return proc.returncode, False
    except subprocess.TimeoutExpired:
        proc.send_signal(sig)
        return proc.wait(), True


def ctrl_c_ok(run_dir: Path, rc: int) -> bool:
    """Ctrl-C in the loop: exit status 130, ``interrupted``, a checkpoint to resume from; after
    the loop it is ignored until the run folder is complete (``completed``; a Ctrl-C while
    the interpreter exits may still end the process by the signal, with nothing lost)."""
    try:
        status = json.loads((run_dir / "summary.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return False
    if rc == 130:
        return status == "interrupted" and (run_dir / "checkpoint.pt").exists()
    return status == "completed"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="seeds the kill times")
    ap.add_argument(
        "--strategies", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES)
    )
    ap.add_argument("--sigint-every", type=int, default=4, help="every n-th trial uses SIGINT")
    ap.add_argument("--keep", type=Path, help="keep the run folders here")
    args = ap.parse_args(argv)
    names = [s for s in args.strategies.split(",") if s]
    unknown = set(names) - set(CASES)
    if unknown:
        ap.error(f"unknown strategies {sorted(unknown)}")
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="fedclock-crash-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    os.environ.update(env)
    try:
        want: dict[str, Any] = {}
        window: dict[str, tuple[float, float]] = {}  # first checkpoint written → run ended
        for case in names:
            run_dir = work / f"whole-{case}"
            t0 = time.perf_counter()
            proc = subprocess.Popen(command(case, run_dir, 5))
            first = None
            while proc.poll() is None:
                if first is None and (run_dir / "checkpoint.pt").exists():
                    first = time.perf_counter() - t0
                time.sleep(0.02)
            if proc.returncode != 0:
                raise SystemExit(f"the uninterrupted {case} run failed")
            end = time.perf_counter() - t0
            window[case] = (first if first is not None else 0.5 * end, end)
            want[case] = outputs(run_dir)
            print(f"uninterrupted {case}: {end:.1f} s, first checkpoint at {window[case][0]:.1f} s")
        failed = resumed = interrupted = 0
        for trial in range(1, args.trials + 1):
            case = names[(trial - 1) % len(names)]
            run_dir = work / f"trial-{trial:02d}-{case}"
            every = rng.choice([1, 2, 5])
            sig = signal.SIGINT if trial % args.sigint_every == 0 else signal.SIGKILL
            lo, hi = window[case]
            delay = rng.uniform(0.0, 0.8 * (hi - lo))
            rc, hit = interrupt(command(case, run_dir, every), run_dir, delay, sig)
            had_checkpoint = (run_dir / "checkpoint.pt").exists()
            resumed += had_checkpoint
            interrupted += hit
            when = f"{delay:.1f} s after its first checkpoint"
            note = f"{signal.Signals(sig).name} {when} (exit {rc})" if hit else "ran to its end"
            if sig == signal.SIGINT and hit and not ctrl_c_ok(run_dir, rc):
                note += " — Ctrl-C did not leave an interrupted run with a checkpoint (status 130)"
                failed += 1
            resume = [sys.executable, "-m", "fedclock", "run", "--resume", str(run_dir), "-q"]
            if rng.random() < 0.5:  # killed once more while resuming
                again = rng.uniform(0.0, 0.5 * (hi - lo))
                _, hit2 = interrupt(resume, run_dir, again, signal.SIGKILL)
                if hit2:
                    note += f", its resume killed {again:.1f} s in"
            done = subprocess.run(resume, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"trial {trial:2d} {case:16s} FAILED: resume exited {done.returncode}: "
                      f"{done.stderr.strip()}")  # fmt: skip
                failed += 1
                continue
            same = outputs(run_dir) == want[case]
            failed += not same
            print(
                f"trial {trial:2d} {case:16s} every {every} agg  {note}, "
                f"checkpoint {'yes' if had_checkpoint else 'no '}  "
                f"{'identical' if same else 'DIFFERENT'}",
                flush=True,
            )
        print(
            f"{args.trials - failed}/{args.trials} trials identical to the uninterrupted runs "
            f"({interrupted} interrupted, {resumed} of them went on from a checkpoint)"
        )
        return 1 if failed else 0
    finally:
        if args.keep is not None:
            shutil.copytree(work, args.keep, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
