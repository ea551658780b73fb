"""Aggregation weights d_i and staleness functions — small pure functions.

Fraboni et al., "A General Theory for Federated Optimization with Asynchronous
and Heterogeneous Clients Updates": the server step is

    θ^{n+1} = θ^n + η_g Σ_{i ∈ S_n} d_i Δ_i(ρ_i(n))                       (eq. 6)

and the weights d_i below make the expected aggregation weight q_i equal the
client importance p_i (so the run minimises the federated problem, eq. 2).
τ_i is client i's update time (compute + communication); p_i its importance
(Σ p_i = 1: uniform 1/M or n_i/Σn).

FedAsync (Xie, Koyejo & Gupta 2019) mixes θ ← (1 − α_t) θ + α_t θ_new with
α_t = α · s(staleness); FLSim's FedBuff multiplies each delta's weight by a
staleness weight s. The functions s live here too; the product d_i · s (α · s
for FedAsync, whose d_i is α) is taken by ``asynchronous.StalenessWeighting``.

Fraboni's FX update times τ_i are a device scenario:
:func:`fedclock.devices.population.fx_update_times`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")

# ⌈τ/Δt⌉ is taken as ⌈τ/Δt − CEIL_TOLERANCE⌉, so a ratio that is an integer up
# to float round-off (0.6/0.3 = 2.0000000000000004) is not pushed to the next one.
CEIL_TOLERANCE = 1e-9


def _as_array(x: Sequence[float] | np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def identical_weights(num: int) -> np.ndarray:
    """*Identical*: d_i = 1 for every client (Fraboni et al. §5.1)."""
    return np.ones(num)


def sync_weights(p: Sequence[float] | np.ndarray) -> np.ndarray:
    """Synchronous FedAvg: d_i = p_i (§4.2, Table 2)."""
    return _as_array(p).copy()


def time_based_weights(
    tau: Sequence[float] | np.ndarray, p: Sequence[float] | np.ndarray
) -> np.ndarray:
    """*Time-based* asynchronous FedAvg: d_i = [Σ_j 1/τ_j] · τ_i · p_i  (eq. 36).

    Client i arrives at a rate ∝ 1/τ_i, so its expected weight per server step is
    (1/τ_i)/Σ_j(1/τ_j) · d_i = p_i.
    """
    t, w = _as_array(tau), _as_array(p)
    if t.shape != w.shape:
        raise ValueError("tau and p must have the same length")
    if (t <= 0).any() or not np.isfinite(t).all():
        raise ValueError("update times tau must be finite and > 0")
    return float(np.sum(1.0 / t)) * t * w


def fedfix_periods(tau: Sequence[float] | np.ndarray, delta_t: float) -> np.ndarray:
    """⌈τ_i/Δt⌉: the number of FedFix ticks between two contributions of client i."""
    if not (delta_t > 0 and math.isfinite(delta_t)):
        raise ValueError("delta_t must be finite and > 0")
    t = _as_array(tau)
    return np.maximum(np.ceil(t / delta_t - CEIL_TOLERANCE), 1.0)


def fedfix_weights(
    tau: Sequence[float] | np.ndarray, p: Sequence[float] | np.ndarray, delta_t: float
) -> np.ndarray:
    """FedFix-Δt: d_i = ⌈τ_i/Δt⌉ · p_i  (eq. 40).

    A client contributes once every ⌈τ_i/Δt⌉ ticks, so this restores q_i = p_i.
    """
    w = _as_array(p)
    periods = fedfix_periods(tau, delta_t)
    if periods.shape != w.shape:
        raise ValueError("tau and p must have the same length")
    return periods * w


def fedbuff_weights(buffer_size: int, num: int) -> np.ndarray:
    """FedBuff-m as in the authors' code (``FedBuff_identical``): d_i = 1/m."""
    if buffer_size < 1:
        raise ValueError("buffer_size must be at least 1")
    return np.full(num, 1.0 / buffer_size)


def participation_weights(
    p: Sequence[float] | np.ndarray, participations: Sequence[float] | np.ndarray, aggregations: int
) -> np.ndarray:
    """FedBuff's participation-rate variant (``FedBuff_weight``): d_i = p_i / r_i.

    r_i = (participations of i) / (server steps), counted so far including the
    current step, so the expected weight r_i · d_i is p_i.
    """
    w, c = _as_array(p), _as_array(participations)
    if aggregations < 1 or (c <= 0).any():
        raise ValueError("participation rates need ≥ 1 aggregation and ≥ 1 participation each")
    return w * aggregations / c


# ------------------------------------------------------------------ staleness


@dataclass(frozen=True)
class Staleness:
    """A staleness function s(x) of the staleness x ≥ 0 (in model versions).

    - ``constant``: s(x) = 1;
    - ``polynomial``: s(x) = (1 + x)^(−a)  (Xie et al.; FLSim/FedBuff use a = 0.5);
    - ``hinge``: s(x) = 1 if x ≤ b, else 1 / (a·(x − b) + 1)  (Xie et al.).

    With ``normalize_at`` = x̄ the value is divided by s(x̄) so that s(x̄) = 1, as
    FLSim's staleness weights do with ``avg_staleness``.
    """

    kind: str = "constant"
    a: float = 0.5
    b: float = 4.0
    normalize_at: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in STALENESS_FUNCTIONS:
            raise ValueError(
                f"unknown staleness function {self.kind!r}; allowed: {', '.join(STALENESS_FUNCTIONS)}"
            )
        if self.a < 0 or self.b < 0:
            raise ValueError("staleness parameters a and b must be ≥ 0")

    def raw(self, x: float) -> float:
        if x < 0:
            raise ValueError(f"staleness must be ≥ 0, got {x}")
        if self.kind == "constant":
            return 1.0
        if self.kind == "polynomial":
            return float((1.0 + x) ** (-self.a))
        return 1.0 if x <= self.b else 1.0 / (self.a * (x - self.b) + 1.0)

    def __call__(self, x: float) -> float:
        if self.normalize_at is None or self.kind == "constant":
            return self.raw(x)
        return self.raw(x) / self.raw(self.normalize_at)

    @property
    def is_constant(self) -> bool:
        return self.kind == "constant"
