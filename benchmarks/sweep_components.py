"""Child process of ``sweep-table2``: one ``fedclock sweep`` with timers around its two kinds
of arithmetic, to bound what any bookkeeping work could still gain.

``python -m benchmarks.sweep_components OUT.json <fedclock sweep arguments>`` runs the sweep
in this process and writes ``{"wall_s", "evaluation_s", "training_steps_s"}``:

- ``evaluation_s``: time in :func:`fedclock.train.evaluate.evaluate_joint` (every stacked
  evaluation of a lockstep group: the models' forward passes over the test and validation
  sets, and the stacking of the versions' parameters);
- ``training_steps_s``: time in ``VectorizedExecutor._train_steps`` (the ``vmap``'d
  forward-backward passes and the SGD updates of every block, nothing of the block's set-up:
  batch rows, stacking, momentum buffers, deltas);
- ``wall_s``: the whole command, from just before the CLI's import to its exit.

Run with ``--jobs 1`` (one process, the groups one after another) and
``executor.threads=1``, every timed call runs while the rest of the process waits, so the
timers do not overlap.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _timed(totals: dict[str, float], key: str, f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - t0

    return wrapper


def main(argv: list[str]) -> None:
    out, args = Path(argv[0]), argv[1:]
    t0 = time.perf_counter()
    totals = {"evaluation_s": 0.0, "training_steps_s": 0.0}
    # patched before the CLI imports the lockstep code, which looks both up at call time
    import fedclock.train.evaluate as evaluate
    import fedclock.train.vectorized as vectorized

    evaluate.evaluate_joint = _timed(totals, "evaluation_s", evaluate.evaluate_joint)
    ex = vectorized.VectorizedExecutor
    ex._train_steps = _timed(totals, "training_steps_s", ex._train_steps)  # type: ignore[method-assign]
    from fedclock.cli import main as cli

    sys.argv = ["fedclock", "sweep", *args]
    try:
        cli()
    except SystemExit as stop:
        if stop.code:
            raise
    wall = time.perf_counter() - t0
    out.write_text(json.dumps({"wall_s": wall, **totals}))


if __name__ == "__main__":
    main(sys.argv[1:])
