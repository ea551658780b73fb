"""RAM-Fed (Wang et al., "Theoretical convergence guaranteed resource-adaptive federated
learning with mixed heterogeneity", KDD 2023; Fed-RAA's baseline [13]): synchronous rounds
in which every client trains a submodel of neurons sized to its computing resources.

The paper's full text was not reachable; this is our reading of its abstract and of
Fed-RAA's description (docs/methods/ram-fed.md, which numbers the equations cited here):

- :func:`submodel_counts` — eq. 1: client i's submodel is the largest one whose FLOPs are
  at most s_i / max_j s_j of the full model's (s the device's speed), so every client's
  compute takes about as long as the fastest device's full task;
- :class:`SubmodelWork` — eq. 2: each round client i keeps k_l of the C_l units of every
  hidden layer l, drawn uniformly without replacement (``random``: "arbitrarily assigned
  neurons"), the first k_l (``static``: HeteroFL's prefix) or a window of k_l units that
  rolls one index per round (``rolling``: FedRolex, Alam et al. 2022), as a
  :class:`~fedclock.models.shapes.Neurons` task (a :data:`FULL` one when it keeps all);
- :class:`ClientShare` — ω_i = p_i, the client's importance over the whole population;
- :class:`MemoryAverage` — eq. 3–4 (``memory``, RAM-Fed): the server keeps each client's
  latest update of every element and steps with Σ_i p_i G_i over all clients;
- :class:`CoverageAverage` — eq. 5 (``coverage``, RA-Fed): each element's update averaged
  over the clients that trained it this round, weights p_i.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from fedclock.devices.cost import TaskCost
from fedclock.models.early_exit import EarlyExitNet
from fedclock.models.shapes import (
    FULL,
    Layout,
    Neurons,
    WorkShape,
    build_units,
    hidden_widths,
    masked_cost,
    neuron_masks,
)
from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, ModelVersion, Params, TaskPlan
from fedclock.strategies.aggregators import (
    Target,
    Update,
    client_importance,
    coverage_average,
    covers_on,
    keep_buffers,
)
from fedclock.strategies.base import Work

log = logging.getLogger(__name__)

EXTRACTIONS = ("random", "static", "rolling")
AGGREGATIONS = ("memory", "coverage")


# --------------------------------------------------------------------- eq. 1: the sizes
def counts_at(q: int, widths: Sequence[int]) -> tuple[int, ...]:
    """k_l = ⌈q·C_l / C_max⌉ units of every hidden layer l (C_max the widest): the rate
    q / C_max in integer arithmetic (q = C_max keeps every unit)."""
    top = max(widths)
    return tuple(-(-q * c // top) for c in widths)


def prefix_keep(counts: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(range(k)) for k in counts)


def rolling_keep(
    r: int, counts: Sequence[int], widths: Sequence[int]
) -> tuple[tuple[int, ...], ...]:
    """FedRolex's rolling window (Alam et al. 2022, §3): in round r a client keeping k_l of
    the C_l units of layer l trains units (r + i) mod C_l, i = 0..k_l − 1 (sorted), so the
    window moves one index per round and every unit is trained by every client size."""
    return tuple(
        tuple(sorted((r + i) % c for i in range(k))) for c, k in zip(widths, counts, strict=True)
    )


def submodel_counts(layout: Layout, shares: Sequence[float]) -> list[tuple[int, ...]]:
    """Eq. 1: for each compute share σ_i = s_i / max_j s_j, the units k_l per hidden layer of
    the largest submodel (rate q / C_max, q = 1..C_max) whose FLOPs per sample are at most
    σ_i times the full model's; the smallest (q = 1) when none is (one unit of the widest
    layer: a device too slow for any submodel still trains the least one)."""
    widths = hidden_widths(layout.param_shapes)
    top = max(widths)
    full = masked_cost(layout, neuron_masks(layout.param_shapes, prefix_keep(widths)), 1).flops
    flops: dict[int, float] = {}

    def cost(q: int) -> float:
        if q not in flops:
            keep = prefix_keep(counts_at(q, widths))
            flops[q] = masked_cost(layout, neuron_masks(layout.param_shapes, keep), 1).flops
        return flops[q]

    out = []
    for share in shares:
        limit = share * full * (1.0 + 1e-12)  # (a share of 1 keeps every unit)
        lo, hi = 1, top  # the largest q with cost(q) ≤ limit, or 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cost(mid) <= limit:
                lo = mid
            else:
                hi = mid - 1
        out.append(counts_at(lo, widths))
    return out


# --------------------------------------------------------------------- eq. 2: the submodels
class SubmodelWork:
    """The rounds' work (a :class:`~fedclock.strategies.base.RoundWork`): client i keeps
    ``counts[i]`` units of every hidden layer — a fresh uniform draw each round from the
    stream ``("submodel", round, client)`` (``random``) or the first ones (``static``) — and
    trains that :class:`Neurons` submodel; a client that keeps every unit trains the full
    model. A task's cost depends only on the counts (:func:`masked_cost`)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (_costs is a cache)

    def __init__(
        self,
        *,
        full_plans: Sequence[TaskPlan],
        layout: Layout,
        counts: Sequence[tuple[int, ...]],
        extraction: str = "random",
    ) -> None:
        if extraction not in EXTRACTIONS:
            raise ValueError(
                f"unknown extraction {extraction!r}; allowed: {', '.join(EXTRACTIONS)}"
            )
        self.full_plans, self.layout, self.extraction = full_plans, layout, extraction
        self.widths = hidden_widths(layout.param_shapes)
        self.counts = [tuple(int(k) for k in c) for c in counts]
        self._costs: dict[int, TaskCost] = {}

    def is_full(self, client: int) -> bool:
        return self.counts[client] == self.widths

    def nominal(self, client: int) -> tuple[TaskPlan, TaskCost]:
        """The full model's task (the deadline check, clients.csv)."""
        full = self.full_plans[client]
        return full, FULL.cost(self.layout, full.samples)

    def plan(self, ctx: Context | None, client: int) -> tuple[TaskPlan, TaskCost]:
        return self.nominal(client)  # a round's work comes from assign()

    def keep(self, ctx: Context, r: int, client: int) -> tuple[tuple[int, ...], ...]:
        """Eq. 2: the units client ``client`` keeps in round ``r``."""
        counts = self.counts[client]
        if self.extraction == "static":
            return prefix_keep(counts)
        if self.extraction == "rolling":  # FedRolex: units r, r+1, …, r+k−1 (mod C) in round r
            return rolling_keep(r, counts, self.widths)
        rng = ctx.rng("submodel", r, client)
        return tuple(
            tuple(int(u) for u in np.sort(rng.choice(c, size=k, replace=False)))
            for c, k in zip(self.widths, counts, strict=True)
        )

    def shape(self, ctx: Context, r: int, client: int) -> WorkShape:
        return FULL if self.is_full(client) else Neurons(self.keep(ctx, r, client))

    def cost(self, client: int) -> TaskCost:
        got = self._costs.get(client)
        if got is None:
            plan = self.full_plans[client]
            static = FULL if self.is_full(client) else Neurons(prefix_keep(self.counts[client]))
            got = self._costs[client] = static.cost(self.layout, plan.samples)
        return got

    def assign(self, ctx: Context, r: int, clients: np.ndarray) -> list[Work]:
        out = []
        for c in clients:
            c = int(c)
            plan = replace(self.full_plans[c], shape=self.shape(ctx, r, c))
            out.append(Work(plan, self.cost(c)))
        return out


