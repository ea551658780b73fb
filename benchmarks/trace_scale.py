"""Device traces at FedScale's size: loading a 500,000-device trace with availability, and
the host time of a round that selects 100 online clients from it.

The fleet is generated in fedclock's trace format (``fedclock.devices.trace``): speeds as
FedScale's (6e8 FLOPs over a log-normal inference latency of median 150 ms), links of
median 5,000 kbit/s, and for 80 % of the devices four online intervals of 10–60 minutes in
a two-day period (about 1.6 M intervals; the rest always online). Each figure comes from its
own process:

- load: ``read_trace`` of the folder — seconds and the resident memory it adds;
- rounds: synchronous FedAvg rounds (``SyncRounds`` with availability: 100 clients drawn
  among those online at the round start), logistic regression on 32 MNIST-shaped samples
  per client (index views into one pool), one local epoch of batch 16 — host seconds per
  round over a population of 500,000 devices against the same run over a fleet of 5,000
  made the same way: the median of the host time between server steps from
  the second on; the first round's host time (one-time work: the online set, the row
  index of every client's samples) is reported on its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

NAME = "trace-scale"
POOL = 60_000
PER_CLIENT = 32
SELECTED = 100
PERIOD = 172_800.0


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def make_fleet(folder: Path, devices: int, seed: int = 0) -> None:
    """The generated fleet (module docstring) written to ``folder``."""
    from fedclock.devices.trace import Availability, Trace, write_trace

    rng = np.random.default_rng(seed)
    flops = 6.0e8 / rng.lognormal(np.log(0.15), 0.8, devices)
    bw = rng.lognormal(np.log(5000.0), 1.0, devices) * 128.0
    listed = int(devices * 0.8)
    starts = np.sort(rng.uniform(0.0, PERIOD - 3600.0, (listed, 4)), axis=1)
    lengths = rng.uniform(600.0, 3600.0, (listed, 4))
    rows = [
        (d, float(s), float(s + e), PERIOD)
        for d in range(listed)
        for s, e in zip(starts[d], lengths[d], strict=True)
    ]
    avail = Availability.from_rows(devices, rows)
    trace = Trace([str(i) for i in range(devices)], flops, bw, bw, [""] * devices,
                  ["benchmark"] * devices, avail, ["source: benchmarks/trace_scale.py"])  # fmt: skip
    write_trace(folder, trace)


def child_load(folder: Path) -> dict[str, float]:
    from fedclock.devices.trace import read_trace

    before = _rss_mb()
    t0 = time.perf_counter()
    trace = read_trace(folder)
    seconds = time.perf_counter() - t0
    assert trace.availability is not None
    return {"devices": len(trace), "intervals": len(trace.availability.start),
            "load_s": seconds, "added_rss_mb": _rss_mb() - before}  # fmt: skip


def child_rounds(folder: Path, population: int, rounds: int) -> dict[str, float]:
    from dataclasses import replace

    from fedclock.devices.population import Population, trace_assignment
    from fedclock.devices.trace import read_trace
    from fedclock.models import build_model, layer_view, param_bytes
    from fedclock.sim.simulator import Budget, Simulator
    from fedclock.strategies import LocalSGDPlanner, Strategy, SyncRounds, Update
    from fedclock.strategies.aggregators import Importance
    from fedclock.train.executor import ClientData, snapshot
    from fedclock.train.factory import make_executor
    from fedclock.train.local import LocalTraining, Needs

    trace = read_trace(folder)
    assert trace.availability is not None
    which = trace_assignment(len(trace), population, 0, "round_robin")
    pop = Population(
        speed=trace.flops_per_s[which], up_bandwidth=trace.up_bytes_per_s[which],
        down_bandwidth=trace.down_bytes_per_s[which],
    )  # fmt: skip
    pop = replace(pop, availability=trace.availability.take(which))
    del trace
    g = torch.Generator().manual_seed(0)
    x = torch.randn(POOL, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (POOL,), generator=g)
    rng = np.random.default_rng(0)
    data = ClientData.from_partition(
        x, y, [rng.integers(0, POOL, PER_CLIENT) for _ in range(population)]
    )
    model = build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=0)
    layers = layer_view(model, (1, 28, 28))
    planner = LocalSGDPlanner(
        client_sizes=data.sizes(), batch_size=16, local_epochs=1.0, local_steps=None,
        flops_per_sample=sum(la.fwd_flops + la.bwd_flops for la in layers),
        model_bytes=param_bytes(model),
    )  # fmt: skip
    strategy = Strategy(
        "fedavg", planner, SyncRounds(client_fraction=SELECTED / population), Update(Importance())
    )
    executor = make_executor(Needs(synchronous=True), model, data, seed=0,
                             local=LocalTraining(lr=0.05))  # fmt: skip
    stamps: list[float] = []

    class Clock:  # the host time at every server step
        def on_aggregation(self, sim: object, version: object) -> None:
            stamps.append(time.perf_counter())

    sim = Simulator(strategy=strategy, executor=executor, population=pop,
                    initial=snapshot(model, 0), seed=0, budget=Budget(aggregations=rounds),
                    observers=[Clock()])  # fmt: skip
    t0 = time.perf_counter()
    sim.run()
    steps = np.diff(stamps)
    return {"population": population, "rounds": sim.counters.aggregations,
            "first_round_s": stamps[0] - t0,  # (one-time work: the online set, row index)
            "host_s_per_round": float(np.median(steps)) if len(steps) else float("nan"),
            "clients_per_round": sim.counters.updates_used / max(1, sim.counters.aggregations),
            "updates_lost": sim.counters.updates_lost}  # fmt: skip


def _child(args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.trace_scale", *args,
           "--threads", str(torch.get_num_threads())]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    result: dict = json.loads(out.strip().splitlines()[-1])
    return result


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    from benchmarks.common import machine, median

    devices = 50_000 if quick else 500_000
    rounds = 5 if quick else 100
    small = 5_000
    with tempfile.TemporaryDirectory() as tmp:
        folder, little_fleet = Path(tmp) / "fleet", Path(tmp) / "fleet-5000"
        make_fleet(folder, devices)
        make_fleet(little_fleet, small)  # (the same generator: the same shares online)
        loads = [_child(["--load", str(folder)]) for _ in range(repeats)]
        big = [_child(["--rounds", str(rounds), "--population", str(devices), str(folder)])
               for _ in range(repeats)]  # fmt: skip
        little = [_child(["--rounds", str(rounds), "--population", str(small), str(little_fleet)])
                  for _ in range(repeats)]  # fmt: skip
    per_big = median([r["host_s_per_round"] for r in big])
    per_small = median([r["host_s_per_round"] for r in little])
    return {
        "benchmark": NAME, "quick": quick, "devices": devices,
        "intervals": loads[0]["intervals"],
        "load_s": median([r["load_s"] for r in loads]),
        "load_added_rss_mb": median([r["added_rss_mb"] for r in loads]),
        "host_s_per_round_big": per_big, "host_s_per_round_5000": per_small,
        "clients_per_round": [big[0]["clients_per_round"], little[0]["clients_per_round"]],
        "first_round_s_big": median([r["first_round_s"] for r in big]),
        "first_round_s_5000": median([r["first_round_s"] for r in little]),
        "ratio": per_big / per_small, "rounds": rounds, "machine": machine(),
    }  # fmt: skip


def rows(result: dict) -> list[tuple[str, str]]:
    return [
        ("devices / online intervals", f"{result['devices']:,} / {result['intervals']:,}"),
        ("load (read_trace)", f"{result['load_s']:.2f} s, +{result['load_added_rss_mb']:.0f} MB"),
        ("host s per round, all devices", f"{result['host_s_per_round_big']:.4f}"),
        ("host s per round, 5,000 devices", f"{result['host_s_per_round_5000']:.4f}"),
        (
            "first round (one-time work)",
            f"{result['first_round_s_big']:.3f} / {result['first_round_s_5000']:.3f} s",
        ),
        ("ratio", f"{result['ratio']:.2f}x"),
        (
            "clients per round (all / 5,000)",
            " / ".join(f"{c:.1f}" for c in result["clients_per_round"]),
        ),
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", nargs="?")
    ap.add_argument("--load")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--population", type=int)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.load:
        print(json.dumps(child_load(Path(a.load))))
    else:
        print(json.dumps(child_rounds(Path(a.folder), a.population, a.rounds)))
