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

``--authors-rng``: the authors' random calls, in the authors' order
--------------------------------------------------------------------

The default mode above draws its own random numbers. With ``--authors-rng`` the script
instead makes the random calls that the authors' ``main.py`` / ``utils.py`` make (as read at
``langnatalie/SALF`` ``ad6533a``; spec §1.3), on the same generators and in the same order,
so that a run at ``--seed 1234`` draws the authors' validation split, initial model, shards,
mini-batches, straggler set and SALF depths. The calls, in order:

1. ``torch.manual_seed(s)``, ``np.random.seed(s)``, ``random.seed(s)`` (``initializations``;
   ``torch.cuda.manual_seed_all`` has no effect on the CPU streams below).
2. ``random_split(train, [50000, 10000])`` with the default generator: one
   ``torch.randperm(60000)``; its first 50,000 entries are the training subset, the last
   10,000 (in that order) the validation set (``data_split``).
3. The global model: ``FC2Layer`` (fc1, fc2, fc3) or ``CNN2Layer`` (conv1, conv2, fc1, fc2),
   each layer's default ``reset_parameters`` in that order on torch's global generator.
4. ``federated_setup``: one ``torch.randperm(50000)``; user u's shard is positions
   ``[u·1666, (u+1)·1666)`` of it, mapped through the training subset. The U local models
   are ``copy.deepcopy`` of the global one (no random calls; the default mode instead
   initialises U fresh models), each with its own SGD optimizer.
5. Unless vanilla (``--stragglers None`` draws nothing here): the straggler set,
   ``random.sample(range(U), round(ρ·U))`` on Python's ``random``, once.
6. Every round, users 0..U−1 in order; a drop-mode straggler draws nothing. Every other
   user trains one mini-batch from a fresh iterator of its ``DataLoader(shuffle=True,
   batch_size=16)``, which in torch's code is: ``_BaseDataLoaderIter`` draws ``_base_seed``
   (``torch.empty((), dtype=int64).random_()``), then ``RandomSampler.__iter__`` draws a seed
   the same way, seeds a fresh ``torch.Generator`` with it and takes
   ``torch.randperm(1666, generator=…)``; the batch is its first 16 entries. Then, for a SALF
   straggler only, ``np.random.randint(1, L_e + 1)`` (numpy's global RNG) gives k.
7. FedAvg sums the local state dicts in user order and divides by U; validation accuracy in
   batches of 1,000 in the split's order; test accuracy of the best-validation model.

Nothing else in the authors' loop consumes these three generators (``torchinfo.summary``
without an input, ``deepcopy``, ``load_state_dict``, the optimizers and the evaluation draw
nothing). MNIST is read from the IDX files: ``(x/255 − 0.5)/0.5`` in float32 is bitwise what
torchvision's ``ToTensor`` + ``Normalize((0.5,), (0.5,))`` give.

Where it cannot be exact:

- The authors trained on ``cuda:0`` (their default device); this script runs on the CPU.
  Every random draw above is made on the CPU generators in both, and no draw depends on a
  computed value, so the data order, initial weights, straggler set and depths are the
  authors'; the floating-point results of the forward/backward passes are not (cuBLAS /
  cuDNN vs CPU kernels round differently), so a run here is not bitwise the authors' run.
  How much that moves an accuracy was not measured on a GPU. On the CPU the MLP runs are
  insensitive to rounding: 1 vs 2 threads give bitwise the same run, and a float64 forward
  pass gave the same accuracies to 4 decimals (vanilla, drop ρ=0.7, SALF ρ=0.9, seed 1234).
- The torch version: the calls above are those of torch 2.x's ``random_split``,
  ``DataLoader`` and ``RandomSampler`` (checked against the torch installed here); the
  authors' version is not recorded. ``randperm`` and ``uniform_`` on the CPU generator are
  assumed to produce the same numbers across versions.
- Seeds other than 1234: the authors' ``--seed`` has ``type=float``, so ``--seed 1`` on their
  command line becomes ``1.0``, which ``np.random.seed`` rejects (TypeError with the numpy
  installed here); only the default, the int 1234, runs unedited. ``--seed s`` here seeds
  all three generators with the int s, as the authors' code would with its default edited.
- ``asyncfl`` and ``--redraw`` are not in the authors' code (no call order to copy), so
  ``--authors-rng`` refuses them.

