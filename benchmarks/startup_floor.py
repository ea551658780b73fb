"""The floor of the `startup` benchmark, as a whole process: what a PyTorch user would write
for the w1-fedavg or w2-small workload, with nothing of fedclock in it.

``python -m benchmarks.startup_floor w1-fedavg|w2-small [ROUNDS]`` imports torch, generates
the workload's MNIST-shaped data (``benchmarks.common.mnist_like``: N(0, 1) pixels, labels
from a random linear teacher; the same number of train and test samples as the fedclock
config), builds a plain ``nn.Sequential`` MLP and runs the floor loop
(``benchmarks.common.run_handwritten``: hand-written gradients over blocks of clients; every
round trains every client and evaluates on the whole test set), then exits. It prints one JSON line: ``first_round_at`` and ``last_round_at``
(``time.perf_counter()`` when the first round starts and when the last one ends: on Linux the
system-wide monotonic clock, so the parent can subtract its own start time) and the loop's
seconds per round.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence

import torch
from torch import nn


def plain_mlp(hidden: Sequence[int], in_features: int = 784, classes: int = 10) -> nn.Module:
    """Flatten → [Linear → ReLU] per hidden width → Linear: fedclock's ``mlp`` in plain torch."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def main(argv: list[str]) -> int:
    torch.set_num_threads(2)
    from benchmarks import common, w1_fedavg, w2_small

    module = {"w1-fedavg": w1_fedavg, "w2-small": w2_small}[argv[0]]
    setup = module.setup()
    if len(argv) > 1:
        setup = dataclasses.replace(setup, rounds=int(argv[1]))
    model = plain_mlp(setup.hidden)
    first = time.perf_counter()
    s_per_round = common.run_handwritten(
        setup, block=module.floor_block(len(setup.data.parts)), model=model
    )
    last = time.perf_counter()
    print(json.dumps({"first_round_at": first, "last_round_at": last, "s_per_round": s_per_round}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
