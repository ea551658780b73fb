"""A minimal asynchronous FedBuff trigger for the engine benchmarks (not the product's FedBuff).

``concurrency`` clients train at any time; every arrival goes into a buffer, the server
aggregates every ``buffer_size`` arrivals, and the client that just arrived is replaced by a
random idle client (drawn from one seeded stream), who starts on the current model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, ModelVersion, Task


class AsyncBuffered:
    def __init__(self, *, concurrency: int, buffer_size: int) -> None:
        self.concurrency = concurrency
        self.buffer_size = buffer_size
        self.arrivals = 0
        self._busy: set[int] = set()
        self._buffer: list[Contribution] = []
        self._rng: np.random.Generator | None = None
        self._draws: list[int] = []

    def _idle_client(self, ctx: Context) -> int:
        n = ctx.num_clients
        while True:
            if not self._draws:
                assert self._rng is not None
                self._draws = self._rng.integers(0, n, size=4096).tolist()
            c = self._draws.pop()
            if c not in self._busy:
                return c

    def _start(self, ctx: Context) -> Task:
        c = self._idle_client(ctx)
        self._busy.add(c)
        return ctx.dispatch(ctx.prepare(c))

    def on_start(self, ctx: Context) -> None:
        self._rng = ctx.rng("select", 0)
        for _ in range(min(self.concurrency, ctx.num_clients)):
            self._start(ctx)

    def on_arrival(self, ctx: Context, contribution: Contribution) -> None:
        self.arrivals += 1
        self._busy.discard(contribution.client)
        self._buffer.append(contribution)
        if len(self._buffer) >= self.buffer_size:
            batch, self._buffer = self._buffer, []
            ctx.commit(batch)
        if not ctx.stopping:
            self._start(ctx)

    def on_timer(self, ctx: Context, tag: Any) -> None:
        pass


class NoopExecutor:
    """A no-op model: every task returns an empty update at once."""

    def run(self, tasks: Sequence[Task]) -> list[Contribution]:
        return [
            Contribution(task=t, delta={}, buffers={}, num_samples=1, train_loss=0.0) for t in tasks
        ]


class NoopAggregator:
    def aggregate(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> ModelVersion:
        return ModelVersion(version=base.version + 1, params=base.params, buffers=base.buffers)
