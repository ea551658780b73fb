"""Cross-check: the SALF authors' training loop, re-implemented in plain PyTorch.

``python scripts/salf_authors_loop.py --data-dir DIR --model mlp --method drop --ratio 0.9``

An independent re-implementation (no fedclock strategy, executor or simulator code) of the
loop that ``../shared/specs/reference-implementations.md`` §1.3 describes, so that
fedclock's ``salf.mode: reference`` can be checked against something other than itself:

- MNIST normalised with (x − 0.5)/0.5; a random 10,000-sample validation split taken out of
  the 60,000 training images; the other 50,000 permuted and cut into U shards of
  ⌊50,000/U⌋ (1,666 for U = 30);
- U local models, each with its own SGD(lr, momentum 0.5) that lives for the whole run
  (momentum buffers persist across rounds);
- the straggler set is drawn once (round(ρ·U) users) and fixed;
- every round each local model loads the global weights; a non-straggler takes ONE SGD step
  on a batch of 16 drawn from its shard; ``drop``: a straggler does nothing; ``salf``: a
  straggler takes the step, then keeps only its last k state-dict tensors (k uniform on
  {1..L_e}); ``asyncfl``: a straggler of depth l (l = L_e − k + 1) delivers a full step
  computed on the model it downloaded 2l rounds before;
- aggregation: global = (1/U) Σ_u local_u for every tensor (stragglers count with the
  global value);
- validation accuracy every round; the result is the test accuracy of the best-validation
  model (Table II's metric).

It prints one JSON line. The random streams differ from fedclock's, so single runs differ
by the seed spread; compare means over seeds.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedclock.data.idx import read_idx


class MLP(nn.Module):  # 784-32-16-10, ReLU (spec §1.3)
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 32), nn.Linear(32, 16), nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class CNN(nn.Module):  # conv 1→6→6 (k5, maxpool 2), fc 96→50→10 (spec §1.3)
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 6, 5), nn.Conv2d(6, 6, 5)
        self.fc1, self.fc2 = nn.Linear(96, 50), nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load(data_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    def images(name: str) -> torch.Tensor:
        x = read_idx(data_dir / name).astype(np.float32) / 255.0
        return torch.from_numpy((x - 0.5) / 0.5).unsqueeze(1)

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
    correct = 0
    for i in range(0, len(x), 1000):
        correct += int((model(x[i : i + 1000]).argmax(1) == y[i : i + 1000]).sum())
    return correct / len(x)


def run(args: argparse.Namespace) -> dict[str, float | int | str]:
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    x, y, x_test, y_test = load(Path(args.data_dir))
    split = torch.randperm(len(x))
    val, train = split[:10_000], split[10_000:]
    x_val, y_val = x[val], y[val]
    order = train[torch.randperm(len(train))]
    per_user = len(train) // args.users
    shards = [order[u * per_user : (u + 1) * per_user] for u in range(args.users)]

    net = {"mlp": MLP, "cnn": CNN}[args.model]
    glob = net()
    local = [net() for _ in range(args.users)]
    opts = [torch.optim.SGD(m.parameters(), lr=args.lr, momentum=args.momentum) for m in local]
    keys = list(glob.state_dict())
    n_tensors = len(keys)
    stragglers = set(random.sample(range(args.users), round(args.ratio * args.users)))
    stale: dict[int, tuple[dict[str, torch.Tensor], int]] = {}  # asyncfl: (base, due round)

    def step(u: int) -> None:
        idx = shards[u][torch.randperm(per_user)[: args.batch]]
        loss = F.cross_entropy(local[u](x[idx]), y[idx])
        opts[u].zero_grad()
        loss.backward()
        opts[u].step()

    best_val, best_state = -1.0, glob.state_dict()
    for t in range(args.rounds):
        if args.redraw and t > 0:  # the paper's wording: a new straggler set every round
            stragglers = set(random.sample(range(args.users), round(args.ratio * args.users)))
        g = {k: v.clone() for k, v in glob.state_dict().items()}
        total = {k: torch.zeros_like(v) for k, v in g.items()}
        for u in range(args.users):
            m = local[u]
            m.load_state_dict(g)
            if u in stragglers and args.method == "drop":
                pass
            elif u in stragglers and args.method == "salf":
                step(u)
                k = int(np.random.randint(1, n_tensors + 1))
                kept = set(keys[n_tensors - k :])
                m.load_state_dict(
                    {key: (v if key in kept else g[key]) for key, v in m.state_dict().items()}
                )
            elif u in stragglers and args.method == "asyncfl":
                if u not in stale:
                    k = int(np.random.randint(1, n_tensors + 1))
                    stale[u] = (g, t + 2 * (n_tensors - k + 1) - 1)
                base, due = stale[u]
                if t == due:
                    m.load_state_dict(base)
                    step(u)
                    delta = {key: v - base[key] for key, v in m.state_dict().items()}
                    m.load_state_dict({key: g[key] + delta[key] for key in keys})
                    del stale[u]
            else:
                step(u)
            for key, v in m.state_dict().items():
                total[key] += v
        glob.load_state_dict({k: v / args.users for k, v in total.items()})
        v_acc = accuracy(glob, x_val, y_val)
        if v_acc > best_val:
            best_val, best_state = v_acc, {k: v.clone() for k, v in glob.state_dict().items()}
    final_test = accuracy(glob, x_test, y_test)
    glob.load_state_dict(best_state)
    return {
        "model": args.model,
        "method": args.method,
        "ratio": args.ratio,
        "seed": args.seed,
        "rounds": args.rounds,
        "redraw": args.redraw,
        "lr": args.lr,
        "best_val_accuracy": round(best_val, 4),
        "val_best_test_accuracy": round(accuracy(glob, x_test, y_test), 4),
        "final_test_accuracy": round(final_test, 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True, help="folder with the four MNIST IDX .gz files")
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    ap.add_argument("--method", choices=("vanilla", "drop", "salf", "asyncfl"), default="drop")
    ap.add_argument("--ratio", type=float, default=0.9, help="straggler ratio ρ")
    ap.add_argument("--rounds", type=int, help="default: 250 (mlp) / 150 (cnn), as the paper")
    ap.add_argument("--lr", type=float, help="default: 0.05 (mlp) / 0.1 (cnn), as the paper")
    ap.add_argument("--momentum", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--users", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--redraw",
        action="store_true",
        help="draw a new straggler set every round (the paper's text) instead of once (the code)",
    )
    args = ap.parse_args(argv)
    if args.method == "vanilla":
        args.ratio = 0.0
    args.rounds = args.rounds or (250 if args.model == "mlp" else 150)
    args.lr = args.lr or (0.05 if args.model == "mlp" else 0.1)
    torch.set_num_threads(1)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
