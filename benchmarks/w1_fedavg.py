"""W1, compute-bound FedAvg: 100 clients × 600 MNIST-shaped samples, MLP 784-200-200-10,
10 rounds of 1 local epoch with batch 50 and SGD lr 0.05; test accuracy every round."""

from __future__ import annotations

from benchmarks import common
from benchmarks.common import FedAvgSetup, fedavg_benchmark, fedavg_rows, mnist_like

NAME = "w1-fedavg"
FLOOR_BLOCK = 10  # (the fastest hand-written block on the reference CPU: docs/benchmarks.md)


def setup(*, quick: bool = False) -> FedAvgSetup:
    """The workload (its data generated now)."""
    clients, rounds = (10, 3) if quick else (100, 10)
    return FedAvgSetup(
        mnist_like(clients, 600), hidden=(200, 200), rounds=rounds, batch_size=50, lr=0.05,
        local_epochs=1.0,
    )  # fmt: skip


def floor_block(clients: int) -> int:
    # on a GPU the fastest hand-written loop trains every client in one block
    return FLOOR_BLOCK if common.DEVICE.type == "cpu" else clients


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    s = setup(quick=quick)
    block = floor_block(len(s.data.parts))
    return fedavg_benchmark(NAME, s, block=block, repeats=repeats, quick=quick)


rows = fedavg_rows
