"""Aggregators: how committed contributions become the next global model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, ModelVersion


def fedavg_weights(num_samples: Sequence[int], scheme: str) -> np.ndarray:
    """Normalised FedAvg weights p_i: ∝ n_i (``samples``, McMahan et al.) or uniform."""
    n = np.asarray(num_samples, dtype=np.float64)
    if scheme == "samples":
        return n / n.sum()
    if scheme == "uniform":
        return np.full(len(n), 1.0 / len(n))
    raise ValueError(f"unknown weighting scheme {scheme!r}")


def weighted_delta(
    contributions: Sequence[Contribution], weights: np.ndarray
) -> dict[str, torch.Tensor]:
    """Σ_i w_i Δ_i over the parameter tensors."""
    names = list(contributions[0].delta)
    if not names:
        return {}
    acc = [torch.zeros_like(contributions[0].delta[n]) for n in names]
    with torch.no_grad():
        for c, w in zip(contributions, weights, strict=True):  # one fused add per client
            torch._foreach_add_(acc, [c.delta[n] for n in names], alpha=float(w))
    return dict(zip(names, acc, strict=True))


def average_buffers(
    contributions: Sequence[Contribution], weights: np.ndarray
) -> dict[str, torch.Tensor]:
    """Weighted average of floating-point buffers (e.g. BatchNorm running stats); others from the first."""
    out: dict[str, torch.Tensor] = {}
    for name, first in contributions[0].buffers.items():
        if first.is_floating_point():
            acc = torch.zeros_like(first)
            for c, w in zip(contributions, weights, strict=True):
                acc.add_(c.buffers[name], alpha=float(w))
            out[name] = acc
        else:
            out[name] = first.clone()
    return out


class FedAvgAggregator:
    """θ ← θ + η_g Σ_i p_i Δ_i with p_i ∝ n_i (or uniform) over the committed updates.

    With η_g = 1 this is McMahan et al.'s FedAvg: the p-weighted average of the
    clients' models. An empty commit leaves the model unchanged.
    """

    def __init__(self, *, weights: str = "samples", server_lr: float = 1.0) -> None:
        self.weights = weights
        self.server_lr = server_lr

    def aggregate(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> ModelVersion:
        if not contributions:
            return base
        p = fedavg_weights([c.num_samples for c in contributions], self.weights)
        step = weighted_delta(contributions, p)
        names = list(base.params)
        old = [base.params[k] for k in names]
        upd = [step[k] for k in names]
        # θ + η_g·Δ; with η_g = 1 one fused add (x·1.0 is exact, so the values are the same)
        new = (
            torch._foreach_add(old, upd)
            if self.server_lr == 1.0
            else [v + self.server_lr * d for v, d in zip(old, upd, strict=True)]
        )
        params = dict(zip(names, new, strict=True))
        buffers = average_buffers(contributions, p) if base.buffers else {}
        return ModelVersion(version=base.version + 1, params=params, buffers=buffers)
