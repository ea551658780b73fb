"""Device populations built from a scenario.

A population stores per-client compute speed (FLOP/s) and up/down bandwidth
(bytes/s) as arrays, so a population of 100k clients costs a few MB. The
per-task slowdown draw is keyed by (seed, client, k) where k counts the
client's tasks, so every strategy run with the same seed sees the same draws
(a counter-based draw: output number client·2³² + k of a SplitMix64 stream,
:func:`fedclock.rng.splitmix64_at`; the engine makes one per task, so it must
cost next to nothing).

Scenarios
- ``homogeneous``: every device has ``speed`` and the given bandwidths.
- ``fx`` (Fraboni et al. §5.1, authors' code): client i's time factor is
  τ_i = 1 − i·(X/100)/(N−1) (:func:`fx_update_times`), so client 0 is the
  slowest (runs at ``speed``) and client N−1 the fastest (its tasks take
  (1 − X/100) of the slowest's time). Speed and both bandwidths are divided
  by τ_i, so every task duration scales by τ_i.
- ``classes``: a list of classes with a fraction of the population each and their
  own speed/bandwidths; clients are assigned to classes by a seeded shuffle
  (largest-remainder counts); a class without its own bandwidths uses the
  population's.
- ``trace``: the devices of a fedclock trace folder (``population.trace``,
  :mod:`fedclock.devices.trace`), assigned to clients by a seeded permutation or
  round-robin (``population.assign``), with their availability.
- ``capability`` (Fed-RAA §6.3): two classes, a share β of "extremely low"
  devices of capability ``capabilities[0]`` and the rest "low" of capability
  ``capabilities[1]``, a capability c running at c·``speed`` FLOP/s; assigned as
  ``classes`` (so β = 0.5 equals the two classes of fraction 0.5).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fedclock.devices.cost import TaskCost, TaskTiming, task_timing
from fedclock.devices.trace import Availability, read_trace
from fedclock.rng import _M64, counter_key, splitmix64_at, stream

_TWO_PI = 2.0 * math.pi

SLOWDOWN_KINDS = ("none", "lognormal", "exponential")

#: population.server_speed's default: SplitFed's server at this many times the fastest
#: device's speed (docs/methods/splitfed.md)
SERVER_SPEEDUP = 10.0


@dataclass(frozen=True)
class Population:
    """Per-client device profiles (arrays of length N) and the slowdown model."""

    speed: np.ndarray  # FLOP/s
    up_bandwidth: np.ndarray  # bytes/s (inf = free)
    down_bandwidth: np.ndarray  # bytes/s (inf = free)
    slowdown_kind: str = "none"
    slowdown_sigma: float = 0.5
    seed: int = 0
    # FLOP/s of the server that trains a split task's upper layers (SplitFed's main
    # server; it serves each client at this speed, in parallel); inf: its compute is free
    server_speed: float = math.inf
    # a trace's fleet (scenario trace): each client's device id, and when each is online
    # (None: always)
    device_ids: list[str] | None = field(default=None, compare=False)
    availability: Availability | None = field(default=None, compare=False, repr=False)
    _key: int = field(init=False, repr=False, compare=False)
    _speed: memoryview = field(init=False, repr=False, compare=False)
    _up_bandwidth: memoryview = field(init=False, repr=False, compare=False)
    _down_bandwidth: memoryview = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.server_speed > 0:
            raise ValueError(f"server_speed must be positive, got {self.server_speed}")
        if self.slowdown_kind not in SLOWDOWN_KINDS:
            raise ValueError(
                f"unknown slowdown kind {self.slowdown_kind!r}; allowed: {', '.join(SLOWDOWN_KINDS)}"
            )
        object.__setattr__(self, "_key", counter_key(self.seed, "slowdown"))
        # memoryviews index to Python floats without a copy (the engine's hot path)
        for name in ("speed", "up_bandwidth", "down_bandwidth"):
            a = np.ascontiguousarray(getattr(self, name), dtype=np.float64)
            object.__setattr__(self, name, a)
            object.__setattr__(self, "_" + name, memoryview(a))  # type: ignore[arg-type]
        # the engine calls timing() once per task: shadow the method with a closure
        # over locals (same values, no attribute look-ups, the mixer inlined)
        object.__setattr__(self, "timing", self._compiled_timing())

    def __len__(self) -> int:
        return int(self.speed.shape[0])

    def slowdown(self, client: int, k: int) -> float:
        """Compute slowdown factor of the client's k-th task (mean 1; 1 when kind is none).

        lognormal: exp(σZ − σ²/2); exponential: Exp(1) (Fraboni's unreliable
        devices, whose update time is exponential with the nominal mean). Z and
        the exponential come from one 64-bit counter-based draw keyed by
        (seed, client, k) — Box–Muller for Z, the inverse CDF for Exp(1).
        """
        kind = self.slowdown_kind
        if kind == "none":
            return 1.0
        z = splitmix64_at(self._key, (client << 32) | k)  # 64 random bits for (client, k)
        if kind == "lognormal":
            # Box–Muller on the two 32-bit halves (one normal; tails cut at 6.7σ)
            u1 = ((z >> 32) + 0.5) * 2.0**-32
            u2 = (z & 0xFFFFFFFF) * 2.0**-32
            normal = math.sqrt(-2.0 * math.log(u1)) * math.cos(_TWO_PI * u2)
            s = self.slowdown_sigma
            return math.exp(s * normal - 0.5 * s * s)
        return -math.log(((z >> 11) + 0.5) * 2.0**-53)  # inverse CDF of Exp(1) on u ∈ (0, 1)

    def timing(self, client: int, cost: TaskCost, k: int) -> TaskTiming:
        """Timing of the client's k-th task with cost ``cost`` (the engine's hot path).

        Same as :func:`~fedclock.devices.cost.task_timing`: a transfer over an
        infinite bandwidth is free (x / inf = 0); a split task's training phase adds its
        exchange with the server (:class:`~fedclock.devices.cost.SplitExchange`).
        """
        up, down = self._up_bandwidth[client], self._down_bandwidth[client]
        compute = cost.flops / self._speed[client] * self.slowdown(client, k)
        x = cost.split
        if x is not None:
            compute += x.bytes_up / up + x.server_flops / self.server_speed + x.bytes_down / down
        return TaskTiming(cost.bytes_down / down, compute, cost.bytes_up / up)

    def _compiled_timing(self) -> Callable[[int, TaskCost, int], TaskTiming]:
        """:meth:`timing` as a closure; tests check that both agree."""
        speed, up, down = self._speed, self._up_bandwidth, self._down_bandwidth
        kind, key, sigma = self.slowdown_kind, self._key, self.slowdown_sigma
        server = self.server_speed
        # TaskTiming(a, b, c) without the named tuple's Python-level __new__ (2× faster)
        new = tuple.__new__
        if kind == "none":

            def nominal(client: int, cost: TaskCost, k: int) -> TaskTiming:
                compute = cost.flops / speed[client]
                x = cost.split
                if x is not None:  # a split task's exchange with the server
                    compute += (
                        x.bytes_up / up[client] + x.server_flops / server
                        + x.bytes_down / down[client]
                    )  # fmt: skip
                return new(
                    TaskTiming,
                    (cost.bytes_down / down[client], compute, cost.bytes_up / up[client]),
                )

            return nominal

        m64, golden, c1, c2 = _M64, 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
        log, sqrt, cos, exp, two_pi, half = (
            math.log, math.sqrt, math.cos, math.exp, _TWO_PI, 0.5 * sigma * sigma,
        )  # fmt: skip
        lognormal = kind == "lognormal"

        def timing(client: int, cost: TaskCost, k: int) -> TaskTiming:
            # output number client·2³² + k of the SplitMix64 stream seeded by key
            z = (key + (((client << 32) | k) + 1) * golden) & m64
            z = ((z ^ (z >> 30)) * c1) & m64
            z = ((z ^ (z >> 27)) * c2) & m64
            z ^= z >> 31
            if lognormal:
                u1 = ((z >> 32) + 0.5) * 2.0**-32
                normal = sqrt(-2.0 * log(u1)) * cos(two_pi * ((z & 0xFFFFFFFF) * 2.0**-32))
                s = exp(sigma * normal - half)
            else:
                s = -log(((z >> 11) + 0.5) * 2.0**-53)
            compute = cost.flops / speed[client] * s
            x = cost.split
            if x is not None:  # a split task's exchange with the server
                compute += (
                    x.bytes_up / up[client] + x.server_flops / server + x.bytes_down / down[client]
                )
            return new(
                TaskTiming, (cost.bytes_down / down[client], compute, cost.bytes_up / up[client])
            )

        return timing

    def nominal_timing(self, client: int, cost: TaskCost) -> TaskTiming:
        """Timing without the random slowdown (the device profile's own figure)."""
        return task_timing(
            cost,
            speed=float(self.speed[client]),
            up_bandwidth=float(self.up_bandwidth[client]),
            down_bandwidth=float(self.down_bandwidth[client]),
            server_speed=self.server_speed,
        )


def fx_update_times(num_clients: int, percent: float) -> np.ndarray:
    """Fraboni's FX scenario as in the authors' code: τ_i = 1 − i·(X/100)/(M − 1) (§5.1).

    Client 0 is the slowest (τ = 1), client M−1 the fastest (τ = 1 − X/100); a
    population of one client has τ = 1. The ``fx`` scenario divides speed and bandwidths by τ_i, so
    every task duration scales by τ_i.
    """
    if num_clients == 1:
        return np.ones(1)
    return 1.0 - np.arange(num_clients) * (percent / 100.0) / (num_clients - 1)


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
    pop = _build_devices(cfg, n, seed, common)
    if cfg.server_speed is None:  # SplitFed's server: 10 × the fastest device by default
        return replace(pop, server_speed=SERVER_SPEEDUP * float(pop.speed.max()))
    return replace(pop, server_speed=float(cfg.server_speed))


def _build_devices(cfg, n: int, seed: int, common: dict[str, Any]) -> Population:
    """The population's devices (see the module docstring)."""
    if cfg.scenario == "homogeneous":
        return Population(
            speed=np.full(n, float(cfg.speed)),
            up_bandwidth=np.full(n, _bw(cfg.up_bandwidth)),
            down_bandwidth=np.full(n, _bw(cfg.down_bandwidth)),
            **common,
        )
    if cfg.scenario == "fx":
        tau = fx_update_times(n, cfg.fx_percent)
        return Population(
            speed=float(cfg.speed) / tau,
            up_bandwidth=_bw(cfg.up_bandwidth) / tau,
            down_bandwidth=_bw(cfg.down_bandwidth) / tau,
            **common,
        )
    if cfg.scenario == "trace":
        return _trace_devices(cfg, n, seed, common)
    if cfg.scenario == "capability":  # Fed-RAA's β: two classes of the population's links
        low, high = (float(c) * float(cfg.speed) for c in cfg.capabilities)
        beta = float(cfg.beta)
        fractions, speeds = [beta, 1.0 - beta], [low, high]
        ups = downs = [None, None]
    else:  # classes
        fractions = [c.fraction for c in cfg.classes]
        speeds = [float(c.speed) for c in cfg.classes]
        ups = [c.up_bandwidth for c in cfg.classes]
        downs = [c.down_bandwidth for c in cfg.classes]
    counts = _class_counts(fractions, n)
    which = np.repeat(np.arange(len(fractions)), counts)
    which = which[stream(seed, "device-classes").permutation(n)]
    speed = np.array(speeds)[which]
    # a class without its own bandwidth inherits the population's
    up = np.array([_bw(u or cfg.up_bandwidth) for u in ups])[which]
    down = np.array([_bw(d or cfg.down_bandwidth) for d in downs])[which]
    return Population(speed=speed, up_bandwidth=up, down_bandwidth=down, **common)


def trace_assignment(devices: int, n: int, seed: int, rule: str) -> np.ndarray:
    """Which trace device each of ``n`` clients gets: ``round_robin`` client i → device
    i mod D (FedScale's rule); ``permutation`` the i-th of a seeded shuffle of the devices
    (stream ``trace-devices``), wrapping when there are more clients than devices."""
    i = np.arange(n)
    if rule == "round_robin":
        return i % devices
    return stream(seed, "trace-devices").permutation(devices)[i % devices]


def _trace_devices(cfg, n: int, seed: int, common: dict[str, Any]) -> Population:
    """``scenario: trace``: each client's device from the trace (:func:`trace_assignment`);
    a device without FLOP/s runs at ``speed``, one without a bandwidth transfers free."""
    from pathlib import Path

    trace = read_trace(Path(cfg.trace))
    which = trace_assignment(len(trace), n, seed, cfg.assign)
    flops = trace.flops_per_s[which]
    speed = np.where(np.isnan(flops), float(cfg.speed), flops)
    return Population(
        speed=speed,
        up_bandwidth=trace.up_bytes_per_s[which],
        down_bandwidth=trace.down_bytes_per_s[which],
        device_ids=[trace.device_id[int(d)] for d in which],
        availability=None if trace.availability is None else trace.availability.take(which),
        **common,
    )
