"""fedclock's own FedBuff for the engine and memory benchmarks, and a no-op model.

:func:`fedbuff` builds the product's strategy from its parts, exactly as
``strategy.name: fedbuff`` does (:func:`fedclock.strategies.asynchronous.build_async`):
the :class:`ArrivalBuffer` trigger (a server step every ``buffer_size`` arrivals; with a
``concurrency`` C, C clients train at a time, FLSim-style) and the eq. 6
:class:`Update` with FedBuff's d_i = 1/m.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedclock.sim.types import Contribution, Task
from fedclock.strategies import Strategy
from fedclock.strategies.aggregators import Update, step_buffers
from fedclock.strategies.asynchronous import (
    ArrivalBuffer,
    StalenessWeighting,
    UpdateTimes,
    WeightRule,
)
from fedclock.strategies.base import Planner


def fedbuff(
    planner: Planner, *, clients: int, buffer_size: int, concurrency: int | None
) -> Strategy:
    times = UpdateTimes("profile", planner)
    trigger = ArrivalBuffer(times, buffer_size=buffer_size, concurrency=concurrency)
    weights = WeightRule(
        "fedbuff", importance=np.full(clients, 1.0 / clients), times=times, buffer_size=buffer_size
    )
    return Strategy(
        "fedbuff", planner, trigger, Update(StalenessWeighting(weights), buffers=step_buffers)
    )


class NoopExecutor:
    """A no-op model: every task returns an empty update at once.

    The empty delta and buffers are shared (nothing writes to a contribution's dicts).
    """

    def run(self, tasks: Sequence[Task]) -> list[Contribution]:
        empty: dict[str, Any] = {}
        return [Contribution(t, empty, empty, 1, 0.0) for t in tasks]
