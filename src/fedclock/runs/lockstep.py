"""Run batching: several runs of a comparison or sweep advanced in lockstep in one process.

Each run of a group is an ordinary :func:`~fedclock.experiment.run_experiment` in a thread
of its own — its own event heap, random streams, model versions and run folder. Only its
training and evaluation are shared: whenever a run's simulator needs results (contributions
of a batch of tasks, or the test metrics of a model version), it hands the request to the
group's :class:`Lockstep` and waits; once every unfinished run of the group is waiting, all
the requests are served in one call — the batches trained together
(:func:`fedclock.train.joint.run_joint`: tasks of equal work shape from runs of equal model
and data share ``vmap`` blocks), the versions evaluated together
(:func:`fedclock.train.evaluate.evaluate_joint`: MLPs on the same test set in one stacked
pass) — and every run goes on with its own results. Runs of a group that read the same data
(same data section, seed and validation hold-out) also share one copy of it.

A run's results are those of the same run made alone (its contributions are, see
:mod:`fedclock.train.joint`); what batching saves is the per-block overhead of many small
blocks (the SALF MLP grid: one SGD step of 30 clients per round), matrix products too thin
to run at full speed alone (the test set's), the data's loading, and the threads' contention
(one call at a time, on all cores, instead of one per run). The batches are joined in the
order of the runs in the group, so a batched run is itself reproducible.

Memory: glibc gives each new thread that allocates its own malloc arena, and an arena keeps
what its thread freed. A group of 17 runs held ≈ 2.3 GB that way, against ≈ 1.2 GB with
the arenas capped (:func:`limit_malloc_arenas`, called before a group's threads start).
"""

from __future__ import annotations

import ctypes
import gc
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedclock.config import ExperimentConfig
from fedclock.experiment import data_key
from fedclock.sim.types import Contribution, Task

AUTO_MAX_RUNS = 8
"""At most this many runs at once by default (memory: each holds its models and evaluator)."""

BATCH_INVARIANT_ARCHS = ("mlp", "logreg")
"""Architectures whose ``vmap`` kernels give each client the same bits whatever the block's
size (``nn.Linear``): batching them by default never changes a number."""


def auto_batch_runs(cfg: ExperimentConfig) -> int:
    """The default ``--batch-runs``: :data:`AUTO_MAX_RUNS` for models whose training is
    batch-invariant on the vectorized executor (MLPs, logistic regression; exact results),
    1 otherwise (convolutions: equal to float tolerance only, so only on request)."""
    e = cfg.executor
    if cfg.model.arch in BATCH_INVARIANT_ARCHS and e.kind in ("auto", "vectorized"):
        return AUTO_MAX_RUNS
    return 1


@dataclass
class _Call:
    index: int  # the run's place in its group: batches are joined in this order
    executor: Any = None  # a training request: these tasks on this executor
    tasks: list[Task] = field(default_factory=list)
    evaluation: tuple[Any, Any] | None = None  # an evaluation request: (Evaluator, version)
    done: bool = False
    result: Any = None
    error: BaseException | None = None


