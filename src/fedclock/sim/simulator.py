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

Everything that watches the run (evaluation and its schedule, the recorder, validation,
client losses, checkpoints, progress) is an observer (:mod:`fedclock.sim.observers`);
:meth:`Simulator.evaluate` builds an evaluation row of the counters for them to fill.
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
from fedclock.rng import stream
from fedclock.sim.guard import UpdateGuard
from fedclock.sim.observers import HOOKS
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan

if TYPE_CHECKING:
    from fedclock.devices.cost import TaskCost
    from fedclock.devices.population import Population

_ARRIVAL, _TIMER, _EVAL, _LOST = 0, 1, 2, 3
# rejected updates in a row after which the guard declares the run diverged: at least this
# many, and this many per client (every client had several chances)
REJECTED_STREAK, REJECTED_PER_CLIENT = 1000, 10
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
    updates_lost: int = 0  # lost when their device went offline (population availability)
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

    def online(self, client: int) -> bool:
        """Whether ``client``'s device is online now (always without a trace's availability)."""
        return self._sim.online(client)

    def next_online(self, client: int) -> float:
        """When ``client``'s device is next online: now if it is, inf if never again."""
        return self._sim.next_online(client)

    def next_offline(self, client: int) -> float:
        """When ``client``'s device next goes offline: now if it is offline, inf if never
        (always, without availability)."""
        avail = self._sim._avail
        return math.inf if avail is None else avail.next_offline(client, self._sim.now)

    def online_clients(self, positions: np.ndarray | None = None) -> np.ndarray:
        """The clients whose device is online now, in index order (all, without
        availability); ``positions``: the ones at those places of that order."""
        return self._sim.online_clients(positions)

    def online_count(self) -> int:
        """How many clients' devices are online now."""
        return self._sim.online_count()

    def next_any_online(self) -> float:
        """While no device is online: when one comes online (inf: never)."""
        return self._sim.next_any_online()

    @property
    def real_time(self) -> bool:
        """Whether the clock is the wall clock and tasks run on real devices (fedclock.deploy):
        no task's timing is known in advance, so a deadline must always be armed."""
        return self._sim.real_time

    @property
    def has_availability(self) -> bool:
        """Whether devices come and go (a trace's availability)."""
        return self._sim._avail is not None

    def set_timer(self, at: float, tag: Any = None) -> None:
        self._sim.push(max(at, self._sim.now), _TIMER, tag)

    def cancel(self, task: Task) -> None:
        """Abort an in-flight task now: its partial compute counts as wasted."""
        self._sim.cancel(task)

    def commit(self, contributions: Sequence[Contribution]) -> ModelVersion:
        """Aggregate ``contributions`` into a new global model (one server step)."""
        return self._sim.commit(contributions)