# --------------------------------------------------------------------- eq. 3–5: the update
class ClientShare:
    """ω_i = p_i, client i's importance over the whole population (n_i / n, or 1/N): the
    weight its update (or its memory) carries, whoever else committed."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, p: np.ndarray) -> None:
        self.p = np.asarray(p, dtype=np.float64)

    def __call__(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> np.ndarray:
        return self.p[[c.client for c in contributions]]


class MemoryAverage:
    """Eq. 3–4, RAM-Fed as we read it: the server keeps G_i, client i's latest update of
    every element (eq. 3: G_i ← Δ_i where its round's submodel covers the element, else
    unchanged; 0 before its first), and the round's update is Σ_i p_i G_i over every client
    of the population (eq. 4), so each element moves by every client's data, an element a
    client did not train this round by that client's latest update of it. ``p``: the
    clients' importance (summing to 1)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ("memory",)

    def __init__(self, p: np.ndarray) -> None:
        self.p = np.asarray(p, dtype=np.float64)
        self.memory: dict[int, dict[str, torch.Tensor]] = {}  # client → G_i

    def __call__(
        self, base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray,
        target: Target,
    ) -> Params:  # fmt: skip
        # eq. 4 weights every client's memory, committed this round or not, by its p_i: a
        # per-contribution ω cannot say that, so the only ω it takes is p_i itself
        # (ClientShare's); any other weighting would be silently ignored, and is refused
        if not np.array_equal(
            np.asarray(w, dtype=np.float64), self.p[[c.client for c in contributions]]
        ):
            raise ValueError(
                "MemoryAverage weights each client's latest update by its own importance p_i "
                "(RAM-Fed eq. 4); it takes only ClientShare's weighting, not another ω"
            )
        for c in contributions:  # eq. 3
            old = self.memory.get(c.client)
            g: dict[str, torch.Tensor] = {}
            for name, theta in base.params.items():
                cover, d = covers_on(c, name, theta), c.delta[name]
                prev = torch.zeros_like(theta) if old is None else old[name]
                if isinstance(cover, torch.Tensor):
                    g[name] = torch.where(cover, d, prev)
                else:
                    g[name] = d.clone() if cover else prev
            self.memory[c.client] = g
        update: Params = {}
        for name, theta in base.params.items():  # eq. 4, clients in index order
            acc = torch.zeros_like(theta)
            for client in sorted(self.memory):
                acc.add_(self.memory[client][name], alpha=float(self.p[client]))
            update[name] = acc
        return update


