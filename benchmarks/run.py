"""Benchmark runner: ``python -m benchmarks.run [NAME ...] [--json] [--quick] [--repeats N]``.

Without a name every benchmark runs. The machine may be shared: unless ``--no-wait`` (or
``--quick``) is given, every timed run first waits until other processes leave the CPUs
alone, and a run they disturbed is repeated (see ``benchmarks.common.measure``); the
other processes' CPU use during each run is recorded in the result. Each result is written to
``benchmarks/results/NAME.json``; ``--json`` prints one JSON object (the result itself for a
single benchmark, ``{name: result}`` for several) instead of the table.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch

BENCHMARKS = {
    "w1-fedavg": "benchmarks.w1_fedavg",
    "w2-small": "benchmarks.w2_small",
    "engine-events": "benchmarks.engine_events",
    "scale-memory": "benchmarks.scale_memory",
    "partial-backprop": "benchmarks.partial_backprop",
    "checkpoint-cost": "benchmarks.checkpoint_cost",
    "sweep-parallel": "benchmarks.sweep_parallel",
    "executor-ray": "benchmarks.executor_ray",
    "startup": "benchmarks.startup",
    "sweep-table2": "benchmarks.sweep_table2",
    "fedraa-fragments": "benchmarks.fedraa_fragments",
    "fedraa-step": "benchmarks.fedraa_step",
    "trace-scale": "benchmarks.trace_scale",
    "selection-scale": "benchmarks.selection_scale",
    "w2-parts": "benchmarks.w2_parts",
}
RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    ap.add_argument("names", nargs="*", metavar="NAME", help=", ".join(BENCHMARKS))
    ap.add_argument("--json", action="store_true", help="print one JSON object, no table")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke test")
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure (median), default 3")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    ap.add_argument(
        "--no-wait",
        action="store_true",
        help="measure at once even if other processes are busy (default with --quick)",
    )
    ap.add_argument(
        "--max-wait",
        type=float,
        default=3600.0,
        help="seconds to wait for a quiet machine in all (default 3600), then measure anyway",
    )
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time figures by the wall clock (default) or by this process's CPU time",
    )
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the training runners (w1-fedavg, w2-small, partial-backprop) run; "
        "engine-events and scale-memory are CPU-only (default cpu)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark {unknown[0]!r}; allowed: {', '.join(BENCHMARKS)}")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    torch.set_num_threads(args.threads)
    from benchmarks import common

    common.WAIT_FOR_QUIET = not (args.no_wait or args.quick)
    common.MAX_TOTAL_WAIT = args.max_wait
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available")
    common.DEVICE = torch.device(args.device)
    common.CLOCK = time.perf_counter if args.clock == "wall" else time.process_time
    names = args.names or list(BENCHMARKS)
    results: dict[str, dict[str, object]] = {}
    for name in names:
        module = importlib.import_module(BENCHMARKS[name])
        t0 = time.perf_counter()
        result = module.run(quick=args.quick, repeats=args.repeats)
        result["wall_s"] = round(time.perf_counter() - t0, 2)
        result["clock"] = args.clock
        result["threads"] = args.threads
        result["device"] = args.device
        result["command"] = " ".join(["python -m benchmarks.run", *sys.argv[1:]])
        results[name] = result
        args.out.mkdir(parents=True, exist_ok=True)
        suffix = ("-quick" if args.quick else "") + (f"-{args.threads}t-{args.clock}")
        suffix += "-cuda" if args.device == "cuda" else ""
        (args.out / f"{name}{suffix}.json").write_text(json.dumps(result, indent=2) + "\n")
        if not args.json:
            print(f"\n{name}  ({result['wall_s']} s)")
            for label, value in module.rows(result):
                print(f"  {label:<34} {value}")
            sys.stdout.flush()
    if args.json:
        out = results[names[0]] if len(names) == 1 else results
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
