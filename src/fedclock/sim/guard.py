"""Guarded aggregation and fault injection: client updates checked before they reach the
aggregator.

- :class:`UpdateGuard` (config ``guard``): an update whose training loss or Δ is not finite,
  or whose ‖Δ‖₂ exceeds a bound, is rejected — counted (``updates_rejected``) and wasted,
  never aggregated.
- :class:`FaultInjector` (config ``population.faults``): a seeded share of the clients are
  faulty and send a corrupted Δ (NaN everywhere, or Δ times a large factor) — the test
  bench for the guard.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedclock.rng import stream
from fedclock.sim.types import Contribution


def update_norm(contribution: Contribution) -> float:
    """‖Δ‖₂ over every tensor, summed in float64 (inf or nan when Δ is not finite)."""
    total = 0.0
    for d in contribution.delta.values():
        total += float(torch.linalg.vector_norm(d, dtype=torch.float64)) ** 2
    return math.sqrt(total)


@dataclass(frozen=True)
class UpdateGuard:
    """Rejects updates that are not finite (training loss or Δ) or whose ‖Δ‖₂ > ``max_norm``;
    with ``faults``, the faulty clients' updates are corrupted first (the test bench)."""

    reject_nonfinite: bool = True
    max_norm: float | None = None
    faults: FaultInjector | None = None

    @property
    def checks(self) -> bool:
        """Whether it rejects anything (a guard may only carry the fault injector)."""
        return self.reject_nonfinite or self.max_norm is not None

    def corrupt(self, contributions: Sequence[Contribution]) -> Sequence[Contribution]:
        if self.faults is None:
            return contributions
        return [self.faults.apply(c) for c in contributions]

    def rejects(self, contribution: Contribution) -> bool:
        if self.reject_nonfinite and not math.isfinite(contribution.train_loss):
            return True
        norm = update_norm(contribution)
        if self.reject_nonfinite and not math.isfinite(norm):
            return True
        return self.max_norm is not None and norm > self.max_norm


class FaultInjector:
    """round(``fraction``·N) clients, drawn from the stream ``("faults",)``, send a corrupted
    update: ``nan`` (every element NaN) or ``scale`` (Δ × ``scale``)."""

    def __init__(self, fraction: float, kind: str, scale: float, num_clients: int, seed: int):
        count = round(fraction * num_clients)
        chosen = stream(seed, "faults").choice(num_clients, size=count, replace=False)
        self.faulty = np.zeros(num_clients, dtype=bool)
        self.faulty[chosen] = True
        self.kind, self.scale = kind, scale

    def apply(self, contribution: Contribution) -> Contribution:
        if not self.faulty[contribution.client]:
            return contribution
        if self.kind == "nan":
            delta = {n: torch.full_like(d, math.nan) for n, d in contribution.delta.items()}
        else:
            delta = {n: d * self.scale for n, d in contribution.delta.items()}
        return dataclasses.replace(contribution, delta=delta)
