"""Observers: everything that watches a run without changing it, as callbacks on one
protocol (in the spirit of pfl-research's callbacks).

The :class:`~fedclock.sim.simulator.Simulator` takes a list of observers and calls, in list
order, each one's hooks that it defines:

- ``on_start(sim)``: before the strategy's start (not on a resumed run);
- ``on_dispatch(sim, task)``: a task was dispatched;
- ``on_arrival(sim, contribution)``: an update arrived, before the trigger sees it;
- ``on_cancel(sim, task)``: an in-flight task was cancelled (cut at a deadline);
- ``on_reject(sim, contribution)``: the update guard refused an update;
- ``on_commit(sim, contributions)``: a server step is about to aggregate ``contributions``
  (after the guard; ``sim.model`` is still the version they are stale against);
- ``on_aggregation(sim, version)``: a server step made ``version`` (after the counters);
- ``on_evaluation(sim, row)``: an evaluation at ``row["virtual_time"]``; ``row`` holds the
  counters and each observer may add its columns (test metrics, exit accuracies, client
  losses) or read them (the recorder, the divergence check) — so order matters;
- ``on_event(sim)``: after every event (progress display, checkpoints);
- ``on_end(sim)``: the run ended normally (not on divergence or Ctrl-C);
- ``on_measured(sim, task)``: a deployment (fedclock.deploy) measured a task's phases on a
  real device and set ``task.timing`` (never called in simulation).

An observer with state between events declares ``checkpoint_fields`` like any part. The
generic ones are here; the evaluators (``train/evaluate.py``), the recorder
(``metrics/recorder.py``), the device timeline (``metrics/timeline.py``), the TensorBoard
writer (``metrics/tensorboard.py``) and the checkpointer (``sim/checkpoint.py``) are
observers too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

from fedclock.errors import DivergenceError
from fedclock.sim.types import ModelVersion

# the hooks receive the Simulator (sim/simulator.py), which imports this module: typed Any
Simulator = Any

HOOKS = (
    "on_start", "on_dispatch", "on_arrival", "on_cancel", "on_lost", "on_reject", "on_commit",
    "on_aggregation", "on_evaluation", "on_event", "on_end", "on_measured",
)  # fmt: skip


class EvaluationSchedule:
    """When to evaluate: at the start, after every ``every_aggregations``-th server step,
    every ``every_virtual_seconds`` of virtual time, and at the end (``eval.*``)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (the next tick is in the event heap)

    def __init__(
        self, every_aggregations: int | None = 1, every_virtual_seconds: float | None = None
    ) -> None:
        self.every_aggregations = every_aggregations
        self.every_virtual_seconds = every_virtual_seconds

    def on_start(self, sim: Simulator) -> None:
        sim.evaluate(0.0)
        if self.every_virtual_seconds is not None:
            sim.evaluate_every(self.every_virtual_seconds)

    def on_aggregation(self, sim: Simulator, version: ModelVersion) -> None:
        k = self.every_aggregations
        if k is not None and sim.counters.aggregations % k == 0:
            sim.evaluate(sim.now)

    def on_end(self, sim: Simulator) -> None:
        sim.evaluate(sim.now)


class Metrics:
    """The test columns of an evaluation: ``test_accuracy``, ``test_loss`` from
    ``evaluate(version)`` and the columns ``more(version)`` gives (CIS's per-exit accuracy),
    measured once per model version (a fine evaluation grid over synchronous rounds sees the
    same model several times)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (_cache: recomputed after a resume)

    def __init__(
        self,
        evaluate: Callable[[ModelVersion], tuple[float, float]],
        more: Callable[[ModelVersion], dict[str, float]] | None = None,
    ) -> None:
        self.evaluate, self.more = evaluate, more
        self._cache: tuple[int, dict[str, Any]] | None = None

    def on_evaluation(self, sim: Simulator, row: dict[str, Any]) -> None:
        version = sim.model
        if self._cache is None or self._cache[0] != version.version:
            acc, loss = self.evaluate(version)
            cols = {"test_accuracy": acc, "test_loss": loss}
            if self.more is not None:
                cols.update(self.more(version))
            self._cache = (version.version, cols)
        row.update(self._cache[1])


class DivergenceCheck:
    """Raises :class:`DivergenceError` when the test loss is not finite or exceeds
    ``factor`` × the loss at t = 0 (``eval.divergence_factor``); after the recorder, so the
    row is written first."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, factor: float | None, *, guarded: bool = False) -> None:
        self.factor, self.guarded = factor, guarded

    def on_evaluation(self, sim: Simulator, row: dict[str, Any]) -> None:
        loss, initial = row["test_loss"], sim.history[0]["test_loss"]
        if math.isfinite(loss) and (self.factor is None or loss <= self.factor * initial):
            return
        hint = (
            "." if math.isfinite(loss) or self.guarded
            else " (or set guard.reject_nonfinite: true if clients may send corrupt updates)."
        )  # fmt: skip
        raise DivergenceError(
            f"Training diverged: the test loss is {loss:.4g} after aggregation "
            f"{sim.counters.aggregations} (t = {row['virtual_time']:.4g} s), against "
            f"{initial:.4g} at the start; lower train.lr" + hint
        )


class Progress:
    """A plain callable ``fn(sim)`` run after every event and at the end (the CLI's progress
    display, a test's probe)."""

    def __init__(self, fn: Callable[[Simulator], None]) -> None:
        self.fn = fn

    def on_event(self, sim: Simulator) -> None:
        self.fn(sim)

    def on_end(self, sim: Simulator) -> None:
        self.fn(sim)
