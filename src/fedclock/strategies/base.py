"""Strategy = Planner × Trigger × Aggregator (see docs/architecture.md), with an optional
client rule.

- a **Planner** decides what each client computes (and what it costs);
- a **Trigger** decides when the server builds a new global model: it reacts
  to the simulator's callbacks and calls ``ctx.commit`` with the updates to use;
- an **Aggregator** decides how the committed contributions are combined;
- a **ClientRule** (:mod:`.client`, optional) adds terms to the local objective, tensors to
  each task it sends down, and keeps per-client state (SCAFFOLD, FedDyn).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

import numpy as np

from fedclock.devices.cost import TaskCost
from fedclock.devices.population import Population
from fedclock.models.shapes import FULL
from fedclock.sim.checkpoint import register_value_type
from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan
from fedclock.strategies.client import ClientRule, ClientState
from fedclock.train.local import Needs


class Planner(Protocol):
    """What a client computes. The contract: ``plan`` and ``nominal`` have no side effects
    (the simulator may ask for a plan it never dispatches); a planner that keeps state
    changes it in the optional hooks ``on_dispatch(task)`` (a task really started) and
    ``on_commit(contributions)`` (updates used by a server step), which the simulator
    calls when the strategy's planner has them."""

    def plan(self, ctx: Context, client: int) -> tuple[TaskPlan, TaskCost]: ...

    def nominal(self, client: int) -> tuple[TaskPlan, TaskCost]:
        """The client's nominal task (its full one): what the trigger's update times τ_i,
        the deadline check and ``clients.csv`` are computed from."""
        ...


@dataclass(frozen=True, slots=True)
class Work:
    """What a round asks of one client: a plan and its cost (``None``: nothing to send this
    round), trained on ``base`` (``None``: the current model)."""

    plan: TaskPlan | None
    cost: TaskCost | None = None
    base: ModelVersion | None = None

    @property
    def partial(self) -> bool:
        """Less than a full update: the client works until a deadline and sends what it has."""
        return self.plan is None or self.plan.shape is not FULL


class RoundWork(Planner, Protocol):
    """A planner that decides a synchronous round's work for every participant at once
    (:class:`fedclock.strategies.triggers.SyncRounds` asks it once at each round start and
    dispatches every plan it returns, so a round planner may keep its round's state here).
    """

    def assign(self, ctx: Context, r: int, clients: np.ndarray) -> list[Work]: ...


@register_value_type  # (a round's draw is checkpointed with the planner that holds it)
@dataclass(frozen=True)
class Draw:
    """One round's straggler draw over all U users: depth d_u (1 = full, L+1 = nothing)
    and who is a straggler."""

    depths: np.ndarray
    stragglers: np.ndarray


class DepthSource(Protocol):
    """Who straggles in round ``r``, and how deep each user's backprop gets."""

    def draw(self, ctx: Context, r: int) -> Draw: ...


class Trigger(Protocol):
    def on_start(self, ctx: Context) -> None: ...
    def on_arrival(self, ctx: Context, contribution: Contribution) -> None: ...
    def on_timer(self, ctx: Context, tag: Any) -> None: ...


class Aggregator(Protocol):
    def aggregate(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> ModelVersion: ...


@dataclass
class Strategy:
    """A named triple; the simulator talks to it, it delegates to its parts."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # the state is in its parts

    name: str
    planner: Planner
    trigger: Trigger
    aggregator: Aggregator
    # what the strategy asks of the executor (work shapes, per-client momentum, deadline):
    # run_experiment builds the executor from it and never inspects the parts
    needs: Needs = field(default_factory=Needs)
    # numbers the strategy measured while it was built (e.g. CIS Balanced Adj's σ), added to
    # summary.json
    summary: dict[str, Any] = field(default_factory=dict)
    # the client side (strategies/client.py): local gradient terms, tensors sent down with
    # each task, per-client state; None: plain local SGD on what the planner asks
    client_rule: ClientRule | None = None
    # what the strategy keeps per client (the rule's state; each client's momentum buffers
    # under needs.momentum_per_client, which the executor reads and writes in place)
    client_state: ClientState = field(default_factory=ClientState)

    def __post_init__(self) -> None:
        # the simulator calls these once per event: bind the parts' methods directly
        # (one Python call instead of two); a subclass that overrides one keeps it
        for name, part in (("plan", self.planner), ("on_arrival", self.trigger)):
            if getattr(type(self), name) is getattr(Strategy, name):
                setattr(self, name, getattr(part, name))
        # a task lost when its device went offline (population availability): the trigger's
        # to handle (a trigger without on_lost cannot run on a fleet with availability)
        lost = getattr(self.trigger, "on_lost", None)
        if lost is not None:
            self.on_lost: Callable[[Context, Task], None] = lost
        # the state hooks of the planner and the client rule (None: no part keeps state the
        # simulator must tell it of); the rule's terms are part of what the executor needs
        dispatch = [f for f in (getattr(self.planner, "on_dispatch", None),) if f is not None]
        commit = [f for f in (getattr(self.planner, "on_commit", None),) if f is not None]
        rule = self.client_rule
        state = getattr(rule, "state", None)
        if isinstance(state, ClientState):  # one per-client store per strategy
            self.client_state = state
        if rule is not None:
            dispatch.insert(0, self._attach_down)
            commit.append(rule.on_commit)
            if self.needs.terms != rule.terms:
                self.needs = replace(self.needs, terms=rule.terms)
        self.on_dispatch: Callable[[Task], None] | None = _chain(dispatch)
        self.on_commit: Callable[[Sequence[Contribution]], None] | None = _chain(commit)

    def _attach_down(self, task: Task) -> None:
        """Task.down: what the client rule sends with the task, fixed at dispatch."""
        assert self.client_rule is not None
        task.down = self.client_rule.down(task)

    def plan(self, ctx: Context, client: int) -> tuple[TaskPlan, TaskCost]:
        return self.planner.plan(ctx, client)

    def on_start(self, ctx: Context) -> None:
        self.trigger.on_start(ctx)

    def on_arrival(self, ctx: Context, contribution: Contribution) -> None:
        self.trigger.on_arrival(ctx, contribution)

    def on_timer(self, ctx: Context, tag: Any) -> None:
        self.trigger.on_timer(ctx, tag)

    def aggregate(self, ctx: Context, contributions: Sequence[Contribution]) -> ModelVersion:
        return self.aggregator.aggregate(ctx, ctx.model, contributions)


def _chain(hooks: list[Callable[[Any], None]]) -> Callable[[Any], None] | None:
    """One hook calling ``hooks`` in order (the single one itself; None for none)."""
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]

    def call(arg: Any) -> None:
        for f in hooks:
            f(arg)

    return call


@dataclass(frozen=True)
class BuildInfo:
    """What strategy builders need to know about the experiment."""

    client_sizes: np.ndarray
    layer_fwd_flops: tuple[float, ...]  # per sample, input side first
    layer_bwd_flops: tuple[float, ...]
    model_bytes: int
    model: Any = None  # the initial model (SALF: state-dict tensors, HeteroFL slicing)
    layers: tuple[Any, ...] = ()  # fedclock.models.layer_view(model)
    population: Population | None = None  # SALF's deadline scenario: exact p_l
    train: tuple[Any, Any] | None = None  # the training inputs and labels (CIS: σ_e)
    # each client's indices into ``train`` (PruneFL's initial pruning at one client)
    client_indices: tuple[Any, ...] = ()
