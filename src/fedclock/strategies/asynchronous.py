"""The asynchronous family on one aggregation rule (Fraboni et al. eq. 6) and FedAsync.

Their server update is :class:`~fedclock.strategies.aggregators.Update` with the weighting
:class:`StalenessWeighting`:

    θ^{n+1} = θ^n + η_g Σ_{i ∈ S_n} ω_i(n) Δ_i(ρ_i(n)),   ω_i(n) = d_i · s(n − ρ_i(n))   (eq. 5–6)

where Δ_i was computed on the (possibly stale) version ρ_i(n) the client received
(the task's ``base``), d_i comes from a :class:`WeightRule` (:mod:`.weights`) and
s is an optional staleness weight (FLSim-style; constant by default); the server step
may add momentum or Adam. With the target ``mix`` it is FedAsync's
θ ← (1 − α_t) θ + α_t θ_new, i.e. θ + α_t (θ_base + Δ − θ).

Three triggers decide when S_n closes (the fourth, the barrier, is
:class:`~fedclock.strategies.triggers.SyncRounds`):

- :class:`ArrivalBuffer` with m = 1: every arrival (asynchronous FedAvg, FedAsync);
  the arriving client immediately restarts on the new model;
- :class:`ArrivalBuffer` with m > 1: every m arrivals (FedBuff); the m
  contributors wait for the aggregation and restart on the new model, the others
  keep working on older ones;
- :class:`FixedPeriod`: every Δt (FedFix); a client that finishes waits idle for
  the next tick, then receives the new model, so it contributes every ⌈τ_i/Δt⌉ ticks.

All triggers keep every client of the population working (no client sampling), or,
with ``strategy.concurrency`` C, C clients at a time drawn uniformly (FLSim's max
concurrency), so a population of 100k clients costs only the C tasks in flight.
Update times τ_i come from :class:`UpdateTimes`: the device profile's nominal
task duration, or the server's running estimate from observed update times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fedclock.errors import ConfigError
from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, ModelVersion, Task
from fedclock.strategies.aggregators import (
    Update,
    client_importance,
    mix,
    mix_buffers,
    step_buffers,
)
from fedclock.strategies.base import BuildInfo, Planner, Strategy
from fedclock.strategies.selection import Selection
from fedclock.strategies.server import server_optimizer
from fedclock.strategies.weights import (
    Staleness,
    fedbuff_weights,
    fedfix_weights,
    identical_weights,
    participation_weights,
    sync_weights,
    time_based_weights,
)

if TYPE_CHECKING:
    from fedclock.config import ExperimentConfig, WeightedAsyncOptions

TAU_SOURCES = ("profile", "estimated")

_by_client = attrgetter("task.client")  # sort key of a commit: a fixed sum order


class UpdateTimes:
    """The server's view of each client's update time τ_i.

    - ``profile``: the nominal duration of the client's task on its device
      (download + compute + upload, without the random slowdown), from
      :meth:`Population.nominal_timing` — what a server that knows the device
      profiles would use;
    - ``estimated``: the mean of the client's observed update times (arrival
      minus dispatch); a client not heard from yet is taken to need the time
      elapsed since it was sent its model (a lower bound, the server's only
      knowledge), or the mean of the observed clients if that is longer.
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = ("_profile", "_sum", "_count", "_started")

    def __init__(self, source: str, planner: Planner) -> None:
        if source not in TAU_SOURCES:
            raise ValueError(f"unknown tau source {source!r}; allowed: {', '.join(TAU_SOURCES)}")
        self.source = source
        self.planner = planner
        self._profile: np.ndarray | None = None
        self._sum = np.zeros(0)
        self._count = np.zeros(0, dtype=np.int64)
        self._started = np.zeros(0)

    def setup(self, ctx: Context) -> None:
        n = ctx.num_clients
        self._sum = np.zeros(n)
        self._count = np.zeros(n, dtype=np.int64)
        self._started = np.zeros(n)
        if self.source == "profile":
            self._profile = np.array(
                [
                    ctx.population.nominal_timing(c, self.planner.nominal(c)[1]).duration
                    for c in range(n)
                ]
            )

    def started(self, client: int, t: float) -> None:
        self._started[client] = t

    def observe(self, task: Task, now: float) -> None:
        if self._profile is not None:
            return
        self._sum[task.client] += now - task.t_start
        self._count[task.client] += 1

    def tau(self, now: float) -> np.ndarray:
        if self._profile is not None:
            return self._profile
        seen = self._count > 0
        mean = np.divide(self._sum, self._count, out=np.zeros_like(self._sum), where=seen)
        floor = float(mean[seen].mean()) if seen.any() else 0.0
        unseen = np.maximum(now - self._started, floor)
        unseen = np.where(unseen > 0, unseen, 1.0)  # nothing known at all: equal times
        return np.where(seen, mean, unseen)


