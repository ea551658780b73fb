"""A real device's side of a deployment: it holds its own client's data and trains each task
it is sent with the simulator's own executor (the same local step code, batch order and work
shapes), timed by its own monotonic clock.

Budgets are relative (clocks are not synchronised): a task may carry ``budget_s``, the time
the server gives it from the message's receipt. With the ``suffix`` cut (SALF) the device
picks the deepest layer suffix whose FLOPs fit the budget at the speed it measured on its
previous task (the server sends that speed back down; on its first task it tries the full
model), trains that suffix, and stops at the last local-step boundary that still fits (at
least one step); it reports the suffix and the steps: the gradients of the last layers it
could backpropagate in time, as the paper describes. A device that runs over its budget
still replies; the server's trigger decides (a late reply to a closed round is discarded,
never used silently). A task whose budget ran out while the device was busy with an earlier
one is not started (:class:`BudgetSpent`).

Two ways to emulate a slower device on a fast machine (a local deployment's stragglers;
the measured speed includes them): ``slow``, ``slow`` times slower than this machine (after a
task the device sleeps ``slow − 1`` times as long as it computed: simple, but it scales this
machine's noise too), and ``flops_per_s``, a device of that speed (after each local step it
sleeps until the task's FLOPs so far, at that speed, have taken their time: deterministic,
and a layer suffix costs what its FLOPs say).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

from fedclock.deploy.wire import Payload, decode_task, encode_reply, suffix_depth
from fedclock.models.shapes import FULL, Suffix

#: the share of a budget kept back for the upload when the device knows no better
UPLOAD_SHARE = 0.1


class BudgetSpent(RuntimeError):
    """A task's budget ran out while the device was still busy with an earlier one: it is not
    started (the server has cut it by then; a reply would be discarded)."""


class DeviceWorker:
    """One device: client ``client`` of the run ``cfg`` (an ExperimentConfig), its data, a
    serial executor of its own."""

    def __init__(
        self, cfg: Any, client: int, *, slow: float = 1.0, flops_per_s: float | None = None
    ) -> None:
        from fedclock.experiment import device_parts

        if slow < 1.0:
            raise ValueError(f"a device's slowdown is at least 1, got {slow}")
        if flops_per_s is not None and not flops_per_s > 0:
            raise ValueError(f"a device's speed is positive, got {flops_per_s}")
        self.client = client
        self.slow = slow
        self.flops_per_s = flops_per_s
        self.executor, self.layout, self.flops = device_parts(cfg)
        self.speed: float | None = None  # FLOP/s this device measured (slowdown included)
        self._lock = threading.Lock()

    def _timed(self, fn: Any) -> tuple[Any, float]:
        """``fn()`` and the seconds it took, the emulated slowdown included."""
        t0 = time.monotonic()
        out = fn()
        spent = time.monotonic() - t0
        if self.slow > 1.0:
            time.sleep(spent * (self.slow - 1.0))
        return out, time.monotonic() - t0

    def _depth(self, task: Any, budget: float) -> int:
        """The deepest layer suffix d whose work fits ``budget`` at the measured speed (the
        last unit if none does: the device always sends something)."""
        assert self.speed is not None and self.layout is not None
        units = self.layout.units.count
        avail = budget * (1.0 - UPLOAD_SHARE)
        start = suffix_depth(task.plan.shape) or 1
        for d in range(start, units + 1):
            shape = FULL if d == 1 else Suffix(d)
            if self.flops(shape, task.plan.samples) / self.speed <= avail:
                return d
        return units

    def handle(self, payload: Payload, *, setup_s: float = 0.0) -> Payload:
        """Train the task ``payload`` carries; the reply to send back. ``setup_s``: time the
        device spent before it could start (a fresh process building its data), counted in
        its busy time."""
        received = time.monotonic() - setup_s
        task, budget, cut, speed = decode_task(payload)
        if task.client != self.client:
            raise ValueError(f"this device holds client {self.client}'s data, not {task.client}'s")
        with self._lock:  # (one task at a time: the executor has one working model)
            if budget is not None and time.monotonic() - received >= budget:
                raise BudgetSpent(
                    f"task {task.task_id}'s budget of {budget:g} s was spent before it started"
                )
            shape = task.plan.shape
            if cut == "suffix" and budget is not None:
                if self.speed is None and speed is not None:
                    self.speed = speed
                if self.speed is not None:  # (unknown on its first task: it tries in full)
                    d = self._depth(task, budget - (time.monotonic() - received))
                    if d != (suffix_depth(shape) or 1):
                        shape = FULL if d == 1 else Suffix(d)
                        task.plan = replace(task.plan, shape=shape)
            serial = getattr(self.executor, "inner", self.executor)
            sent_steps = task.plan.local_steps
            start = time.monotonic()
            if cut == "suffix" and budget is not None:  # stop at a step boundary in time
                left = received + budget * (1.0 - UPLOAD_SHARE) - start
                serial.stop_at = start + left / self.slow  # (the emulated slowdown comes after)
            if self.flops_per_s is not None:  # each step takes its FLOPs' time at that speed
                per_step = self.flops(shape, task.plan.samples) / sent_steps / self.flops_per_s
                serial.after_step = lambda done: time.sleep(
                    max(0.0, start + done * per_step - time.monotonic())
                )
            try:
                [contribution], compute_s = self._timed(lambda: self.executor.run([task]))
            finally:
                serial.stop_at = serial.after_step = None
            done = task.plan.local_steps / sent_steps  # (the share of the steps it took)
            self.speed = self.flops(shape, task.plan.samples) * done / max(compute_s, 1e-9)
        return encode_reply(
            task, contribution, shape=shape, compute_s=compute_s,
            busy_s=time.monotonic() - received, speed=self.speed,
        )  # fmt: skip
