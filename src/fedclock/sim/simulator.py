"""The simulator: a heap of events on a virtual clock.

Events are ordered by (virtual time, sequence number), so ties resolve in the
order the events were scheduled and every run is deterministic. The strategy
reacts to ``on_start``, ``on_arrival`` and ``on_timer`` through a
:class:`Context`; every task dispatched within one callback reaches the
executor as one batch when the callback returns.

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

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedclock.errors import DivergenceError
from fedclock.metrics.recorder import federated_metrics
from fedclock.rng import stream
from fedclock.sim.types import Contribution, ModelVersion, Task

if TYPE_CHECKING:
    from fedclock.devices.population import Population

_ARRIVAL, _TIMER, _EVAL = 0, 1, 2


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
    def prepare(self, client: int, *, base: ModelVersion | None = None) -> Task:
        """Build (but do not dispatch) a task for ``client`` on ``base`` (default: current model).

        Lets a trigger look at the task's timing before deciding how to dispatch it.
        """
        return self._sim.prepare(client, base or self._sim.model)

    def dispatch(self, task: Task, *, execute: bool = True) -> Task:
        """Start a prepared task now; its arrival fires at ``task.t_finish``.

        ``execute=False`` skips the training compute because the strategy already
        knows the update will be discarded (it must cancel or discard it).
        """
        return self._sim.dispatch(task, execute=execute)

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
        on_progress: Callable[[Simulator], None] = lambda sim: None,
        eval_every_aggregations: int | None = 1,
        eval_every_virtual_seconds: float | None = None,
        divergence_factor: float | None = None,
        evaluate_clients: Callable[[ModelVersion], np.ndarray] | None = None,
        importance: np.ndarray | None = None,
    ) -> None:
        self.strategy = strategy
        self.executor = executor
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
        self.importance = importance  # p_i of eq. 2 (default: ∝ client sizes)
        self.last_client_losses: np.ndarray | None = None

        self.now = 0.0
        self.counters = Counters()
        self.stop_reason: StopReason | None = None
        self.ctx = Context(self)
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._live_events = 0  # arrivals and timers in the heap (evaluation ticks excluded)
        self._next_task_id = 0
        self._task_count = np.zeros(len(population), dtype=np.int64)
        self._pending: list[Task] = []
        self._results: dict[int, Contribution] = {}
        self._in_flight: dict[int, Task] = {}
        self._last_eval: tuple[int, float] | None = None
        self._wall0 = time.perf_counter()
        self.history: list[dict[str, Any]] = []

    # ------------------------------------------------------------ events
    def push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (t, self._seq, kind, payload))
        self._seq += 1
        if kind != _EVAL:
            self._live_events += 1

    def prepare(self, client: int, base: ModelVersion) -> Task:
        plan, cost = self.strategy.plan(self.ctx, client)
        k = int(self._task_count[client])
        timing = self.population.timing(client, cost, k)
        task = Task(
            task_id=self._next_task_id, client=client, k=k, base=base, plan=plan,
            cost=cost, timing=timing, t_start=self.now,
        )  # fmt: skip
        return task

    def dispatch(self, task: Task, *, execute: bool) -> Task:
        if task.task_id != self._next_task_id:
            raise RuntimeError("dispatch() takes the task returned by the latest prepare()")
        self._next_task_id += 1
        self._task_count[task.client] += 1
        task.execute = execute
        self.counters.bytes_down += task.cost.bytes_down
        self._in_flight[task.task_id] = task
        if execute:
            self._pending.append(task)
        self.push(task.t_finish, _ARRIVAL, task)
        return task

    def cancel(self, task: Task) -> None:
        if task.cancelled or task.task_id not in self._in_flight:
            return
        task.cancelled = True
        del self._in_flight[task.task_id]
        self._results.pop(task.task_id, None)
        done = task.timing.compute_done_by(self.now - task.t_start)
        self.counters.compute_s_spent += done
        self.counters.compute_s_wasted += done
        self.counters.updates_discarded += 1

    def discard(self, contribution: Contribution) -> None:
        self.counters.updates_discarded += 1
        self.counters.compute_s_wasted += contribution.task.timing.compute_s

    def commit(self, contributions: Sequence[Contribution]) -> ModelVersion:
        for c in contributions:
            if not math.isfinite(c.train_loss):
                raise DivergenceError(
                    f"Training diverged: client {c.client} reported a non-finite training loss "
                    f"at aggregation {self.counters.aggregations + 1} (t = {self.now:.4g} s); "
                    "lower train.lr."
                )
        current = self.model.version
        self.model = self.strategy.aggregate(self.ctx, contributions)
        ctr = self.counters
        ctr.aggregations += 1
        ctr.updates_used += len(contributions)
        for c in contributions:
            ctr.participation[c.client] = ctr.participation.get(c.client, 0) + 1
            stale = current - c.base_version
            ctr.staleness[stale] = ctr.staleness.get(stale, 0) + 1
            if c.weight is not None:
                ctr.weight_received[c.client] = ctr.weight_received.get(c.client, 0.0) + c.weight
        k = self.eval_every_aggregations
        if k is not None and ctr.aggregations % k == 0:
            self._record(self.now)
        b = self.budget
        if self.stop_reason is None:
            if b.aggregations is not None and ctr.aggregations >= b.aggregations:
                self.stop_reason = StopReason.AGGREGATIONS
            elif b.updates is not None and ctr.updates_used >= b.updates:
                self.stop_reason = StopReason.UPDATES
        return self.model

    def _flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        for contribution in self.executor.run(batch):
            self._results[contribution.task.task_id] = contribution

    # ------------------------------------------------------------ records
    def _record(self, t: float) -> None:
        key = (self.model.version, t)
        if self._last_eval == key:
            return
        self._last_eval = key
        acc, loss = self.evaluate(self.model)
        ctr = self.counters
        row = {
            "virtual_time": t,
            "wall_time": time.perf_counter() - self._wall0,
            "aggregation": ctr.aggregations,
            "updates_received": ctr.updates_received,
            "updates_used": ctr.updates_used,
            "updates_discarded": ctr.updates_discarded,
            "test_accuracy": acc,
            "test_loss": loss,
            "bytes_up": ctr.bytes_up,
            "bytes_down": ctr.bytes_down,
            "compute_s_spent": ctr.compute_s_spent,
            "compute_s_wasted": ctr.compute_s_wasted,
        }
        if self.evaluate_clients is not None:
            self.last_client_losses = self.evaluate_clients(self.model)
            row.update(self.client_metrics(self.last_client_losses))
        self.history.append(row)
        self.on_record(row)
        initial = self.history[0]["test_loss"]
        factor = self.divergence_factor
        if not math.isfinite(loss) or (factor is not None and loss > factor * initial):
            raise DivergenceError(
                f"Training diverged: the test loss is {loss:.4g} after aggregation "
                f"{ctr.aggregations} (t = {t:.4g} s), against {initial:.4g} at the start; "
                "lower train.lr."
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

    # ------------------------------------------------------------ main loop
    def run(self) -> StopReason:
        """Run until a budget is spent or nothing is left to happen.

        If the run ends early (divergence, Ctrl-C) the exception propagates
        after the work in flight has been accounted for.
        """
        try:
            self._loop()
        finally:
            self._settle_in_flight()
        self._record(self.now)
        self.on_progress(self)
        assert self.stop_reason is not None
        return self.stop_reason

    def _loop(self) -> None:
        self._record(0.0)
        dt = self.eval_every_virtual_seconds
        if dt is not None:
            self.push(dt, _EVAL, None)
        self.strategy.on_start(self.ctx)
        self._flush()
        while self.stop_reason is None:
            if self._live_events == 0:
                self.stop_reason = StopReason.IDLE
                break
            t, _, kind, payload = self._heap[0]
            if self.budget.virtual_time is not None and t > self.budget.virtual_time:
                self.now = self.budget.virtual_time
                self.stop_reason = StopReason.VIRTUAL_TIME
                break
            heapq.heappop(self._heap)
            self.now = t
            if kind != _EVAL:
                self._live_events -= 1
            if kind == _ARRIVAL:
                task: Task = payload
                if task.cancelled:
                    continue
                del self._in_flight[task.task_id]
                if not task.execute:
                    raise RuntimeError(
                        f"strategy {self.strategy.name!r} let a task dispatched with execute=False arrive"
                    )
                contribution = self._results.pop(task.task_id)
                self.counters.bytes_up += task.cost.bytes_up
                self.counters.updates_received += 1
                self.counters.compute_s_spent += task.timing.compute_s
                self.strategy.on_arrival(self.ctx, contribution)
            elif kind == _TIMER:
                self.strategy.on_timer(self.ctx, payload)
            else:
                self._record(t)
                assert dt is not None
                self.push(t + dt, _EVAL, None)
            self._flush()
            self.on_progress(self)

    def _settle_in_flight(self) -> None:
        """Work still in flight when the run stops is never aggregated: spent and wasted."""
        for task in self._in_flight.values():
            done = task.timing.compute_done_by(self.now - task.t_start)
            self.counters.compute_s_spent += done
            self.counters.compute_s_wasted += done
        self._in_flight.clear()
        self._results.clear()
