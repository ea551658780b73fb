"""SALF (Lang et al., stragglers-aware layer-wise FL) and its four baselines.

See ``docs/methods/salf.md``. The pure math (eq. 8–10) comes first; then the
depth sources (straggler ratio, deadline), the aggregators (eq. 9, the
authors' divide-by-U rule, HeteroFL's per-element coverage average) and one
round-based trigger/planner that serves the five methods ``vanilla``,
``drop-stragglers``, ``salf``, ``heterofl`` and ``asyncfl``.

Depth convention (paper): layers 1..L, 1 = input side; a user of depth d
updates layers d..L; d = 1 is a full update, d = L+1 nothing. A "layer" is a
module with parameters in ``paper`` mode and one state-dict tensor in
``reference`` mode (the authors' code).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from fedclock.devices.cost import TaskCost
from fedclock.devices.population import Population
from fedclock.models.shapes import (
    FULL,
    Layout,
    Suffix,
    Units,
    Width,
    build_units,
)
from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, ModelVersion, Params, Task, TaskPlan
from fedclock.train.local import Needs

log = logging.getLogger(__name__)

METHODS = ("vanilla", "drop-stragglers", "salf", "heterofl", "asyncfl")


# --------------------------------------------------------------------- pure math
def update_sets(depths: Sequence[int], num_layers: int) -> list[list[int]]:
    """U^l = {u : d_u ≤ l} for l = 1..L (eq. 8), as lists of user positions."""
    return [[u for u, d in enumerate(depths) if d <= layer] for layer in range(1, num_layers + 1)]


def p_eq10(layer: int, num_layers: int, num_users: int) -> float:
    """p_l = (1 − l/(L+1))^U (eq. 10): P(|U^l| = 0) under AS4."""
    return (1.0 - layer / (num_layers + 1)) ** num_users


def p_exact_ratio(
    layer: int, num_layers: int, num_users: int, num_stragglers: int, *, reference: bool = False
) -> float:
    """P(|U^l| = 0) when ``num_stragglers`` of ``num_users`` straggle with uniform depth.

    Non-stragglers have depth 1 (so U^l is never empty if there is one). A
    straggler's depth is uniform on {1..L+1} (paper) or {1..L} (reference).
    With every user a straggler (paper) this is eq. 10.
    """
    if num_stragglers < num_users:
        return 0.0
    top = num_layers if reference else num_layers + 1
    return max(0.0, 1.0 - layer / top) ** num_stragglers


def slowdown_survival(x: float, kind: str, sigma: float) -> float:
    """P(s > x) for the population's per-task compute slowdown s (``Population.slowdown``).

    none: s = 1; lognormal: s = exp(σZ − σ²/2), so P(s > x) = ½·erfc((ln x + σ²/2)/(σ√2));
    exponential: s ~ Exp(1), so P(s > x) = e^(−x). s > 0, so P(s > x) = 1 for x ≤ 0.
    """
    if x <= 0.0:
        return 1.0
    if math.isinf(x):
        return 0.0
    if kind == "none" or (kind == "lognormal" and sigma <= 0.0):  # s = 1 exactly
        return 0.0 if x >= 1.0 else 1.0
    if kind == "lognormal":
        return 0.5 * math.erfc((math.log(x) + 0.5 * sigma * sigma) / (sigma * math.sqrt(2.0)))
    if kind == "exponential":
        return math.exp(-x)
    raise ValueError(f"unknown slowdown kind {kind!r}")


def p_exact_deadline(
    *,
    t_max: float,
    speed: Sequence[float],
    up_bandwidth: Sequence[float],
    down_bandwidth: Sequence[float],
    slowdown_kind: str,
    slowdown_sigma: float,
    samples: Sequence[int],
    flops_per_sample: Sequence[float],
    down_bytes: int,
    up_bytes: Sequence[int],
) -> list[float]:
    """p_l = P(|U^l| = 0) (eq. 9's definition) for l = 1..L in the deadline scenario.

    Mirrors ``StragglerRounds._deadline_depths``: a depth-l task of user u downloads
    ``down_bytes``, computes n_u·``flops_per_sample[l−1]`` FLOPs at ``speed[u]`` times this
    round's slowdown s_u, and uploads ``up_bytes[l−1]`` (layers l..L); transfers are not
    slowed. So d_u ≤ l ⇔ s_u·c_{u,l} ≤ avail_{u,l} with c_{u,l} = n_u·flops_l/speed_u and
    avail_{u,l} = t_max − down/down_u − up_l/up_u. Users draw s_u independently, so
    p_l = Π_u P(s_u > avail_{u,l} / c_{u,l}). Without a slowdown every p_l is 0 or 1.
    """
    num_layers = len(flops_per_sample)
    out = [1.0] * num_layers
    for n, spd, up, down in zip(samples, speed, up_bandwidth, down_bandwidth, strict=True):
        for layer in range(num_layers):
            # as Population.timing: x / inf = 0 (a free link)
            avail = t_max - down_bytes / float(down) - up_bytes[layer] / float(up)
            flops = n * flops_per_sample[layer]
            x = math.inf if flops <= 0.0 else avail * float(spd) / flops
            if avail < 0.0:
                x = 0.0  # even s → 0 leaves no time: the depth is beyond l
            out[layer] *= slowdown_survival(x, slowdown_kind, slowdown_sigma)
    return out


def salf_layer_update(w: torch.Tensor, deltas: Sequence[torch.Tensor], p: float) -> torch.Tensor:
    """Eq. 9 for one layer in delta form.

    w̃ = w if U^l is empty, else (mean_{U^l}(w + Δ_u) − p·w)/(1 − p) = w + mean_{U^l} Δ_u/(1 − p).

    Guard: a p that rounds to 1 (no user is ever expected to reach layer l: the deadline
    scenario's exact p_l without a slowdown, or with one too slow for any draw to matter)
    means U^l is empty in practice, and this returns w before dividing. Should a user reach
    it anyway (a float tie at the depth boundary), 1/(1 − p) would be infinite, so the
    layer takes the plain mean (p treated as 0) instead of dividing by zero.
    """
    if not deltas:
        return w
    mean = torch.stack(list(deltas)).mean(dim=0)
    if p >= 1.0:
        return w + mean
    return w + mean / (1.0 - p)


def divide_by_u_update(
    w: torch.Tensor, deltas: Sequence[torch.Tensor], num_users: int
) -> torch.Tensor:
    """The authors' rule: w + (1/U) Σ Δ_u (users that did not update the tensor count as Δ = 0)."""
    if not deltas:
        return w
    return w + torch.stack(list(deltas)).sum(dim=0) / num_users


def coverage_update(
    w: torch.Tensor, deltas: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
) -> torch.Tensor:
    """HeteroFL: each element averaged over the clients that hold it; unheld elements unchanged."""
    if not deltas:
        return w
    total = torch.stack(list(deltas)).sum(dim=0)
    count = torch.stack([m.to(w.dtype) for m in masks]).sum(dim=0)
    return w + torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(w))


def deadline_depth(durations: Sequence[float], t_max: float) -> int:
    """Deepest unit reached under a deadline: the smallest d with ``durations[d−1]`` ≤ t_max,
    where ``durations[d−1]`` is the whole depth-d task's time (non-increasing in d: a deeper
    start computes and uploads less); L+1 if not even the last unit fits."""
    depth = len(durations) + 1
    for d in range(len(durations), 0, -1):
        if durations[d - 1] > t_max:
            break
        depth = d
    return depth


# --------------------------------------------------------------------- aggregators
class SalfAggregator:
    """``paper``: eq. 9 per unit with p_l (``p_rule`` exact / eq10 / zero; drop-stragglers,
    vanilla and AsyncFL are the p = 0 case — a plain mean over the users holding the
    unit). ``reference``: w + (1/U) Σ Δ_u over every tensor (the authors' FedAvg)."""

    def __init__(
        self, *, mode: str, units: Units, num_users: int, p_values: Sequence[float]
    ) -> None:
        self.mode = mode
        self.units = units
        self.num_users = num_users
        self.p_values = tuple(p_values)  # p_l for l = 1..L

    def aggregate(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> ModelVersion:
        depth = [suffix_depth(c.task.plan.shape) for c in contributions]
        holders = update_sets(depth, self.units.count)  # U^l, l = 1..L (eq. 8)
        for c in contributions:
            c.weight = 1.0 / len(contributions) if self.mode == "paper" else 1.0 / self.num_users
        params: Params = {}
        for name, w in base.params.items():
            deltas = [c.delta[name] for c in contributions]
            if self.mode == "reference":
                params[name] = divide_by_u_update(w, deltas, self.num_users)
            else:
                unit = self.units.of_param[name]
                held = [deltas[u] for u in holders[unit - 1]]
                params[name] = salf_layer_update(w, held, self.p_values[unit - 1])
        buffers: Params = {}
        for name, b in base.buffers.items():
            if self.mode == "reference":
                vals = [c.buffers[name] for c in contributions]
                if b.is_floating_point():
                    buffers[name] = divide_by_u_update(b, [v - b for v in vals], self.num_users)
                else:  # averaged as an integer and truncated, as the authors' code
                    s = sum((v - b for v in vals), torch.zeros_like(b))
                    buffers[name] = b + torch.div(s, self.num_users, rounding_mode="trunc")
            else:
                unit = self.units.of_buffer.get(name, self.units.count)
                vals = [contributions[u].buffers[name] for u in holders[unit - 1]]
                if not vals:
                    buffers[name] = b
                elif b.is_floating_point():
                    buffers[name] = torch.stack(vals).mean(dim=0)
                else:
                    buffers[name] = vals[0].clone()
        return ModelVersion(version=base.version + 1, params=params, buffers=buffers)


def suffix_depth(shape: object) -> int:
    """d of a full (1) or layer-suffix task: the user is in U^l for l ≥ d (eq. 8)."""
    if shape is FULL:
        return 1
    if isinstance(shape, Suffix):
        return shape.depth
    raise ValueError(f"SALF's layer-wise aggregation cannot take a {shape!r} contribution")


class CoverageAggregator:
    """HeteroFL: each element averaged over the contributions covering it (``WorkShape.coverage``)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def aggregate(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> ModelVersion:
        layout = self.layout
        shapes = {c.task.plan.shape for c in contributions}
        params: Params = {}
        for name, w in base.params.items():
            cover: dict[object, torch.Tensor] = {}
            for shape in shapes:  # True / False: the whole tensor or none of it
                got = shape.coverage(layout, name, w)
                cover[shape] = (
                    got if isinstance(got, torch.Tensor)
                    else torch.full_like(w, bool(got), dtype=torch.bool)
                )  # fmt: skip
            masks = [cover[c.task.plan.shape] for c in contributions]
            params[name] = coverage_update(w, [c.delta[name] for c in contributions], masks)
        for c in contributions:
            c.weight = 1.0 / max(1, len(contributions))
        buffers = {k: v.clone() for k, v in base.buffers.items()}
        return ModelVersion(version=base.version + 1, params=params, buffers=buffers)


# --------------------------------------------------------------------- rounds
@dataclass
class RoundSetup:
    method: str
    mode: str  # paper | reference
    scenario: str  # ratio | deadline
    units: Units
    num_users: int
    straggler_ratio: float
    t_max: float | None
    full_plans: Sequence[TaskPlan]  # each user's full local task (from its own data size)
    model_bytes: int
    # the model as work shapes see it (units, tensor shapes, bytes; with
    # ``charge_full_step`` a reference-mode suffix task is charged the full step it trains)
    layout: Layout
    heterofl_rate: float = 0.5
    fixed: dict[str, Any] = field(default_factory=dict)


class StragglerRounds:
    """Synchronous rounds over all U users with a depth per user per round.

    Acts as both Planner and Trigger: at a round start it draws every user's
    depth (streams ``("stragglers", ...)``, ``("depths", round)``: common to
    every method), then dispatches what the method asks of each user; the
    round closes when every dispatched task has arrived, with one aggregation.

    Deadline scenario: the server sends the model to every user, and a user the
    method gives nothing to send (SALF: not even the last layer fits; drop-stragglers:
    any straggler) still works until t_max (SALF, drop-stragglers and HeteroFL; vanilla
    has no deadline and AsyncFL's stale updates span rounds), so it gets a full task dispatched
    without execution and cancelled at the deadline (its compute up to t_max is
    spent and wasted; its device draws its next slowdown next round). A round in
    which some user could not finish the full task closes at t_max, not earlier,
    and a task still running then (a HeteroFL submodel too slow) is cut too.
    """

    def __init__(self, setup: RoundSetup) -> None:
        self.s = setup
        self.round = 0
        self._next: dict[int, tuple[TaskPlan, TaskCost]] = {}
        self._outstanding: dict[int, Task] = {}  # task id → task, this round
        self._arrived: list[Contribution] = []
        self._cut: list[Task] = []  # deadline scenario: tasks cancelled at t_max
        self._deadline: float | None = None  # when the current round closes, if at t_max
        # AsyncFL: client → (stale base, round at which it delivers)
        self._cycles: dict[int, tuple[ModelVersion, int, int]] = {}
        self.stragglers = np.zeros(setup.num_users, dtype=bool)  # this round's, by depths()

    # ---- planner
    def cost(self, plan: TaskPlan) -> TaskCost:
        """What a task costs on the clock: its work shape's cost (``WorkShape.cost``)."""
        return plan.shape.cost(self.s.layout, plan.samples)

    def plan(self, ctx: Context | None, client: int) -> tuple[TaskPlan, TaskCost]:
        got = self._next.get(client)
        if got is None:
            full = self.s.full_plans[client]
            return full, self.cost(full)
        return got

    # ---- depth sources
    def depths(self, ctx: Context) -> np.ndarray:
        """Depth per user this round (1 = full, L+1 = nothing); sets ``self.stragglers``.

        Who is a straggler: in the ratio scenario, the members of the drawn set (fixed in
        reference mode, re-drawn each round in paper mode), whatever depth they draw —
        drop-stragglers, HeteroFL and AsyncFL drop, shrink or delay every member, so the
        effective ratio is the nominal one (a member that draws depth 1 is still a
        straggler; SALF gives it a full task, as its depth says). In the deadline
        scenario, the users with depth > 1 (a user that reached the input layer finished
        in time).
        """
        s, L, U = self.s, self.s.units.count, self.s.num_users
        if s.scenario == "deadline":
            d = self._deadline_depths(ctx)
            self.stragglers = d > 1
            return d
        m = round(s.straggler_ratio * U)
        d = np.ones(U, dtype=np.int64)
        if s.mode == "reference":  # fixed straggler set, k uniform on {1..L} tensors
            if "set" not in s.fixed:
                g = ctx.rng("stragglers")
                s.fixed["set"] = np.sort(g.choice(U, size=m, replace=False))
            stragglers = s.fixed["set"]
            draws = ctx.rng("depths", self.round).integers(1, L + 1, size=U)
        else:  # re-drawn each round, depth uniform on {1..L+1}
            stragglers = np.sort(ctx.rng("stragglers", self.round).choice(U, size=m, replace=False))
            draws = ctx.rng("depths", self.round).integers(1, L + 2, size=U)
        d[stragglers] = draws[stragglers]
        # the set is decided before the depth draw (a depth-1 member is still a straggler)
        self.stragglers = np.zeros(U, dtype=bool)
        self.stragglers[stragglers] = True
        return d

    def _deadline_depths(self, ctx: Context) -> np.ndarray:
        """Each user's depth: the smallest d whose task (download, forward, backward of
        units d..L, upload of units d..L) fits in t_max at this round's slowdown — timed
        exactly as the dispatched task will be (L+1 if not even the last unit fits)."""
        s = self.s
        assert s.t_max is not None
        L = s.units.count
        out = np.full(s.num_users, L + 1, dtype=np.int64)
        timing = ctx.population.timing
        for c in range(s.num_users):
            self._next.pop(c, None)
            k = ctx.prepare(c).k  # the round's task counter: it keys the slowdown draw
            full = s.full_plans[c]
            durations = [
                timing(c, self.cost(replace(full, shape=Suffix(d)) if d > 1 else full), k).duration
                for d in range(1, L + 1)
            ]
            out[c] = deadline_depth(durations, s.t_max)
        return out

    # ---- trigger
    def on_start(self, ctx: Context) -> None:
        self._start_round(ctx)

    def _start_round(self, ctx: Context) -> None:
        while True:
            depths = self.depths(ctx)
            self._dispatch_round(ctx, depths)
            if self._outstanding or self._deadline is not None or ctx.stopping:
                return
            ctx.commit([])  # nobody computes anything this round: the model is kept
            self.round += 1
            if ctx.stopping:
                return

    def _dispatch_round(self, ctx: Context, depths: np.ndarray) -> None:
        s, L = self.s, self.s.units.count
        self._arrived, self._outstanding, self._cut = [], {}, []
        # vanilla has no deadline; AsyncFL's stale updates span rounds (see the docs)
        deadline = s.scenario == "deadline" and s.method in ("salf", "drop-stragglers", "heterofl")
        self._deadline = None
        for c in range(s.num_users):
            full = s.full_plans[c]
            d = int(depths[c])
            straggler = bool(self.stragglers[c])
            base: ModelVersion | None = None
            plan: TaskPlan | None = full
            if s.method == "vanilla":
                pass
            elif s.method == "drop-stragglers":
                plan = None if straggler else full
            elif s.method == "salf":
                plan = None if d > L else (replace(full, shape=Suffix(d)) if d > 1 else full)
            elif s.method == "heterofl":
                plan = replace(full, shape=Width(s.heterofl_rate)) if straggler else full
            elif s.method == "asyncfl":
                plan, base = self._asyncfl(ctx, c, d, straggler)
            if plan is None:
                if deadline:  # works until t_max, sends nothing
                    self._cut.append(ctx.dispatch(ctx.prepare(c), execute=False))
                continue
            self._next[c] = (plan, self.cost(plan))
            task = ctx.prepare(c, base=base)
            ctx.dispatch(task)
            self._outstanding[task.task_id] = task
        self._next.clear()
        if deadline and (self._cut or bool((depths > 1).any())):
            assert s.t_max is not None
            self._deadline = ctx.now + s.t_max
            ctx.set_timer(self._deadline, ("deadline", self.round))

    def _asyncfl(
        self, ctx: Context, c: int, d: int, straggler: bool
    ) -> tuple[TaskPlan | None, ModelVersion | None]:
        """A straggler of depth l downloads the model, then delivers a full update computed
        on it 2l rounds later (participation every 2l rounds); others deliver every round."""
        cycle = self._cycles.get(c)
        if cycle is None:
            if not straggler:
                return self.s.full_plans[c], None
            cycle = (ctx.model, self.round, self.round + 2 * d - 1)
            self._cycles[c] = cycle
        stale, _, due = cycle
        if self.round < due:
            return None, None
        del self._cycles[c]
        return self.s.full_plans[c], stale

    def on_arrival(self, ctx: Context, contribution: Contribution) -> None:
        self._outstanding.pop(contribution.task.task_id, None)
        self._arrived.append(contribution)
        if not self._outstanding and self._deadline is None:
            self._close_round(ctx)

    def _close_round(self, ctx: Context) -> None:
        ctx.commit(sorted(self._arrived, key=lambda c: c.client))
        self.round += 1
        if not ctx.stopping:
            self._start_round(ctx)

    def on_timer(self, ctx: Context, tag: Any) -> None:
        """The deadline of round ``tag[1]``: cut everyone still working, aggregate what arrived."""
        if tag != ("deadline", self.round):
            return
        for task in self._cut:
            ctx.cancel(task)
        for task in self._outstanding.values():  # float round-off past t_max: late
            ctx.cancel(task)
        self._outstanding.clear()
        self._deadline = None
        self._close_round(ctx)


def p_values(setup: RoundSetup, rule: str, population: Population | None = None) -> list[float]:
    """p_l, l = 1..L, for ``rule`` exact / eq10 / zero (non-SALF methods always use 0).

    ``exact`` in the deadline scenario needs the ``population`` (speeds, bandwidths, slowdown).
    """
    L, U = setup.units.count, setup.num_users
    if rule == "zero" or setup.method != "salf":
        return [0.0] * L
    if rule == "eq10":
        return [p_eq10(layer, L, U) for layer in range(1, L + 1)]
    if setup.scenario == "ratio":
        m = round(setup.straggler_ratio * U)
        ref = setup.mode == "reference"
        return [p_exact_ratio(layer, L, U, m, reference=ref) for layer in range(1, L + 1)]
    # deadline: each user's depth follows from its speed, bandwidths and slowdown draw
    if population is None:
        raise ValueError("p_rule 'exact' in the deadline scenario needs the population")
    assert setup.t_max is not None
    # one sample's depth-l task, l = 1..L: the same shapes and costs the rounds dispatch
    per_sample = [(FULL if d == 1 else Suffix(d)).cost(setup.layout, 1) for d in range(1, L + 1)]
    return p_exact_deadline(
        t_max=setup.t_max, speed=population.speed.tolist(),
        up_bandwidth=population.up_bandwidth.tolist(),
        down_bandwidth=population.down_bandwidth.tolist(), slowdown_kind=population.slowdown_kind,
        slowdown_sigma=population.slowdown_sigma,
        samples=[plan.samples for plan in setup.full_plans],
        flops_per_sample=[c.flops for c in per_sample], down_bytes=setup.model_bytes,
        up_bytes=[c.bytes_up for c in per_sample],
    )  # fmt: skip


# --------------------------------------------------------------------- builder
def build_salf_family(cfg: Any, info: Any, method: str) -> Any:
    """The Strategy for ``method`` under ``cfg.salf`` (scenario, mode, p_rule)."""
    from fedclock.errors import ConfigError
    from fedclock.strategies.base import Strategy
    from fedclock.strategies.planners import local_sgd_plan

    sc = cfg.salf
    if sc.scenario is None:
        raise ConfigError(
            f"Strategy '{method}' needs salf.scenario: 'ratio' (population.straggler_ratio) "
            "or 'deadline' (strategy.t_max)."
        )
    t_max = getattr(cfg.strategy, "t_max", None)  # vanilla's options have none: no deadline
    if sc.scenario == "deadline" and t_max is None:
        if method != "vanilla":
            raise ConfigError("salf.scenario 'deadline' needs a deadline: set strategy.t_max.")
        t_max = math.inf  # every user's full update fits: the depths it never uses are all 1
    if info.model is None:
        raise ConfigError(f"Strategy '{method}' needs the model in BuildInfo.")
    if method == "heterofl" and any(True for _ in info.model.buffers()):
        raise ConfigError(
            "Strategy 'heterofl' supports models without BatchNorm buffers (mlp, cnn) only."
        )
    if sc.scenario == "deadline" and sc.mode == "reference" and sc.charge == "work":
        raise ConfigError(
            "salf.mode 'reference' under a deadline needs salf.charge: suffix (the authors' "
            "code trains the full step, so with charge 'work' no partial depth could fit)."
        )
    units = build_units(info.model, info.layers, sc.mode)
    sizes = info.client_sizes
    t = cfg.train
    by_size = {
        n: local_sgd_plan(n, t.batch_size, local_epochs=t.local_epochs, local_steps=t.local_steps)
        for n in {int(v) for v in sizes}
    }
    setup = RoundSetup(
        method=method, mode=sc.mode, scenario=sc.scenario, units=units, num_users=len(sizes),
        straggler_ratio=cfg.population.straggler_ratio, t_max=t_max,
        full_plans=[by_size[int(n)] for n in sizes], model_bytes=info.model_bytes,
        layout=Layout.of(
            info.model, units, info.model_bytes,
            charge_full_step=sc.mode == "reference" and sc.charge == "work",
        ),
        heterofl_rate=sc.heterofl_rate,
    )  # fmt: skip
    rounds = StragglerRounds(setup)
    aggregator: Any
    if method == "heterofl":
        aggregator = CoverageAggregator(setup.layout)
    else:
        population = info.population
        if population is None and sc.scenario == "deadline" and sc.p_rule == "exact":
            # the experiment's own population, rebuilt from its config (same seed, same arrays)
            from fedclock.devices import build_population

            population = build_population(cfg.population, len(sizes), cfg.seed)
        p = p_values(setup, sc.p_rule, population)
        log.debug("%s p_l (p_rule %s, scenario %s): %s", method, sc.p_rule, sc.scenario, p)
        aggregator = SalfAggregator(mode=sc.mode, units=units, num_users=len(sizes), p_values=p)
    needs = Needs(
        shapes=frozenset({type(FULL), Suffix, Width}),  # what StragglerRounds may dispatch
        layout=setup.layout, suffix_trains_fully=sc.mode == "reference",
        momentum_per_client=sc.mode == "reference",
    )  # fmt: skip
    return Strategy(name=method, planner=rounds, trigger=rounds, aggregator=aggregator, needs=needs)
