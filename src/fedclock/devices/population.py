"""Device populations built from a scenario.

A population stores per-client compute speed (FLOP/s) and up/down bandwidth
(bytes/s) as arrays, so a population of 100k clients costs a few MB. The
per-task slowdown draw is keyed by (seed, client, k) where k counts the
client's tasks, so every strategy run with the same seed sees the same draws.

Scenarios
- ``homogeneous``: every device has ``speed`` and the given bandwidths.
- ``fx`` (Fraboni et al. §5.1, authors' code): client i's time factor is
  τ_i = 1 − i·(X/100)/(N−1), so client 0 is the slowest (runs at ``speed``) and
  client N−1 the fastest (its tasks take (1 − X/100) of the slowest's time).
  Speed and both bandwidths are divided by τ_i, so every task duration scales by τ_i.
- ``classes`` (Fed-RAA's capability classes β): a list of classes with a fraction
  of the population each and their own speed/bandwidths; clients are assigned
  to classes by a seeded shuffle (largest-remainder counts); a class without
  its own bandwidths uses the population's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedclock.devices.cost import TaskCost, TaskTiming, task_timing
from fedclock.rng import stream

SLOWDOWN_KINDS = ("none", "lognormal", "exponential")


@dataclass(frozen=True)
class Population:
    """Per-client device profiles (arrays of length N) and the slowdown model."""

    speed: np.ndarray  # FLOP/s
    up_bandwidth: np.ndarray  # bytes/s (inf = free)
    down_bandwidth: np.ndarray  # bytes/s (inf = free)
    slowdown_kind: str = "none"
    slowdown_sigma: float = 0.5
    seed: int = 0

    def __len__(self) -> int:
        return int(self.speed.shape[0])

    def slowdown(self, client: int, k: int) -> float:
        """Compute slowdown factor of the client's k-th task (mean 1; 1 when kind is none).

        lognormal: exp(σZ − σ²/2); exponential: Exp(1) (Fraboni's unreliable
        devices, whose update time is exponential with the nominal mean).
        """
        if self.slowdown_kind == "none":
            return 1.0
        g = stream(self.seed, "slowdown", client, k)
        if self.slowdown_kind == "lognormal":
            s = self.slowdown_sigma
            return float(math.exp(s * g.standard_normal() - 0.5 * s * s))
        return float(g.exponential(1.0))

    def timing(self, client: int, cost: TaskCost, k: int) -> TaskTiming:
        """Timing of the client's k-th task with cost ``cost``."""
        return task_timing(
            cost,
            speed=float(self.speed[client]),
            up_bandwidth=float(self.up_bandwidth[client]),
            down_bandwidth=float(self.down_bandwidth[client]),
            slowdown=self.slowdown(client, k),
        )

    def nominal_timing(self, client: int, cost: TaskCost) -> TaskTiming:
        """Timing without the random slowdown (the device profile's own figure)."""
        return task_timing(
            cost,
            speed=float(self.speed[client]),
            up_bandwidth=float(self.up_bandwidth[client]),
            down_bandwidth=float(self.down_bandwidth[client]),
        )


def _bw(x: float | None) -> float:
    return math.inf if x is None else float(x)


def _class_counts(fractions: list[float], n: int) -> np.ndarray:
    """Largest-remainder integer counts summing to n."""
    f = np.asarray(fractions, dtype=float)
    f = f / f.sum()
    raw = f * n
    counts = np.floor(raw).astype(int)
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[: n - counts.sum()]] += 1
    return counts


def build_population(cfg, num_clients: int, seed: int) -> Population:  # cfg: PopulationConfig
    """Build a population of ``num_clients`` devices from a ``PopulationConfig``."""
    n = num_clients
    common = {
        "slowdown_kind": cfg.slowdown.kind,
        "slowdown_sigma": cfg.slowdown.sigma,
        "seed": seed,
    }
    if cfg.scenario == "homogeneous":
        return Population(
            speed=np.full(n, float(cfg.speed)),
            up_bandwidth=np.full(n, _bw(cfg.up_bandwidth)),
            down_bandwidth=np.full(n, _bw(cfg.down_bandwidth)),
            **common,
        )
    if cfg.scenario == "fx":
        x = cfg.fx_percent / 100.0
        tau = 1.0 - np.arange(n) * x / (n - 1) if n > 1 else np.ones(1)
        return Population(
            speed=float(cfg.speed) / tau,
            up_bandwidth=_bw(cfg.up_bandwidth) / tau,
            down_bandwidth=_bw(cfg.down_bandwidth) / tau,
            **common,
        )
    # classes
    counts = _class_counts([c.fraction for c in cfg.classes], n)
    which = np.repeat(np.arange(len(cfg.classes)), counts)
    which = which[stream(seed, "device-classes").permutation(n)]
    speed = np.array([float(c.speed) for c in cfg.classes])[which]
    # a class without its own bandwidth inherits the population's
    up = np.array([_bw(c.up_bandwidth or cfg.up_bandwidth) for c in cfg.classes])[which]
    down = np.array([_bw(c.down_bandwidth or cfg.down_bandwidth) for c in cfg.classes])[which]
    return Population(speed=speed, up_bandwidth=up, down_bandwidth=down, **common)