``--init-seed S`` (with ``--authors-rng``) replaces only the initial model by the one the
authors' calls draw at seed S (steps 1–3 at S); every other draw stays the run seed's (the
run still makes its own step-3 draws, then overwrites the weights), so ``--seed 1
--init-seed 1234`` is seed 1's run started from seed 1234's initial model.
"""

from __future__ import annotations

import argparse
import copy
import functools
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


@functools.cache  # read once per process (the tests call main() many times)
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


N_VAL = 10_000  # the authors' validation split: as many samples as the test set


# --authors-rng: each helper makes exactly the torch calls that the authors' code makes
# through torch.utils.data (module docstring, steps 2, 4 and 6), nothing more.
def authors_split(n_total: int, n_val: int = N_VAL) -> tuple[torch.Tensor, torch.Tensor]:
    """random_split(data, [n_total − n_val, n_val]): (training subset, validation set)."""
    perm = torch.randperm(n_total)
    return perm[: n_total - n_val], perm[n_total - n_val :]


def authors_shards(train: torch.Tensor, users: int) -> list[torch.Tensor]:
    """federated_setup: user u's shard, as indices into the full training set."""
    order = torch.randperm(len(train))
    per_user = len(train) // users
    return [train[order[u * per_user : (u + 1) * per_user]] for u in range(users)]


def authors_batch(shard_len: int, batch: int) -> torch.Tensor:
    """Positions in the shard of the first batch of a fresh DataLoader(shuffle=True) iterator."""
    torch.empty((), dtype=torch.int64).random_()  # _BaseDataLoaderIter._base_seed
    seed = int(torch.empty((), dtype=torch.int64).random_().item())  # RandomSampler.__iter__
    generator = torch.Generator()
    generator.manual_seed(seed)
    return torch.randperm(shard_len, generator=generator)[:batch]


def authors_initial_state(net: type[nn.Module], seed: int, n_total: int) -> dict:
    """The global model's initial weights that the authors' calls draw at ``seed``."""
    torch.manual_seed(seed)
    authors_split(n_total)
    return net().state_dict()


def run(args: argparse.Namespace) -> dict[str, float | int | str | list[int] | None]:
    net = {"mlp": MLP, "cnn": CNN}[args.model]
    x, y, x_test, y_test = load(Path(args.data_dir))
    init_state = None
    if args.init_seed is not None:
        init_state = authors_initial_state(net, args.init_seed, len(x))
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    if args.authors_rng:
        train, val = authors_split(len(x))
        glob = net()
        if init_state is not None:
            glob.load_state_dict(init_state)
        shards = authors_shards(train, args.users)
        per_user = len(shards[0])
        local = [copy.deepcopy(glob) for _ in range(args.users)]
        drawn = (
            []
            if args.method == "vanilla"
            else random.sample(range(args.users), round(args.ratio * args.users))
        )
    else:
        split = torch.randperm(len(x))
        val, train = split[:N_VAL], split[N_VAL:]
        order = train[torch.randperm(len(train))]
        per_user = len(train) // args.users
        shards = [order[u * per_user : (u + 1) * per_user] for u in range(args.users)]
        glob = net()
        local = [net() for _ in range(args.users)]
        drawn = random.sample(range(args.users), round(args.ratio * args.users))
    x_val, y_val = x[val], y[val]
    opts = [torch.optim.SGD(m.parameters(), lr=args.lr, momentum=args.momentum) for m in local]
    keys = list(glob.state_dict())
    n_tensors = len(keys)
    stragglers = set(drawn)
    stale: dict[int, tuple[dict[str, torch.Tensor], int]] = {}  # asyncfl: (base, due round)

    def step(u: int) -> None:
        if args.authors_rng:
            idx = shards[u][authors_batch(per_user, args.batch)]
        else:
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
    out: dict[str, float | int | str | list[int] | None] = {
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
    if args.authors_rng:
        out.update(authors_rng=True, init_seed=args.init_seed, stragglers=drawn)
    return out


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
    ap.add_argument(
        "--authors-rng",
        action="store_true",
        help="make the authors' random calls in the authors' order (see the module docstring)",
    )
    ap.add_argument(
        "--init-seed",
        type=int,
        help="with --authors-rng: start from the initial model the authors' calls draw at "
        "this seed (every other draw stays --seed's)",
    )
    args = ap.parse_args(argv)
    if args.authors_rng and (args.method == "asyncfl" or args.redraw):
        ap.error("--authors-rng: asyncfl and --redraw are not in the authors' code")
    if args.init_seed is not None and not args.authors_rng:
        ap.error("--init-seed needs --authors-rng")
    if args.method == "vanilla":
        args.ratio = 0.0
    args.rounds = args.rounds or (250 if args.model == "mlp" else 150)
    args.lr = args.lr or (0.05 if args.model == "mlp" else 0.1)
    torch.set_num_threads(1)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
