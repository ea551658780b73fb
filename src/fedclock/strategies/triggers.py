"""Triggers: when the server builds a new global model."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, Task
from fedclock.strategies.base import RoundWork, Work
from fedclock.strategies.selection import Selection


def select_clients(
    rng: np.random.Generator | Callable[[], np.random.Generator], num_clients: int, fraction: float
) -> np.ndarray:
    """A round's participants: max(1, ⌊C·N⌋) clients without replacement, sorted.

    ``rng`` may be a callable that makes the stream: it is then only built when a draw is
    needed (C < 1), since building a numpy stream costs more than the rest of a round's
    bookkeeping.
    """
    m = max(1, int(fraction * num_clients + 1e-9))  # McMahan et al.: m = max(⌊C·K⌋, 1)
    if m >= num_clients:
        return np.arange(num_clients)
    g = rng() if callable(rng) else rng
    return np.sort(g.choice(num_clients, size=m, replace=False))


class SyncRounds:
    """Synchronous rounds: a barrier, optionally closed early by a deadline ``t_max``.

    Each round samples a fraction C of the clients (stream ``("select", round)``,
    common to every strategy) and sends them the current model. Without a
    deadline the round closes when every participant has arrived (FedAvg's
    barrier). With ``t_max`` it closes at the first of: all arrived, or
    ``t_max`` after the round started; updates still in flight then are
    cancelled — their compute up to the deadline counts as spent and wasted —
    and the clients start the next round on the new model (drop-stragglers,
    SALF eq. 4). A task whose duration already exceeds ``t_max`` is dispatched
    without running its training compute, as its result could never be used.

    ``work`` (a :class:`~fedclock.strategies.base.RoundWork` planner) decides each
    participant's work per round (the SALF family: a layer suffix, a width slice, nothing,
    a stale full update). Under a deadline a participant with partial work works until
    ``t_max`` and sends what it has then, so such a round closes at ``t_max``; one with
    nothing to send still computes until ``t_max`` (a full task dispatched without its
    training compute and cancelled then: spent and wasted). A round in which nobody has
    anything to send and no deadline runs is aggregated at once (an empty commit).

    ``selection`` (:mod:`fedclock.strategies.selection`: Oort, TiFL, REFL) chooses each
    round's participants among the online clients instead of the uniform draw, and hears
    the round's used contributions. ``keep_late`` (REFL's staleness-aware aggregation): a
    participant that cannot meet the deadline is not cut; its task trains on, arrives after
    its round and is committed, stale, with the next round to close.

    ``over_commit`` o > 1 makes a round **K-of-N** (Bonawitz et al., SysML'19; FedScale's
    over-commitment, 1.3): it asks N = ⌈o·m⌉ clients (at most the candidates) and closes
    when the first K = m updates have arrived; the others are cancelled, their compute up to
    then spent and wasted. Under a deadline the round closes at the first of the K-th
    arrival and ``t_max`` (a round held to its deadline by partial work closes there).
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = (
        "round",
        "_outstanding",
        "_arrived",
        "_cut",
        "_hold",
        "_dispatched",
        "_late",
        "_stale",
        "_waiting",
    )

    def __init__(
        self,
        *,
        client_fraction: float = 1.0,
        t_max: float | None = None,
        work: RoundWork | None = None,
        selection: Selection | None = None,
        keep_late: bool = False,
        over_commit: float = 1.0,
        track_participants: bool = False,
    ) -> None:
        self.client_fraction = client_fraction
        self.over_commit = over_commit  # o > 1: ask ⌈o·m⌉, close at the first m (K-of-N)
        self.t_max = t_max
        self.work = work
        # whom a round asks (strategies/selection.py: Oort, TiFL, REFL); None: uniformly
        self.selection = selection
        self.round = 0
        self._outstanding: dict[int, Task] = {}
        self._arrived: list[Contribution] = []
        self._cut: list[Task] = []  # participants with nothing to send, working until t_max
        self._hold = False  # the round closes at its deadline, not at the last arrival
        self._dispatched: list[Task] = []  # the round's tasks (what a selection hears of)
        # keep_late (REFL's staleness-aware aggregation): a task that cannot meet the deadline
        # trains on; it arrives after its round and is used, stale, by the next round to close
        self.keep_late = keep_late
        self._late: dict[int, Task] = {}  # still training after their round closed
        self._stale: list[Contribution] = []  # arrived late, used at the next close
        self._waiting = False  # every online client busy with a late task: wait for one
        # keep the round's tasks (participants()) without a selection too: SALF over a
        # fraction of its users computes eq. 9's p_l over the round's users
        self.track_participants = track_participants

    def choose_with(
        self, selection: Selection | None, *, keep_late: bool = False, over_commit: float = 1.0
    ) -> None:
        """Who the rounds ask and how many they wait for (``selection``, ``keep_late``,
        ``over_commit`` as in the class docstring): set while the strategy is assembled,
        before its first round (``strategies.with_selection``); refused after."""
        if self.round or self._outstanding or self._dispatched:
            raise RuntimeError("a trigger's selection is chosen before its first round")
        self.selection = selection
        self.keep_late = keep_late
        self.over_commit = over_commit

    def participants(self) -> list[int]:
        """The clients asked in the round being closed (with a selection or
        ``track_participants``), ascending."""
        return sorted({t.client for t in self._dispatched})

    def on_start(self, ctx: Context) -> None:
        if self.selection is not None:
            self.selection.setup(ctx)
        self._start_round(ctx)

    def _start_round(self, ctx: Context) -> None:
        while not self._dispatch_round(ctx) and not ctx.stopping:
            ctx.commit([])  # nobody has anything to send this round: the model is kept
            self.round += 1
            if ctx.stopping:
                return

    def _dispatch_round(self, ctx: Context) -> bool:
        """Start round ``self.round``; False if it has nothing to wait for."""
        r = self.round
        if self.selection is not None:
            got = self._selected(ctx, r)
            if got is None:
                return True
            clients = got
        elif ctx.has_availability:
            got = self._online_clients(ctx, r)
            if got is None:  # nobody online: the round starts when someone is
                return True
            clients = got
        else:
            clients = select_clients(
                lambda: ctx.rng("select", r), ctx.num_clients, self._asked_fraction(ctx)
            )
        self._arrived = []
        self._outstanding = {}
        self._cut = []
        deadline = None if self.t_max is None else ctx.now + self.t_max
        hold = late_any = False
        late_now: list[Task] = []
        if self.work is None:
            works: list[Work] | None = None
        else:
            works = self.work.assign(ctx, r, clients)
        for i, c in enumerate(clients):
            if works is None:
                task = ctx.prepare(int(c))
            else:
                w = works[i]
                if deadline is not None and w.partial:
                    hold = True
                if w.plan is None:
                    if deadline is not None:  # works until t_max, sends nothing
                        self._cut.append(ctx.dispatch(ctx.prepare(int(c)), execute=False))
                    continue
                assert w.cost is not None
                task = ctx.prepare(int(c), base=w.base, work=(w.plan, w.cost))
            # compare arrival and deadline as the event heap will (same float sums)
            late = deadline is not None and task.t_finish > deadline
            late_any |= late
            if late and self.keep_late:  # trains on past the deadline, used stale later
                ctx.dispatch(task, execute=True)
                self._late[task.task_id] = task
                late_now.append(task)
                hold = True  # (the round still lasts until its deadline)
                continue
            ctx.dispatch(task, execute=not late)
            self._outstanding[task.task_id] = task
        if self.selection is not None or self.track_participants:
            self._dispatched = [*self._outstanding.values(), *self._cut, *late_now]
        self._hold = hold
        if deadline is not None and (hold or late_any or ctx.real_time):
            ctx.set_timer(deadline, r)  # (on real devices lateness is known only then)
            return True
        return bool(self._outstanding)

    def _wanted(self, ctx: Context) -> int:
        """m = max(1, ⌊C·N⌋): the updates a round waits for (McMahan et al.)."""
        return max(1, int(self.client_fraction * ctx.num_clients + 1e-9))

    def _asking(self, ctx: Context) -> int:
        """The clients a round asks: m, or ⌈o·m⌉ with over-commitment (at most N)."""
        m = self._wanted(ctx)
        if self.over_commit <= 1.0:
            return m
        return min(ctx.num_clients, math.ceil(self.over_commit * m - 1e-9))

    def _asked_fraction(self, ctx: Context) -> float:
        """The fraction :func:`select_clients` draws to ask :meth:`_asking` clients."""
        if self.over_commit <= 1.0:
            return self.client_fraction
        return self._asking(ctx) / ctx.num_clients

    def _online_clients(self, ctx: Context, r: int) -> np.ndarray | None:
        """With availability (a trace): the round's participants, m = max(1, ⌊C·N⌋) drawn
        among the devices online now (all of them if fewer are); None when none is — then a
        timer starts the round when the first comes online."""
        count = ctx.online_count()
        if not count:
            wake = ctx.next_any_online()
            if np.isfinite(wake):
                ctx.set_timer(wake, ("wake", r))
            return None
        m = self._asking(ctx)
        if m >= count:
            return ctx.online_clients()
        # (the same draw as choice over the sorted online clients, without listing them)
        return np.sort(
            ctx.online_clients(ctx.rng("select", r).choice(count, size=m, replace=False))
        )

    def _selected(self, ctx: Context, r: int) -> np.ndarray | None:
        """With a selection: its m = max(1, ⌊C·N⌋) participants among the online devices
        (every client without availability); None when none is online (a timer starts the
        round when one is)."""
        if ctx.has_availability:
            candidates = ctx.online_clients()
            if not len(candidates):
                wake = ctx.next_any_online()
                if np.isfinite(wake):
                    ctx.set_timer(wake, ("wake", r))
                return None
        else:
            candidates = np.arange(ctx.num_clients)
        if self._late:  # clients still training a late task are busy
            busy = np.fromiter((t.client for t in self._late.values()), dtype=np.int64)
            candidates = candidates[~np.isin(candidates, busy)]
            if not len(candidates):  # everyone online is busy: the next late arrival starts it
                self._hold = True
                self._waiting = True
                return None
        m = self._asking(ctx)
        assert self.selection is not None
        return self.selection.select(ctx, r, candidates, min(m, len(candidates)))

    def on_arrival(self, ctx: Context, contribution: Contribution) -> None:
        if self._late and contribution.task.task_id in self._late:  # after its round
            del self._late[contribution.task.task_id]
            self._stale.append(contribution)
            if self._waiting:  # the round was waiting for a free client
                self._waiting = False
                self._start_round(ctx)
            return
        del self._outstanding[contribution.task.task_id]
        self._arrived.append(contribution)
        if (
            self.over_commit > 1.0
            and not self._hold
            and self._outstanding
            and len(self._arrived) >= self._wanted(ctx)
        ):  # K-of-N: the first m are in, the rest are cut
            for task in [*self._cut, *self._outstanding.values()]:
                ctx.cancel(task)
            self._outstanding = {}
            self._cut = []
        if not self._outstanding and not self._hold:
            self._close(ctx)

    def on_lost(self, ctx: Context, task: Task) -> None:
        """A participant's device went offline: the round no longer waits for it (a barrier
        closes with the others; under a deadline it is simply absent)."""
        if self._late.pop(task.task_id, None) is not None:  # a late task: its round is over
            if self._waiting:  # its client is free again (offline now): try the round again
                self._waiting = False
                self._start_round(ctx)
            return
        self._outstanding.pop(task.task_id, None)
        self._cut = [t for t in self._cut if t.task_id != task.task_id]
        if not self._outstanding and not self._hold:
            self._close(ctx)

    def on_timer(self, ctx: Context, tag: Any) -> None:
        if isinstance(tag, tuple) and tag[0] == "wake":  # someone came online: start the round
            if tag[1] == self.round:
                self._start_round(ctx)
            return
        if tag != self.round:  # the round already closed when everyone arrived
            return
        for task in self._cut:
            ctx.cancel(task)
        for task in self._outstanding.values():
            ctx.cancel(task)
        self._outstanding = {}
        self._close(ctx)

    def _close(self, ctx: Context) -> None:
        # contributions in arrival order; sort by client so the sum order is fixed
        used = sorted(self._arrived, key=lambda c: c.client)
        if self._stale:  # late updates of earlier rounds (keep_late), after the fresh ones
            used += sorted(self._stale, key=lambda c: (c.base_version, c.client))
            self._stale = []
        if self.selection is not None:  # what the round's participants sent up
            self.selection.on_round(ctx, self.round, used, self._dispatched)
        ctx.commit(used)  # (the update may read the round's participants: cleared after)
        self._dispatched = []
        self.round += 1
        if not ctx.stopping:
            self._start_round(ctx)