class Simulator:
    """The event loop. ``observers`` watch it through the hooks of
    :mod:`fedclock.sim.observers` (evaluation, recording, validation, checkpoints,
    progress); ``guard`` screens updates before the aggregator sees them."""

    real_time = False  # (fedclock.deploy.driver.RealTimeDriver: the wall clock)

    def __init__(
        self,
        *,
        strategy: StrategyProtocol,
        executor: Executor,
        population: Population,
        initial: ModelVersion,
        seed: int,
        budget: Budget,
        observers: Sequence[object] = (),
        guard: UpdateGuard | None = None,
        execute: Callable[[Sequence[Task]], list[Contribution]] | None = None,
    ) -> None:
        self.strategy = strategy
        self.executor = executor
        # how a batch of tasks is trained: the executor's run, or (run batching, ``execute``)
        # a call that trains it together with other simulations' batches
        self.execute: Callable[[Sequence[Task]], list[Contribution]] = execute or executor.run
        self.population = population
        self.model = initial
        self.seed = seed
        self.budget = budget
        self.observers = list(observers)
        self.guard = guard  # refuses bad updates before the aggregator sees them
        self._rejected_streak = 0  # updates rejected since the last accepted one
        # each hook's bound methods, in observer order
        self._hooks: dict[str, list[Callable[..., None]]] = {
            h: [f for o in self.observers if (f := getattr(o, h, None)) is not None] for h in HOOKS
        }
        self._ticks = 0  # evaluation ticks in the heap (evaluate_every)

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
        self._wall0 = time.perf_counter()
        self.history: list[dict[str, Any]] = []
        self._resumed = False  # restore_state() was called: the loop skips the start
        # when each device is online (a trace's availability; None: always): a task whose
        # device goes offline before it ends is lost then (_LOST), known at dispatch
        self._avail = getattr(population, "availability", None)
        self._online_set: Any = None  # (online_count/online_clients: derived, not state)
        if self._avail is not None:
            if getattr(strategy, "on_lost", None) is None:
                from fedclock.errors import ConfigError

                raise ConfigError(
                    f"Strategy '{getattr(strategy, 'name', '?')}' does not handle devices that "
                    "go offline yet: run it on a trace without availability.csv (docs/traces.md "
                    "lists the strategies that do)."
                )
            self.start = self._start_available  # type: ignore[method-assign]
            self.ctx.start = self.start  # type: ignore[method-assign]

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

    def _register(self, task: Task) -> None:
        """A prepared task starts: its id, the client's task and base counts, the bytes down,
        in flight (``dispatch``'s bookkeeping; a deployment's driver shares it)."""
        if task.task_id != self._next_task_id:
            raise RuntimeError("dispatch() takes the task returned by the latest prepare()")
        self._next_task_id += 1
        self._task_count[task.client] += 1
        self._count_base(task.client, task.base.version)
        self.counters.bytes_down += task.cost.bytes_down
        self._in_flight[task.task_id] = task

    def dispatch(self, task: Task, *, execute: bool) -> Task:
        self._register(task)
        kind, at = _ARRIVAL, task.t_finish
        if self._avail is not None:  # its device goes offline before it ends: lost then
            off = self._avail.next_offline(task.client, task.t_start)
            if off < at:
                kind, at, execute = _LOST, off, False
        task.execute = execute
        if execute:
            self._pending[task.task_id] = task
        self.push(at, kind, task)
        if self._on_dispatch is not None:
            self._on_dispatch(task)
        for f in self._hooks["on_dispatch"]:
            f(self, task)
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
        for f in self._hooks["on_dispatch"]:
            f(self, task)
        return task

    def _start_available(self, client: int) -> Task:
        """:meth:`start` with availability: prepare + dispatch, which looks up when the
        client's device goes offline."""
        return self.dispatch(self.prepare(client, self.model), execute=True)

    @property
    def population_has_availability(self) -> bool:
        """Whether the population's devices come and go (a trace's availability)."""
        return self._avail is not None

    def online(self, client: int) -> bool:
        """Whether ``client``'s device is online now (always, without availability)."""
        return self._avail is None or bool(self._avail.online(client, self.now))

    def _online_now(self) -> Any:
        """The population's :class:`~fedclock.devices.trace.OnlineSet` at the current time
        (built on first use, e.g. after a resume: it depends on the time alone)."""
        from fedclock.devices.trace import OnlineSet

        assert self._avail is not None
        if self._online_set is None or self._online_set.t > self.now:
            self._online_set = OnlineSet(self._avail, self.now)
        self._online_set.advance(self.now)
        return self._online_set

    def online_clients(self, positions: np.ndarray | None = None) -> np.ndarray:
        """The clients whose device is online now, in index order (``positions``: only the
        ones at those places of that order)."""
        n = len(self.population)
        if self._avail is None:
            return np.arange(n) if positions is None else np.asarray(positions)
        online = self._online_now()
        if positions is None:  # every one: the flags, in one pass
            return np.flatnonzero(online.on).astype(np.int64)
        return np.array([online.kth(int(k)) for k in positions], dtype=np.int64)

    def online_count(self) -> int:
        """How many clients' devices are online now."""
        return len(self.population) if self._avail is None else self._online_now().count

    def next_any_online(self) -> float:
        """When a device next comes online while none is (inf: never)."""
        return self.now if self._avail is None else self._online_now().next_change()

    def next_online(self, client: int) -> float:
        """When ``client``'s device is next online (now if it is; inf: never again)."""
        return self.now if self._avail is None else self._avail.next_online(client, self.now)

    def _lose(self, task: Task) -> None:
        """``task``'s device went offline now: its work is lost (spent and wasted)."""
        del self._in_flight[task.task_id]
        done = task.timing.compute_done_by(self.now - task.t_start)
        ctr = self.counters
        ctr.compute_s_spent += done
        ctr.compute_s_wasted += done
        ctr.updates_lost += 1
        for f in self._hooks["on_lost"]:
            f(self, task)
        self.strategy.on_lost(self.ctx, task)  # type: ignore[attr-defined]

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
        for f in self._hooks["on_cancel"]:
            f(self, task)

    def commit(self, contributions: Sequence[Contribution]) -> ModelVersion:
        guard = self.guard
        if guard is not None:
            contributions = guard.corrupt(contributions)  # the fault injector's test bench
            if guard.checks:
                kept = self._screen(guard, contributions)
                if kept is None:  # nothing left: no server step
                    return self.model
                contributions = kept
        isfinite = math.isfinite
        for c in contributions:
            if not isfinite(c.train_loss):
                raise DivergenceError(
                    f"Training diverged: client {c.client} reported a non-finite training loss "
                    f"at aggregation {self.counters.aggregations + 1} (t = {self.now:.4g} s); "
                    "lower train.lr (or set guard.reject_nonfinite to drop such updates)."
                )
        for f in self._hooks["on_commit"]:
            f(self, contributions)
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
        for f in self._hooks["on_aggregation"]:
            f(self, self.model)
        b = self.budget
        if self.stop_reason is None:
            if b.aggregations is not None and ctr.aggregations >= b.aggregations:
                self.stop_reason = StopReason.AGGREGATIONS
            elif b.updates is not None and ctr.updates_used >= b.updates:
                self.stop_reason = StopReason.UPDATES
        return self.model

    def _screen(
        self, guard: UpdateGuard, contributions: Sequence[Contribution]
    ) -> list[Contribution] | None:
        """The updates the guard keeps (the others counted and wasted, never aggregated);
        None when it keeps none."""
        kept = []
        for c in contributions:
            if guard.rejects(c):
                self.counters.updates_rejected += 1
                self.counters.compute_s_wasted += c.task.timing.compute_s
                for f in self._hooks["on_reject"]:
                    f(self, c)
            else:
                kept.append(c)
        if kept:
            self._rejected_streak = 0
            return kept
        self._rejected_streak += len(contributions)
        if self._rejected_streak >= max(
            REJECTED_STREAK, REJECTED_PER_CLIENT * len(self.population)
        ):
            raise DivergenceError(
                f"The update guard rejected the last {self._rejected_streak} updates "
                f"in a row (t = {self.now:.4g} s), so the model cannot move; loosen "
                "guard.max_update_norm or lower population.faults.fraction."
            )
        return None

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

    # ------------------------------------------------------------ evaluations
    def evaluate(self, t: float) -> None:
        """One evaluation row at virtual time ``t``: the counters, then every observer's
        ``on_evaluation`` (the metrics, then who reads them); once per (version, t)."""
        key = (self.model.version, t)
        if self._last_eval == key:
            return
        self._last_eval = key
        ctr = self.counters
        row: dict[str, Any] = {
            "virtual_time": t,
            "wall_time": time.perf_counter() - self._wall0,
            "aggregation": ctr.aggregations,
            "updates_received": ctr.updates_received,
            "updates_used": ctr.updates_used,
            "updates_discarded": ctr.updates_discarded,
            "updates_rejected": ctr.updates_rejected,
            "bytes_up": ctr.bytes_up,
            "bytes_down": ctr.bytes_down,
            "compute_s_spent": ctr.compute_s_spent,
            "compute_s_wasted": ctr.compute_s_wasted,
        }
        self.history.append(row)
        for f in self._hooks["on_evaluation"]:
            f(self, row)

    def evaluate_every(self, dt: float) -> None:
        """An evaluation every ``dt`` virtual seconds from now (a tick that re-arms itself)."""
        self._ticks += 1
        self.push(self.now + dt, _EVAL, dt)

    def per_client(self, counts: dict[int, int] | dict[int, float]) -> np.ndarray:
        out = np.zeros(len(self.population))
        for client, v in counts.items():
            out[client] = v
        return out

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
            "model": self.model,
            "wall_s": time.perf_counter() - self._wall0,
        }

    @property
    def tasks_dispatched(self) -> int:
        """Tasks dispatched so far (task ids are 0 … this − 1, in dispatch order)."""
        return self._next_task_id

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
        self._ticks = sum(1 for event in self._heap if event[2] == _EVAL)
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
        for f in self._hooks["on_end"]:
            f(self)
        assert self.stop_reason is not None
        return self.stop_reason

    def _loop(self) -> None:
        if not self._resumed:  # (a restored run has its start behind it)
            for f in self._hooks["on_start"]:
                f(self)
            self.strategy.on_start(self.ctx)
        # the loop runs once per event: everything it touches is bound to a local
        heap, pop, push = self._heap, heapq.heappop, heapq.heappush
        in_flight, results, counters = self._in_flight, self._results, self.counters
        on_arrival, on_timer = self.strategy.on_arrival, self.strategy.on_timer
        observe_arrival, after_event = self._hooks["on_arrival"], self._hooks["on_event"]
        ctx, flush = self.ctx, self._flush
        t_end = self.budget.virtual_time
        if t_end is None:
            t_end = math.inf
        # `while True` + break, not `while <condition>`: CPython 3.11 only specializes
        # the bytecode of a function called once when it takes an unconditional
        # backward jump, so a `while <condition>` loop would run unspecialized
        # (about twice as slow) for the whole run
        while True:
            if self.stop_reason is not None:
                break
            if len(heap) == self._ticks:  # only evaluation ticks left: nothing can happen
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
                if task.cost.split is not None:  # a split task's activations and gradients
                    counters.bytes_up += task.cost.split.bytes_up
                    counters.bytes_down += task.cost.split.bytes_down
                counters.updates_received += 1
                counters.compute_s_spent += task.timing.compute_s
                for f in observe_arrival:
                    f(self, contribution)
                on_arrival(ctx, contribution)
            elif kind == _TIMER:
                on_timer(ctx, payload)
            elif kind == _LOST:
                if not payload.cancelled:
                    self._lose(payload)
            else:  # an evaluation tick; it re-arms itself (payload: its period)
                self.evaluate(t)
                push(heap, (t + payload, next(self._seq), _EVAL, payload))
            for f in after_event:
                f(self)

    def _settle_in_flight(self) -> None:
        """Work still in flight when the run stops is never aggregated: spent and wasted."""
        for task in self._in_flight.values():
            done = task.timing.compute_done_by(self.now - task.t_start)
            self.counters.compute_s_spent += done
            self.counters.compute_s_wasted += done
        self._in_flight.clear()
        self._results.clear()
        self._pending.clear()
