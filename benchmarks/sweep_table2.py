"""Run batching on a researcher's real workload: the SALF MLP reference Table II grid (5
strategies × 4 straggler ratios, 250 rounds; 3 seeds, 51 runs: vanilla reads no straggler
ratio) by ``fedclock sweep``, with ``--batch-runs 1`` (one run after another, the sweep before
run batching) against the automatic default (groups of 8 runs in lockstep, a worker process
per core) and the default with ``--jobs 1`` (the groups one after another in one process);
each a fresh command in a fresh folder, timed from start to exit. The ``table.csv`` files
must be identical (wall-time columns aside).

Also measured: the **evaluation floor** — the grid's evaluations alone (every run tests and
validates its model on 10,000 + 10,000 images at the start and after each round) at the speed
of :func:`fedclock.train.evaluate.evaluate_joint` stacking 8 versions, the fastest way this
code evaluates them: one process with all threads, or one single-thread process per core
(taken to scale perfectly); no schedule of the training makes the sweep faster than that.
Given as the median of 20 passes and as the fastest pass: this virtual machine's speed
drifts from minute to minute (the same matrix product takes 49–93 ms), so the fastest pass
is the floor at the machine's best and the median its typical value.

And the **bound of the bookkeeping**: one seed's sweep (17 runs) with ``--jobs 1`` and 1
thread, timed by :mod:`benchmarks.sweep_components`: the share of its wall time spent in the
evaluations and in the training steps themselves (the ``vmap``'d forward-backward passes and
SGD updates). Everything else — drawing batches, stacking and copying per-client state,
deltas, aggregation, recording, the runs' synchronisation, start-up and data loading — is
what faster code could remove; were it free, the default would take that share of its time.

``SWEEP_BASELINE_SRC=/path/to/other/checkout/src`` adds a first variant, the sequential sweep
(``--batch-runs 1``) of that source (e.g. a ``git worktree`` of ``b7ee116``, the code before
run batching), measured in the same session: the speedups are then against it, since this
machine's speed drifts too much between sessions for a figure from another day.

Needs MNIST (``$FEDCLOCK_DATA`` or ``../shared/data/mnist``); ``--quick``: 20 rounds, 1 seed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.sweep_parallel import REPO, _mnist, _table, result
from benchmarks.sweep_parallel import rows as variant_rows

VARIANTS = {
    "batch-runs 1 (sequential)": ["--batch-runs", "1"],
    "batch-runs auto, jobs 1 (one process)": ["--jobs", "1"],
    "batch-runs auto (a group per core)": [],
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
    variants = {name: (extra, env) for name, extra in VARIANTS.items()}
    baseline = os.environ.get("SWEEP_BASELINE_SRC")
    if baseline:  # the older code's sequential sweep, first: the speedups are against it
        old_env = {**os.environ, "PYTHONPATH": baseline}
        variants = {"baseline, batch-runs 1": (["--batch-runs", "1"], old_env), **variants}
    times: dict[str, float] = {}
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (extra, env_of) in variants.items():
            if common.WAIT_FOR_QUIET:
                common.wait_quiet()
            out = Path(tmp) / _folder(name)
            t0 = time.perf_counter()
            subprocess.run([*base, *extra, "--out", str(out)], check=True, env=env_of)
            times[name] = round(time.perf_counter() - t0, 1)
            tables[name] = _table(out)
        first = next(iter(variants))
        cells = len(list((Path(tmp) / _folder(first)).rglob("summary.json")))
        if common.WAIT_FOR_QUIET:
            common.wait_quiet()
        shares = components(base[4:], env, Path(tmp))
    rounds = 20 if quick else 250
    out = result(times, tables, cells, rounds, machine())
    if baseline:
        out["baseline_src"] = baseline
    out["evaluation_floor"] = evaluation_floor(cells, rounds, times[first])
    default = times["batch-runs auto (a group per core)"]
    out["bookkeeping_bound"] = bookkeeping_bound(shares, default, times[first])
    return out


def components(sweep: list[str], env: dict[str, str], tmp: Path) -> dict[str, float]:
    """:mod:`benchmarks.sweep_components` on one seed of the sweep (``sweep``: the ``fedclock
    sweep`` arguments), ``--jobs 1`` and 1 thread."""
    args = [a for a in sweep if a != "-q"]
    seeds = args.index("--seeds")
    args[seeds + 1] = args[seeds + 1].split(",")[0]
    report = tmp / "components.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.sweep_components", str(report), *args, "-q",
         "--jobs", "1", "--set", "executor.threads=1", "--out", str(tmp / "components")],
        check=True, env={**env, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"},
    )  # fmt: skip
    shares: dict[str, float] = json.loads(report.read_text())
    return shares


def bookkeeping_bound(
    shares: dict[str, float], default_s: float, first_s: float
) -> dict[str, float]:
    """The default's time were everything but the evaluations and the training steps free:
    their share of the one-process run (``shares``) × the default's wall time."""
    arithmetic = shares["evaluation_s"] + shares["training_steps_s"]
    share = arithmetic / shares["wall_s"]
    return {
        "wall_s": round(shares["wall_s"], 1),
        "evaluation_s": round(shares["evaluation_s"], 1),
        "training_steps_s": round(shares["training_steps_s"], 1),
        "other_s": round(shares["wall_s"] - arithmetic, 1),
        "arithmetic_share": round(share, 3),
        "bound_s": round(share * default_s, 1),
        "max_speedup": round(first_s / (share * default_s), 2),
    }


