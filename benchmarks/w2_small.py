"""W2, overhead-bound (the SALF MNIST setting): 30 clients × 1,666 MNIST-shaped samples,
MLP 784-32-16-10, every round each client takes ONE SGD step on a batch of 16 (lr 0.05),
250 rounds, test accuracy (10,000 samples) every round."""

from __future__ import annotations

from benchmarks.common import FedAvgSetup, fedavg_benchmark, fedavg_rows, mnist_like

NAME = "w2-small"


def setup(*, quick: bool = False) -> FedAvgSetup:
    """The workload (its data generated now)."""
    rounds = 30 if quick else 250
    return FedAvgSetup(
        mnist_like(30, 1666), hidden=(32, 16), rounds=rounds, batch_size=16, lr=0.05,
        local_steps=1,
    )  # fmt: skip


def floor_block(clients: int) -> int:
    return clients  # every client in one block


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    s = setup(quick=quick)
    return fedavg_benchmark(
        NAME, s, block=floor_block(len(s.data.parts)), repeats=repeats, quick=quick
    )


rows = fedavg_rows
