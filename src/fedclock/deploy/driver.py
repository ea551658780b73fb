"""The real-time driver: the simulator's engine with its virtual clock replaced by the wall
clock and its executor by real devices behind a :class:`Transport`.

The strategy objects are the simulator's own — the planner chooses work, the trigger decides
when the server steps, the update aggregates — and so are the observers (metrics.csv,
timeline.csv, clients.csv, summary.json, checkpoints of the counters). What changes:

- ``now`` is seconds since the run started on the server's monotonic clock; a budget's
  ``virtual_time`` is wall seconds, a trigger's deadline a real timeout;
- a dispatched task is a message to its device (:func:`~fedclock.deploy.wire.encode_task`),
  stamped with the model version it starts from; its arrival is the device's reply, so
  staleness is counted from the stamped version exactly as in simulation;
- nothing is known in advance: the population's cost model prices work at zero time (every
  planner's prediction "fits"), so what is late is what really arrives late. A trigger with a
  deadline always arms it (``Context.real_time``); a reply to a task the trigger already cut
  is logged and discarded;
- every reply is checked (:func:`~fedclock.deploy.wire.check_reply`) before it becomes a
  contribution; a reply refused there, or an error in place of a reply, counts as
  ``updates_rejected``, shows as ``rejected`` in the timeline, and the trigger hears of the
  task as lost (``on_lost``: a round stops waiting for it, an asynchronous slot is refilled);
- each task's timing is what was measured: its compute by the device's clock, the rest of
  the time between dispatch and reply split between download and upload by their bytes.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from fedclock.deploy.wire import SHAPES, Payload, RejectedReply, check_reply, encode_task
from fedclock.devices.cost import TaskTiming
from fedclock.errors import ConfigError
from fedclock.models.shapes import FULL
from fedclock.sim.simulator import _EVAL, _TIMER, Simulator, StopReason
from fedclock.sim.types import Contribution, Task

log = logging.getLogger(__name__)


class Transport(Protocol):
    """How messages reach the devices: ``send`` a task's payload to client ``client``'s
    device; ``poll`` waits up to ``timeout`` seconds and returns the replies that came,
    each (task id, payload), or (task id, a sentence) where the device failed."""

    def send(self, task_id: int, client: int, payload: Payload) -> None: ...
    def poll(self, timeout: float) -> list[tuple[int, Payload | str]]: ...
    def close(self) -> None: ...


class RealFleet:
    """The population as a deployment sees it: every profile as configured, but no task's
    timing is known before it runs (zero: it fits whatever a planner asks)."""

    def __init__(self, population: Any) -> None:
        self._population = population

    def __getattr__(self, name: str) -> Any:
        return getattr(self._population, name)

    def __len__(self) -> int:
        return len(self._population)

    def timing(self, client: int, cost: Any, k: int) -> TaskTiming:
        return TaskTiming(0.0, 0.0, 0.0)


class RealTimeDriver(Simulator):
    """:class:`~fedclock.sim.simulator.Simulator` on the wall clock with real devices.

    ``transport``: the devices; ``budget_s``: the relative time budget each task carries
    (the strategy's deadline t_max; None: none); ``cut``: what a device may cut to meet it
    (``suffix``: SALF's layer suffix; ``none``: it trains in full and may be late);
    ``round_timeout_s``: a task without a reply this many seconds after its dispatch is given
    up — rejected with that reason and reported to the trigger as lost, so a barrier round
    closes with the others instead of waiting for a device that never answers (its reply, if
    it still comes, is counted late and discarded); None: wait for every reply.
    """

    real_time = True

    def __init__(
        self,
        *,
        transport: Transport,
        budget_s: float | None = None,
        cut: str = "none",
        round_timeout_s: float | None = None,
        on_finish: Callable[[RealTimeDriver], None] | None = None,
        population: Any,
        **kwargs: Any,
    ) -> None:
        fleet = RealFleet(population)
        super().__init__(population=fleet, **kwargs)  # type: ignore[arg-type]
        strategy = self.strategy
        if getattr(strategy, "on_lost", None) is None:
            raise ConfigError(
                f"Strategy '{strategy.name}' cannot be deployed yet: its trigger does not "
                "handle a device that fails or sends a reply the server rejects."
            )
        if getattr(population, "availability", None) is not None:
            raise ConfigError(
                "A deployment's devices come and go by themselves: run it on a population "
                "without a trace's availability.csv."
            )
        shapes: frozenset[type] = getattr(getattr(strategy, "needs", None), "shapes", frozenset())
        unsent = sorted(t.__name__ for t in shapes if SHAPES.get(t.__name__) is not t)
        if unsent:
            raise ConfigError(
                f"Strategy '{strategy.name}' cannot be deployed yet: its {', '.join(unsent)} "
                f"work cannot be sent to a device (deployable: {', '.join(SHAPES)})."
            )
        if round_timeout_s is not None and not 0 < round_timeout_s < math.inf:
            raise ConfigError(
                f"The round timeout must be a positive number of seconds, got {round_timeout_s}."
            )
        self.transport = transport
        self.budget_s = budget_s
        self.round_timeout_s = round_timeout_s
        self.cut = cut
        needs = getattr(strategy, "needs", None)
        self.layout = getattr(needs, "layout", None)
        self.trains_fully = bool(getattr(needs, "suffix_trains_fully", False))
        self.start = self._start_real  # type: ignore[method-assign]
        self.ctx.start = self.start  # type: ignore[method-assign]
        self._t0 = time.monotonic()
        self._late = 0  # replies to tasks no longer in flight (cut, or the run over)
        self.on_finish = on_finish  # called with the driver when the run ends
        self.speeds: dict[int, float] = {}  # client → the FLOP/s its device measured last
        self.links: dict[int, float] = {}  # client → bytes/s of its last task's transfers
        # client → its last task's time between dispatch and reply that the device was not
        # busy (messaging, a process start): taken off the budget its next task carries
        self.latency: dict[int, float] = {}
        self._closed: dict[int, Task] = {}  # cut tasks, by id, until their late reply
        self.rejections: list[tuple[int, int, str]] = []  # (task id, client, why)

    def clock(self) -> float:
        return time.monotonic() - self._t0

    # ---- dispatch: a message instead of an arrival event
    def _start_real(self, client: int) -> Task:
        return self.dispatch(self.prepare(client, self.model), execute=True)

    def dispatch(self, task: Task, *, execute: bool) -> Task:
        self.now = max(self.now, self.clock())  # (the server's own work took time too)
        task.t_start = self.now
        task.execute = True  # (a real device always works: whether it is late, time tells)
        self._register(task)
        if self._on_dispatch is not None:  # (first: a client rule attaches Task.down here)
            self._on_dispatch(task)
        budget = self.budget_s
        if budget is not None:  # the device's own time: the deadline less its latency
            budget = max(budget - self.latency.get(task.client, 0.0), 0.0)
        payload = encode_task(task, budget_s=budget, cut=self.cut, seed=self.seed,
                              speed=self.speeds.get(task.client))  # fmt: skip
        self.transport.send(task.task_id, task.client, payload)
        for f in self._hooks["on_dispatch"]:
            f(self, task)
        return task

    def cancel(self, task: Task) -> None:
        """Cut a task (its round closed): its reply, if one comes, is discarded."""
        if task.cancelled or task.task_id not in self._in_flight:
            return
        task.cancelled = True
        del self._in_flight[task.task_id]
        self._closed[task.task_id] = task  # (its late reply still tells the device's pace)
        spent = self.now - task.t_start
        task.timing = TaskTiming(0.0, spent, 0.0)
        self.counters.compute_s_spent += spent
        self.counters.compute_s_wasted += spent
        self.counters.updates_discarded += 1
        for f in self._hooks["on_measured"]:
            f(self, task)
        for f in self._hooks["on_cancel"]:
            f(self, task)

    # ---- replies
    def _measured(self, task: Task, busy_s: float, compute_s: float) -> TaskTiming:
        """The task's phases as measured: compute by the device's clock; the rest of the time
        from dispatch to reply, split between download and upload by their bytes."""
        total = max(self.now - task.t_start, 0.0)
        compute = min(compute_s, total)
        transfer = max(total - min(busy_s, total), 0.0)
        b_down, b_up = float(task.cost.bytes_down), float(task.cost.bytes_up)
        share = b_down / (b_down + b_up) if b_down + b_up > 0 else 0.5
        idle = max(total - transfer - compute, 0.0)  # on the device, not training
        if transfer > 1e-6 and b_down + b_up > 0:  # the link as this task measured it
            self.links[task.client] = (b_down + b_up) / transfer
        return TaskTiming(transfer * share + idle, compute, transfer * (1.0 - share))

    def _learn(self, task: Task, config: dict[str, Any]) -> None:
        """The device's pace from a reply (even one too late to use): its speed and its
        latency (dispatch to reply, less the time it was busy). Numbers that are not finite
        and positive are ignored."""

        def number(key: str) -> float | None:
            v = config.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < math.inf:
                return float(v)
            return None

        speed, busy = number("speed"), number("busy_s")
        if speed:
            self.speeds[task.client] = speed
        if busy is not None:
            self.latency[task.client] = max(self.now - task.t_start - busy, 0.0)

    def _reject(self, task: Task, reason: str) -> None:
        log.warning("task %d (client %d): reply rejected: %s", task.task_id, task.client, reason)
        del self._in_flight[task.task_id]
        spent = self.now - task.t_start
        task.timing = TaskTiming(0.0, spent, 0.0)
        ctr = self.counters
        ctr.updates_received += 1
        ctr.updates_rejected += 1
        ctr.compute_s_spent += spent
        ctr.compute_s_wasted += spent
        record = Contribution(task=task, delta={}, buffers={}, num_samples=0, train_loss=math.nan)
        for f in self._hooks["on_measured"]:
            f(self, task)
        for f in self._hooks["on_reject"]:
            f(self, record)
        self.rejections.append((task.task_id, task.client, reason))
        self.strategy.on_lost(self.ctx, task)  # type: ignore[attr-defined]

    def _time_out(self) -> float:
        """Give up the tasks in flight past the round timeout; when the next one is due."""
        limit = self.round_timeout_s
        if limit is None or not self._in_flight:
            return math.inf
        for task in [t for t in self._in_flight.values() if self.now >= t.t_start + limit]:
            self._closed[task.task_id] = task  # (a reply that still comes is late)
            self._reject(task, f"no reply within the round timeout of {limit:g} s")
        return min((t.t_start + limit for t in self._in_flight.values()), default=math.inf)

    def _reply(self, task_id: int, reply: Payload | str) -> None:
        task = self._in_flight.get(task_id)
        if task is None:  # cut at a deadline, or not ours: never used
            self._late += 1
            log.info("task %d: a reply after its task was closed, discarded", task_id)
            closed = self._closed.pop(task_id, None)
            if closed is not None and not isinstance(reply, str):
                self._learn(closed, reply.config)  # (its numbers only, checked)
            return
        if isinstance(reply, str):
            self._reject(task, f"the device failed: {reply}")
            return
        units = None if self.layout is None else self.layout.units.count
        try:
            r = check_reply(reply, task, max_depth=units)
        except RejectedReply as exc:
            self._reject(task, str(exc))
            return
        del self._in_flight[task_id]
        if r.shape != task.plan.shape or r.local_steps != task.plan.local_steps:
            # the device cut its work to meet its budget: a layer suffix (SALF), fewer steps
            task.plan = replace(task.plan, shape=r.shape, local_steps=r.local_steps)
        coverage = None  # (what a partial update covers: as its program says)
        if r.shape is not FULL and self.layout is not None:
            coverage = r.shape.program(self.layout, trains_fully=self.trains_fully).coverage
        task.timing = self._measured(task, r.busy_s, r.compute_s)
        self._learn(task, {"busy_s": r.busy_s, "speed": r.speed})
        contribution = Contribution(
            task=task, delta=r.delta, buffers=r.buffers, num_samples=r.num_samples,
            train_loss=r.train_loss, coverage=coverage, up=r.up,
        )  # fmt: skip
        ctr = self.counters
        ctr.bytes_up += task.cost.bytes_up
        ctr.updates_received += 1
        ctr.compute_s_spent += task.timing.compute_s
        for f in self._hooks["on_measured"]:
            f(self, task)
        for f in self._hooks["on_arrival"]:
            f(self, contribution)
        self.strategy.on_arrival(self.ctx, contribution)

    # ---- the loop: replies and timers, on the wall clock
    def _loop(self) -> None:
        self._t0 = time.monotonic() - self.now
        if not self._resumed:
            for f in self._hooks["on_start"]:
                f(self)
            self.strategy.on_start(self.ctx)
        heap = self._heap
        t_end = self.budget.virtual_time
        t_end = math.inf if t_end is None else t_end
        after_event = self._hooks["on_event"]
        while self.stop_reason is None:
            if not self._in_flight and len(heap) == self._ticks:
                self.stop_reason = StopReason.IDLE
                break
            now = self.clock()
            if now >= t_end:
                self.now = t_end
                self.stop_reason = StopReason.VIRTUAL_TIME
                break
            due = heap[0][0] if heap else math.inf
            due = min(due, self._time_out())
            wait = max(0.0, min(due, t_end) - now)
            if self._in_flight:
                replies = self.transport.poll(min(wait, 1.0))
            else:
                time.sleep(min(wait, 1.0))
                replies = []
            self.now = max(self.now, self.clock())
            for task_id, reply in replies:
                if self.stop_reason is not None:
                    break
                self._reply(task_id, reply)
                for f in after_event:
                    f(self)
            if self.stop_reason is None:
                self._time_out()
            while heap and heap[0][0] <= self.now and self.stop_reason is None:
                t, _, kind, payload = heapq.heappop(heap)
                if kind == _TIMER:
                    self.strategy.on_timer(self.ctx, payload)
                elif kind == _EVAL:
                    self.evaluate(self.now)
                    heapq.heappush(heap, (t + payload, next(self._seq), _EVAL, payload))
                for f in after_event:
                    f(self)

    @property
    def late_replies(self) -> int:
        """Replies that came after their task was closed (cut at a deadline): discarded."""
        return self._late

    def run(self) -> StopReason:
        try:
            return super().run()
        finally:
            self.transport.close()
            if self.on_finish is not None:
                self.on_finish(self)

    def _settle_in_flight(self) -> None:
        """Work in flight at the end: spent and wasted, by the server's clock."""
        for task in self._in_flight.values():
            spent = max(self.now - task.t_start, 0.0)
            task.timing = TaskTiming(0.0, spent, 0.0)
            self.counters.compute_s_spent += spent
            self.counters.compute_s_wasted += spent
            for f in self._hooks["on_measured"]:
                f(self, task)
        self._in_flight.clear()
