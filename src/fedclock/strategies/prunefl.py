"""PruneFL (Jiang et al., "Model pruning enables efficient federated learning on edge devices",
IEEE TNNLS 2022; arXiv 1909.12326): FedAvg's synchronous rounds on a pruned model whose mask
is reconfigured every ΔR rounds (docs/methods/prunefl.md).

- :func:`release` — the in-use weights of smallest magnitude reconsidered at a
  reconfiguration (the rest are kept);
- :func:`reconfigure` — the adaptive pruning rule: the set M maximising the approximate
  risk reduction per unit of round time, Σ_{j∈M} Z_j / (c + Σ_{j∈M} t_j), over the
  supersets of the kept weights, by adding candidates in decreasing order of Z_j / t_j
  while that ratio exceeds the objective's current value;
- :func:`element_times` — t_j and c from fedclock's cost model (the round's bottleneck
  client: FLOPs at its speed, bytes over its links);
- :func:`initial_pruning` — the initial pruning on one client's data, with its stopping rule;
- :class:`PruneFLState`, :class:`MaskPlanner`, :class:`PruneFLUpdate`,
  :class:`PruneFLRounds` and :func:`build_prunefl`: the strategy.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from fedclock.devices.cost import TaskCost
from fedclock.devices.population import Population
from fedclock.models.shapes import FULL, Layout, Mask, build_units
from fedclock.rng import stream
from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, ModelVersion, TaskPlan
from fedclock.strategies.aggregators import Importance, Update
from fedclock.strategies.triggers import SyncRounds

if TYPE_CHECKING:
    from fedclock.config import ExperimentConfig
    from fedclock.strategies.base import BuildInfo, Strategy

log = logging.getLogger(__name__)

#: the initial pruning stops once this many successive reconfigurations each changed the
#: density by at most ``initial_threshold`` (the authors' code)
INITIAL_PATIENCE = 5
#: the initial pruning reconfigures once the training accuracy on its data reaches this
#: multiple of chance, 1/classes (the authors' code: ADJ_THR_FACTOR = 1.5)
INITIAL_ACCURACY_FACTOR = 1.5
#: the timer tag at which the initially pruned model reaches the server
INITIAL_TAG = "prunefl-initial"


def prunable(shapes: Mapping[str, tuple[int, ...]]) -> list[str]:
    """The tensors PruneFL prunes: the weights (≥ 2 dims); biases always stay."""
    return [n for n, s in shapes.items() if len(s) >= 2]


def release(theta: torch.Tensor, in_use: torch.Tensor, fraction: float) -> torch.Tensor:
    """The ⌊fraction · |in use|⌋ in-use elements of smallest |θ| (ties: the lower flat index
    first): they join the candidates of a reconfiguration; the other in-use ones are kept."""
    flat_use = in_use.reshape(-1)
    idx = torch.nonzero(flat_use).flatten()
    k = math.floor(fraction * idx.numel())
    out = torch.zeros_like(flat_use)
    if k > 0:
        mag = theta.detach().reshape(-1)[idx].abs().cpu()
        order = torch.argsort(mag, stable=True)[:k]
        out[idx[order]] = True
    return out.reshape(in_use.shape)


def reconfigure(
    importance: np.ndarray,
    cost: np.ndarray,
    keep: np.ndarray,
    candidates: np.ndarray,
    *,
    fixed_importance: float = 0.0,
    fixed_time: float = 0.0,
) -> np.ndarray:
    """PruneFL's adaptive pruning over flat arrays of the prunable elements: Z_j (the
    accumulated squared gradients), t_j (the round time each element adds), the elements
    always kept and the candidates. Maximises

        Σ_{j∈M} Z_j / (c + Σ_{j∈M} t_j)     over M ⊇ keep, M ⊆ keep ∪ candidates

    (Z and c include the parts never pruned: ``fixed_importance``, ``fixed_time``): the
    candidates in decreasing order of Z_j / t_j (ties: lower index first) join while
    Z_j / t_j exceeds the objective's current value — once one does not, none after it can
    (the ratios only decrease while the objective only grows). Returns the new mask."""
    num = float(fixed_importance + importance[keep].sum())
    den = float(fixed_time + cost[keep].sum())
    idx = np.flatnonzero(candidates & ~keep)
    ratio = importance[idx] / cost[idx]
    order = np.argsort(-ratio, kind="stable")
    idx, ratio = idx[order], ratio[order]
    before_z = np.concatenate(([0.0], np.cumsum(importance[idx])[:-1]))
    before_t = np.concatenate(([0.0], np.cumsum(cost[idx])[:-1]))
    # Z_k / t_k > (num + Σ_{<k} Z) / (den + Σ_{<k} t), multiplied out (den may be 0)
    joins = ratio * (den + before_t) > num + before_z
    if den <= 0.0 and len(joins):
        joins[0] = True  # an empty model: the first candidate defines the objective
    n = len(joins) if joins.all() else int(np.argmin(joins))
    out = keep.copy()
    out[idx[:n]] = True
    return out


def element_times(
    layout: Layout,
    population: Population,
    samples: Sequence[int],
    masks: Mapping[str, torch.Tensor],
) -> tuple[dict[str, float], float, int]:
    """The round-time model PruneFL's rule needs, T(M) = c + Σ_{j∈M} t_j, from fedclock's cost
    model (``Mask.cost``: FLOPs at the device speed, bytes over its links): for the
    bottleneck client b — the one whose task under ``masks`` takes longest (nominal speed:
    it closes a synchronous round) — t_j per element of each prunable tensor and c, the
    time of its task with every prunable element pruned. Returns ({tensor: t_j}, c, b)."""
    names = prunable(layout.param_shapes)
    current = Mask(dict(masks))
    durations = [
        population.nominal_timing(i, current.cost(layout, int(s))).duration
        for i, s in enumerate(samples)
    ]
    b = int(np.argmax(durations))
    empty = {n: torch.zeros(layout.param_shapes[n], dtype=torch.bool) for n in names}

    def duration(m: dict[str, torch.Tensor]) -> float:
        return population.nominal_timing(b, Mask(m).cost(layout, int(samples[b]))).duration

    c = duration(empty)
    per: dict[str, float] = {}
    for n in names:
        full = dict(empty)
        full[n] = torch.ones(layout.param_shapes[n], dtype=torch.bool)
        per[n] = (duration(full) - c) / math.prod(layout.param_shapes[n])
    return per, c, b


def adapt(
    theta: Mapping[str, torch.Tensor],
    masks: Mapping[str, torch.Tensor],
    importance: Mapping[str, torch.Tensor],
    times: dict[str, float],
    fixed_time: float,
    fraction: float,
) -> dict[str, torch.Tensor]:
    """One reconfiguration of every prunable tensor (:func:`release` then :func:`reconfigure`
    over all of them at once); ``importance`` holds Z for every parameter tensor."""
    names = list(times)
    keep, cand, z, t = [], [], [], []
    for n in names:
        use = masks[n]
        freed = release(theta[n], use, fraction)
        keep.append((use & ~freed).reshape(-1).numpy())
        cand.append((~use | freed).reshape(-1).numpy())
        z.append(importance[n].detach().reshape(-1).cpu().double().numpy())
        t.append(np.full(use.numel(), times[n]))
    fixed = float(sum(float(v.double().sum()) for n, v in importance.items() if n not in times))
    chosen = reconfigure(
        np.concatenate(z), np.concatenate(t), np.concatenate(keep), np.concatenate(cand),
        fixed_importance=fixed, fixed_time=fixed_time,
    )  # fmt: skip
    out: dict[str, torch.Tensor] = {}
    at = 0
    for n in names:
        size = masks[n].numel()
        out[n] = torch.from_numpy(chosen[at : at + size].copy()).reshape(masks[n].shape)
        at += size
    return out


def density(masks: Mapping[str, torch.Tensor], layout: Layout) -> float:
    return Mask(dict(masks)).density(layout)


@dataclass(frozen=True)
class InitialPruning:
    """The initial pruning's result: the pruned model θ (zero outside the masks), the masks,
    its rounds and SGD steps, the reconfigurations' densities and its virtual duration on the
    selected client."""

    params: dict[str, torch.Tensor]
    masks: dict[str, torch.Tensor]
    rounds: int
    steps: int
    densities: tuple[float, ...]
    duration: float
    client: int


# (over 80 lines: the initial pruning's loop of SGD rounds and reconfigurations and its
# stopping rule share their state: PruneFL's initial-pruning stage in one place)
def initial_pruning(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    indices: torch.Tensor,
    *,
    client: int,
    layout: Layout,
    population: Population,
    samples: Sequence[int],
    batch_size: int,
    lr: float,
    batches: int,
    interval: int,
    max_rounds: int,
    threshold: float,
    fraction: float,
    seed: int,
) -> InitialPruning:
    """PruneFL's initial pruning at one client (our reading of the paper's §IV and the
    authors' code): ``batches`` batches of the client's data (one shuffle, stream
    ``("prunefl-initial", client)``); each initial-pruning round one plain SGD step on each
    batch of the masked model, the squared gradients of every element accumulated. From
    the first round whose training accuracy on those batches reaches 1.5/classes, every
    ``interval`` rounds a reconfiguration (:func:`adapt`, the FL round's time model); it
    stops once :data:`INITIAL_PATIENCE` successive reconfigurations each changed the
    density by at most ``threshold`` (relative), or after ``max_rounds`` rounds. The time:
    the client downloads the model, computes every step on the mask then in force
    (sparse cost) and uploads the pruned model."""
    net = copy.deepcopy(model).to("cpu")
    net.train()
    params = dict(net.named_parameters())
    names = prunable(layout.param_shapes)
    masks = {n: torch.ones(layout.param_shapes[n], dtype=torch.bool) for n in names}
    n = int(indices.numel())
    order = torch.from_numpy(stream(seed, "prunefl-initial", client).permutation(n))
    b = min(batch_size, n)
    picks = [indices[order[(i * b) % n : (i * b) % n + b]] for i in range(batches)]
    data = [(x[p], y[p]) for p in picks]
    classes = int(y.max()) + 1
    z = {k: torch.zeros_like(p) for k, p in params.items()}
    flops = 0.0
    start: int | None = None
    densities: list[float] = []
    steady = 0
    rounds = 0
    for r in range(1, max_rounds + 1):
        rounds = r
        cost = Mask(dict(masks)).cost(layout, 1)
        for xb, yb in data:
            loss = F.cross_entropy(net(xb), yb)
            grads = torch.autograd.grad(loss, list(params.values()))
            with torch.no_grad():
                for (k, p), g in zip(params.items(), grads, strict=True):
                    z[k].addcmul_(g, g)
                    p.sub_(lr * g)
                    if k in masks:
                        p.mul_(masks[k])
            flops += cost.flops * len(yb)
        if start is None:
            with torch.no_grad():
                hit = sum(int((net(xb).argmax(1) == yb).sum()) for xb, yb in data)
            if hit / sum(len(yb) for _, yb in data) >= INITIAL_ACCURACY_FACTOR / classes:
                start = r
        if start is None or (r - start) % interval:
            continue
        times, fixed, _ = element_times(layout, population, samples, masks)
        theta = {k: p.detach() for k, p in params.items()}
        masks = adapt(theta, masks, z, times, fixed, fraction)
        with torch.no_grad():
            for k, m in masks.items():
                params[k].mul_(m)
        z = {k: torch.zeros_like(p) for k, p in params.items()}
        d = density(masks, layout)
        if densities and abs(d / densities[-1] - 1.0) <= threshold:
            steady += 1
        else:
            steady = 0
        densities.append(d)
        if steady >= INITIAL_PATIENCE:
            break
    final = Mask(dict(masks)).cost(layout, 0)
    duration = population.nominal_timing(
        client, TaskCost(flops=flops, bytes_down=layout.model_bytes, bytes_up=final.bytes_up)
    ).duration
    theta = {k: p.detach().clone() for k, p in params.items()}
    return InitialPruning(
        theta, masks, rounds, rounds * len(data), tuple(densities), duration, client
    )


# ------------------------------------------------------------------ the strategy's parts
class PruneFLState:
    """What PruneFL keeps between rounds: the mask of every prunable tensor, the accumulated
    squared gradients Z since the last reconfiguration, the FL rounds aggregated, whether the
    initially pruned model has reached the server, and the reconfigurations' densities.

    Its planner (:class:`MaskPlanner`) owns it: the state changes only in the planner's
    ``on_commit``. The update (:class:`PruneFLUpdate`) reads it and, in a reconfiguration
    round, computes the new mask without changing anything but ``pending``, which hands that
    mask to the planner's ``on_commit`` of the same commit (set and consumed inside one
    server step, so never held between events, where checkpoints are taken)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = (
        "masks", "importance", "rounds", "started", "generation", "densities",
    )  # fmt: skip

    def __init__(
        self,
        *,
        masks: dict[str, torch.Tensor],
        layout: Layout,
        interval: int,
        fraction: float,
        samples: Sequence[int],
        started: bool,
    ) -> None:
        self.masks = masks
        self.layout = layout
        self.interval = interval
        self.fraction = fraction
        self.samples = list(samples)
        self.importance: dict[str, torch.Tensor] = {}
        self.rounds = 0
        self.started = started
        self.generation = 0  # reconfigurations so far
        self.densities: list[float] = [density(masks, layout)]
        self._shapes: dict[tuple[int, bool], Mask] = {}
        self.pending: dict[str, torch.Tensor] | None = None  # the commit in progress's mask

    def reporting(self) -> bool:
        """Whether the round now being planned ends in a reconfiguration: its clients upload
        their squared gradients."""
        return (self.rounds + 1) % self.interval == 0

    def shape(self, reports: bool) -> Mask:
        key = (self.generation, reports)
        got = self._shapes.get(key)
        if got is None:
            if len(self._shapes) > 4:
                self._shapes.clear()
            got = self._shapes[key] = Mask(dict(self.masks), reports=reports)
        return got

    def importance_after(self, contributions: Sequence[Contribution]) -> dict[str, torch.Tensor]:
        """Z + Σ_i Σ_k g_{i,k,j}² over the round's updates (every element), as new tensors."""
        z = dict(self.importance)
        for c in contributions:
            for n, g in c.up.get("sq_grads", {}).items():
                g64 = g.detach().to("cpu", torch.float64)
                acc = z.get(n)
                z[n] = g64.clone() if acc is None else acc + g64
        return z

    def adapted(
        self, params: Mapping[str, torch.Tensor], population: Population,
        importance: Mapping[str, torch.Tensor],
    ) -> dict[str, torch.Tensor]:  # fmt: skip
        """The mask a reconfiguration chooses from ``params`` and the importance Z (nothing
        changes here)."""
        times, fixed, _ = element_times(self.layout, population, self.samples, self.masks)
        z = {
            n: importance.get(n, torch.zeros(s, dtype=torch.float64))
            for n, s in self.layout.param_shapes.items()
        }
        return adapt(params, self.masks, z, times, fixed, self.fraction)

    def commit(self, contributions: Sequence[Contribution]) -> None:
        """The state after a server step (the planner's ``on_commit``): the initially pruned
        model's arrival, or Z += the round's squared gradients and one more round — and in a
        reconfiguration round the new mask (``pending``), Z reset."""
        if not self.started:
            self.started = True
            return
        self.importance = self.importance_after(contributions)
        self.rounds += 1
        if self.pending is not None:
            self.masks.clear()
            self.masks.update(self.pending)
            self.pending = None
            self.importance = {}
            self.generation += 1
            self.densities.append(density(self.masks, self.layout))


