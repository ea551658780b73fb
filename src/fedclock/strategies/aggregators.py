"""Aggregators: how committed contributions become the next global model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import torch

from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, ModelVersion
from fedclock.strategies.server import ServerOptimizer


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
    """Σ_i w_i Δ_i over the parameter tensors — the weighted-sum core of every FedAvg-style
    aggregator — recording w_i as each contribution's ``weight``."""
    for c, w in zip(contributions, weights.tolist(), strict=True):
        c.weight = w
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
    """θ ← server step with Δ = Σ_i p_i Δ_i, p_i ∝ n_i (or uniform), over the committed
    updates; records p_i as each contribution's ``weight``.

    With the default server step (SGD, η_g = 1) this is McMahan et al.'s FedAvg: the
    p-weighted average of the clients' models; ``server`` makes it FedAvgM or FedAdam
    (:class:`~fedclock.strategies.server.ServerOptimizer`). An empty commit leaves the
    model unchanged.
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (its server step is a part)

    def __init__(self, *, weights: str = "samples", server: ServerOptimizer | None = None) -> None:
        self.weights = weights
        self.server = server or ServerOptimizer()

    def aggregate(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> ModelVersion:
        if not contributions:
            return base
        p = fedavg_weights([c.num_samples for c in contributions], self.weights)
        params = self.server.step(base.params, weighted_delta(contributions, p))
        buffers = average_buffers(contributions, p) if base.buffers else {}
        return ModelVersion(version=base.version + 1, params=params, buffers=buffers)