def evaluation_floor(cells: int, rounds: int, sequential_s: float) -> dict[str, float]:
    """Seconds the grid's evaluations take at best: ``cells × (rounds + 1) × 2`` evaluations
    of the 784-32-16-10 MLP over 10,000 rows, 8 versions stacked per pass (the median of 20
    passes, and the fastest: ``best_``; random weights and rows: the work does not depend on
    the values)."""
    import statistics

    import torch

    from fedclock.models import build_model
    from fedclock.train.evaluate import Evaluator, evaluate_joint
    from fedclock.train.executor import snapshot

    def model(seed: int) -> torch.nn.Module:
        return build_model("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=[32, 16],
                           seed=seed)  # fmt: skip

    g = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (10_000,), generator=g)
    requests = [(Evaluator(model(0), x, y, batch_size=10_000), snapshot(model(s), s))
                for s in range(8)]  # fmt: skip

    def passes(reqs: list[tuple[Evaluator, object]]) -> tuple[float, float]:
        """(median, fastest) seconds of 20 passes after a warm-up."""
        evaluate_joint(reqs)  # type: ignore[arg-type]
        ts = []
        for _ in range(20):
            t0 = time.perf_counter()
            evaluate_joint(reqs)  # type: ignore[arg-type]
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts), min(ts)

    threads = torch.get_num_threads()
    one, eight = passes(requests[:1])[0], passes(requests)
    torch.set_num_threads(1)
    try:
        eight_1t = passes(requests)
    finally:
        torch.set_num_threads(threads)
    evaluations = cells * (rounds + 1) * 2
    per_core = threads * eight[0] / eight_1t[0]  # a pass per core at once vs all threads on one
    floor, best = (evaluations / 8 * min(eight[k], eight_1t[k] / threads) for k in (0, 1))
    return {
        "evaluations": evaluations,
        "threads": threads,
        "ms_one_version": round(one * 1e3, 2),
        "ms_8_stacked": round(eight[0] * 1e3, 2),
        "ms_8_stacked_1_thread": round(eight_1t[0] * 1e3, 2),
        "best_ms_8_stacked_1_thread": round(eight_1t[1] * 1e3, 2),
        "per_core_gain": round(per_core, 2),
        "floor_s": round(floor, 1),
        "best_floor_s": round(best, 1),
        "max_speedup": round(sequential_s / floor, 2),
        "best_max_speedup": round(sequential_s / best, 2),
    }


def rows(r: dict[str, object]) -> list[tuple[str, str]]:
    out = variant_rows(r)
    f: dict[str, float] = r["evaluation_floor"]  # type: ignore[assignment]
    out.append((
        "evaluation floor",
        f"{f['floor_s']} s for {f['evaluations']} evaluations (8 stacked: {f['ms_8_stacked']} "
        f"ms with {f['threads']} threads, {f['ms_8_stacked_1_thread']} ms with 1; one version "
        f"{f['ms_one_version']} ms): at most {f['max_speedup']}× the first",
    ))  # fmt: skip
    b: dict[str, float] | None = r.get("bookkeeping_bound")  # type: ignore[assignment]
    if b:
        out.append((
            "bookkeeping bound",
            f"one seed, 1 thread: {b['wall_s']} s = evaluations {b['evaluation_s']} + training "
            f"steps {b['training_steps_s']} + other {b['other_s']}; with the other free the "
            f"default would take {b['bound_s']} s: at most {b['max_speedup']}× the first",
        ))  # fmt: skip
    if "best_floor_s" in f:
        out.append((
            "evaluation floor, fastest pass",
            f"{f['best_floor_s']} s ({f['best_ms_8_stacked_1_thread']} ms with 1 thread): at "
            f"most {f['best_max_speedup']}× the first",
        ))  # fmt: skip
    return out


def _folder(variant: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in variant)


__all__ = ["bookkeeping_bound", "components", "evaluation_floor", "rows", "run"]
