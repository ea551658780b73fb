"""Cross-check: the Fed-RAA authors' event loop (``tdwxz/fedraa``), re-implemented in plain PyTorch.

``python scripts/fedraa_authors_loop.py --data-dir DIR --method gre-raa --seed 1 --time 300``

An independent re-implementation (no fedclock strategy, executor or simulator code; only its
IDX reader) of what ``../shared/specs/reference-implementations.md`` §2.2 describes, so that
fedclock's ``strategy.mode: reference`` and its Table 2 / 3 ratios can be checked against
something other than itself:

- MNIST normalised as (x − 0.1307)/0.3081; iid: each of the N clients gets 600 training
  images of every class, drawn independently per client (so clients may overlap; the
  authors' split is not seeded, this one is); the full test set.
- Their MLP: Linear(784, 200) → Dropout(0.5) → ReLU → Linear(200, 10).
- Fragments (Table 4's shares): only the output weight (10×200) is split — flat position p
  is in fragment j when the rank of p's initial value falls in j's share; every other tensor
  is in every fragment.
- Devices: ⌊β·N⌋ clients of capability 1, the rest of capability 5 (their ``--client_cmp``).
- An update: the global model with the output weight masked to the fragment, a new
  SGD(lr 0.005, momentum 0.5), 5 epochs of shuffled batches of 128 over the client's data,
  the mask re-applied after every step; Δ = w_local − w_masked_start.
- Simulated duration: their measured time × part/100 / cmp, with the measured time replaced
  by the full task's time at 1 GFLOP/s so that runs do not depend on the machine:
  d = T_full · part/100 / cmp, T_full = samples · epochs · F / 10⁹ with F = 2·784·200·2 +
  2·200·10·3 FLOPs per sample (each linear layer's forward and weight gradient, and the
  output layer's input gradient).
- Event loop: every idle client whose clock ≤ server time gets a fragment (its use counter
  incremented at assignment), trains at once on the current global model, and its update is
  queued to finish at server time + d; the earliest update is applied,
  θ ← θ + (n_i/n_total)·s·Δ with s = 1/(1 + d/100) and n_total = 60,000; the server time
  moves to its finish; the test set is evaluated.
- Schedulers: ``gre-raa`` as coded (start from fragment 0, move to j ≥ 1 when
  cost[n, j] ≤ K and use[j] < use[current]; cost = (part_j/100)/cmp_n), ``random``
  (uniform), ``mp-raa`` (argmin of the use counters). K defaults to the offline bound
  (clients fastest first, fragments largest first, ⌊N/M⌋ clients each).
- ``sync``: every round all clients train their Gre-RAA fragment from the same global model,
  θ ← θ + Σ (n_i/n)·Δ_i (``--double-count``: the authors' bug, the first client's Δ twice),
  and the time advances by the longest duration. ``fedavg``: every client the full model,
  θ ← Σ (n_i/n)·θ_i, a round lasting T_full / min cmp.

It prints one JSON line: the time at which test accuracy first reaches ``--target``, the
accuracy at the end, and the number of updates applied.
"""

from __future__ import annotations

import argparse
import copy
import heapq
import json
import random
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedclock.data.idx import read_idx

RATIOS = {2: [40, 60], 3: [20, 30, 50], 4: [10, 20, 30, 40], 5: [5, 10, 20, 30, 35]}
FLOPS_PER_SAMPLE = 2 * 784 * 200 * 2 + 2 * 200 * 10 * 3