# --------------------------------------------------------------------- the strategy
def refusal(model: nn.Module) -> str | None:
    """Why RAM-Fed cannot split ``model`` into neuron submodels, or None."""
    if isinstance(model, EarlyExitNet):
        return "splits single-exit models only (not early-exit networks)"
    if any(True for _ in model.buffers()):
        return "supports models without BatchNorm buffers (mlp, cnn) only"
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    if any(not isinstance(m, nn.Linear | nn.Conv2d) for m in owners):
        return "splits models of Linear and Conv2d layers only (mlp, cnn, fraboni_cnn)"
    if len(owners) < 2:
        return "needs a model with a hidden layer (mlp with hidden widths, cnn)"
    return None


def build_ramfed(cfg: Any, info: Any) -> Any:
    """RAM-Fed: :class:`SubmodelWork` (eq. 1–2) × barrier rounds over a fraction C of the
    clients × an :class:`Update` with :class:`ClientShare` and eq. 4 (``memory``) or eq. 5
    (``coverage``), then the server step. ``fedrolex`` is the same with the rolling window
    and the coverage average (FedRolex, docs/methods/fedrolex.md)."""
    from fedclock.errors import ConfigError
    from fedclock.strategies.base import Strategy
    from fedclock.strategies.planners import local_sgd_plan
    from fedclock.strategies.server import server_optimizer
    from fedclock.strategies.triggers import SyncRounds
    from fedclock.train.local import Needs

    s = cfg.strategy
    if info.model is None or info.population is None:
        raise ConfigError(f"Strategy '{s.name}' needs the model and the population in BuildInfo.")
    why = refusal(info.model)
    if why is not None:
        raise ConfigError(f"Strategy '{s.name}' {why}.")
    units = build_units(info.model, info.layers, "paper")
    layout = Layout.of(info.model, units, info.model_bytes)
    t = cfg.train
    full_plans = [
        local_sgd_plan(int(n), t.batch_size, local_epochs=t.local_epochs, local_steps=t.local_steps)
        for n in info.client_sizes
    ]
    speed = np.asarray(info.population.speed, dtype=np.float64)
    counts = submodel_counts(layout, (speed / speed.max()).tolist())
    log.info(
        "%s: submodel rates %s",
        s.name,
        sorted(set(rates(counts, hidden_widths(layout.param_shapes)))),
    )
    # FedRolex: the rolling window, each element averaged over the clients that trained it
    rolex = s.name == "fedrolex"
    extraction = "rolling" if rolex else s.extraction
    aggregation = "coverage" if rolex else s.aggregation
    work = SubmodelWork(full_plans=full_plans, layout=layout, counts=counts, extraction=extraction)
    p = client_importance([int(n) for n in info.client_sizes], s.weights)
    normaliser = MemoryAverage(p) if aggregation == "memory" else coverage_average
    aggregator = Update(
        ClientShare(p), normaliser=normaliser, buffers=keep_buffers,
        server=server_optimizer(s, lr=s.server_lr),
    )  # fmt: skip
    needs = Needs(shapes=frozenset({type(FULL), Neurons}), layout=layout, synchronous=True)
    return Strategy(
        name=s.name,
        planner=work,
        trigger=SyncRounds(client_fraction=s.client_fraction, work=work),
        aggregator=aggregator,
        needs=needs,
    )


def rates(counts: Sequence[tuple[int, ...]], widths: Sequence[int]) -> list[float]:
    """Each client's kept share of its widest hidden layer's units (for logs and docs)."""
    top = max(widths)
    i = list(widths).index(top)
    return [c[i] / top for c in counts]
