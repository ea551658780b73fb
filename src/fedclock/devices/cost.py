"""Cost model: how long a task takes on a device.

duration = bytes_down / down_bandwidth          (download the model)
         + flops / speed · slowdown             (local compute, this task's slowdown draw)
         + bytes_up / up_bandwidth              (upload the contribution)

A bandwidth of ``inf`` makes that transfer free. The duration is known before the
task runs, so the virtual clock never waits on real compute.

A split task (SplitFed, :class:`~fedclock.models.shapes.Split`) trains with a server: for
every mini-batch b the client runs its layers forward, sends the activations (and labels)
up, waits while the server runs its layers forward and backward, receives the gradients of
the activations and runs its layers backward. Nothing overlaps, so the training phase is
the sum over the batches (docs/methods/splitfed.md):

compute = Σ_b [ F_c(b) / speed · slowdown + A_up(b) / up_bandwidth
                + F_s(b) / server_speed + A_down(b) / down_bandwidth ]
        = flops / speed · slowdown + split.bytes_up / up_bandwidth
          + split.server_flops / server_speed + split.bytes_down / down_bandwidth

with ``flops`` the client's FLOPs and :class:`SplitExchange` the rest; the client-side
model's download and upload stay the first and last phases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class SplitExchange:
    """What a split task's training adds to the client's own compute, summed over its
    batches: the server's FLOPs (at the server's speed) and the bytes of activations (and
    labels) up and of their gradients down (over the client's links)."""

    server_flops: float
    bytes_up: int
    bytes_down: int


@dataclass(frozen=True, slots=True)
class TaskCost:
    """The work a task asks of a device (``split``: a split task's exchange with the server)."""

    flops: float
    bytes_down: int
    bytes_up: int
    split: SplitExchange | None = None


class TaskTiming(NamedTuple):
    """Phases of a task in virtual seconds: download, then compute, then upload.

    A named tuple, not a frozen dataclass: the engine builds one per task and a
    tuple is built several times faster.
    """

    down_s: float
    compute_s: float
    up_s: float

    @property
    def duration(self) -> float:
        return self.down_s + self.compute_s + self.up_s

    def compute_done_by(self, elapsed: float) -> float:
        """Compute-seconds performed after ``elapsed`` seconds of the task (abort accounting)."""
        return min(max(elapsed - self.down_s, 0.0), self.compute_s)


def _transfer(nbytes: float, bandwidth: float) -> float:
    if nbytes <= 0 or math.isinf(bandwidth):
        return 0.0
    return nbytes / bandwidth


def task_timing(
    cost: TaskCost,
    *,
    speed: float,
    up_bandwidth: float,
    down_bandwidth: float,
    slowdown: float = 1.0,
    server_speed: float = math.inf,
) -> TaskTiming:
    """Durations of a task's phases on a device (see module docstring); ``server_speed``:
    the FLOP/s a split task's server computes at."""
    compute = cost.flops / speed * slowdown
    x = cost.split
    if x is not None:
        compute += (
            _transfer(x.bytes_up, up_bandwidth)
            + x.server_flops / server_speed
            + _transfer(x.bytes_down, down_bandwidth)
        )
    return TaskTiming(
        down_s=_transfer(cost.bytes_down, down_bandwidth),
        compute_s=compute,
        up_s=_transfer(cost.bytes_up, up_bandwidth),
    )