class MaskPlanner:
    """Every participant trains the current pruned model (``Mask``) on its full local task;
    in a reconfiguration round the task also uploads its squared gradients."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (the state is PruneFLState's)

    def __init__(self, state: PruneFLState, full_plans: Sequence[TaskPlan]) -> None:
        self.state = state
        self.full_plans = list(full_plans)

    def nominal(self, client: int) -> tuple[TaskPlan, TaskCost]:
        plan = self.full_plans[client]
        return plan, FULL.cost(self.state.layout, plan.samples)

    def plan(self, ctx: Context | None, client: int) -> tuple[TaskPlan, TaskCost]:
        shape = self.state.shape(self.state.reporting())
        plan = replace(self.full_plans[client], shape=shape)
        return plan, shape.cost(self.state.layout, plan.samples)

    def on_commit(self, contributions: Sequence[Contribution]) -> None:
        """PruneFL's state moves on after each server step (:meth:`PruneFLState.commit`)."""
        self.state.commit(contributions)


class PruneFLUpdate:
    """FedAvg's update on the pruned model (Δ is 0 outside the mask), then θ ⊙ m; every
    ΔR rounds the squared gradients accumulated since the last reconfiguration choose the
    new mask (:meth:`PruneFLState.adapted`) and θ ← θ ⊙ m_new (regrown weights start at
    0). The first commit of a run with initial pruning is the initially pruned model. It
    changes no state: the planner's ``on_commit`` takes the new mask from ``pending``."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, state: PruneFLState, update: Update, initial: dict[str, torch.Tensor] | None
    ) -> None:
        self.state = state
        self.update = update
        self.initial = initial

    def aggregate(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> ModelVersion:
        st = self.state
        if not st.started:  # (the planner's on_commit records its arrival)
            assert self.initial is not None
            params = {n: self.initial[n].to(t.device, t.dtype) for n, t in base.params.items()}
            return ModelVersion(base.version + 1, params, dict(base.buffers))
        new = self.update.aggregate(ctx, base, contributions)
        masks: Mapping[str, torch.Tensor] = st.masks
        if (st.rounds + 1) % st.interval == 0:  # this step ends in a reconfiguration
            masks = st.pending = st.adapted(
                new.params, ctx.population, st.importance_after(contributions)
            )
        params = dict(new.params)
        for n, m in masks.items():
            params[n] = params[n] * m.to(params[n].device)
        return ModelVersion(new.version, params, new.buffers)


class PruneFLRounds(SyncRounds):
    """FedAvg's barrier rounds, after the initial pruning: the selected client's work takes
    ``initial_time`` virtual seconds, then its pruned model is committed and round 1 starts."""

    # its initial pruning and reconfiguration rounds assume every participant reports:
    # devices that go offline are not handled (a run on such a trace is refused)
    on_lost = None  # type: ignore[assignment]

    def __init__(self, *, client_fraction: float, initial_time: float | None) -> None:
        super().__init__(client_fraction=client_fraction)
        self.initial_time = initial_time

    def on_start(self, ctx: Context) -> None:
        if self.initial_time is None:
            self._start_round(ctx)
        else:
            ctx.set_timer(ctx.now + self.initial_time, INITIAL_TAG)

    def on_timer(self, ctx: Context, tag: Any) -> None:
        if tag == INITIAL_TAG:
            ctx.commit([])
            if not ctx.stopping:
                self._start_round(ctx)
            return
        super().on_timer(ctx, tag)


def _fastest(population: Population, samples: Sequence[int], layout: Layout) -> int:
    """The client whose full task is quickest (nominal; ties: the lowest index)."""
    d = [population.nominal_timing(i, FULL.cost(layout, int(s))).duration
         for i, s in enumerate(samples)]  # fmt: skip
    return int(np.argmin(d))


def build_prunefl(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    from fedclock.config import PruneFLOptions
    from fedclock.errors import ConfigError
    from fedclock.strategies.base import Strategy
    from fedclock.strategies.planners import local_sgd_plan
    from fedclock.strategies.server import server_optimizer
    from fedclock.train.local import Needs

    s = cfg.strategy
    assert isinstance(s, PruneFLOptions)
    if info.model is None or info.population is None:
        raise ConfigError("Strategy 'prunefl' needs the model and the population in BuildInfo.")
    units = build_units(info.model, info.layers, "paper")
    layout = Layout.of(info.model, units, info.model_bytes)
    names = prunable(layout.param_shapes)
    if not names:
        raise ConfigError("Strategy 'prunefl' needs a model with weight tensors to prune.")
    t = cfg.train
    full_plans = [
        local_sgd_plan(int(n), t.batch_size, local_epochs=t.local_epochs, local_steps=t.local_steps)
        for n in info.client_sizes
    ]
    samples = [p.samples for p in full_plans]
    masks = {n: torch.ones(layout.param_shapes[n], dtype=torch.bool) for n in names}
    initial: InitialPruning | None = None
    if s.initial_pruning:
        if info.train is None or not info.client_indices:
            raise ConfigError("Strategy 'prunefl' needs the clients' data in BuildInfo.")
        client = s.initial_client
        if client is None:
            client = _fastest(info.population, samples, layout)
        elif client >= len(info.client_sizes):
            raise ConfigError(
                f"strategy.initial_client = {client} is not a client (0..{len(samples) - 1})."
            )
        x, y = info.train
        log.info(
            "prunefl: initial pruning at client %d before the first round (up to %d rounds of "
            "%d batches on the host)",
            client,
            s.initial_max_rounds,
            s.initial_batches,
        )  # minutes on a large model; shown with fedclock -v (fedclock.logs)
        initial = initial_pruning(
            info.model, x, y, info.client_indices[client], client=client, layout=layout,
            population=info.population, samples=samples, batch_size=t.batch_size, lr=t.lr,
            batches=s.initial_batches, interval=s.initial_interval,
            max_rounds=s.initial_max_rounds, threshold=s.initial_threshold,
            fraction=s.release, seed=cfg.seed,
        )  # fmt: skip
        masks = {n: m.clone() for n, m in initial.masks.items()}
    state = PruneFLState(
        masks=masks, layout=layout, interval=s.reconfig_interval, fraction=s.release,
        samples=samples, started=initial is None,
    )  # fmt: skip
    update = Update(Importance(s.weights), server=server_optimizer(s, lr=s.server_lr))
    summary: dict[str, Any] = {}
    if initial is not None:
        summary = {
            "prunefl_initial_client": initial.client,
            "prunefl_initial_rounds": initial.rounds,
            "prunefl_initial_seconds": initial.duration,
            "prunefl_initial_density": state.densities[0],
        }
    return Strategy(
        name="prunefl",
        planner=MaskPlanner(state, full_plans),
        trigger=PruneFLRounds(
            client_fraction=s.client_fraction,
            initial_time=None if initial is None else initial.duration,
        ),
        aggregator=PruneFLUpdate(state, update, None if initial is None else initial.params),
        needs=Needs(shapes=frozenset({Mask}), layout=layout, synchronous=True),
        summary=summary,
    )


__all__ = [
    "InitialPruning",
    "MaskPlanner",
    "PruneFLRounds",
    "PruneFLState",
    "PruneFLUpdate",
    "adapt",
    "build_prunefl",
    "element_times",
    "initial_pruning",
    "reconfigure",
    "release",
]
