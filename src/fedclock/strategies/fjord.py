"""FjORD (Horváth et al., "FjORD: Fair and Accurate Federated Learning under heterogeneous
targets with Ordered Dropout", NeurIPS 2021): synchronous rounds in which every client
trains with ordered dropout up to the widest submodel its device affords.

- :func:`p_max_of` — §3.3: client i's p_max, the widest width of P whose FLOPs per sample
  are at most s_i / max_j s_j of the full model's (s the device's speed; our rule: the paper
  takes the device tiers as given);
- :class:`OrderedDropoutWork` — §3.1–3.2, Alg. 1 lines 4–8: at each local step the client
  draws p ~ U(P ∩ (0, p_max]) (the paper's uniform D_P) and trains the first ⌈p·K_l⌉ units
  of every hidden layer (:class:`~fedclock.models.shapes.OrderedDropout`); the draws are
  made when the task is dispatched, from the stream ``("fjord", round, client)``, so the
  task's cost follows the widths it trains;
- the update — Alg. 1 line 10 ("aggregate each nested slice over the clients that hold
  it"): each element's n_i-weighted average over the clients whose p_max submodel holds it
  (:func:`~fedclock.strategies.aggregators.coverage_average`), then the server step.

FjORD's self-distillation (§3.4, optional in the paper) is not implemented.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

from fedclock.devices.cost import TaskCost
from fedclock.models.shapes import FULL, Layout, OrderedDropout, build_units
from fedclock.sim.simulator import Context
from fedclock.sim.types import TaskPlan
from fedclock.strategies.base import Work

log = logging.getLogger(__name__)


def p_max_of(layout: Layout, widths: Sequence[float], shares: Sequence[float]) -> list[float]:
    """For each compute share σ_i = s_i / max_j s_j, the widest p of ``widths`` whose
    submodel's FLOPs per sample (:meth:`Layout.prefix_cost`) are at most σ_i times the full
    model's; the narrowest width when none is (a device too slow for any still trains it)."""
    full = layout.prefix_cost(1.0).flops
    flops = [layout.prefix_cost(p).flops for p in widths]
    out = []
    for share in shares:
        limit = share * full * (1.0 + 1e-12)  # (a share of 1 affords the full model)
        fits = [p for p, f in zip(widths, flops, strict=True) if f <= limit]
        out.append(fits[-1] if fits else widths[0])
    return out


class OrderedDropoutWork:
    """The rounds' work (a :class:`~fedclock.strategies.base.RoundWork`): client i trains
    :class:`OrderedDropout` ``(p_max[i], widths)`` with one width drawn per local step."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, *, full_plans: Sequence[TaskPlan], layout: Layout, p_max: Sequence[float],
        widths: Sequence[float],
    ) -> None:  # fmt: skip
        self.full_plans, self.layout = full_plans, layout
        self.widths = tuple(float(p) for p in widths)
        self.p_max = [float(p) for p in p_max]

    def nominal(self, client: int) -> tuple[TaskPlan, TaskCost]:
        """The full model's task (the deadline check, clients.csv)."""
        full = self.full_plans[client]
        return full, FULL.cost(self.layout, full.samples)

    def plan(self, ctx: Context | None, client: int) -> tuple[TaskPlan, TaskCost]:
        return self.nominal(client)  # a round's work comes from assign()

    def levels(self, ctx: Context, r: int, client: int) -> tuple[int, ...]:
        """Each local step's width (an index into ``widths``), uniform over those ≤ p_max."""
        top = self.widths.index(self.p_max[client])
        steps = self.full_plans[client].local_steps
        rng = ctx.rng("fjord", r, client)
        return tuple(int(v) for v in rng.integers(0, top + 1, size=steps))

    def assign(self, ctx: Context, r: int, clients: Any) -> list[Work]:
        out = []
        for c in clients:
            c = int(c)
            full = self.full_plans[c]
            shape = OrderedDropout(self.p_max[c], self.widths, self.levels(ctx, r, c))
            out.append(Work(replace(full, shape=shape), shape.cost(self.layout, full.samples)))
        return out


def build_fjord(cfg: Any, info: Any) -> Any:
    """FjORD: :class:`OrderedDropoutWork` × barrier rounds over a fraction C of the clients ×
    an :class:`Update` with FedAvg's n_i weights and the per-element
    :func:`coverage_average`, then the server step."""
    import numpy as np

    from fedclock.errors import ConfigError
    from fedclock.strategies.aggregators import Importance, Update, coverage_average, keep_buffers
    from fedclock.strategies.base import Strategy
    from fedclock.strategies.planners import local_sgd_plan
    from fedclock.strategies.ramfed import refusal
    from fedclock.strategies.server import server_optimizer
    from fedclock.strategies.triggers import SyncRounds
    from fedclock.train.local import Needs

    s = cfg.strategy
    if info.model is None or info.population is None:
        raise ConfigError(f"Strategy '{s.name}' needs the model and the population in BuildInfo.")
    why = refusal(info.model)
    if why is not None:
        raise ConfigError(f"Strategy '{s.name}' {why}.")
    layout = Layout.of(info.model, build_units(info.model, info.layers, "paper"), info.model_bytes)
    t = cfg.train
    full_plans = [
        local_sgd_plan(int(n), t.batch_size, local_epochs=t.local_epochs, local_steps=t.local_steps)
        for n in info.client_sizes
    ]
    speed = np.asarray(info.population.speed, dtype=np.float64)
    p_max = p_max_of(layout, s.widths, (speed / speed.max()).tolist())
    log.info("%s: p_max per client %s", s.name, sorted(set(p_max)))
    work = OrderedDropoutWork(full_plans=full_plans, layout=layout, p_max=p_max, widths=s.widths)
    aggregator = Update(
        Importance(s.weights), normaliser=coverage_average, buffers=keep_buffers,
        server=server_optimizer(s, lr=s.server_lr),
    )  # fmt: skip
    return Strategy(
        name=s.name,
        planner=work,
        trigger=SyncRounds(client_fraction=s.client_fraction, work=work),
        aggregator=aggregator,
        needs=Needs(shapes=frozenset({OrderedDropout}), layout=layout, synchronous=True),
    )
