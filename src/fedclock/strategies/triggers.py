"""Triggers: when the server builds a new global model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, Task


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
    """

    def __init__(self, *, client_fraction: float = 1.0, t_max: float | None = None) -> None:
        self.client_fraction = client_fraction
        self.t_max = t_max
        self.round = 0
        self._outstanding: dict[int, Task] = {}
        self._arrived: list[Contribution] = []

    def on_start(self, ctx: Context) -> None:
        self._start_round(ctx)

    def _start_round(self, ctx: Context) -> None:
        r = self.round
        clients = select_clients(
            lambda: ctx.rng("select", r), ctx.num_clients, self.client_fraction
        )
        self._arrived = []
        self._outstanding = {}
        deadline = None if self.t_max is None else ctx.now + self.t_max
        for c in clients:
            task = ctx.prepare(int(c))
            # compare arrival and deadline as the event heap will (same float sums)
            late = deadline is not None and task.t_finish > deadline
            ctx.dispatch(task, execute=not late)
            self._outstanding[task.task_id] = task
        if deadline is not None:
            ctx.set_timer(deadline, self.round)

    def on_arrival(self, ctx: Context, contribution: Contribution) -> None:
        del self._outstanding[contribution.task.task_id]
        self._arrived.append(contribution)
        if not self._outstanding:
            self._close(ctx)

    def on_timer(self, ctx: Context, tag: Any) -> None:
        if tag != self.round:  # the round already closed when everyone arrived
            return
        for task in self._outstanding.values():
            ctx.cancel(task)
        self._outstanding = {}
        self._close(ctx)

    def _close(self, ctx: Context) -> None:
        # contributions in arrival order; sort by client so the sum order is fixed
        ctx.commit(sorted(self._arrived, key=lambda c: c.client))
        self.round += 1
        if not ctx.stopping:
            self._start_round(ctx)