class WeightRule:
    """d_i for the committed contributions (see :mod:`fedclock.strategies.weights`).

    ``importance`` is p over the whole population (Σ p = 1).
    """

    checkpoint_fields: ClassVar[
        tuple[str, ...]
    ] = ()  # (its τ estimates are a part; _constant is a cache)

    def __init__(
        self,
        kind: str,
        *,
        importance: np.ndarray,
        times: UpdateTimes | None = None,
        delta_t: float | None = None,
        buffer_size: int | None = None,
    ) -> None:
        self.kind = kind
        self.importance = importance
        self.times = times
        self.delta_t = delta_t
        self.buffer_size = buffer_size
        self._constant: dict[int, np.ndarray] = {}  # identical / fedbuff: d by commit size

    def __call__(self, ctx: Context, contributions: Sequence[Contribution]) -> np.ndarray:
        kind = self.kind
        if kind == "identical" or kind == "fedbuff":
            # the same d_i for every update: one read-only array per commit size, built once
            n = len(contributions)
            d = self._constant.get(n)
            if d is None:
                if kind == "identical":
                    d = identical_weights(n)
                else:
                    assert self.buffer_size is not None
                    d = fedbuff_weights(self.buffer_size, n)
                d.flags.writeable = False
                self._constant[n] = d
            return d
        clients = np.array([c.client for c in contributions], dtype=np.int64)
        p = self.importance[clients]
        if kind == "sync":
            return sync_weights(p)
        if kind == "participation":
            done = ctx.counters.participation
            counts = np.array([done.get(int(c), 0) + 1 for c in clients], dtype=np.float64)
            return participation_weights(p, counts, ctx.counters.aggregations + 1)
        assert self.times is not None
        tau = self.times.tau(ctx.now)
        if kind == "time-based":
            return time_based_weights(tau, self.importance)[clients]
        if kind == "fedfix":
            assert self.delta_t is not None
            return fedfix_weights(tau[clients], p, self.delta_t)
        raise ValueError(f"unknown weight rule {kind!r}")