class MLP(nn.Module):  # the authors' MLP (spec §2.2): Dropout before the ReLU
    def __init__(self) -> None:
        super().__init__()
        self.layer_input = nn.Linear(784, 200)
        self.dropout = nn.Dropout(0.5)
        self.layer_hidden = nn.Linear(200, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_hidden(torch.relu(self.dropout(self.layer_input(x.flatten(1)))))


def load(data_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    def images(name: str) -> torch.Tensor:
        x = torch.from_numpy(read_idx(data_dir / name).astype(np.float32) / 255.0)
        return ((x - 0.1307) / 0.3081).flatten(1)

    def labels(name: str) -> torch.Tensor:
        return torch.from_numpy(read_idx(data_dir / name).astype(np.int64))

    return (
        images("train-images-idx3-ubyte.gz"),
        labels("train-labels-idx1-ubyte.gz"),
        images("t10k-images-idx3-ubyte.gz"),
        labels("t10k-labels-idx1-ubyte.gz"),
    )


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    hits = sum(
        int((model(x[i : i + 2000]).argmax(1) == y[i : i + 2000]).sum())
        for i in range(0, len(x), 2000)
    )
    return hits / len(x)


def fragment_masks(weight: torch.Tensor, ratios: list[int]) -> list[torch.Tensor]:
    """The output weight's element-wise split by the rank of its initial values."""
    rank = torch.argsort(weight.detach().flatten(), stable=True)
    n, out, acc = rank.numel(), [], 0
    for r in ratios:
        lo, acc = acc, acc + r
        out.append(((rank >= lo * n // 100) & (rank < acc * n // 100)).view_as(weight))
    return out


def offline_k(cost: np.ndarray) -> float:
    n, m = cost.shape
    clients = np.argsort(cost[:, -1], kind="stable")  # fastest first
    per = max(1, n // m)
    return max(
        float(cost[i, m - 1 - min(rank // per, m - 1)]) for rank, i in enumerate(clients)
    )  # fragments largest (last) first


def train(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace,
    mask: torch.Tensor | None, gen: torch.Generator,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Local training from ``model``'s weights; returns Δ = w_local − w_masked_start."""
    local = copy.deepcopy(model)
    if mask is not None:
        with torch.no_grad():
            local.layer_hidden.weight.mul_(mask)
    start = {k: v.detach().clone() for k, v in local.state_dict().items()}
    opt = torch.optim.SGD(local.parameters(), lr=args.lr, momentum=0.5)
    local.train()
    for _ in range(args.epochs):
        order = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), args.batch):
            rows = order[i : i + args.batch]
            opt.zero_grad()
            nn.functional.cross_entropy(local(x[rows]), y[rows]).backward()
            opt.step()
            if mask is not None:
                with torch.no_grad():
                    local.layer_hidden.weight.mul_(mask)
    return {k: v.detach() - start[k] for k, v in local.state_dict().items()}


def run(args: argparse.Namespace) -> dict[str, object]:
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    x, y, x_test, y_test = load(Path(args.data_dir))
    by_class = [torch.nonzero(y == c).flatten().tolist() for c in range(10)]
    per_class = len(y) // args.clients // 10
    data = []
    for _ in range(args.clients):  # iid, 600 of each class, drawn independently per client
        idx = torch.tensor([i for c in range(10) for i in rng.sample(by_class[c], per_class)])
        data.append((x[idx], y[idx]))
    n_slow = int(args.beta * args.clients)
    cmp = np.array([1.0] * n_slow + [float(args.low_cmp)] * (args.clients - n_slow))
    ratios = RATIOS[args.fragments]
    model = MLP()
    masks = fragment_masks(model.layer_hidden.weight, ratios)
    part = np.array(ratios, dtype=float) / 100
    cost = part[None, :] / cmp[:, None]
    k = offline_k(cost) if args.k is None else args.k
    t_full = [len(d[1]) * args.epochs * FLOPS_PER_SAMPLE / 1e9 for d in data]
    n_total = len(y)
    use = [0] * len(ratios)

    def choose(n: int) -> int:
        if args.method in ("gre-raa", "sync"):
            h = 0
            for j in range(1, len(ratios)):
                if cost[n, j] <= k and use[j] < use[h]:
                    h = j
        elif args.method == "random":
            h = rng.randrange(len(ratios))
        else:  # mp-raa
            h = int(np.argmin(use))
        use[h] += 1
        return h

    def apply(delta: dict[str, torch.Tensor], a: float) -> None:
        state = model.state_dict()
        for name, d in delta.items():
            state[name].add_(d, alpha=a)

    curve: list[tuple[float, float]] = [(0.0, accuracy(model, x_test, y_test))]
    now, updates = 0.0, 0
    if args.method in ("fedavg", "sync"):
        while now < args.time:
            round_len = 0.0
            steps = []  # (Δ_n, n_n / n) of every client, from the same global model
            for n in range(args.clients):
                j = None if args.method == "fedavg" else choose(n)
                mask = None if j is None else masks[j]
                steps.append((train(model, *data[n], args, mask, gen), len(data[n][1]) / n_total))
                share = 1.0 if j is None else part[j]
                round_len = max(round_len, t_full[n] * share / cmp[n])
            if args.method == "sync" and args.double_count:
                steps.append(steps[0])
            for delta, a in steps:
                apply(delta, a)
            now += round_len
            updates += args.clients
            curve.append((now, accuracy(model, x_test, y_test)))
    else:
        queue: list[tuple[float, int, int, float, dict[str, torch.Tensor]]] = []
        idle = set(range(args.clients))
        order = 0  # ties in finish time: dispatch order
        while now < args.time:
            for n in sorted(idle):
                j = choose(n)
                d = t_full[n] * part[j] / cmp[n]
                delta = train(model, *data[n], args, masks[j], gen)
                heapq.heappush(queue, (now + d, order, n, d, delta))
                order += 1
            idle.clear()
            finish, _, n, d, delta = heapq.heappop(queue)
            idle.add(n)
            apply(delta, len(data[n][1]) / n_total / (1 + d / 100))
            now, updates = finish, updates + 1
            curve.append((now, accuracy(model, x_test, y_test)))
    reached = next((t for t, acc in curve if acc >= args.target), None)
    at_end = [acc for t, acc in curve if t <= args.time][-1]
    return {
        "method": args.method, "seed": args.seed, "beta": args.beta, "fragments": args.fragments,
        "k": k, "time_to_target": reached, "target": args.target,
        "accuracy_at_end": at_end, "time": args.time, "updates": updates,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True, help="folder with the four MNIST IDX .gz files")
    ap.add_argument(
        "--method", choices=("gre-raa", "random", "mp-raa", "sync", "fedavg"), default="gre-raa"
    )
    ap.add_argument("--time", type=float, default=300.0, help="simulated seconds to run")
    ap.add_argument("--target", type=float, default=0.93)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--beta", type=float, default=0.5, help="share of capability-1 clients")
    ap.add_argument("--low-cmp", type=float, default=5.0, help="the other clients' capability")
    ap.add_argument("--fragments", type=int, choices=sorted(RATIOS), default=4)
    ap.add_argument("--k", type=float, help="delay bound K (default: the offline bound)")
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--double-count", action="store_true", help="sync: the authors' bug")
    args = ap.parse_args(argv)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
