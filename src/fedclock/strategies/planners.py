"""Planners: what a client computes, and what that costs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fedclock.devices.cost import TaskCost
from fedclock.models.shapes import Layout, Suffix, Width, WorkShape
from fedclock.sim.simulator import Context
from fedclock.sim.types import ModelVersion, TaskPlan
from fedclock.strategies.base import DepthSource, Draw, Work

if TYPE_CHECKING:
    from fedclock.strategies.base import BuildInfo


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

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (_plans is a cache)

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

    def nominal(self, client: int) -> tuple[TaskPlan, TaskCost]:
        return self.plan(None, client)

    def plan(self, ctx: Context | None, client: int) -> tuple[TaskPlan, TaskCost]:
        size = self._sizes[client]
        cached = self._plans.get(size)
        if cached is None:
            plan = local_sgd_plan(
                size, self._batch, local_epochs=self._epochs, local_steps=self._steps
            )
            cached = self._plans[size] = self._priced(plan)
        return cached

    def _priced(self, plan: TaskPlan) -> tuple[TaskPlan, TaskCost]:
        """The full task and its cost (a subclass may give it another work shape)."""
        cost = TaskCost(
            flops=plan.samples * self._flops, bytes_down=self._bytes, bytes_up=self._bytes
        )
        return plan, cost


def local_sgd_planner(cfg: Any, info: BuildInfo, *, copies: int = 1) -> LocalSGDPlanner:
    """The run's full local SGD for every client (``cfg.train``), priced with ``copies``
    model-sized tensors each way (SCAFFOLD's 2: the model and its control variate)."""
    return LocalSGDPlanner(
        client_sizes=info.client_sizes,
        batch_size=cfg.train.batch_size,
        local_epochs=cfg.train.local_epochs,
        local_steps=cfg.train.local_steps,
        flops_per_sample=sum(info.layer_fwd_flops) + sum(info.layer_bwd_flops),
        model_bytes=copies * info.model_bytes,
    )


# ------------------------------------------------------------------ straggler work
class StragglerWork:
    """A round's work for every user from a :class:`~fedclock.strategies.base.DepthSource`
    draw (SALF's straggler scenarios): subclasses say what a user of depth d, straggler or
    not, is asked for. Every task's cost is its work shape's (``WorkShape.cost``)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, *, depths: DepthSource | None, full_plans: Sequence[TaskPlan], layout: Layout
    ) -> None:
        self.depths = depths
        self.full_plans = full_plans  # each user's full local task (from its own data size)
        self.layout = layout

    def cost(self, plan: TaskPlan) -> TaskCost:
        return plan.shape.cost(self.layout, plan.samples)

    def nominal(self, client: int) -> tuple[TaskPlan, TaskCost]:
        full = self.full_plans[client]
        return full, self.cost(full)

    def plan(self, ctx: Context | None, client: int) -> tuple[TaskPlan, TaskCost]:
        return self.nominal(client)  # a round's work comes from assign()

    def assign(self, ctx: Context, r: int, clients: np.ndarray) -> list[Work]:
        draw = None if self.depths is None else self.depths.draw(ctx, r)
        out = []
        for c in clients:
            c = int(c)
            d = 1 if draw is None else int(draw.depths[c])
            straggler = draw is not None and bool(draw.stragglers[c])
            out.append(self.work(ctx, r, c, d, straggler))
        return out

    def work(self, ctx: Context, r: int, client: int, depth: int, straggler: bool) -> Work:
        return self._full(client)  # vanilla FL: a full update from everyone

    def _full(self, client: int, base: ModelVersion | None = None) -> Work:
        full = self.full_plans[client]
        return Work(full, self.cost(full), base)

    def _shaped(self, client: int, shape: WorkShape) -> Work:
        plan = replace(self.full_plans[client], shape=shape)
        return Work(plan, self.cost(plan))


class DropWork(StragglerWork):
    """drop-stragglers: a straggler sends nothing."""

    def work(self, ctx: Context, r: int, client: int, depth: int, straggler: bool) -> Work:
        return Work(None) if straggler else self._full(client)


class SuffixWork(StragglerWork):
    """SALF: a user of depth d sends layers d..L (``Suffix(d)``); d = L+1 sends nothing."""

    def work(self, ctx: Context, r: int, client: int, depth: int, straggler: bool) -> Work:
        if depth > self.layout.units.count:
            return Work(None)
        return self._full(client) if depth == 1 else self._shaped(client, Suffix(depth))


class WidthWork(StragglerWork):
    """HeteroFL: a straggler trains the width-r submodel (``Width(r)``)."""

    def __init__(self, *, rate: float, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.rate = rate

    def work(self, ctx: Context, r: int, client: int, depth: int, straggler: bool) -> Work:
        return self._shaped(client, Width(self.rate)) if straggler else self._full(client)


class StaleCycleWork(StragglerWork):
    """AsyncFL (SALF's baseline): a straggler of depth l downloads the model, then delivers
    a full update computed on it 2l rounds later (participation every 2l rounds); others
    deliver every round."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ("_cycles",)

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self._cycles: dict[int, tuple[ModelVersion, int]] = {}  # client → (stale base, due)

    def work(self, ctx: Context, r: int, client: int, depth: int, straggler: bool) -> Work:
        cycle = self._cycles.get(client)
        if cycle is None:
            if not straggler:
                return self._full(client)
            cycle = self._cycles[client] = (ctx.model, r + 2 * depth - 1)
        stale, due = cycle
        if r < due:
            return Work(None)
        del self._cycles[client]
        return self._full(client, base=stale)


class PerTask:
    """A round planner's work, one task at a time, for triggers without rounds (FedBuff,
    FedAsync, …): a task started on model version v gets its client's work from round v's
    draw (one draw per version, shared by every task started on it). A client with nothing
    to send in its draw (SALF's depth L+1, a dropped straggler) cannot be given an
    asynchronous task; a stale base (AsyncFL's cycle) has no meaning without rounds."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ("_round", "_draw")

    def __init__(self, work: StragglerWork) -> None:
        self.work = work
        self._round = -1
        self._draw: Draw | None = None

    def nominal(self, client: int) -> tuple[TaskPlan, TaskCost]:
        return self.work.nominal(client)

    def plan(self, ctx: Context, client: int) -> tuple[TaskPlan, TaskCost]:
        r = ctx.model.version
        if r != self._round:
            src = self.work.depths
            self._round, self._draw = r, None if src is None else src.draw(ctx, r)
        draw = self._draw
        d = 1 if draw is None else int(draw.depths[client])
        straggler = draw is not None and bool(draw.stragglers[client])
        w = self.work.work(ctx, r, client, d, straggler)
        if w.plan is None or w.base is not None:
            raise ValueError(
                f"{type(self.work).__name__} gives client {client} no task it can run "
                f"asynchronously on model version {r} (depth {d})."
            )
        assert w.cost is not None
        return w.plan, w.cost
