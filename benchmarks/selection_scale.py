"""Speed-aware selection at 100,000 clients: the host time of a round that asks 100 of them,
chosen uniformly (``random``), by Oort, by TiFL or by REFL's participant selection
(strategies/selection.py; no deadline, so nothing is late and REFL's aggregation is unused).

Synchronous FedAvg rounds over 100,000 clients on a capability population (speeds
log-normal around 4 GFLOP/s, links around 5,000 kbit/s), logistic regression on 32
MNIST-shaped samples per client (index views into one pool), one local epoch of batch 16.
Each selection runs in its own process; the figure is the median host time between server
steps from the second on (a selection's first round registers every client: the cost model's
nominal duration of each, reported on its own). Oort's and TiFL's rounds include what they
need the clients to send up (one forward pass over each participant's epoch:
``fedclock.train.statistics``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
import torch

NAME = "selection-scale"
POOL = 60_000
PER_CLIENT = 32
SELECTED = 100
KINDS = ("random", "oort", "tifl", "refl")


def child(kind: str, population: int, rounds: int) -> dict[str, float]:
    from fedclock.devices.population import Population
    from fedclock.models import build_model, layer_view, param_bytes
    from fedclock.sim.simulator import Budget, Simulator
    from fedclock.strategies import LocalSGDPlanner, Strategy, SyncRounds, Update
    from fedclock.strategies.aggregators import Importance
    from fedclock.strategies.selection import REFL, Oort, TiFL
    from fedclock.train.executor import ClientData, snapshot
    from fedclock.train.factory import make_executor
    from fedclock.train.local import LocalTraining, Needs

    rng = np.random.default_rng(0)
    speed = 4.0e9 * rng.lognormal(0.0, 0.8, population)
    bw = 5000.0 * 128.0 * rng.lognormal(0.0, 1.0, population)
    pop = Population(speed=speed, up_bandwidth=bw, down_bandwidth=bw)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(POOL, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (POOL,), generator=g)
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
    selection = {
        "random": None,
        "oort": lambda: Oort(planner, data.sizes()),
        "tifl": lambda: TiFL(planner),
        "refl": lambda: REFL(planner, t_max=None),
    }[kind]
    rounds_trigger = SyncRounds(
        client_fraction=SELECTED / population, selection=selection() if selection else None
    )
    strategy = Strategy("fedavg", planner, rounds_trigger, Update(Importance()))
    needs = Needs(synchronous=True, statistics=kind in ("oort", "tifl"))
    executor = make_executor(needs, model, data, seed=0, local=LocalTraining(lr=0.05))
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
    return {"kind": kind, "population": population, "rounds": sim.counters.aggregations,
            "first_round_s": stamps[0] - t0,
            "host_s_per_round": float(np.median(steps)) if len(steps) else float("nan"),
            "clients_per_round": sim.counters.updates_used / max(1, sim.counters.aggregations)}  # fmt: skip


def _child(kind: str, population: int, rounds: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.selection_scale", kind, "--population",
           str(population), "--rounds", str(rounds), "--threads", str(torch.get_num_threads())]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    result: dict = json.loads(out.strip().splitlines()[-1])
    return result


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    from benchmarks.common import machine, median

    population = 10_000 if quick else 100_000
    rounds = 10 if quick else 60
    got = {k: [_child(k, population, rounds) for _ in range(repeats)] for k in KINDS}
    per = {k: median([r["host_s_per_round"] for r in v]) for k, v in got.items()}
    return {
        "benchmark": NAME, "quick": quick, "population": population, "rounds": rounds,
        "selected": SELECTED,
        "host_s_per_round": per,
        "first_round_s": {k: median([r["first_round_s"] for r in v]) for k, v in got.items()},
        "ratio_to_random": {k: per[k] / per["random"] for k in KINDS},
        "clients_per_round": {k: v[0]["clients_per_round"] for k, v in got.items()},
        "machine": machine(),
    }  # fmt: skip


def rows(result: dict) -> list[tuple[str, str]]:
    out = [("clients / asked per round", f"{result['population']:,} / {result['selected']}")]
    for k in KINDS:
        out.append(
            (
                f"{k}: host s per round (first round)",
                f"{result['host_s_per_round'][k]:.4f} ({result['first_round_s'][k]:.2f} s), "
                f"{result['ratio_to_random'][k]:.2f}x random",
            )
        )
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--population", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps(child(a.kind, a.population, a.rounds)))
