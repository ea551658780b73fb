"""Where a w2-small round goes in fedclock (issue 47): the host time of each part of a round,
beside the hand-written floor's round.

The w2-small workload (``benchmarks.w2_small``) runs through fedclock's simulator with the
vectorized executor, its parts timed by wrapping their entry points (they do not nest):

- **training**: ``VectorizedExecutor.run`` — the block's rows, stacked tensors, the local
  step, the deltas and the contribution records;
- **update**: ``Update.aggregate`` — the weights, Σ ω Δ, the server step;
- **evaluation**: ``Evaluator.measure`` — the test set through the new model;
- **planning**: ``Simulator.prepare`` and ``dispatch`` — the plan, the cost model, the task
  record, the event;
- **the rest**: the event loop, the trigger's callbacks, the observers and recording (the
  whole run minus the above).

Each figure is the median over ``--repeats`` runs of the part's seconds per round (rounds 2…R
of a run: the total over the run minus its first round, divided by R − 1 — the first round
compiles and allocates). The floor's round (``benchmarks.common.run_handwritten``) is
measured in the same process, after fedclock's. **Minor page faults per round** (this
process's ``ru_minflt`` over rounds 2…R; the floor's over its whole run ÷ R) count the fresh
memory a round touches: a buffer allocated anew every round can be mapped anew too.

``python -m benchmarks.w2_parts [--rounds R] [--test-samples N]`` prints one run's figures as
JSON; ``--test-samples 10`` shrinks the test set so that the evaluation, the same in both,
no longer hides the rest of the round.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Callable
from typing import Any

import torch

NAME = "w2-parts"
PARTS = ("training", "update", "evaluation", "planning")


def _timed(owner: Any, name: str, bucket: dict[str, float], part: str) -> Callable[[], None]:
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            bucket[part] += time.perf_counter() - t0

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original)


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _setup(rounds: int, test_samples: int | None) -> Any:
    from benchmarks import common, w2_small

    setup = w2_small.setup()
    data = setup.data
    if test_samples is not None:  # (the first N test samples)
        data = common.Data(data.x, data.y, data.x_test[:test_samples], data.y_test[:test_samples],
                           data.parts)  # fmt: skip
    return type(setup)(**{**setup.__dict__, "rounds": rounds, "data": data})


def floor_once(rounds: int, test_samples: int | None = None) -> dict[str, float]:
    """The floor's round (s) and minor page faults per round, one run."""
    from benchmarks import common, w2_small

    setup = _setup(rounds, test_samples)
    f0 = _faults()
    s = common.run_handwritten(setup, block=w2_small.floor_block(len(setup.data.parts)))
    return {"round": s, "faults": (_faults() - f0) / rounds}


def parts_once(rounds: int, test_samples: int | None = None) -> dict[str, float]:
    """One fedclock run of w2-small with ``rounds`` rounds: seconds per round of each part,
    and the minor page faults per round (``test_samples``: the first N of the test set)."""
    from benchmarks import common
    from fedclock.sim.simulator import Simulator
    from fedclock.strategies.aggregators import Update
    from fedclock.train.evaluate import Evaluator
    from fedclock.train.vectorized import VectorizedExecutor

    setup = _setup(rounds, test_samples)
    bucket = dict.fromkeys(PARTS, 0.0)
    first: dict[str, float] = {}
    faults: list[int] = []
    undo = [
        _timed(VectorizedExecutor, "run", bucket, "training"),
        _timed(Update, "aggregate", bucket, "update"),
        _timed(Evaluator, "measure", bucket, "evaluation"),
        _timed(Simulator, "prepare", bucket, "planning"),
        _timed(Simulator, "dispatch", bucket, "planning"),
    ]
    stamps: list[float] = []
    original = Update.aggregate

    def stamp(self: Any, *args: Any, **kwargs: Any) -> Any:  # (the end of each round's update)
        out = original(self, *args, **kwargs)
        stamps.append(time.perf_counter())
        if len(stamps) == 1:
            first.update(bucket)
            faults.append(_faults())
        return out

    Update.aggregate = stamp  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        common.run_fedclock(setup, "vectorized")
        total = time.perf_counter() - t0
        faults.append(_faults())
    finally:
        Update.aggregate = original  # type: ignore[method-assign]
        for u in undo:
            u()
    n = max(1, rounds - 1)
    whole = (total - (stamps[0] - t0)) / n
    out = {p: (bucket[p] - first.get(p, 0.0)) / n for p in PARTS}
    out["rest"] = whole - sum(out.values())
    out["round"] = whole
    out["faults"] = (faults[-1] - faults[0]) / n
    return out


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    from benchmarks.common import machine, median

    rounds = 30 if quick else 250
    got = [parts_once(rounds) for _ in range(repeats)]
    floor = [floor_once(rounds) for _ in range(repeats)]
    figures = {k: median([g[k] for g in got]) for k in (*PARTS, "rest", "round")}
    return {"benchmark": NAME, "quick": quick, "rounds": rounds, "s_per_round": figures,
            "floor_s_per_round": median([f["round"] for f in floor]),
            "faults_per_round": median([g["faults"] for g in got]),
            "floor_faults_per_round": median([f["faults"] for f in floor]),
            "threads": torch.get_num_threads(), "machine": machine()}  # fmt: skip


def rows(result: dict) -> list[tuple[str, str]]:
    f = result["s_per_round"]
    out = [(part, f"{1e3 * f[part]:.2f} ms") for part in (*PARTS, "rest")]
    out.append(("fedclock round", f"{1e3 * f['round']:.2f} ms"))
    out.append(("floor round", f"{1e3 * result['floor_s_per_round']:.2f} ms"))
    if "faults_per_round" in result:
        out.append(("minor page faults per round, fedclock / floor",
                    f"{result['faults_per_round']:.0f} / {result['floor_faults_per_round']:.0f}"))  # fmt: skip
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=250)
    ap.add_argument("--test-samples", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps({"fedclock": parts_once(a.rounds, a.test_samples),
                      "floor": floor_once(a.rounds, a.test_samples)}))  # fmt: skip
