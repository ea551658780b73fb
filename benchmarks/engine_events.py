"""Engine overhead: events per second of fedclock's simulator with a no-op model.

fedclock's FedBuff (``benchmarks.async_fedbuff.fedbuff``: the product's trigger, weights and
eq. 6 aggregator) over 10,000 clients, a server step every 10 arrivals; the executor returns
empty updates at once, so everything timed is the engine's own work per event: heap,
callbacks, planning (cached), the task's timing from the cost model with its random slowdown,
dispatch, the client selection, bookkeeping, the commit path and the aggregator's weights.
An event is one arrival popped from the heap (each arrival also dispatches the next task).

Two shapes: 100 clients in flight (``strategy.concurrency: 100``, FLSim's FedBuff: each
arrival frees a slot for a random idle client) — the headline — and all 10,000 in flight
(Fraboni et al.'s FedBuff: the heap holds 10,000 tasks). Devices: the ``fx`` scenario
(speeds spread 5×) with a lognormal slowdown drawn per task; the figure without slowdown
draws is reported beside it.
"""

from __future__ import annotations

import json

import numpy as np

from benchmarks import common
from benchmarks.async_fedbuff import NoopExecutor, fedbuff
from benchmarks.common import interleaved, machine, median
from fedclock.devices.population import Population
from fedclock.sim.observers import EvaluationSchedule, Metrics
from fedclock.sim.simulator import Budget, Simulator
from fedclock.sim.types import ModelVersion
from fedclock.strategies import LocalSGDPlanner

NAME = "engine-events"
CLIENTS = 10_000


def population(n: int, slowdown: str) -> Population:
    tau = 1.0 - np.arange(n) * 0.8 / (n - 1)  # fx scenario, X = 80 %
    return Population(
        speed=1.0e8 / tau, up_bandwidth=1.0e6 / tau, down_bandwidth=1.0e6 / tau,
        slowdown_kind=slowdown, slowdown_sigma=0.5, seed=0,
    )  # fmt: skip


def events_per_s(
    *, clients: int, events: int, slowdown: str, concurrency: int | None = 100
) -> float:
    sizes = np.full(clients, 600, dtype=np.int64)
    planner = LocalSGDPlanner(
        client_sizes=sizes, batch_size=50, local_epochs=1.0, local_steps=None,
        flops_per_sample=1.0e6, model_bytes=800_000,
    )  # fmt: skip
    strategy = fedbuff(planner, clients=clients, buffer_size=10, concurrency=concurrency)
    sim = Simulator(
        strategy=strategy, executor=NoopExecutor(), population=population(clients, slowdown),
        initial=ModelVersion(0, {}), seed=0, budget=Budget(updates=events),
        observers=[EvaluationSchedule(None), Metrics(lambda v: (0.0, 0.0))],
    )  # fmt: skip
    t0 = common.clock()
    sim.run()
    dt = common.clock() - t0
    return sim.counters.updates_received / dt


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    events = 20_000 if quick else 200_000
    runs, load = interleaved(
        {
            "lognormal": lambda: events_per_s(clients=CLIENTS, events=events, slowdown="lognormal"),
            "none": lambda: events_per_s(clients=CLIENTS, events=events, slowdown="none"),
            "all_in_flight": lambda: events_per_s(
                clients=CLIENTS, events=events, slowdown="lognormal", concurrency=None
            ),
        },
        repeats,
    )
    return {
        "benchmark": NAME,
        "quick": quick,
        "events_per_s": median(runs["lognormal"]),
        "events_per_s_without_slowdown_draws": median(runs["none"]),
        "events_per_s_all_in_flight": median(runs["all_in_flight"]),
        "runs_events_per_s": runs,
        "other_processes_cores": load,
        "config": {
            "clients": CLIENTS,
            "in_flight": 100,
            "buffer_size": 10,
            "events_per_run": events,
            "repeats": repeats,
        },
        "machine": machine(),
    }


def rows(r: dict[str, object]) -> list[tuple[str, str]]:
    a, b = r["events_per_s"], r["events_per_s_without_slowdown_draws"]
    c = r["events_per_s_all_in_flight"]
    assert isinstance(a, float) and isinstance(b, float) and isinstance(c, float)
    return [
        ("events/s (100 in flight, lognormal slowdown)", f"{a:,.0f}"),
        ("events/s (100 in flight, no slowdown draws)", f"{b:,.0f}"),
        ("events/s (all 10,000 in flight, lognormal)", f"{c:,.0f}"),
        ("other processes (cores) per run", json.dumps(r["other_processes_cores"])),
    ]
