"""Cost model: how long a task takes on a device.

duration = bytes_down / down_bandwidth          (download the model)
         + flops / speed · slowdown             (local compute, this task's slowdown draw)
         + bytes_up / up_bandwidth              (upload the contribution)

A bandwidth of ``inf`` makes that transfer free. The duration is known before the
task runs, so the virtual clock never waits on real compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class TaskCost:
    """The work a task asks of a device."""

    flops: float
    bytes_down: int
    bytes_up: int


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
) -> TaskTiming:
    """Durations of a task's phases on a device (see module docstring)."""
    return TaskTiming(
        down_s=_transfer(cost.bytes_down, down_bandwidth),
        compute_s=cost.flops / speed * slowdown,
        up_s=_transfer(cost.bytes_up, up_bandwidth),
    )
