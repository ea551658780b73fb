"""Client training on Ray actors against the local vectorized executor: one executor batch
of VGG11 tasks (CIFAR-shaped synthetic data, 8 clients, one local SGD step of 32 samples
each, as a SALF VGG round), timed per batch after a warm-up batch.

- ``vectorized``: ``executor.kind: auto`` in this process, with the benchmark's threads;
- ``ray, N workers``: ``executor.kind: ray`` — the batch cut into N blocks on N actors of
  one thread each, the model version put into the object store once per batch.
"""

from __future__ import annotations

import functools
import statistics
import time

import numpy as np
import torch

from fedclock.devices.cost import TaskCost, TaskTiming
from fedclock.models import build_model
from fedclock.sim.types import ModelVersion, Task
from fedclock.strategies import local_sgd_plan
from fedclock.train.executor import ClientData, snapshot
from fedclock.train.factory import make_executor
from fedclock.train.local import LocalTraining, Needs

CLIENTS, PER_CLIENT, BATCH = 8, 64, 32


def _setup() -> tuple[ClientData, torch.nn.Module]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(CLIENTS * PER_CLIENT, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (len(x),), generator=g)
    parts = np.split(np.arange(len(x)), CLIENTS)
    model = build_model("vgg11", input_shape=(3, 32, 32), num_classes=10, seed=0)
    return ClientData.from_partition(x, y, parts), model


def _tasks(base: ModelVersion, first: int) -> list[Task]:
    plan = local_sgd_plan(PER_CLIENT, BATCH, local_epochs=None, local_steps=1)
    return [
        Task(first + c, c, 0, base, plan, TaskCost(1.0, 1, 1), TaskTiming(0, 1, 0), 0.0)
        for c in range(CLIENTS)
    ]


def _time(executor: object, model: torch.nn.Module, repeats: int) -> float:
    times = []
    for r in range(repeats + 1):  # the first batch warms up (and, on Ray, ships the model)
        tasks = _tasks(snapshot(model, r), r * CLIENTS)
        t0 = time.perf_counter()
        executor.run(tasks)  # type: ignore[attr-defined]
        if r:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    from benchmarks.common import machine

    data, model = _setup()
    local = LocalTraining(lr=0.01)
    vec = make_executor(Needs(), model, data, seed=0, local=local, kind="auto")
    seconds = {"vectorized": round(_time(vec, model, 1 if quick else repeats), 3)}
    from fedclock.train.ray_executor import RayExecutor

    for workers in (1, 2):
        build = functools.partial(make_executor, Needs(), model, data, seed=0, local=local)
        ray_exec = RayExecutor(build, workers=workers)
        try:
            seconds[f"ray, {workers} workers"] = round(
                _time(ray_exec, model, 1 if quick else repeats), 3
            )
        finally:
            ray_exec.close()
    return {
        "machine": machine(),
        "model": "vgg11",
        "clients": CLIENTS,
        "batch": BATCH,
        "threads": torch.get_num_threads(),
        "seconds_per_batch": seconds,
    }


def rows(r: dict[str, object]) -> list[tuple[str, str]]:
    seconds: dict[str, float] = r["seconds_per_batch"]  # type: ignore[assignment]
    base = seconds["vectorized"]
    return [(k, f"{v} s per batch ({base / v:.2f}× vectorized)") for k, v in seconds.items()]
