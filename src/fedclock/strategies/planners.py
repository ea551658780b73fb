"""Planners: what a client computes, and what that costs."""

from __future__ import annotations

import math

import numpy as np

from fedclock.devices.cost import TaskCost
from fedclock.sim.simulator import Context
from fedclock.sim.types import TaskPlan


def local_sgd_plan(
    num_samples: int, batch_size: int, *, local_epochs: float | None, local_steps: int | None
) -> TaskPlan:
    """Steps and samples of local SGD on a client holding ``num_samples`` samples.

    Batches are cut from successive shuffles of the client's data; an epoch has
    ⌈n/B⌉ batches, the last one partial. ``local_epochs`` (may be fractional)
    gives ⌊epochs·⌈n/B⌉ + ½⌋ ≥ 1 steps (halves round up); ``local_steps`` gives the count directly.
    """
    n = int(num_samples)
    b = min(batch_size, n)
    per_epoch = math.ceil(n / b)
    if local_steps is not None:
        steps = int(local_steps)
    else:
        assert local_epochs is not None
        steps = max(1, math.floor(local_epochs * per_epoch + 0.5))
    full, rem = divmod(steps, per_epoch)
    samples = full * n + rem * b
    return TaskPlan(local_steps=steps, batch_size=b, samples=samples, epochs=local_epochs)


class LocalSGDPlanner:
    """Every client runs full local SGD (forward + backward through every layer)."""

    def __init__(
        self,
        *,
        client_sizes: np.ndarray,
        batch_size: int,
        local_epochs: float | None,
        local_steps: int | None,
        flops_per_sample: float,
        model_bytes: int,
    ) -> None:
        # keyed by client data size, not by client: a population of 100k clients has
        # few distinct sizes, so the cache does not grow with the population
        self._plans: dict[int, tuple[TaskPlan, TaskCost]] = {}
        self._sizes = memoryview(np.ascontiguousarray(client_sizes, dtype=np.int64))  # type: ignore[arg-type]
        self._batch = batch_size
        self._epochs = local_epochs
        self._steps = local_steps
        self._flops = flops_per_sample
        self._bytes = model_bytes

    def plan(self, ctx: Context, client: int) -> tuple[TaskPlan, TaskCost]:
        size = self._sizes[client]
        cached = self._plans.get(size)
        if cached is None:
            plan = local_sgd_plan(
                size, self._batch, local_epochs=self._epochs, local_steps=self._steps
            )
            cost = TaskCost(
                flops=plan.samples * self._flops, bytes_down=self._bytes, bytes_up=self._bytes
            )
            cached = self._plans[size] = (plan, cost)
        return cached
