"""The simulator: a heap of events on a virtual clock.

Events are ordered by (virtual time, sequence number), so ties resolve in the
order the events were scheduled and every run is deterministic. The strategy
reacts to ``on_start``, ``on_arrival`` and ``on_timer`` through a
:class:`Context`. Training is lazy: dispatched tasks wait until one of them
arrives without a result, then all of them reach the executor as one batch
(per-client random streams make the results independent of the batching).

Accounting (all in virtual seconds / bytes):
- compute spent: the compute phase of every task, charged when the task ends
  (arrives, is cancelled, or is cut off by the end of the run — then only the
  part performed), so the column only grows;
- compute wasted: the part of it whose result was never aggregated (discarded
  updates, cancelled stragglers, work in flight at the end);
- bytes down when a task is dispatched, bytes up when its update arrives;
- per committed update: its staleness (global versions created since the
  client's base version, Fraboni et al.'s n − ρ_i(n)) and the weight the
  aggregator gave it (``Contribution.weight``), summed per client.

With ``evaluate_clients`` every evaluation also measures each client's training
loss L_i of the global model and records the federated loss (eq. 2), the
surrogate loss (eq. 10) and the spread of the client losses
(:func:`fedclock.metrics.recorder.federated_metrics`).
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedclock.errors import DivergenceError
from fedclock.metrics.recorder import federated_metrics
from fedclock.rng import stream
from fedclock.sim.guard import FaultInjector, UpdateGuard
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan

if TYPE_CHECKING:
    from fedclock.devices.cost import TaskCost
    from fedclock.devices.population import Population

_ARRIVAL, _TIMER, _EVAL = 0, 1, 2
_heappush = heapq.heappush


_gc_lock = threading.Lock()
_gc_users = 0  # simulations running in this process (run batching runs several in threads)
_gc_saved: tuple[int, ...] = ()


@contextlib.contextmanager
def _quiet_gc() -> Iterator[None]:
    """Keep Python's cyclic garbage collector off the event loop's back.

    With thousands of tasks in flight, the collector's full passes over every live
    object took a quarter of the engine's time. The objects alive when the run
    starts (the data, the model, torch's own) are frozen out of the collector and
    the first generation's threshold is raised; both are restored afterwards — by the
    last of the simulations running at once (run batching runs several in threads).
    """
    global _gc_users, _gc_saved
    with _gc_lock:
        gc.freeze()  # (garbage among them is collected after the run, once unfrozen)
        if _gc_users == 0:
            _gc_saved = gc.get_threshold()
            gc.set_threshold(max(_gc_saved[0], 50_000), *_gc_saved[1:])
        _gc_users += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0:
                gc.set_threshold(*_gc_saved)
                gc.unfreeze()


class StopReason(StrEnum):
    VIRTUAL_TIME = "virtual_time"
    AGGREGATIONS = "aggregations"
    UPDATES = "updates"
    IDLE = "idle"  # the strategy has nothing left in flight


class Executor(Protocol):
    def run(self, tasks: Sequence[Task]) -> list[Contribution]: ...


class StrategyProtocol(Protocol):
    name: str

    def on_start(self, ctx: Context) -> None: ...
    def on_arrival(self, ctx: Context, contribution: Contribution) -> None: ...
    def on_timer(self, ctx: Context, tag: Any) -> None: ...
    def plan(self, ctx: Context, client: int) -> tuple[Any, Any]: ...
    def aggregate(self, ctx: Context, contributions: Sequence[Contribution]) -> ModelVersion: ...


@dataclass
class Counters:
    aggregations: int = 0
    updates_received: int = 0  # arrived at the server
    updates_used: int = 0
    updates_discarded: int = 0
    updates_rejected: int = 0  # arrived, refused by the update guard (never aggregated)
    bytes_up: float = 0.0
    bytes_down: float = 0.0
    compute_s_spent: float = 0.0
    compute_s_wasted: float = 0.0
    participation: dict[int, int] = field(default_factory=dict)
    staleness: dict[int, int] = field(default_factory=dict)  # staleness → committed updates
    weight_received: dict[int, float] = field(default_factory=dict)  # client → Σ ω_i(n)


@dataclass
class Budget:
    virtual_time: float | None = None
    aggregations: int | None = None
    updates: int | None = None


class Context:
    """What a strategy callback may see and do."""

    def __init__(self, sim: Simulator) -> None:
        self._sim = sim
        self.start = sim.start  # type: ignore[method-assign]  # the hot path: no extra call

    # ---- what the strategy sees
    @property
    def now(self) -> float:
        return self._sim.now

    @property
    def model(self) -> ModelVersion:
        return self._sim.model

    @property
    def num_clients(self) -> int:
        return len(self._sim.population)

    @property
    def population(self) -> Population:
        return self._sim.population

    @property
    def client_sizes(self) -> np.ndarray:
        return self._sim.client_sizes

    @property
    def counters(self) -> Counters:
        return self._sim.counters

    @property
    def stopping(self) -> bool:
        return self._sim.stop_reason is not None

    def rng(self, purpose: str, *ids: int) -> np.random.Generator:
        """A stream keyed by (run seed, purpose, *ids): common across strategies."""
        return stream(self._sim.seed, purpose, *ids)

    # ---- what the strategy does
    def prepare(
        self,
        client: int,
        *,
        base: ModelVersion | None = None,
        work: tuple[TaskPlan, TaskCost] | None = None,
    ) -> Task:
        """Build (but do not dispatch) a task for ``client`` on ``base`` (default: current model).

        ``work``: the task's plan and cost when a round's planner decided them (default: the
        strategy's ``plan`` for the client). Lets a trigger look at the task's timing before
        deciding how to dispatch it.
        """
        return self._sim.prepare(client, base or self._sim.model, work)

    def dispatch(self, task: Task, *, execute: bool = True) -> Task:
        """Start a prepared task now; its arrival fires at ``task.t_finish``.

        ``execute=False`` skips the training compute because the strategy already
        knows the update will be discarded (it must cancel or discard it).
        """
        return self._sim.dispatch(task, execute=execute)

    def start(self, client: int) -> Task:
        """``dispatch(prepare(client))`` on the current model, in one step (the hot path)."""
        return self._sim.start(client)

    def set_timer(self, at: float, tag: Any = None) -> None:
        self._sim.push(max(at, self._sim.now), _TIMER, tag)

    def cancel(self, task: Task) -> None:
        """Abort an in-flight task now: its partial compute counts as wasted."""
        self._sim.cancel(task)

    def discard(self, contribution: Contribution) -> None:
        """Drop an arrived update: its compute counts as wasted."""
        self._sim.discard(contribution)

    def commit(self, contributions: Sequence[Contribution]) -> ModelVersion:
        """Aggregate ``contributions`` into a new global model (one server step)."""
        return self._sim.commit(contributions)


class Simulator:
    def __init__(
        self,
        *,
        strategy: StrategyProtocol,
        executor: Executor,
        population: Population,
        initial: ModelVersion,
        client_sizes: np.ndarray,
        seed: int,
        budget: Budget,
        evaluate: Callable[[ModelVersion], tuple[float, float]],
        on_record: Callable[[dict[str, Any]], None] = lambda row: None,
        on_progress: Callable[[Simulator], None] | None = None,
        eval_every_aggregations: int | None = 1,
        eval_every_virtual_seconds: float | None = None,
        divergence_factor: float | None = None,
        evaluate_clients: Callable[[ModelVersion], np.ndarray] | None = None,
        evaluate_more: Callable[[ModelVersion], dict[str, float]] | None = None,
        importance: np.ndarray | None = None,
        on_aggregate: Callable[[ModelVersion, int], None] | None = None,
        guard: UpdateGuard | None = None,
        faults: FaultInjector | None = None,
        execute: Callable[[Sequence[Task]], list[Contribution]] | None = None,
    ) -> None:
        self.strategy = strategy
        self.executor = executor
        # how a batch of tasks is trained: the executor's run, or (run batching) a call
        # that trains it together with other simulations' batches
        self.execute = executor.run if execute is None else execute
        self.population = population
        self.model = initial
        self.client_sizes = client_sizes
        self.seed = seed
        self.budget = budget
        self.evaluate = evaluate
        self.on_record = on_record
        self.on_progress = on_progress
        self.eval_every_aggregations = eval_every_aggregations
        self.eval_every_virtual_seconds = eval_every_virtual_seconds
        self.divergence_factor = divergence_factor
        self.evaluate_clients = evaluate_clients
        self.evaluate_more = evaluate_more  # extra metrics.csv columns (e.g. per-exit accuracy)
        self.importance = importance  # p_i of eq. 2 (default: ∝ client sizes)
        self.on_aggregate = on_aggregate  # (new version, aggregation count), after records
        self.guard = guard  # refuses bad updates before the aggregator sees them
        self.faults = faults  # corrupts the updates of faulty clients (a test bench)
        self._rejected_streak = 0  # updates rejected since the last accepted one
        self.last_client_losses: np.ndarray | None = None

        self.now = 0.0
        self.counters = Counters()
        self.stop_reason: StopReason | None = None
        self.ctx = Context(self)
        self._heap: list[tuple[float, int, int, Any]] = []
        # sequence numbers: events at the same time fire in the order they were pushed
        self._seq = itertools.count()
        self._next_task_id = 0
        self._task_count = [0] * len(population)  # k of each client's next task
        # each client's newest base version and how many of its tasks started on it
        self._last_base = [-1] * len(population)
        self._on_last_base = [0] * len(population)
        # the hot path's look-ups, bound once (a Strategy binds its parts' methods)
        self._plan = strategy.plan
        # the planner's state hooks (Planner's contract: planning has no side effects)
        self._on_dispatch = getattr(strategy, "on_dispatch", None)
        self._on_commit = getattr(strategy, "on_commit", None)
        self._timing = population.timing
        self._pending: dict[int, Task] = {}  # dispatched, not executed yet (by task id)
        self._results: dict[int, Contribution] = {}
        self._in_flight: dict[int, Task] = {}
        self._last_eval: tuple[int, float] | None = None
        # (model version, accuracy, loss, other columns) of the last evaluation
        self._eval_cache: tuple[int, float, float, dict[str, Any]] | None = None
        self._wall0 = time.perf_counter()
        self.history: list[dict[str, Any]] = []
        self._resumed = False  # restore_state() was called: the loop skips the start

    # ------------------------------------------------------------ events
    def push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload))

    def _repeat(self, client: int, version: int, k: int) -> int:
        """``Task.repeat``: the task's index among the client's tasks on base ``version``.

        0 for the first (the batch stream of every earlier release), 1, 2, … for further
        tasks on the same base. A base older than the client's newest (a stale download,
        AsyncFL) gets k + 1, which exceeds every index used on that base before.
        """
        last = self._last_base[client]
        if version == last:
            return self._on_last_base[client]
        return 0 if version > last else k + 1

    def _count_base(self, client: int, version: int) -> None:
        last = self._last_base[client]
        if version > last:
            self._last_base[client] = version
            self._on_last_base[client] = 1
        elif version == last:
            self._on_last_base[client] += 1

    def prepare(
        self, client: int, base: ModelVersion, work: tuple[TaskPlan, TaskCost] | None = None
    ) -> Task:
        plan, cost = self._plan(self.ctx, client) if work is None else work
        k = self._task_count[client]
        task = Task(
            self._next_task_id, client, k, base, plan, cost, self._timing(client, cost, k), self.now
        )
        task.repeat = self._repeat(client, base.version, k)
        return task

    def dispatch(self, task: Task, *, execute: bool) -> Task:
        if task.task_id != self._next_task_id:
            raise RuntimeError("dispatch() takes the task returned by the latest prepare()")
        self._next_task_id += 1
        self._task_count[task.client] += 1
        self._count_base(task.client, task.base.version)
        task.execute = execute
        self.counters.bytes_down += task.cost.bytes_down
        self._in_flight[task.task_id] = task
        if execute:
            self._pending[task.task_id] = task
        self.push(task.t_finish, _ARRIVAL, task)
        if self._on_dispatch is not None:
            self._on_dispatch(task)
        return task

    def start(self, client: int) -> Task:
        """prepare + dispatch on the current model, inlined: one call per task."""
        plan, cost = self._plan(self.ctx, client)
        counts = self._task_count
        k = counts[client]
        counts[client] = k + 1
        timing = self._timing(client, cost, k)
        tid = self._next_task_id
        self._next_task_id = tid + 1
        now = self.now
        model = self.model
        version = model.version
        task = Task(tid, client, k, model, plan, cost, timing, now)
        if self._last_base[client] == version:
            task.repeat = self._on_last_base[client]
            self._on_last_base[client] += 1
        else:  # the current model is the newest version this client has seen
            self._last_base[client] = version
            self._on_last_base[client] = 1
        self.counters.bytes_down += cost.bytes_down
        self._in_flight[tid] = task
        self._pending[tid] = task
        down, compute, up = timing  # arrival at t_finish (the same float sums)
        _heappush(self._heap, (now + (down + compute + up), next(self._seq), _ARRIVAL, task))
        if self._on_dispatch is not None:
            self._on_dispatch(task)
        return task

    def cancel(self, task: Task) -> None:
        if task.cancelled or task.task_id not in self._in_flight:
            return
        task.cancelled = True
        del self._in_flight[task.task_id]
        self._results.pop(task.task_id, None)
        self._pending.pop(task.task_id, None)  # never trained
        done = task.timing.compute_done_by(self.now - task.t_start)
        self.counters.compute_s_spent += done
        self.counters.compute_s_wasted += done
        self.counters.updates_discarded += 1

    def discard(self, contribution: Contribution) -> None:
        self.counters.updates_discarded += 1
        self.counters.compute_s_wasted += contribution.task.timing.compute_s

    def commit(self, contributions: Sequence[Contribution]) -> ModelVersion:
        if self.faults is not None:
            contributions = [self.faults.apply(c) for c in contributions]
        guard = self.guard
        if guard is not None:
            kept = []
            for c in contributions:
                if guard.rejects(c):  # counted and wasted, never aggregated
                    self.counters.updates_rejected += 1
                    self.counters.compute_s_wasted += c.task.timing.compute_s
                else:
                    kept.append(c)
            if not kept:  # nothing left: no server step
                self._rejected_streak += len(contributions)
                if self._rejected_streak >= max(1000, 10 * len(self.population)):
                    raise DivergenceError(
                        f"The update guard rejected the last {self._rejected_streak} updates "
                        f"in a row (t = {self.now:.4g} s), so the model cannot move; loosen "
                        "guard.max_update_norm or lower population.faults.fraction."
                    )
                return self.model
            self._rejected_streak = 0
            contributions = kept
        isfinite = math.isfinite
        for c in contributions:
            if not isfinite(c.train_loss):
                raise DivergenceError(
                    f"Training diverged: client {c.client} reported a non-finite training loss "
                    f"at aggregation {self.counters.aggregations + 1} (t = {self.now:.4g} s); "
                    "lower train.lr (or set guard.reject_nonfinite to drop such updates)."
                )
        current = self.model.version
        self.model = self.strategy.aggregate(self.ctx, contributions)
        if self._on_commit is not None:
            self._on_commit(contributions)
        ctr = self.counters
        ctr.aggregations += 1
        ctr.updates_used += len(contributions)
        participation, staleness, received = ctr.participation, ctr.staleness, ctr.weight_received
        participation_get, staleness_get, received_get = (
            participation.get, staleness.get, received.get
        )  # fmt: skip
        for c in contributions:
            task = c.task
            client = task.client
            participation[client] = participation_get(client, 0) + 1
            stale = current - task.base.version
            staleness[stale] = staleness_get(stale, 0) + 1
            weight = c.weight
            if weight is not None:
                received[client] = received_get(client, 0.0) + weight
        k = self.eval_every_aggregations
        if k is not None and ctr.aggregations % k == 0:
            self._record(self.now)
        if self.on_aggregate is not None:
            self.on_aggregate(self.model, ctr.aggregations)
        b = self.budget
        if self.stop_reason is None:
            if b.aggregations is not None and ctr.aggregations >= b.aggregations:
                self.stop_reason = StopReason.AGGREGATIONS
            elif b.updates is not None and ctr.updates_used >= b.updates:
                self.stop_reason = StopReason.UPDATES
        return self.model

    def _flush(self) -> None:
        """Execute every pending task in one executor batch.

        Execution is lazy: it happens when an arriving task has no result yet, so
        the executor sees every task dispatched since the last flush at once (large
        vectorized batches even when a trigger dispatches one task per arrival),
        and tasks cancelled or still in flight at the end are never trained.
        """
        if not self._pending:
            return
        batch = list(self._pending.values())
        self._pending = {}
        results = self._results
        for contribution in self.execute(batch):
            results[contribution.task.task_id] = contribution

    # ------------------------------------------------------------ records
    def _record(self, t: float) -> None:
        key = (self.model.version, t)
        if self._last_eval == key:
            return
        self._last_eval = key
        ctr = self.counters
        cached = self._eval_cache
        if cached is not None and cached[0] == self.model.version:
            # the model has not changed since the last evaluation (a fine evaluation grid
            # over synchronous rounds): the same metrics, not computed again
            _, acc, loss, more = cached
        else:
            acc, loss = self.evaluate(self.model)
            more = {} if self.evaluate_more is None else self.evaluate_more(self.model)
            if self.evaluate_clients is not None:
                self.last_client_losses = self.evaluate_clients(self.model)
            self._eval_cache = (self.model.version, acc, loss, more)
        row = {
            "virtual_time": t,
            "wall_time": time.perf_counter() - self._wall0,
            "aggregation": ctr.aggregations,
            "updates_received": ctr.updates_received,
            "updates_used": ctr.updates_used,
            "updates_discarded": ctr.updates_discarded,
            "updates_rejected": ctr.updates_rejected,
            "test_accuracy": acc,
            "test_loss": loss,
            "bytes_up": ctr.bytes_up,
            "bytes_down": ctr.bytes_down,
            "compute_s_spent": ctr.compute_s_spent,
            "compute_s_wasted": ctr.compute_s_wasted,
        }
        row.update(more)
        if self.evaluate_clients is not None and self.last_client_losses is not None:
            row.update(self.client_metrics(self.last_client_losses))
        self.history.append(row)
        self.on_record(row)
        initial = self.history[0]["test_loss"]
        factor = self.divergence_factor
        if not math.isfinite(loss) or (factor is not None and loss > factor * initial):
            raise DivergenceError(
                f"Training diverged: the test loss is {loss:.4g} after aggregation "
                f"{ctr.aggregations} (t = {t:.4g} s), against {initial:.4g} at the start; "
                "lower train.lr"
                + (
                    "."
                    if math.isfinite(loss) or self.guard is not None
                    else " (or set guard.reject_nonfinite: true if clients may send corrupt updates)."
                )
            )

    def per_client(self, counts: dict[int, int] | dict[int, float]) -> np.ndarray:
        out = np.zeros(len(self.population))
        for client, v in counts.items():
            out[client] = v
        return out

    def client_metrics(self, losses: np.ndarray) -> dict[str, float]:
        """Federated / surrogate / participation losses and the spread, from client losses."""
        p = self.importance
        if p is None:
            p = self.client_sizes / self.client_sizes.sum()
        return federated_metrics(
            losses,
            p,
            weight_received=self.per_client(self.counters.weight_received),
            participations=self.per_client(self.counters.participation),
        )

    # ------------------------------------------------------------ checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """The engine's state between two events (fedclock.sim.checkpoint stores it; the
        strategy, executor and evaluator are components of their own)."""
        seq = next(self._seq)
        self._seq = itertools.count(seq)  # (reading the counter must not advance it)
        return {
            "now": self.now,
            "counters": dict(vars(self.counters)),
            "heap": list(self._heap),
            "seq": seq,
            "next_task_id": self._next_task_id,
            "task_count": list(self._task_count),
            "last_base": list(self._last_base),
            "on_last_base": list(self._on_last_base),
            # in dispatch order: the order the executor gets them in
            "pending": list(self._pending.values()),
            "results": list(self._results.values()),
            "in_flight": list(self._in_flight.values()),
            "last_eval": self._last_eval,
            "history": self.history,
            "rejected_streak": self._rejected_streak,
            "last_client_losses": self.last_client_losses,
            "model": self.model,
            "wall_s": time.perf_counter() - self._wall0,
        }

    @property
    def wall_start(self) -> float:
        """``time.perf_counter()`` at the run's start (before a restore: moved back by the
        wall time the checkpointed part took)."""
        return self._wall0

    def restore_state(self, state: dict[str, Any]) -> None:
        self.now = state["now"]
        self.counters = Counters(**state["counters"])
        self._heap = list(state["heap"])
        self._seq = itertools.count(state["seq"])
        self._next_task_id = state["next_task_id"]
        self._task_count = list(state["task_count"])
        self._last_base = list(state["last_base"])
        self._on_last_base = list(state["on_last_base"])
        self._pending = {t.task_id: t for t in state["pending"]}
        self._results = {c.task.task_id: c for c in state["results"]}
        self._in_flight = {t.task_id: t for t in state["in_flight"]}
        self._last_eval = state["last_eval"]
        self.history = list(state["history"])
        self._rejected_streak = state["rejected_streak"]
        self.last_client_losses = state["last_client_losses"]
        self.model = state["model"]
        self._wall0 = time.perf_counter() - state["wall_s"]
        self._resumed = True

    # ------------------------------------------------------------ main loop
    def run(self) -> StopReason:
        """Run until a budget is spent or nothing is left to happen (from where a restored
        checkpoint left off, if one was).

        If the run ends early (divergence, Ctrl-C) the exception propagates
        after the work in flight has been accounted for.
        """
        try:
            with _quiet_gc():
                self._loop()
        finally:
            self._settle_in_flight()
        self._record(self.now)
        if self.on_progress is not None:
            self.on_progress(self)
        assert self.stop_reason is not None
        return self.stop_reason

    def _loop(self) -> None:
        dt = self.eval_every_virtual_seconds
        if not self._resumed:  # (a restored run has its start behind it)
            self._record(0.0)
            if dt is not None:
                self.push(dt, _EVAL, None)
            self.strategy.on_start(self.ctx)
        # the loop runs once per event: everything it touches is bound to a local
        heap, pop, push = self._heap, heapq.heappop, heapq.heappush
        in_flight, results, counters = self._in_flight, self._results, self.counters
        on_arrival, on_timer = self.strategy.on_arrival, self.strategy.on_timer
        on_progress, ctx, flush = self.on_progress, self.ctx, self._flush
        t_end = self.budget.virtual_time
        if t_end is None:
            t_end = math.inf
        # the heap holds one evaluation tick at most (it re-arms itself); arrivals and
        # timers are the live events: with none left the run is idle
        ticks = 0 if dt is None else 1
        # `while True` + break, not `while <condition>`: CPython 3.11 only specializes
        # the bytecode of a function called once when it takes an unconditional
        # backward jump, so a `while <condition>` loop would run unspecialized
        # (about twice as slow) for the whole run
        while True:
            if self.stop_reason is not None:
                break
            if len(heap) == ticks:
                self.stop_reason = StopReason.IDLE
                break
            event = pop(heap)
            t, _, kind, payload = event
            if t > t_end:
                push(heap, event)  # (not run: the heap keeps it)
                self.now = t_end
                self.stop_reason = StopReason.VIRTUAL_TIME
                break
            self.now = t
            if kind == _ARRIVAL:
                task: Task = payload
                if task.cancelled:
                    continue
                tid = task.task_id
                del in_flight[tid]
                if not task.execute:
                    raise RuntimeError(
                        f"strategy {self.strategy.name!r} let a task dispatched with execute=False arrive"
                    )
                contribution = results.pop(tid, None)
                if contribution is None:  # not executed yet: run everything pending
                    flush()
                    contribution = results.pop(tid)
                counters.bytes_up += task.cost.bytes_up
                counters.updates_received += 1
                counters.compute_s_spent += task.timing.compute_s
                on_arrival(ctx, contribution)
            elif kind == _TIMER:
                on_timer(ctx, payload)
            else:
                self._record(t)
                assert dt is not None
                push(heap, (t + dt, next(self._seq), _EVAL, None))
            if on_progress is not None:
                on_progress(self)

    def _settle_in_flight(self) -> None:
        """Work still in flight when the run stops is never aggregated: spent and wasted."""
        for task in self._in_flight.values():
            done = task.timing.compute_done_by(self.now - task.t_start)
            self.counters.compute_s_spent += done
            self.counters.compute_s_wasted += done
        self._in_flight.clear()
        self._results.clear()
        self._pending.clear()
