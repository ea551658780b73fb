"""SALF (Lang et al., stragglers-aware layer-wise FL) and its four baselines.

See ``docs/methods/salf.md``. The pure math (eq. 8–10) comes first; then the
aggregators (eq. 9, the authors' divide-by-U rule, HeteroFL's per-element coverage
average), the depth sources (straggler ratio, deadline) and the builder that composes the
five methods ``vanilla``, ``drop-stragglers``, ``salf``, ``heterofl`` and ``asyncfl`` from
synchronous rounds (``triggers.SyncRounds``) × their work (``planners.StragglerWork`` and
its subclasses) × an aggregator.

Depth convention (paper): layers 1..L, 1 = input side; a user of depth d
updates layers d..L; d = 1 is a full update, d = L+1 nothing. A "layer" is a
module with parameters in ``paper`` mode and one state-dict tensor in
``reference`` mode (the authors' code).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch

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
from fedclock.sim.types import Contribution, ModelVersion, Params, TaskPlan
from fedclock.strategies.aggregators import Target, Update, coverage_average, keep_buffers
from fedclock.strategies.base import Draw
from fedclock.strategies.planners import (
    DropWork,
    StaleCycleWork,
    StragglerWork,
    SuffixWork,
    WidthWork,
)
from fedclock.strategies.server import ServerOptimizer, server_optimizer
from fedclock.train.local import Needs

log = logging.getLogger(__name__)


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


def p_over_users(factors: np.ndarray, users: Sequence[int]) -> list[float]:
    """p_l = P(|U^l| = 0) over the round's ``users`` only: Π_{u ∈ users} P(u does not reach
    l), from :meth:`DeadlineDepths.reach_factors` (users in the order given; l = 1..L)."""
    num_layers = factors.shape[1]
    out = [1.0] * num_layers
    for u in users:
        row = factors[u]
        for layer in range(num_layers):
            out[layer] *= float(row[layer])
    return out


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

    Mirrors ``DeadlineDepths.draw``: a depth-l task of user u downloads
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


def salf_layer_delta(
    w: torch.Tensor, deltas: Sequence[torch.Tensor], p: float,
    weights: Sequence[float] | None = None,
) -> torch.Tensor:  # fmt: skip
    """Eq. 9 for one layer as the update w̃ − w (``weights``: the mean over U^l weighted by
    them, Σ ω_u Δ_u / Σ ω_u; None: the plain mean).

    w̃ = w if U^l is empty, else (mean_{U^l}(w + Δ_u) − p·w)/(1 − p) = w + mean_{U^l} Δ_u/(1 − p).

    Guard: a p that rounds to 1 (no user is ever expected to reach layer l: the deadline
    scenario's exact p_l without a slowdown, or with one too slow for any draw to matter)
    means U^l is empty in practice, and this returns 0 before dividing. Should a user reach
    it anyway (a float tie at the depth boundary), 1/(1 − p) would be infinite, so the
    layer takes the plain mean (p treated as 0) instead of dividing by zero.
    """
    if not deltas:
        return torch.zeros_like(w)
    if weights is None:
        mean = torch.stack(list(deltas)).mean(dim=0)
    else:
        mean = sum_weighted(w, deltas, weights) / sum(weights)
    if p >= 1.0:
        return mean
    return mean / (1.0 - p)


def sum_weighted(
    w: torch.Tensor, deltas: Sequence[torch.Tensor], weights: Sequence[float]
) -> torch.Tensor:
    """Σ_u ω_u Δ_u (0 for no update)."""
    acc = torch.zeros_like(w)
    for d, wi in zip(deltas, weights, strict=True):
        acc.add_(d, alpha=wi)
    return acc


def divide_by_u_delta(
    w: torch.Tensor, deltas: Sequence[torch.Tensor], num_users: int
) -> torch.Tensor:
    """The authors' rule as an update: (1/U) Σ Δ_u (users that did not update the tensor
    count as Δ = 0)."""
    if not deltas:
        return torch.zeros_like(w)
    return torch.stack(list(deltas)).sum(dim=0) / num_users


def coverage_delta(
    w: torch.Tensor, deltas: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
) -> torch.Tensor:
    """HeteroFL as an update: each element's Δ averaged over the clients that hold it;
    unheld elements 0."""
    if not deltas:
        return torch.zeros_like(w)
    total = torch.stack(list(deltas)).sum(dim=0)
    count = torch.stack([m.to(w.dtype) for m in masks]).sum(dim=0)
    return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(w))


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


# --------------------------------------------------------------------- the update's parts
def suffix_depth(shape: object) -> int:
    """d of a full (1) or layer-suffix task: the user is in U^l for l ≥ d (eq. 8)."""
    if shape is FULL:
        return 1
    if isinstance(shape, Suffix):
        return shape.depth
    raise ValueError(f"SALF's layer-wise aggregation cannot take a {shape!r} contribution")


class SalfWeighting:
    """ω_u = 1/|round's users| (``paper``; the per-unit normaliser divides by |U^l| itself)
    or 1/U (``reference``: the authors' w + (1/U) Σ Δ_u). ``shapes_checked``: only full and
    layer-suffix contributions (eq. 8's depths)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, mode: str, num_users: int, shapes_checked: bool = True) -> None:
        self.mode, self.num_users, self.shapes_checked = mode, num_users, shapes_checked

    def __call__(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> np.ndarray:
        if self.shapes_checked:
            for c in contributions:
                suffix_depth(c.task.plan.shape)
        n = len(contributions) if self.mode == "paper" else self.num_users
        return np.full(len(contributions), 1.0 / max(1, n))


def _equal(w: np.ndarray) -> bool:
    """Whether every ω is the same (then a plain mean is the ω-weighted one)."""
    return len(w) == 0 or bool(np.all(w == w[0]))


class PerUnit:
    """The per-unit normaliser: eq. 9 per unit over the users that sent it (U^l, read
    from ``Contribution.covers``), mean Δ/(1 − p_l) — p = 0 is a plain mean (drop-stragglers,
    vanilla, AsyncFL) — or, in ``reference`` mode, (1/U) Σ Δ_u over every tensor.

    The mean is ω-weighted (Σ_{U^l} ω_u Δ_u / Σ_{U^l} ω_u) and reference mode's sum is
    Σ_u ω_u Δ_u; with SALF's ω (equal, 1/U in reference mode) they are computed as the plain
    mean and (1/U)·ΣΔ, the operations of eq. 9 and of the authors' code."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, *, mode: str, units: Units, num_users: int, p_values: Sequence[float],
        round_p: Callable[[], Sequence[float]] | None = None,
    ) -> None:  # fmt: skip
        self.mode, self.units, self.num_users = mode, units, num_users
        self.p_values = tuple(p_values)  # p_l for l = 1..L
        # a round over some of the users (SALF with a client fraction or a selection): p_l
        # of the round's users, asked at each aggregation
        self.round_p = round_p

    def __call__(
        self, base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray,
        target: Target,
    ) -> Params:  # fmt: skip
        update: Params = {}
        equal = _equal(w)
        by_u = equal and (len(w) == 0 or w[0] == 1.0 / self.num_users)
        p_values = self.p_values if self.round_p is None else tuple(self.round_p())
        for name, theta in base.params.items():
            if self.mode == "reference":  # every user's Δ (0 where it did not train)
                deltas = [c.delta[name] for c in contributions]
                if by_u:
                    update[name] = divide_by_u_delta(theta, deltas, self.num_users)
                else:  # Σ_u ω_u Δ_u
                    update[name] = sum_weighted(theta, deltas, w.tolist())
            else:
                got = [(t, wi) for c, wi in zip(contributions, w.tolist(), strict=True)
                       if (t := target(c, name, theta)) is not None]  # fmt: skip
                held = [t for t, _ in got]
                unit = self.units.of_param[name]
                weights = None if equal else [wi for _, wi in got]
                update[name] = salf_layer_delta(theta, held, p_values[unit - 1], weights)
        return update


def per_element(
    base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray, target: Target
) -> Params:
    """The per-element normaliser (HeteroFL): each element's Δ averaged over the
    contributions covering it (``Contribution.coverage``: a mask, or the whole tensor),
    weighted by ω (:func:`~fedclock.strategies.aggregators.coverage_average`); with equal ω
    (HeteroFL's 1/n) the plain per-element mean, as the paper's."""
    if not _equal(w):
        return coverage_average(base, contributions, w, target)
    update: Params = {}
    for name, theta in base.params.items():
        masks = []
        for c in contributions:
            got = c.covers(name)
            masks.append(
                got.to(theta.device) if isinstance(got, torch.Tensor)
                else torch.full_like(theta, bool(got), dtype=torch.bool)
            )  # fmt: skip
        update[name] = coverage_delta(theta, [c.delta[name] for c in contributions], masks)
    return update


class SalfBuffers:
    """Buffers (BatchNorm statistics) of the SALF family: ``paper``, per unit the mean over
    the users that reached it (U^l of eq. 8; integers the first's); ``reference``, the
    authors' b + (1/U) Σ (b_u − b), integers averaged and truncated as their code."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, mode: str, units: Units, num_users: int) -> None:
        self.mode, self.units, self.num_users = mode, units, num_users

    def __call__(
        self, base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray,
        lr: float,
    ) -> Params:  # fmt: skip
        depth = [suffix_depth(c.task.plan.shape) for c in contributions]
        holders = update_sets(depth, self.units.count)  # U^l, l = 1..L (eq. 8)
        buffers: Params = {}
        for name, b in base.buffers.items():
            if self.mode == "reference":
                vals = [c.buffers[name] for c in contributions]
                if b.is_floating_point():
                    buffers[name] = b + divide_by_u_delta(b, [v - b for v in vals], self.num_users)
                else:  # averaged as an integer and truncated, as the authors' code
                    s = sum((v - b for v in vals), torch.zeros_like(b))
                    buffers[name] = b + torch.div(s, self.num_users, rounding_mode="trunc")
                continue
            unit = self.units.of_buffer.get(name, self.units.count)
            vals = [contributions[u].buffers[name] for u in holders[unit - 1]]
            if not vals:
                buffers[name] = b
            elif b.is_floating_point():
                buffers[name] = torch.stack(vals).mean(dim=0)
            else:
                buffers[name] = vals[0].clone()
        return buffers


def salf_update(
    *, mode: str, units: Units, num_users: int, p_values: Sequence[float],
    server: ServerOptimizer | None = None, round_p: Callable[[], Sequence[float]] | None = None,
) -> Update:  # fmt: skip
    """Eq. 9 (``paper``; p = 0: a plain mean over U^l) or the authors' divide-by-U
    (``reference``) as the one server update: it takes full and layer-suffix contributions."""
    return Update(
        SalfWeighting(mode=mode, num_users=num_users),
        normaliser=PerUnit(mode=mode, units=units, num_users=num_users, p_values=p_values,
                           round_p=round_p),
        buffers=SalfBuffers(mode=mode, units=units, num_users=num_users), server=server,
        step_when_empty=True,
    )  # fmt: skip


# --------------------------------------------------------------------- depth sources
class RatioDepths:
    """The ratio scenario: round(ρ·U) stragglers, drawn before their depths.

    ``reference`` (the authors' code): a fixed set (stream ``("stragglers",)``), depth
    uniform on {1..L} tensors; paper: the set re-drawn each round (``("stragglers", round)``),
    depth uniform on {1..L+1} units. Depths come from ``("depths", round)`` (common to every
    method). A member that draws depth 1 is still a straggler: drop-stragglers, HeteroFL and
    AsyncFL drop, shrink or delay every member, so the effective ratio is the nominal one.
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = ("_fixed",)

    def __init__(self, *, num_users: int, num_units: int, ratio: float, reference: bool) -> None:
        self.num_users, self.num_units = num_users, num_units
        self.ratio, self.reference = ratio, reference
        self._fixed: np.ndarray | None = None

    def draw(self, ctx: Context, r: int) -> Draw:
        U, L = self.num_users, self.num_units
        m = round(self.ratio * U)
        if self.reference:
            if self._fixed is None:
                self._fixed = np.sort(ctx.rng("stragglers").choice(U, size=m, replace=False))
            who = self._fixed
            draws = ctx.rng("depths", r).integers(1, L + 1, size=U)
        else:
            who = np.sort(ctx.rng("stragglers", r).choice(U, size=m, replace=False))
            draws = ctx.rng("depths", r).integers(1, L + 2, size=U)
        depths = np.ones(U, dtype=np.int64)
        depths[who] = draws[who]
        stragglers = np.zeros(U, dtype=bool)
        stragglers[who] = True
        return Draw(depths, stragglers)

    def p_exact(self, population: Population | None = None) -> list[float]:
        """P(|U^l| = 0), l = 1..L, under this draw (:func:`p_exact_ratio`)."""
        L, U, m = self.num_units, self.num_users, round(self.ratio * self.num_users)
        return [
            p_exact_ratio(layer, L, U, m, reference=self.reference) for layer in range(1, L + 1)
        ]


class DeadlineDepths:
    """The deadline scenario: each user's depth is the smallest d whose task (download,
    forward, backward of units d..L, upload of units d..L) fits in ``t_max`` at this
    round's slowdown — timed exactly as the dispatched task will be (L+1 if not even the
    last unit fits). The stragglers are the users with depth > 1."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, t_max: float, full_plans: Sequence[TaskPlan], layout: Layout) -> None:
        self.t_max, self.full_plans, self.layout = t_max, full_plans, layout

    def _task(self, client: int, depth: int) -> TaskPlan:
        full = self.full_plans[client]
        return full if depth == 1 else replace(full, shape=Suffix(depth))

    def draw(self, ctx: Context, r: int) -> Draw:
        L = self.layout.units.count
        depths = np.full(len(self.full_plans), L + 1, dtype=np.int64)
        timing, layout = ctx.population.timing, self.layout
        for c in range(len(self.full_plans)):
            k = ctx.prepare(c).k  # the round's task counter: it keys the slowdown draw
            durations = [
                timing(c, (plan := self._task(c, d)).shape.cost(layout, plan.samples), k).duration
                for d in range(1, L + 1)
            ]
            depths[c] = deadline_depth(durations, self.t_max)
        return Draw(depths, depths > 1)

    def reach_factors(self, population: Population) -> np.ndarray:
        """Per user u and unit l, P(u does not reach l) this round (U × L): the factors of
        :func:`p_exact_deadline`'s product, one user at a time (a round over some users
        multiplies theirs, :func:`p_over_users`)."""
        L = self.layout.units.count
        out = np.ones((len(self.full_plans), L))
        for u in range(len(self.full_plans)):
            out[u] = self._p_exact(population, users=[u])
        return out

    def p_exact(self, population: Population | None = None) -> list[float]:
        """P(|U^l| = 0), l = 1..L (:func:`p_exact_deadline`): needs the ``population``
        (speeds, bandwidths, slowdown)."""
        return self._p_exact(population)

    def _p_exact(
        self, population: Population | None, users: Sequence[int] | None = None
    ) -> list[float]:
        if population is None:
            raise ValueError("p_rule 'exact' in the deadline scenario needs the population")
        L = self.layout.units.count
        # one sample's depth-l task, l = 1..L: the same shapes and costs the rounds dispatch
        per_sample = [(FULL if d == 1 else Suffix(d)).cost(self.layout, 1) for d in range(1, L + 1)]
        who = list(range(len(self.full_plans))) if users is None else list(users)
        return p_exact_deadline(
            t_max=self.t_max, speed=population.speed[who].tolist(),
            up_bandwidth=population.up_bandwidth[who].tolist(),
            down_bandwidth=population.down_bandwidth[who].tolist(),
            slowdown_kind=population.slowdown_kind, slowdown_sigma=population.slowdown_sigma,
            samples=[self.full_plans[u].samples for u in who],
            flops_per_sample=[c.flops for c in per_sample], down_bytes=self.layout.model_bytes,
            up_bytes=[c.bytes_up for c in per_sample],
        )  # fmt: skip


def p_values(
    rule: str, depths: RatioDepths | DeadlineDepths, population: Population | None = None
) -> list[float]:
    """SALF's p_l, l = 1..L (eq. 9), for ``rule`` exact / eq10 / zero.

    ``exact`` is P(|U^l| = 0) under the depth source's own draw; the deadline scenario's
    needs the ``population`` (speeds, bandwidths, slowdown).
    """
    if isinstance(depths, RatioDepths):
        L, U = depths.num_units, depths.num_users
    else:
        L, U = depths.layout.units.count, len(depths.full_plans)
    if rule == "zero":
        return [0.0] * L
    if rule == "eq10":
        return [p_eq10(layer, L, U) for layer in range(1, L + 1)]
    return depths.p_exact(population)


# --------------------------------------------------------------------- builder
# each method: its work planner and whether its rounds keep the scenario's deadline
# (vanilla has none; AsyncFL's stale updates span rounds, see the docs)
WORK: dict[str, tuple[type[StragglerWork], bool]] = {
    "vanilla": (StragglerWork, False),
    "drop-stragglers": (DropWork, True),
    "salf": (SuffixWork, True),
    "heterofl": (WidthWork, True),
    "asyncfl": (StaleCycleWork, False),
}


def _check(cfg: Any, info: Any, method: str) -> None:
    """One sentence for a config the SALF family cannot run."""
    from fedclock.errors import ConfigError

    sc = cfg.salf
    if sc.scenario is None:
        raise ConfigError(
            f"Strategy '{method}' needs salf.scenario: 'ratio' (population.straggler_ratio) "
            "or 'deadline' (strategy.t_max)."
        )
    t_max = getattr(cfg.strategy, "t_max", None)
    if sc.scenario == "deadline" and t_max is None and method != "vanilla":
        raise ConfigError("salf.scenario 'deadline' needs a deadline: set strategy.t_max.")
    if info.model is None:
        raise ConfigError(f"Strategy '{method}' needs the model in BuildInfo.")
    if method == "heterofl" and any(True for _ in info.model.buffers()):
        raise ConfigError(
            "Strategy 'heterofl' supports models without BatchNorm buffers (mlp, cnn) only."
        )
    some = getattr(cfg.strategy, "client_fraction", 1.0) < 1.0 or cfg.selection.name != "random"
    if method == "salf" and some and (sc.scenario != "deadline" or sc.mode != "paper"):
        raise ConfigError(
            "SALF over some of its users per round (strategy.client_fraction below 1, or a "
            "selection) runs in the deadline scenario in paper mode only (eq. 9's p_l over "
            "each round's users); set salf.scenario: deadline and salf.mode: paper."
        )
    if sc.scenario == "deadline" and sc.mode == "reference" and sc.charge == "work":
        raise ConfigError(
            "salf.mode 'reference' under a deadline needs salf.charge: suffix (the authors' "
            "code trains the full step, so with charge 'work' no partial depth could fit)."
        )


def _round_p(
    rule: str, depths: Any, population: Population | None, rounds: Any, num_units: int
) -> Callable[[], list[float]]:
    """p_l of the users a round asked (SALF over some of its users): ``exact`` multiplies
    those users' factors (:meth:`DeadlineDepths.reach_factors`), ``eq10`` is eq. 10 with U
    the round's user count, ``zero`` a plain mean."""
    if rule == "zero":
        return lambda: [0.0] * num_units
    if rule == "eq10":
        return lambda: [p_eq10(layer, num_units, len(rounds.participants()))
                        for layer in range(1, num_units + 1)]  # fmt: skip
    assert population is not None
    factors = depths.reach_factors(population)
    return lambda: p_over_users(factors, rounds.participants())


def build_salf_family(cfg: Any, info: Any, method: str) -> Any:
    """The Strategy for ``method`` under ``cfg.salf`` (scenario, mode, p_rule): synchronous
    rounds over every user (:class:`SyncRounds`) × the method's work from the scenario's
    depth source × eq. 9 (the authors' divide-by-U in reference mode; HeteroFL's per-element
    coverage average)."""
    from fedclock.strategies.base import Strategy
    from fedclock.strategies.planners import local_sgd_plan
    from fedclock.strategies.triggers import SyncRounds

    sc = cfg.salf
    _check(cfg, info, method)
    t_max = getattr(cfg.strategy, "t_max", None)  # vanilla's options have none: no deadline
    units = build_units(info.model, info.layers, sc.mode)
    sizes = info.client_sizes
    U = len(sizes)
    t = cfg.train
    by_size = {
        n: local_sgd_plan(n, t.batch_size, local_epochs=t.local_epochs, local_steps=t.local_steps)
        for n in {int(v) for v in sizes}
    }
    full_plans = [by_size[int(n)] for n in sizes]
    # the model as work shapes see it (with ``charge_full_step`` a reference-mode suffix
    # task is charged the full step it trains)
    layout = Layout.of(
        info.model, units, info.model_bytes,
        charge_full_step=sc.mode == "reference" and sc.charge == "work",
    )  # fmt: skip
    depths: RatioDepths | DeadlineDepths
    if sc.scenario == "ratio":
        depths = RatioDepths(
            num_users=U, num_units=units.count, ratio=cfg.population.straggler_ratio,
            reference=sc.mode == "reference",
        )  # fmt: skip
    else:
        # vanilla has no deadline: every depth would be 1 (and it draws none)
        t = math.inf if t_max is None else t_max
        depths = DeadlineDepths(t_max=t, full_plans=full_plans, layout=layout)
    kind, keeps_deadline = WORK[method]
    extra = {"rate": sc.heterofl_rate} if method == "heterofl" else {}
    work = kind(
        depths=None if method == "vanilla" else depths, full_plans=full_plans, layout=layout,
        **extra,
    )  # fmt: skip
    fraction = getattr(cfg.strategy, "client_fraction", 1.0) if method == "salf" else 1.0
    some_users = fraction < 1.0 or cfg.selection.name != "random"
    rounds = SyncRounds(t_max=t_max if keeps_deadline and sc.scenario == "deadline" else None,
                        work=work, client_fraction=fraction,
                        # eq. 9's p_l over each round's users: the round's participants kept
                        track_participants=some_users and method == "salf")  # fmt: skip
    server = server_optimizer(cfg.strategy, lr=cfg.strategy.server_lr)
    if method == "heterofl":  # 1/n recorded; the update averages each element over holders
        aggregator = Update(
            SalfWeighting(mode="paper", num_users=U, shapes_checked=False),
            normaliser=per_element, buffers=keep_buffers, server=server, step_when_empty=True,
        )  # fmt: skip
    else:
        rule = sc.p_rule if method == "salf" else "zero"  # the others: a plain mean
        population = info.population
        if population is None and sc.scenario == "deadline" and rule == "exact":
            # the experiment's own population, rebuilt from its config (same seed, same arrays)
            from fedclock.devices import build_population

            population = build_population(cfg.population, U, cfg.seed)
        p = p_values(rule, depths, population)
        log.debug("%s p_l (p_rule %s, scenario %s): %s", method, rule, sc.scenario, p)
        round_p = None
        if some_users and method == "salf":  # eq. 9's p_l over each round's users
            round_p = _round_p(rule, depths, population, rounds, units.count)
        aggregator = salf_update(mode=sc.mode, units=units, num_users=U, p_values=p,
                                 server=server, round_p=round_p)  # fmt: skip
    needs = Needs(
        shapes=frozenset({type(FULL), Suffix, Width}),  # what the work planners dispatch
        layout=layout, suffix_trains_fully=sc.mode == "reference",
        momentum_per_client=sc.mode == "reference",
        # a round's block of updates is aggregated together (the executor may share its
        # memory), except AsyncFL's: its stragglers' updates arrive rounds later
        synchronous=method != "asyncfl",
    )  # fmt: skip
    return Strategy(name=method, planner=work, trigger=rounds, aggregator=aggregator, needs=needs)
