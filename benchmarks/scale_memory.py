"""Memory against population size and against clients in flight.

fedclock's FedBuff (``benchmarks.async_fedbuff.fedbuff``: the product's trigger and eq. 6
aggregator with d_i = 1/m), logistic regression on MNIST-shaped data, one local epoch of
batch 16 on 32 samples per client, trained by fedclock's default executor. Two series:

- population: 1k / 10k / 100k clients, 500 in flight (``strategy.concurrency``), a server
  step every 10 arrivals — memory must not grow with the population;
- in flight: 1,000 clients, FedBuff m = 50, 100 / 250 / 500 / 1,000 (all) in flight — the
  memory that does grow, with the tasks in flight.

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


def child(
    population: int, updates: int, *, in_flight: int = IN_FLIGHT, buffer_size: int = 10
) -> dict[str, float]:
    """One configuration, in this process."""
    from benchmarks.async_fedbuff import fedbuff
    from fedclock.devices.population import Population
    from fedclock.models import build_model, layer_view, param_bytes
    from fedclock.sim.observers import EvaluationSchedule, Metrics
    from fedclock.sim.simulator import Budget, Simulator
    from fedclock.strategies import LocalSGDPlanner
    from fedclock.train.evaluate import Evaluator
    from fedclock.train.executor import ClientData, snapshot
    from fedclock.train.factory import make_executor
    from fedclock.train.local import LocalTraining, Needs

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
    concurrency = None if in_flight >= population else in_flight
    strategy = fedbuff(
        planner, clients=population, buffer_size=buffer_size, concurrency=concurrency
    )
    executor = make_executor(Needs(), model, data, seed=0, local=LocalTraining(lr=0.05))
    evaluator = Evaluator(
        build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=0), x[:2000], y[:2000]
    )
    before = _current_rss_mb()
    sim = Simulator(
        strategy=strategy, executor=executor, population=pop, initial=snapshot(model, 0),
        seed=0, budget=Budget(updates=updates),
        observers=[EvaluationSchedule(None), Metrics(evaluator)],
    )  # fmt: skip
    t0 = time.perf_counter()
    sim.run()
    return {
        "population": population,
        "in_flight": min(in_flight, population),
        "buffer_size": buffer_size,
        "peak_rss_mb": _rss_mb(),
        "rss_before_simulation_mb": before,
        "updates": sim.counters.updates_used,
        "wall_s": time.perf_counter() - t0,
        "executor": type(executor).__name__,
    }


POPULATIONS = (1_000, 10_000, 100_000)
IN_FLIGHT_SERIES = (100, 250, 500, 1_000)  # of 1,000 clients, FedBuff m = 50


def _child_process(population: int, updates: int, in_flight: int, buffer_size: int) -> dict:
    cmd = [
        sys.executable, "-m", "benchmarks.scale_memory", "--population", str(population),
        "--updates", str(updates), "--threads", str(torch.get_num_threads()),
        "--in-flight", str(in_flight), "--buffer-size", str(buffer_size),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    result: dict = json.loads(out.strip().splitlines()[-1])
    return result


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    from benchmarks.common import machine, median

    updates = 300 if quick else 10_000
    runs: dict[int, list[dict[str, float]]] = {n: [] for n in POPULATIONS}
    flight: dict[int, list[dict[str, float]]] = {c: [] for c in IN_FLIGHT_SERIES}
    for _ in range(repeats):
        for n in POPULATIONS:
            runs[n].append(_child_process(n, updates, IN_FLIGHT, 10))
        for c in IN_FLIGHT_SERIES:
            flight[c].append(_child_process(1_000, updates, c, 50))
    peak = {str(n): median([r["peak_rss_mb"] for r in rs]) for n, rs in runs.items()}
    before = {str(n): median([r["rss_before_simulation_mb"] for r in rs]) for n, rs in runs.items()}
    return {
        "benchmark": NAME,
        "quick": quick,
        "peak_rss_mb": peak,
        "rss_before_simulation_mb": before,
        "peak_rss_mb_vs_in_flight": {
            str(c): median([r["peak_rss_mb"] for r in rs]) for c, rs in flight.items()
        },
        "runs": {str(n): rs for n, rs in runs.items()},
        "runs_in_flight": {str(c): rs for c, rs in flight.items()},
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
    flight = r["peak_rss_mb_vs_in_flight"]
    assert isinstance(peak, dict) and isinstance(before, dict) and isinstance(flight, dict)
    out = [
        (
            f"{int(n):,} clients, {IN_FLIGHT} in flight",
            f"peak {peak[n]:7.0f} MB  (before the simulation {before[n]:.0f} MB)",
        )
        for n in peak
    ]
    out += [(f"1,000 clients, FedBuff m=50, {int(c):,} in flight", f"peak {flight[c]:7.0f} MB")
            for c in flight]  # fmt: skip
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--population", type=int, required=True)
    ap.add_argument("--updates", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--in-flight", type=int, default=IN_FLIGHT)
    ap.add_argument("--buffer-size", type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(
        json.dumps(child(a.population, a.updates, in_flight=a.in_flight, buffer_size=a.buffer_size))
    )
