"""FedNova (Wang et al., NeurIPS 2020, §4): FedAvg's rounds with normalized averaging.

With plain local SGD a client's change after τ_i steps is Δ_i = −η G_i a_i, a_i = [1, …, 1],
‖a_i‖₁ = τ_i; FedNova's server step θ − τ_eff Σ_i p_i η G_i a_i / ‖a_i‖₁ is the weighting

    ω_i = τ_eff · p_i / τ_i,   τ_eff = Σ_j p_j τ_j

of the shared :class:`~fedclock.strategies.aggregators.Update` (docs/methods/fednova.md);
the strategy is ``_fednova`` in ``strategies/__init__.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, ModelVersion, Params
from fedclock.strategies.aggregators import average_buffers, client_importance


class FedNovaWeighting:
    """ω_i = τ_eff · p_i / τ_i over the committed contributions: p_i the client importance
    (``scheme``), τ_i the task's local steps, τ_eff = Σ_j p_j τ_j."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, scheme: str = "samples") -> None:
        self.scheme = scheme

    def __call__(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> np.ndarray:
        p = client_importance([c.num_samples for c in contributions], self.scheme)
        tau = np.array([c.task.plan.local_steps for c in contributions], dtype=np.float64)
        return float(p @ tau) * p / tau


def normalized_buffers(
    base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray, lr: float
) -> Params:
    """Buffers averaged with ω_i / Σ_j ω_j (FedNova's ω do not sum to 1)."""
    return average_buffers(base, contributions, w / w.sum(), lr)