class Lockstep:
    """The meeting point of a group's runs (see the module docstring)."""

    def __init__(self, runs: int) -> None:
        self._cond = threading.Condition()
        self._active = runs  # runs not finished yet
        self._waiting: list[_Call] = []
        self._interrupted = False
        self._on_interrupt: dict[int, Callable[[], None]] = {}  # run → its checkpointer's stop
        self._shared: dict[Hashable, Any] = {}
        self._shared_lock = threading.Lock()
        # held while a run builds itself (data, model, FLOPs, strategy); and no run starts
        # before all are built (:meth:`built`): torch's flop counter tracks modules through
        # process-wide hooks, so another thread's forward passes would skew a run's FLOPs
        self.setup_lock = threading.RLock()
        self._unbuilt = set(range(runs))

    def shared(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """``build()`` once per key for the whole group (the data runs read)."""
        with self._shared_lock:
            if key not in self._shared:
                self._shared[key] = build()
            return self._shared[key]

    def data(self, cfg: ExperimentConfig, build: Callable[[], Any]) -> Any:
        """The run's data: ``build()`` once for the group's runs with equal :func:`data_key`."""
        return self.shared(data_key(cfg), build)

    def execute(self, index: int, executor: Any) -> Callable[[Sequence[Task]], list[Contribution]]:
        """The ``Simulator.execute`` of run ``index``: trains its batches with the others'."""

        def run(tasks: Sequence[Task]) -> list[Contribution]:
            result: list[Contribution] = self._submit(_Call(index, executor, list(tasks)))
            return result

        return run

    def evaluation(self, index: int) -> Callable[[Any, Any], tuple[float, float]]:
        """The ``Evaluator.submit`` of run ``index``: evaluates its versions with the others'."""

        def evaluate(evaluator: Any, version: Any) -> tuple[float, float]:
            result: tuple[float, float] = self._submit(
                _Call(index, evaluation=(evaluator, version))
            )
            return result

        return evaluate

    def built(self, index: int) -> None:
        """Run ``index`` is built: wait until every run of the group is (or has failed)."""
        with self._cond:
            self._unbuilt.discard(index)
            self._cond.notify_all()
            while self._unbuilt and not self._interrupted:
                self._cond.wait()

    def leave(self, index: int) -> None:
        """Run ``index`` finished (or failed): the others no longer wait for it."""
        with self._cond:
            self._unbuilt.discard(index)
            self._active -= 1
            self._cond.notify_all()
            if self._waiting and len(self._waiting) >= self._active:
                self._serve()

    def on_interrupt(self, index: int, stop: Callable[[], None]) -> None:
        """Ctrl-C asks run ``index`` to ``stop`` (its checkpointer: a checkpoint at the next
        event, then it stops); a run without one stops at its next batch."""
        with self._cond:
            self._on_interrupt[index] = stop

    def interrupt(self) -> None:
        """Ctrl-C: every run stops (each records itself as interrupted, as a run alone)."""
        with self._cond:
            self._interrupted = True
            for stop in self._on_interrupt.values():
                stop()
            keep = []
            for call in self._waiting:
                if call.index in self._on_interrupt:
                    keep.append(call)  # trained as usual: it stops at its next event
                else:
                    call.error, call.done = KeyboardInterrupt(), True
            self._waiting = keep
            self._cond.notify_all()

    def _submit(self, call: _Call) -> Any:
        with self._cond:
            if self._interrupted and call.index not in self._on_interrupt:
                raise KeyboardInterrupt
            self._waiting.append(call)
            if len(self._waiting) >= self._active:
                self._serve()
            while not call.done:
                self._cond.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def _serve(self) -> None:
        """Every unfinished run is waiting: train all their batches and evaluate all their
        versions (the lock is held)."""
        from fedclock.train.evaluate import evaluate_joint
        from fedclock.train.joint import run_joint

        calls = sorted(self._waiting, key=lambda c: c.index)
        self._waiting = []
        train = [c for c in calls if c.evaluation is None]
        evaluate = [c for c in calls if c.evaluation is not None]
        try:
            if train:
                results = run_joint([(c.executor, c.tasks) for c in train])
                for call, contributions in zip(train, results, strict=True):
                    call.result = contributions
            if evaluate:
                metrics = evaluate_joint([c.evaluation for c in evaluate])  # type: ignore[misc]
                for call, measured in zip(evaluate, metrics, strict=True):
                    call.result = measured
        except BaseException as exc:  # a bug in one batch stops the group's runs with it
            for call in calls:
                call.error = exc
        for call in calls:
            call.done = True
        self._cond.notify_all()


MALLOC_ARENAS = 2
"""glibc's ``M_ARENA_MAX`` in a process that runs a lockstep group: its threads take turns,
so they gain nothing from arenas of their own, and each would keep its freed memory."""

_M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process (``mallopt(M_ARENA_MAX, arenas)``, as the
    ``MALLOC_ARENA_MAX`` environment variable would at start-up); False where the C library
    is not glibc. It changes where memory comes from, never a result."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):  # not glibc (macOS, Windows, musl)
        return False


def run_cells_together(
    cells: Sequence[tuple[ExperimentConfig, Path]],
    on_done: Callable[[int, Any], None] = lambda k, result: None,
) -> list[Any]:
    """Run ``cells`` (config, run folder) as one lockstep group; each cell's
    :class:`~fedclock.experiment.RunResult`, or the exception it raised. ``on_done(k,
    result)`` is called as each finishes. Ctrl-C interrupts every run of the group (each
    leaves its run folder, as a run alone does) and is raised again once they stopped."""
    from fedclock.runs.cache import run_cell

    if len(cells) > 1:
        limit_malloc_arenas()
    group = Lockstep(len(cells))
    results: list[Any] = [None] * len(cells)

    def work(k: int) -> None:
        cfg, run_dir = cells[k]
        try:
            results[k] = run_cell(cfg, run_dir, None, lockstep=(group, k))
        except BaseException as exc:  # reported by the caller, with the others going on
            results[k] = exc
        finally:
            group.leave(k)
        on_done(k, results[k])

    threads = [
        threading.Thread(target=work, args=(k,), name=f"fedclock-run-{k}", daemon=True)
        for k in range(len(cells))
    ]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except KeyboardInterrupt:
        group.interrupt()
        for t in threads:
            t.join()
        raise
    gc.collect()  # the group's runs leave reference cycles (see run_cell)
    return results


def batch_groups(
    cells: Sequence[Any], size: int, key: Callable[[Any], Hashable], workers: int = 1
) -> list[list[Any]]:
    """Groups of at most ``size`` cells, those with equal ``key`` (their data) together, as
    even in size as can be and, when there is more than one wave of groups, as many as a
    multiple of ``workers`` (the groups that run at once): 51 cells on 2 workers in groups
    of at most 8 are 8 groups of 6 or 7 (two workers busy to the end), not 7 groups of 8, 8,
    8, 8, 8, 8 and 3 (the last one alone)."""
    order: dict[Hashable, list[Any]] = {}
    for cell in cells:
        order.setdefault(key(cell), []).append(cell)
    ranked = [cell for same in order.values() for cell in same]
    if not ranked:
        return []
    count = -(-len(ranked) // size)
    if count > workers > 1:
        count = min(len(ranked), -(-count // workers) * workers)
    small, extra = divmod(len(ranked), count)
    out, at = [], 0
    for g in range(count):
        n = small + (g < extra)
        out.append(ranked[at : at + n])
        at += n
    return out


__all__ = [
    "AUTO_MAX_RUNS",
    "BATCH_INVARIANT_ARCHS",
    "MALLOC_ARENAS",
    "Lockstep",
    "auto_batch_runs",
    "batch_groups",
    "data_key",
    "limit_malloc_arenas",
    "run_cells_together",
]
