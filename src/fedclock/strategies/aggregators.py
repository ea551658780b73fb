"""The server update: one aggregator, :class:`Update`, composed of parts.

    θ ← server_step(θ, N(ω, t))

- a **weighting** ω_i for the committed contributions (each family file keeps its own:
  FedAvg's client importance p_i here, the asynchronous d_i · s(staleness), Fed-RAA's α·s
  and share discount, CIS's Λ̃-coefficient, SALF's 1/U);
- a **target** t_i per parameter tensor: the delta Δ_i (:func:`delta`), or FedAsync's mix
  θ_base,i + Δ_i − θ (:func:`mix`); ``None`` where the contribution covers no element;
- a **normaliser** N: none, Σ_i ω_i t_i (:func:`weighted_sum`); per unit (SALF eq. 9,
  ``salf.PerUnit``); per element (:func:`coverage_average`; HeteroFL's ``salf.per_element``);
  every normaliser uses ω (RAM-Fed's ``MemoryAverage`` takes only its own p_i and refuses
  another ω);
- a **buffer policy** for floating-point state such as BatchNorm statistics;
- the **server step** (:mod:`.server`: SGD, momentum, Adam), applied after every
  aggregation of every strategy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np
import torch

from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, ModelVersion, Params
from fedclock.strategies.server import ServerOptimizer

#: ω_i for the committed contributions, given the server's current version
Weighting = Callable[[Context, ModelVersion, Sequence[Contribution]], np.ndarray]
#: t_i for one parameter tensor (name, the server's θ); None: the contribution covers none of it
Target = Callable[[Contribution, str, torch.Tensor], "torch.Tensor | None"]
#: the update Δ per parameter tensor from the weights and targets
Normaliser = Callable[[ModelVersion, Sequence[Contribution], np.ndarray, Target], Params]
#: the new buffers from the weights and the server step's rate η
BufferPolicy = Callable[[ModelVersion, Sequence[Contribution], np.ndarray, float], Params]


# ------------------------------------------------------------------ weighting (FedAvg)
def client_importance(num_samples: Sequence[int], scheme: str) -> np.ndarray:
    """The client importance p_i, normalised: ∝ n_i (``samples``, McMahan et al. eq. 1's
    n_k/n) or uniform."""
    n = np.asarray(num_samples, dtype=np.float64)
    if scheme == "samples":
        return n / n.sum()
    if scheme == "uniform":
        return np.full(len(n), 1.0 / len(n))
    raise ValueError(f"unknown weighting scheme {scheme!r}")


class Importance:
    """FedAvg's ω_i = p_i over the committed contributions (:func:`client_importance`)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, scheme: str = "samples") -> None:
        self.scheme = scheme

    def __call__(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> np.ndarray:
        return client_importance([c.num_samples for c in contributions], self.scheme)


# ------------------------------------------------------------------ targets
def delta(c: Contribution, name: str, theta: torch.Tensor) -> torch.Tensor | None:
    """t_i = Δ_i (zero outside the part the task trained)."""
    return None if c.covers(name) is False else c.delta[name]


def mix(c: Contribution, name: str, theta: torch.Tensor) -> torch.Tensor | None:
    """t_i = θ_base,i + Δ_i − θ on the elements the contribution covers, 0 elsewhere:
    with ω_i = α_t, θ + ω_i t_i is FedAsync's (1 − α_t)θ + α_t θ_new (Xie et al. eq. 2;
    Fed-RAA Alg. 1 on a fragment)."""
    cover = c.covers(name)
    if cover is False:
        return None
    t = c.task.base.params[name] + c.delta[name] - theta
    return torch.where(cover, t, torch.zeros_like(t)) if isinstance(cover, torch.Tensor) else t


# ------------------------------------------------------------------ normaliser: none
def weighted_delta(contributions: Sequence[Contribution], weights: np.ndarray) -> Params:
    """Σ_i w_i Δ_i over every parameter tensor, one fused add per contribution (the
    :func:`weighted_sum` of whole-model deltas)."""
    names = list(contributions[0].delta)
    if not names:
        return {}
    acc = [torch.zeros_like(contributions[0].delta[n]) for n in names]
    with torch.no_grad():
        for c, w in zip(contributions, weights, strict=True):
            torch._foreach_add_(acc, [c.delta[n] for n in names], alpha=float(w))
    return dict(zip(names, acc, strict=True))


def weighted_sum(
    base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray, target: Target
) -> Params:
    """Δ = Σ_i ω_i t_i per tensor, over the contributions that cover it (no normaliser)."""
    if target is delta and contributions and all(c.coverage is None for c in contributions):
        return weighted_delta(contributions, w)
    out: Params = {}
    for name, theta in base.params.items():
        acc = torch.zeros_like(theta)
        for c, wi in zip(contributions, w.tolist(), strict=True):
            t = target(c, name, theta)
            if t is not None:
                acc.add_(t, alpha=wi)
        out[name] = acc
    return out


# ------------------------------------------------------------------ normaliser: per element
def covers_on(c: Contribution, name: str, like: torch.Tensor) -> torch.Tensor | bool:
    """Where ``c`` covers parameter ``name``: a mask on ``like``'s device, or a bool."""
    got = c.covers(name)
    return got.to(like.device) if isinstance(got, torch.Tensor) else bool(got)


def coverage_average(
    base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray, target: Target
) -> Params:
    """Each element's ω-weighted average over the contributions that cover it:
    Δ_j = Σ_{i ∋ j} ω_i Δ_ij / Σ_{i ∋ j} ω_i, 0 where none does (RA-Fed's eq. 5; HeteroFL's
    per-element average, ``salf.per_element``, with unequal ω)."""
    update: Params = {}
    for name, theta in base.params.items():
        num = torch.zeros_like(theta)
        den = torch.zeros_like(theta)
        for c, wi in zip(contributions, w.tolist(), strict=True):
            cover = covers_on(c, name, theta)
            if cover is False:
                continue
            num.add_(c.delta[name], alpha=wi)  # (Δ_i is 0 outside its submodel)
            den.add_(cover.to(theta.dtype) if isinstance(cover, torch.Tensor) else 1.0, alpha=wi)
        held = den > 0
        update[name] = torch.where(held, num / torch.where(held, den, 1.0), 0.0)
    return update


# ------------------------------------------------------------------ buffer policies
def average_buffers(
    base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray, lr: float
) -> Params:
    """Σ_i ω_i b_i for floating-point buffers (BatchNorm statistics), ω summing to 1;
    others from the first contribution."""
    out: Params = {}
    for name, first in contributions[0].buffers.items():
        if first.is_floating_point():
            acc = torch.zeros_like(first)
            for c, wi in zip(contributions, w, strict=True):
                acc.add_(c.buffers[name], alpha=float(wi))
            out[name] = acc
        else:
            out[name] = first.clone()
    return out


def _buffer_sums(
    base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray, *, own_base: bool
) -> Params:
    """Σ_i ω_i (b_i − r_i) per floating-point buffer, r_i the task's base (own_base) or the
    server's current buffer; the other buffers are returned as the server's."""
    out: Params = {}
    for name, cur in base.buffers.items():
        if not cur.is_floating_point():
            out[name] = cur
            continue
        acc = torch.zeros_like(cur)
        for c, wi in zip(contributions, w, strict=True):
            ref = c.task.base.buffers[name] if own_base else cur
            acc.add_(c.buffers[name] - ref, alpha=float(wi))
        out[name] = acc
    return out


def step_buffers(
    base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray, lr: float
) -> Params:
    """b + η Σ_i ω_i (b_i − b_base,i): floating-point buffers move as the parameters (Fraboni
    et al. eq. 6); others keep the server's."""
    sums = _buffer_sums(base, contributions, w, own_base=True)
    return {
        n: cur + lr * sums[n] if cur.is_floating_point() else cur for n, cur in base.buffers.items()
    }


def mix_buffers(
    base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray, lr: float
) -> Params:
    """FedAsync's mix on floating-point buffers: b + Σ_i α_i (b_i − b); others the server's."""
    sums = _buffer_sums(base, contributions, w, own_base=False)
    return {n: cur + sums[n] if cur.is_floating_point() else cur for n, cur in base.buffers.items()}


def keep_buffers(
    base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray, lr: float
) -> Params:
    """The server's buffers, unchanged."""
    return {n: b.clone() for n, b in base.buffers.items()}


# ------------------------------------------------------------------ the update
class Update:
    """The aggregator of every strategy: ω from ``weighting``, Δ = ``normaliser`` over the
    ``target``s, θ ← ``server``.step(θ, Δ), buffers by ``buffers``; records ω_i as each
    contribution's ``weight``. An empty commit leaves the model unchanged (same version)
    unless ``step_when_empty`` (a round always makes a version: the SALF family, CIS).

    With the defaults (p_i ∝ n_i, Δ, no normaliser, averaged buffers, SGD with η = 1) it is
    McMahan et al.'s FedAvg.
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (its parts hold any state)

    def __init__(
        self,
        weighting: Weighting | None = None,
        *,
        target: Target = delta,
        normaliser: Normaliser = weighted_sum,
        buffers: BufferPolicy = average_buffers,
        server: ServerOptimizer | None = None,
        step_when_empty: bool = False,
    ) -> None:
        self.weighting = weighting or Importance()
        self.target, self.normaliser, self.buffers = target, normaliser, buffers
        self.server = server or ServerOptimizer()
        self.step_when_empty = step_when_empty

    def aggregate(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> ModelVersion:
        if not contributions and not self.step_when_empty:
            return base
        w = np.asarray(self.weighting(ctx, base, contributions), dtype=np.float64)
        for c, wi in zip(contributions, w.tolist(), strict=True):
            c.weight = wi
        update = self.normaliser(base, contributions, w, self.target)
        params = self.server.step(base.params, update)
        buffers = self.buffers(base, contributions, w, self.server.lr) if base.buffers else {}
        return ModelVersion(version=base.version + 1, params=params, buffers=buffers)