class ConstantWeight:
    """d_i = c for every contribution (FedAsync's α before the staleness factor)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, ctx: Context, contributions: Sequence[Contribution]) -> np.ndarray:
        return np.full(len(contributions), self.value)


class StalenessWeighting:
    """ω_i(n) = d_i · s(n − ρ_i(n)) (Fraboni et al. eq. 6): d_i from ``weights`` (a
    :class:`WeightRule` or :class:`ConstantWeight`), s the staleness function over the
    versions since the client's base (constant: ω_i = d_i)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        weights: Callable[[Context, Sequence[Contribution]], np.ndarray],
        staleness: Staleness | None = None,
    ) -> None:
        self.weights = weights
        self.staleness = staleness or Staleness()

    def __call__(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> np.ndarray:
        d = np.asarray(self.weights(ctx, contributions), dtype=np.float64)
        if self.staleness.is_constant:
            return d
        s = np.array([self.staleness(base.version - c.base_version) for c in contributions])
        return d * s


# ------------------------------------------------------------------ triggers


class _AllClients:
    """Shared by the asynchronous triggers: which clients work, and when they restart.

    By default every client of the population works all the time (Fraboni et al.):
    a contributor restarts on the new model. With ``concurrency`` C (FLSim's max
    concurrency) only C clients train at once: C clients drawn uniformly at random
    start, and each freed slot goes to a client drawn uniformly from those not
    training (the one just freed included), on the current model. Draws come from
    the run's ``client-selection`` stream.
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = (
        "concurrency", "_idle", "_draws", "_rng", "_queue", "_batch", "_heard", "_sent",
        "_empty", "_slot_timer",
    )  # fmt: skip

    def __init__(self, times: UpdateTimes, *, concurrency: int | None = None) -> None:
        if concurrency is not None and concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.times = times
        self._estimating = times.source == "estimated"
        self.concurrency = concurrency
        self._idle: list[int] = []  # clients not training (concurrency mode)
        self._draws: list[float] = []
        self._rng: np.random.Generator | None = None
        # with a concurrency, who fills the freed slots (strategies/selection.py; None:
        # uniformly among the idle): it picks C idle clients at a time (a "round" of the
        # selection), handed out one per freed slot; it hears the contributions committed
        # and the tasks started since its last pick
        self.selection: Selection | None = None  # (choose_with)
        self._queue: list[int] = []
        self._batch = 0
        self._heard: list[Contribution] = []
        self._sent: list[Task] = []
        # with a concurrency on a fleet whose devices come and go: slots waiting for an idle
        # client whose device is online, and when the timer that looks again is set
        self._empty = 0
        self._slot_timer = math.inf

    def choose_with(self, selection: Selection | None) -> None:
        """Who fills the freed slots (None: uniformly among the idle): set while the strategy
        is assembled, before the run starts (``strategies.with_selection``)."""
        if self._sent or self._heard:
            raise RuntimeError("a trigger's selection is chosen before the run starts")
        self.selection = selection

    def _start(self, ctx: Context, client: int) -> None:
        if ctx.has_availability and not ctx.online(client):  # it starts when it comes back
            self._wait_online(ctx, client)
            return
        ctx.start(client)
        if self._estimating:
            self.times.started(client, ctx.now)

    def _wait_online(self, ctx: Context, client: int) -> None:
        back = ctx.next_online(client)
        if np.isfinite(back):
            ctx.set_timer(back, ("online", client))

    def on_lost(self, ctx: Context, task: Task) -> None:
        """The client's device went offline mid-task: its work is lost, and it starts a new
        task (on the model of then) when its device is online again — or, under a
        concurrency, it joins the idle clients and its slot goes to an online one."""
        if self.concurrency is not None:
            self._idle.append(task.client)
            self._fill(ctx)
            return
        self._wait_online(ctx, task.client)

    def _online_timer(self, ctx: Context, tag: Any) -> bool:
        """Handle an ("online", client) or a ("slots",) timer; whether ``tag`` was one."""
        if isinstance(tag, tuple) and tag[0] == "online":
            if not ctx.stopping:
                self._start(ctx, int(tag[1]))
            return True
        if isinstance(tag, tuple) and tag[0] == "slots":
            self._slot_timer = math.inf
            if not ctx.stopping:
                waiting, self._empty = self._empty, 0
                for _ in range(waiting):
                    self._fill(ctx)
            return True
        return False

    # -- a concurrency on a fleet whose devices come and go
    def _online_idle(self, ctx: Context) -> list[int]:
        """The idle clients whose device is online now, in client order."""
        online = np.zeros(ctx.num_clients, dtype=bool)
        online[ctx.online_clients()] = True
        return sorted(c for c in self._idle if online[c])

    def _fill(self, ctx: Context) -> None:
        """Give one slot to an idle client whose device is online (drawn uniformly, or the
        selection's next pick among them); when none is, the slot waits until the first
        idle device comes online."""
        if ctx.stopping:
            return
        if self.selection is not None:
            client = self._take_selected(ctx)
        else:
            pool = self._online_idle(ctx)
            client = None
            if pool:
                client = pool[int((self._draws or self._refill()).pop() * len(pool))]
                self._idle.remove(client)
        if client is None:
            self._empty += 1
            back = min((ctx.next_online(c) for c in self._idle), default=math.inf)
            if math.isfinite(back) and back < self._slot_timer:
                self._slot_timer = back
                ctx.set_timer(back, ("slots",))
            return
        task = ctx.start(client)
        if self.selection is not None:
            self._sent.append(task)
        if self._estimating:
            self.times.started(client, ctx.now)

    def _start_all(self, ctx: Context) -> None:
        self.times.setup(ctx)
        n = ctx.num_clients
        if self.concurrency is None or self.concurrency >= n:
            self.concurrency = None
            for c in range(n):
                self._start(ctx, c)
            return
        self._rng = ctx.rng("client-selection")
        self._idle = list(range(n))
        if self.selection is not None:
            self.selection.setup(ctx)
        if ctx.has_availability:  # the slots go to online clients only
            for _ in range(self.concurrency):
                self._fill(ctx)
            return
        if self.selection is not None:
            for _ in range(self.concurrency):
                self._start_selected(ctx)
            return
        for _ in range(self.concurrency):
            self._start(ctx, self._take_idle())

    def _refill(self) -> list[float]:
        """The next 4,096 uniform draws of the selection stream (taken from the end)."""
        assert self._rng is not None
        self._draws = self._rng.random(4096).tolist()
        return self._draws

    def _take_idle(self) -> int:
        """Remove and return a client drawn uniformly from the idle ones."""
        idle = self._idle
        i = int((self._draws or self._refill()).pop() * len(idle))
        client = idle[i]
        idle[i] = idle[-1]  # swap-remove: O(1)
        idle.pop()
        return client

    def _take_selected(self, ctx: Context) -> int | None:
        """The next client the selection picked (a new pick of C idle clients when none is
        left), removed from the idle ones; the task it starts is remembered for the pick's
        feedback. With availability the pick is among the online idle clients, and a picked
        client whose device has gone offline since is passed over; None: none is online."""
        assert self.selection is not None and self.concurrency is not None
        avail = ctx.has_availability
        while self._queue and avail and not ctx.online(self._queue[-1]):
            self._queue.pop()  # (it stays idle)
        if not self._queue:
            if self._batch:  # what the last pick led to
                self.selection.on_round(ctx, self._batch - 1, self._heard, self._sent)
                self._heard, self._sent = [], []
            pool = self._online_idle(ctx) if avail else self._idle
            if not pool:
                return None
            idle = np.sort(np.array(pool, dtype=np.int64))
            picked = self.selection.select(ctx, self._batch, idle, min(self.concurrency, len(idle)))
            self._batch += 1
            self._queue = picked.tolist()[::-1]  # (popped from the end: in client order)
            if not self._queue:
                return None
        client = self._queue.pop()
        self._idle.remove(client)
        return client

    def _start_selected(self, ctx: Context) -> None:
        client = self._take_selected(ctx)
        assert client is not None  # (without availability every idle client can start)
        self._sent.append(ctx.start(client))
        if self._estimating:
            self.times.started(client, ctx.now)

    def _restart(self, ctx: Context, client: int) -> None:
        """``client``'s update has been used: it (or, with a concurrency, a random idle client)
        starts (with availability: when its device is online)."""
        if ctx.has_availability:
            if self.concurrency is not None:  # it joins the idle; an online one takes the slot
                self._idle.append(client)
                self._fill(ctx)
                return
            self._start(ctx, client)
            return
        if self.selection is not None:  # the slot goes to the selection's next pick
            self._idle.append(client)
            self._start_selected(ctx)
            return
        if self.concurrency is not None:
            # ``client`` joins the idle ones and one of them, uniformly, takes its slot
            # (once per arrival under a concurrency: the draw is inlined)
            idle = self._idle
            n = len(idle)
            i = int((self._draws or self._refill()).pop() * (n + 1))
            if i < n:
                client, idle[i] = idle[i], client
        ctx.start(client)
        if self._estimating:
            self.times.started(client, ctx.now)

    def _commit_and_restart(self, ctx: Context, arrived: list[Contribution]) -> None:
        batch = sorted(arrived, key=_by_client)  # fixed sum order
        ctx.commit(batch)
        if self.selection is not None:
            self._heard.extend(batch)
        if not ctx.stopping:
            for c in batch:
                self._restart(ctx, c.task.client)


class ArrivalBuffer(_AllClients):
    """Aggregate every ``buffer_size`` arrivals (1: asynchronous FedAvg; m: FedBuff).

    Without a concurrency the m contributors wait for the aggregation and restart
    on the new model. With one, as in FLSim, an arrival frees its slot at once: a
    new client starts on the current model (on the new one if this arrival filled
    the buffer).
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = (*_AllClients.checkpoint_fields, "_buffer")

    def __init__(
        self, times: UpdateTimes, *, buffer_size: int = 1, concurrency: int | None = None
    ) -> None:
        super().__init__(times, concurrency=concurrency)
        if buffer_size < 1:
            raise ValueError("buffer_size must be at least 1")
        self.buffer_size = buffer_size
        self._buffer: list[Contribution] = []

    def on_start(self, ctx: Context) -> None:
        self._start_all(ctx)

    def on_arrival(self, ctx: Context, contribution: Contribution) -> None:
        if self._estimating:
            self.times.observe(contribution.task, ctx.now)
        buffer = self._buffer
        buffer.append(contribution)
        if self.concurrency is None:
            if len(buffer) >= self.buffer_size:
                self._buffer = []
                self._commit_and_restart(ctx, buffer)
            return
        if len(buffer) >= self.buffer_size:
            self._buffer = []
            batch = sorted(buffer, key=_by_client)
            ctx.commit(batch)
            if self.selection is not None:
                self._heard.extend(batch)
            if ctx.stopping:  # (only a commit can end the run during a callback)
                return
        # the slot is free: the client joins the idle ones and one of them, uniformly, takes it
        self._restart(ctx, contribution.task.client)

    def on_timer(self, ctx: Context, tag: Any) -> None:
        self._online_timer(ctx, tag)


class FixedPeriod(_AllClients):
    """FedFix: aggregate every ``delta_t`` virtual seconds whatever has arrived.

    Ticks are at t₀ + Δt, (t₀ + Δt) + Δt, … (each computed from the previous
    one, so with Δt equal to the slowest task duration the ticks coincide with
    the synchronous barrier). An update arriving exactly at a tick is in that
    tick. A tick with no update makes no server step.
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = (
        *_AllClients.checkpoint_fields,
        "_waiting",
    )

    def __init__(
        self, times: UpdateTimes, *, delta_t: float, concurrency: int | None = None
    ) -> None:
        super().__init__(times, concurrency=concurrency)
        if not delta_t > 0:
            raise ValueError("delta_t must be > 0")
        self.delta_t = delta_t
        self._waiting: list[Contribution] = []

    def on_start(self, ctx: Context) -> None:
        self._start_all(ctx)
        ctx.set_timer(ctx.now + self.delta_t, "tick")

    def on_arrival(self, ctx: Context, contribution: Contribution) -> None:
        self.times.observe(contribution.task, ctx.now)
        self._waiting.append(contribution)  # idle until the next tick

    def on_timer(self, ctx: Context, tag: Any) -> None:
        if self._online_timer(ctx, tag):
            return
        if self._waiting:
            arrived, self._waiting = self._waiting, []
            self._commit_and_restart(ctx, arrived)
        if not ctx.stopping:
            ctx.set_timer(ctx.now + self.delta_t, "tick")


# ------------------------------------------------------------------ builders


def _weighted_trigger(
    s: WeightedAsyncOptions, name: str, times: UpdateTimes, num_clients: int
) -> ArrivalBuffer | FixedPeriod:
    """The trigger the options class declares (``WeightedAsyncOptions.trigger``)."""
    if s.trigger == "period":
        if s.delta_t is None:
            raise ConfigError(
                f"Strategy '{name}' needs a period: set strategy.delta_t (virtual seconds)."
            )
        return FixedPeriod(times, delta_t=s.delta_t, concurrency=s.concurrency)
    if s.trigger == "buffer":
        if s.buffer_size is None:
            raise ConfigError(
                f"Strategy '{name}' needs a buffer size: set strategy.buffer_size "
                "(updates per step)."
            )
        if s.buffer_size > num_clients:
            raise ConfigError(
                f"strategy.buffer_size = {s.buffer_size} exceeds the {num_clients} clients, "
                "so the buffer could never fill."
            )
        return ArrivalBuffer(times, buffer_size=s.buffer_size, concurrency=s.concurrency)
    return ArrivalBuffer(times, buffer_size=1, concurrency=s.concurrency)


def build_async(cfg: ExperimentConfig, info: BuildInfo, planner: Planner) -> Strategy:
    """The strategies ``async-identical``, ``async-time-based``, ``fedfix``, ``fedbuff``,
    ``fedasync``: the options class says which trigger and weight rule (no name switch)."""
    from fedclock.config import AsyncOptions, FedAsyncOptions, WeightedAsyncOptions

    s = cfg.strategy
    assert isinstance(s, AsyncOptions)
    name = s.name
    staleness = Staleness(
        kind=s.staleness, a=s.staleness_a, b=s.staleness_b, normalize_at=s.staleness_normalize_at
    )
    trigger: ArrivalBuffer | FixedPeriod
    if isinstance(s, FedAsyncOptions):  # θ ← (1 − α_t)·θ + α_t·θ_client on every arrival
        times = UpdateTimes("profile", planner)  # no weight rule reads τ_i
        aggregator = Update(
            StalenessWeighting(ConstantWeight(s.alpha), staleness), target=mix,
            buffers=mix_buffers, server=server_optimizer(s, lr=1.0),
        )  # fmt: skip
        trigger = ArrivalBuffer(times, buffer_size=1, concurrency=s.concurrency)
        return Strategy(name=name, planner=planner, trigger=trigger, aggregator=aggregator)

    assert isinstance(s, WeightedAsyncOptions)
    times = UpdateTimes(s.tau_source, planner)
    trigger = _weighted_trigger(s, name, times, cfg.partition.num_clients)
    kind = type(s).weight_rule(s.aggregation_weights)  # auto: the strategy's own rule
    if kind == "fedfix" and s.delta_t is None:
        raise ConfigError(
            "strategy.aggregation_weights 'fedfix' (⌈τ_i/Δt⌉·p_i) needs strategy.delta_t."
        )
    if kind == "fedbuff" and s.buffer_size is None:
        raise ConfigError(
            "strategy.aggregation_weights 'fedbuff' (1/m) needs strategy.buffer_size."
        )
    rule = WeightRule(
        kind,
        importance=client_importance(info.client_sizes.tolist(), s.weights),
        times=times,
        delta_t=s.delta_t,
        buffer_size=s.buffer_size,
    )
    aggregator = Update(
        StalenessWeighting(rule, staleness), buffers=step_buffers,
        server=server_optimizer(s, lr=s.server_lr),
    )  # fmt: skip
    return Strategy(name=name, planner=planner, trigger=trigger, aggregator=aggregator)
