"""The benchmarks' reference loops: the hand-written-gradient floor trains the same model as
the plain serial loop (same batches, same order) to float tolerance, so the "floor" figures
of docs/benchmarks.md time the same work fedclock does."""

from __future__ import annotations

import pytest
import torch

from benchmarks import common


@pytest.mark.parametrize(
    ("hidden", "steps", "epochs", "block"),
    [((8,), None, 2.0, 2), ((12, 6), 1, None, 4), ((5,), 3, None, 3)],
)
def test_the_handwritten_floor_equals_the_plain_serial_loop(
    hidden: tuple[int, ...], steps: int | None, epochs: float | None, block: int
) -> None:
    """Several rounds of several clients, one epoch or more (reshuffled) or a few steps,
    blocks that do and do not divide the clients: the same global model after every round's
    weighted average (float32; relative 1e-4 over a few hundred SGD steps)."""
    torch.manual_seed(0)
    setup = common.FedAvgSetup(
        common.mnist_like(5, 32, num_test=50), hidden=hidden, rounds=3, batch_size=8, lr=0.1,
        local_epochs=epochs, local_steps=steps,
    )  # fmt: skip
    plain: list[torch.Tensor] = []
    hand: list[torch.Tensor] = []
    common.run_plain_serial(setup, final=plain)
    common.run_handwritten(setup, block=block, final=hand)
    assert len(plain) == len(hand) == 2 * (len(hidden) + 1)
    for a, b in zip(plain, hand, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
