"""Memory against population size: peak RSS for 1k / 10k / 100k clients.

Asynchronous FedBuff (``benchmarks.async_fedbuff``): 500 clients in flight, aggregation every
10 arrivals (sample-weighted FedAvg of the buffer), logistic regression on MNIST-shaped data,
one local epoch of batch 16 on 32 samples per client, trained by fedclock's default executor.
The training pool is one tensor of 60,000 MNIST-shaped samples held once; each client owns
32 indices into it (index views, not copies), so the data does not grow with the population
and the figure shows what fedclock itself keeps per client. Each population size runs in its
own process (``ru_maxrss`` is a per-process high-water mark).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np
import torch

NAME = "scale-memory"
POOL = 60_000
PER_CLIENT = 32
IN_FLIGHT = 500


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def _current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except OSError:
        return float("nan")
    return pages * resource.getpagesize() / 2**20


def child(population: int, updates: int) -> dict[str, float]:
    """One population size, in this process."""
    from benchmarks.async_fedbuff import AsyncBuffered
    from fedclock.config import TrainConfig
    from fedclock.devices.population import Population
    from fedclock.models import build_model, layer_view, param_bytes
    from fedclock.sim.simulator import Budget, Simulator
    from fedclock.strategies import FedAvgAggregator, LocalSGDPlanner, Strategy
    from fedclock.train.evaluate import Evaluator
    from fedclock.train.executor import ClientData, make_executor, snapshot

    g = torch.Generator().manual_seed(0)
    x = torch.randn(POOL, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (POOL,), generator=g)
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, POOL, PER_CLIENT) for _ in range(population)]
    data = ClientData.from_partition(x, y, parts)
    del parts
    model = build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=0)
    layers = layer_view(model, (1, 28, 28))
    sizes = data.sizes()
    tau = 1.0 - np.arange(population) * 0.8 / (population - 1)
    pop = Population(speed=1.0e6 / tau, up_bandwidth=1.0e6 / tau, down_bandwidth=1.0e6 / tau)
    planner = LocalSGDPlanner(
        client_sizes=sizes, batch_size=16, local_epochs=1.0, local_steps=None,
        flops_per_sample=sum(la.fwd_flops + la.bwd_flops for la in layers),
        model_bytes=param_bytes(model),
    )  # fmt: skip
    trigger = AsyncBuffered(concurrency=IN_FLIGHT, buffer_size=10)
    strategy = Strategy("fedbuff-bench", planner, trigger, FedAvgAggregator())
    train = TrainConfig(local_epochs=1.0, batch_size=16, lr=0.05)
    executor = make_executor("auto", model, data, seed=0, train=train, device="cpu")
    evaluator = Evaluator(
        build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=0), x[:2000], y[:2000]
    )
    before = _current_rss_mb()
    sim = Simulator(
        strategy=strategy, executor=executor, population=pop, initial=snapshot(model, 0),
        client_sizes=sizes, seed=0, budget=Budget(updates=updates), evaluate=evaluator,
        eval_every_aggregations=None,
    )  # fmt: skip
    t0 = time.perf_counter()
    sim.run()
    return {
        "population": population,
        "peak_rss_mb": _rss_mb(),
        "rss_before_simulation_mb": before,
        "updates": sim.counters.updates_used,
        "wall_s": time.perf_counter() - t0,
        "executor": type(executor).__name__,
    }


POPULATIONS = (1_000, 10_000, 100_000)


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    from benchmarks.common import machine, median

    updates = 300 if quick else 10_000
    runs: dict[int, list[dict[str, float]]] = {n: [] for n in POPULATIONS}
    for _ in range(repeats):
        for n in POPULATIONS:
            cmd = [
                sys.executable, "-m", "benchmarks.scale_memory", "--population", str(n),
                "--updates", str(updates), "--threads", str(torch.get_num_threads()),
            ]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            runs[n].append(json.loads(out.strip().splitlines()[-1]))
    peak = {str(n): median([r["peak_rss_mb"] for r in rs]) for n, rs in runs.items()}
    before = {str(n): median([r["rss_before_simulation_mb"] for r in rs]) for n, rs in runs.items()}
    return {
        "benchmark": NAME,
        "quick": quick,
        "peak_rss_mb": peak,
        "rss_before_simulation_mb": before,
        "runs": {str(n): rs for n, rs in runs.items()},
        "config": {
            "in_flight": IN_FLIGHT,
            "buffer_size": 10,
            "pool_samples": POOL,
            "samples_per_client": PER_CLIENT,
            "updates": updates,
            "repeats": repeats,
        },
        "machine": machine(),
    }


def rows(r: dict[str, object]) -> list[tuple[str, str]]:
    peak, before = r["peak_rss_mb"], r["rss_before_simulation_mb"]
    assert isinstance(peak, dict) and isinstance(before, dict)
    return [
        (
            f"{int(n):,} clients",
            f"peak {peak[n]:7.0f} MB  (before the simulation {before[n]:.0f} MB)",
        )
        for n in peak
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--population", type=int, required=True)
    ap.add_argument("--updates", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps(child(a.population, a.updates)))
