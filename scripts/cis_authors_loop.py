"""Cross-check: the CIS authors' training loop (``arodio/FedCIS``), re-implemented in plain PyTorch.

``python scripts/cis_authors_loop.py --data-dir DIR --strategy serving --serving 80-15-5 --seed 9``

An independent re-implementation (no fedclock strategy, executor, simulator, model or
evaluation code; only its IDX reader) of the loop that ``../shared/specs/reference-
implementations.md`` §3.2–3.5 describes (``main.py``, ``custom_training_topology.py``,
``aggregator.py`` at ``7c7f1bc``), on MNIST, so that fedclock's CIS ``strategy.mode:
reference`` can be checked against something other than itself:

- The 4-2-1 tree: root 0 holds exits 1–3, nodes 1–2 (children of 0) exits 1–2, leaves 3–6
  (3, 4 under 1; 5, 6 under 2) exit 1. Requests arrive at the leaves only.
- MNIST normalised as (x − 0.1307)/0.3081; a seeded random permutation of the 60,000
  training images split per layer (``--split``; equal: 1/3 per layer, evenly within a layer:
  root 20,000, mid nodes 10,000, leaves 5,000); the full test set.
- The early-exit CNN written out by hand (fedclock's ``ee_cnn`` with channels [16, 16, 32]):
  stem Conv3×3(1→16, stride 2) + ReLU → exit 1; residual block 16→16 (conv3×3 stride 2,
  ReLU, conv3×3, plus a 1×1 stride-2 skip conv, ReLU) → exit 2; residual block 16→32 → exit
  3; each head AdaptiveAvgPool(2) → Linear(4·C → 10). No normalisation layers. Every node
  starts from the same seeded initialisation and holds the entries and heads of its exits.
- Per node: SGD(lr, momentum 0.9, ``--weight-decay``) over the parameters it holds, created
  once, so its momentum buffer persists across rounds (as in the authors' code), and a
  ``CosineAnnealingLR(T_max = rounds, eta_min = --lr-min)`` stepped once per round for every
  node.
- A round (t = 0 … T−1): every node draws its exit — its own E_i, or with probability ε
  (``--epsilon``, the authors' ``--sampled-probability``) a lower exit drawn uniformly — and
  runs J = ``--local-steps`` SGD steps of batch ``--batch-size`` on the cross-entropy of
  that exit alone (batches cut from successive seeded shuffles of the node's data; the
  authors ran round(E·|S_root|/|S_i|) epochs, about the same number of steps for every
  node, which J replaces).
- Aggregation as coded (§3.4): the cloud model **is** the root's model, so the root's local
  training moves it in place; for every sampled (i, e), over the entries up to exit e,
  cloud += Λ̃_e·|S_i|/|S_{e,p}|·p_{i,e}·(w_i − cloud_post_root) (p multiplied; the root's
  own term is zero; S_{e,p}: the nodes whose own exit is e, or deeper when ε > 0; p_{i,e} =
  1 − ε for E_i, ε/(E_i − 1) below, 1 for a one-exit node). No head is ever updated by
  aggregation: the authors' last loop tests the 0-based entry index against the 1-based exit
  list (3, 9, 17), so the heads keep the root's values — its own exit's head after its local
  training, the lower exits' heads at their initialisation when ε = 0. (With this CNN's exits
  at entries 1, 2, 3 the literal off-by-one would instead add the mid nodes' exit-2 head
  updates; we port the consequence on the authors' ResNet, which is what fedclock's reference
  mode and the spec describe.) At ε = 0 this gives, per tensor, w + Λ̃1·mean(Δ_leaf) +
  Λ̃2·mean(Δ_mid) + Λ̃3·Δ_root on the stem (the paper's Algorithm 1), w + Λ̃2·mean(Δ_mid) +
  (1 − Λ̃2)·Δ_root on block 1 and w + Δ_root on block 2 and the exit-3 head.
- Then the broadcast: every node's tensors are overwritten in place with the cloud's.
- Λ̃: ``serving`` = the serving shares normalised (e.g. 0.80/0.15/0.05), ``equal`` = 1/3.
- Evaluation after the last round (§3.5): per-exit top-1 accuracy on the full test set, and
  CIS accuracy by the cascade the authors' routing amounts to when all nodes of a layer hold
  the same model: exit 1 serves the ``x``% of test points with the lowest normalised entropy
  H(softmax)/log 10 of exit 1, exit 2 the next ``y``% (of the total) of the rest by exit 2's
  entropy, exit 3 the remainder; a fractional boundary point is split (the authors spread a
  remainder differently, which never matters when the shares × 10,000 are integers).

What differs from fedclock's run of the ``cis-table1`` preset (so equal numbers run-for-run
are not expected, only the same distribution): the seeds drive different streams (the data
split, the initialisation, the batches and the exit draws come from one ``torch`` generator
and one ``numpy`` generator here, from fedclock's named streams there); fedclock cuts a
task's batches from a fresh shuffle per task, this script from each node's ongoing
shuffles; the cosine rate comes from torch's recursive ``CosineAnnealingLR`` here and from
the closed form there; fedclock routes on the tree (each node's served rate), this script
runs the three-level cascade.

``--mode paper`` runs Algorithm 1 as the paper prints it instead, the same independent way,
to check fedclock's ``strategy.mode: paper``:

- p_{i,E_i} = 1 − (E_i − 1)·ε and p_{i,e} = ε for each lower exit (the paper's §4 rule; a
  node draws its exit from that row);
- every task starts from the server's model w^t with a fresh SGD optimizer (momentum 0.9
  reset, ``--weight-decay``), at the round's cosine rate (the closed form, the same for
  every node);
- the server's model is its own (not the root's), and line 8 of Algorithm 1:
  w^{t+1} = w^t + η_s·Σ_{(i,e)} Λ̃_e·|S_i|/|S_{e,p}|·(w_{i,e} − w^t)/p_{i,e}, over the entries up
  to exit e and exit e's head (heads included), with S_{e,p} the nodes with p_{i,e} > 0;
- then every node is overwritten with w^{t+1}.

It prints one JSON line: the settings, each exit's test accuracy and the CIS accuracy.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedclock.data.idx import read_idx

#: the 4-2-1 tree: parent and deepest exit of nodes 0..6 (root 0, mid nodes 1–2, leaves 3–6)
PARENT = (-1, 0, 0, 1, 1, 2, 2)
EXIT = (3, 2, 2, 1, 1, 1, 1)
ROOT = 0
#: the data share of each exit layer (leaves' layer first), spread evenly within the layer
SPLITS = {
    "equal": (1 / 3, 1 / 3, 1 / 3),
    "biased": (0.143, 0.286, 0.571),
    "highly-biased": (0.034, 0.199, 0.767),
}
#: entry k (1-based) is ENTRIES[k − 1]; exit e comes after entry e
ENTRIES = ("stem.", "block1.", "block2.")
HEADS = ("head1.", "head2.", "head3.")


# ----------------------------------------------------------------------------- model
class Block(nn.Module):
    """conv3×3 (stride) → ReLU → conv3×3, plus a 1×1 conv of the input (stride), ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1)
        self.skip = nn.Conv2d(c_in, c_out, 1, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv2(F.relu(self.conv1(x))) + self.skip(x))


def _head(c: int) -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4 * c, 10))


class EECNN(nn.Module):
    """Three entries with an exit head after each; ``forward(x, upto)`` → logits of exits
    1..upto, a list."""

    def __init__(self, channels: Sequence[int] = (16, 16, 32)) -> None:
        super().__init__()
        c1, c2, c3 = channels
        self.stem = nn.Sequential(nn.Conv2d(1, c1, 3, 2, 1), nn.ReLU())
        self.block1 = Block(c1, c2, 2)
        self.block2 = Block(c2, c3, 2)
        self.head1, self.head2, self.head3 = _head(c1), _head(c2), _head(c3)

    def forward(self, x: torch.Tensor, upto: int = 3) -> list[torch.Tensor]:
        out = []
        for entry, head in zip((self.stem, self.block1, self.block2)[:upto],
                               (self.head1, self.head2, self.head3), strict=False):  # fmt: skip
            x = entry(x)
            out.append(head(x))
        return out


def held(name: str, top: int) -> bool:
    """Whether a node whose deepest exit is ``top`` holds the tensor ``name``."""
    return name.startswith(ENTRIES[:top] + HEADS[:top])


# ----------------------------------------------------------------------------- the rules
def p_exit(top: int, e: int, epsilon: float) -> float:
    """p_{i,e} as the authors code it: a one-exit node 1, its own exit 1 − ε, each lower
    exit ε/(E_i − 1), a deeper one 0."""
    if e > top:
        return 0.0
    if top == 1:
        return 1.0
    return 1.0 - epsilon if e == top else epsilon / (top - 1)


def coefficients(
    exits: Mapping[int, int], sizes: Sequence[float], lam: Sequence[float], epsilon: float,
    tops: Sequence[int] = EXIT,
) -> dict[int, float]:  # fmt: skip
    """Λ̃_e·|S_i|/|S_{e,p}|·p_{i,e} of each sampled node i (``exits``: i → its exit e), with
    S_{e,p} the data of the nodes whose own exit is e, or deeper when ε > 0."""
    out = {}
    for i, e in exits.items():
        pool = sum(s for s, top in zip(sizes, tops, strict=True)
                   if top == e or (e < top and epsilon > 0))  # fmt: skip
        out[i] = lam[e - 1] * sizes[i] / pool * p_exit(tops[i], e, epsilon)
    return out


@torch.no_grad()
def aggregate(
    cloud: Mapping[str, torch.Tensor], nodes: Mapping[int, Mapping[str, torch.Tensor]],
    exits: Mapping[int, int], coef: Mapping[int, float],
) -> dict[str, torch.Tensor]:  # fmt: skip
    """The authors' server update. ``cloud``: the root's weights after its local training;
    ``nodes[i]``: node i's weights after its local training on exit ``exits[i]``. Every
    entry up to exit e gets coef_i·(w_i − cloud) added; the heads keep the cloud's values."""
    out = {}
    for name, w in cloud.items():
        acc = w.clone()
        if not name.startswith(HEADS):
            for i, e in exits.items():
                if name.startswith(ENTRIES[:e]) and name in nodes[i]:
                    acc += coef[i] * (nodes[i][name] - w)
        out[name] = acc
    return out


def p_paper(top: int, e: int, epsilon: float) -> float:
    """p_{i,e} of the paper (§4, node collaboration): ε for each exit below E_i, the rest
    1 − (E_i − 1)·ε for E_i, 0 above."""
    if e > top:
        return 0.0
    return 1.0 - (top - 1) * epsilon if e == top else epsilon


def paper_coefficients(
    exits: Mapping[int, int], sizes: Sequence[float], lam: Sequence[float], epsilon: float,
    tops: Sequence[int] = EXIT,
) -> dict[int, float]:  # fmt: skip
    """Λ̃_e·|S_i|/|S_{e,p}|/p_{i,e} (Algorithm 1, line 8) of each sampled node i, S_{e,p} the
    data of every node with p_{i,e} > 0."""
    out = {}
    for i, e in exits.items():
        pool = sum(s for s, top in zip(sizes, tops, strict=True) if p_paper(top, e, epsilon) > 0)
        out[i] = lam[e - 1] * sizes[i] / pool / p_paper(tops[i], e, epsilon)
    return out


@torch.no_grad()
def paper_aggregate(
    w: Mapping[str, torch.Tensor], nodes: Mapping[int, Mapping[str, torch.Tensor]],
    exits: Mapping[int, int], coef: Mapping[int, float], server_lr: float = 1.0,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Line 8 of Algorithm 1: w + η_s·Σ_i coef_i·(w_i − w) over the tensors node i trained
    (the entries up to its exit e and exit e's head)."""
    out = {}
    for name, v in w.items():
        acc = v.clone()
        for i, e in exits.items():
            if name.startswith((*ENTRIES[:e], HEADS[e - 1])):
                acc += server_lr * coef[i] * (nodes[i][name] - v)
        out[name] = acc
    return out


def lambda_tilde(strategy: str, shares: Sequence[float]) -> np.ndarray:
    s = np.asarray(shares, dtype=float)
    return np.full(len(s), 1 / len(s)) if strategy == "equal" else s / s.sum()


def cascade(entropy: np.ndarray, correct: np.ndarray, shares: Sequence[float]) -> float:
    """CIS accuracy of the three-level cascade: exit e < E serves the share ``shares[e]`` (of
    the total) of the points still unserved with the lowest exit-e entropy (a boundary point
    split), the last exit serves the rest. ``entropy``, ``correct``: (E, N)."""
    n_exits, n = entropy.shape
    total = float(sum(shares))
    mass = np.full(n, 1.0 / n)
    hits = 0.0
    for e in range(n_exits):
        if e == n_exits - 1:
            take = mass.copy()
        else:
            order = np.argsort(entropy[e], kind="stable")
            m = mass[order]
            ahead = np.cumsum(m) - m
            take = np.zeros(n)
            take[order] = np.clip(shares[e] / total - ahead, 0.0, m)
        hits += float((take * correct[e]).sum())
        mass = mass - take
    return hits


# ----------------------------------------------------------------------------- data
def load(data_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    def images(name: str) -> torch.Tensor:
        x = torch.from_numpy(read_idx(data_dir / name).astype(np.float32) / 255.0)
        return ((x - 0.1307) / 0.3081).unsqueeze(1)

    def labels(name: str) -> torch.Tensor:
        return torch.from_numpy(read_idx(data_dir / name).astype(np.int64))

    return (
        images("train-images-idx3-ubyte.gz"),
        labels("train-labels-idx1-ubyte.gz"),
        images("t10k-images-idx3-ubyte.gz"),
        labels("t10k-labels-idx1-ubyte.gz"),
    )


def split_sizes(n: int, split: str) -> list[int]:
    """Samples per node: layer e (exit e) holds ``SPLITS[split][e − 1]`` of n, evenly."""
    share = SPLITS[split]
    per = [share[top - 1] / EXIT.count(top) for top in EXIT]
    return [round(n * s) for s in per]


class Batches:
    """Successive shuffles of one node's data (a persistent shuffled loader), batch b."""

    def __init__(self, n: int, b: int, gen: torch.Generator) -> None:
        self.n, self.b, self.gen = n, min(b, n), gen
        self.order, self.pos = torch.randperm(n, generator=gen), 0

    def next(self) -> torch.Tensor:
        if self.pos + self.b > self.n:  # drop_last, then reshuffle
            self.order, self.pos = torch.randperm(self.n, generator=self.gen), 0
        rows = self.order[self.pos : self.pos + self.b]
        self.pos += self.b
        return rows


# ----------------------------------------------------------------------------- the loop
@torch.no_grad()
def evaluate(model: EECNN, x: torch.Tensor, y: torch.Tensor, shares: Sequence[float]) -> dict:
    model.eval()
    logits = [torch.cat(z) for z in zip(*(model(x[i : i + 2000]) for i in range(0, len(x), 2000)),
                                         strict=True)]  # fmt: skip
    model.train()
    prob = [torch.softmax(z, 1) for z in logits]
    entropy = np.stack([(-(p * torch.log(p)).sum(1) / np.log(10)).numpy() for p in prob])
    correct = np.stack([(z.argmax(1) == y).double().numpy() for z in logits])
    out = {f"exit{e + 1}_accuracy": float(correct[e].mean()) for e in range(len(logits))}
    out["cis_accuracy"] = cascade(entropy, correct, shares)
    return out


def train(
    args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor
) -> tuple[EECNN, list[EECNN], dict[str, torch.Tensor]]:
    """The authors' rounds on training data (x, y); returns the cloud (= root) model, every
    node's model and the initial weights."""
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    sizes = split_sizes(len(y), args.split)
    perm = torch.randperm(len(y), generator=gen)
    start = np.concatenate([[0], np.cumsum(sizes)])
    shards = [perm[start[i] : start[i + 1]] for i in range(len(EXIT))]
    init = EECNN()
    initial = {k: v.clone() for k, v in init.state_dict().items()}
    models = [init if i == ROOT else EECNN() for i in range(len(EXIT))]
    for i, m in enumerate(models):
        m.load_state_dict(initial)
        for name, p in m.named_parameters():
            p.requires_grad_(held(name, EXIT[i]))
    opts = [
        torch.optim.SGD([p for n, p in m.named_parameters() if held(n, EXIT[i])], lr=args.lr,
                        momentum=0.9, weight_decay=args.weight_decay)
        for i, m in enumerate(models)
    ]  # fmt: skip
    scheds = [torch.optim.lr_scheduler.CosineAnnealingLR(o, args.rounds, args.lr_min) for o in opts]
    batches = [Batches(len(s), args.batch_size, gen) for s in shards]
    lam = lambda_tilde(args.strategy, args.shares)
    cloud = models[ROOT]
    for _t in range(args.rounds):
        exits = {}
        for i, top in enumerate(EXIT):  # the authors' draw: own exit, or w.p. ε a lower one
            lower = top > 1 and rng.random() < args.epsilon
            exits[i] = int(rng.integers(1, top)) if lower else top
        for i, m in enumerate(models):  # the root trains the cloud model in place
            for _ in range(args.local_steps):
                rows = shards[i][batches[i].next()]
                loss = F.cross_entropy(m(x[rows], upto=exits[i])[exits[i] - 1], y[rows])
                opts[i].zero_grad()
                loss.backward()
                opts[i].step()
            scheds[i].step()
        coef = coefficients(exits, sizes, lam, args.epsilon)
        states = {i: {n: t for n, t in m.state_dict().items() if held(n, EXIT[i])}
                  for i, m in enumerate(models)}  # fmt: skip
        new = aggregate(cloud.state_dict(), states, exits, coef)
        with torch.no_grad():
            for i, m in enumerate(models):  # cloud update, then the broadcast, in place
                for name, t in m.state_dict().items():
                    if i == ROOT or held(name, EXIT[i]):
                        t.copy_(new[name])
    return cloud, models, initial


def train_paper(
    args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor
) -> tuple[EECNN, dict[str, torch.Tensor]]:
    """Algorithm 1 as printed on training data (x, y); returns the server's model and the
    initial weights."""
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    sizes = split_sizes(len(y), args.split)
    perm = torch.randperm(len(y), generator=gen)
    start = np.concatenate([[0], np.cumsum(sizes)])
    shards = [perm[start[i] : start[i + 1]] for i in range(len(EXIT))]
    server = EECNN()
    initial = {k: v.clone() for k, v in server.state_dict().items()}
    node = EECNN()  # one work model: every task starts from w^t
    batches = [Batches(len(s), args.batch_size, gen) for s in shards]
    lam = lambda_tilde(args.strategy, args.shares)
    for t in range(args.rounds):
        lr = args.lr_min + (args.lr - args.lr_min) * (1 + np.cos(np.pi * t / args.rounds)) / 2
        w = {k: v.clone() for k, v in server.state_dict().items()}
        exits, trained = {}, {}
        for i, top in enumerate(EXIT):
            p = np.array([p_paper(top, e, args.epsilon) for e in range(1, top + 1)])
            exits[i] = 1 + min(int((rng.random() >= np.cumsum(p)).sum()), top - 1)
        for i, e in exits.items():
            node.load_state_dict(w)
            params = [q for n, q in node.named_parameters()
                      if n.startswith((*ENTRIES[:e], HEADS[e - 1]))]  # fmt: skip
            opt = torch.optim.SGD(params, lr=float(lr), momentum=0.9,
                                  weight_decay=args.weight_decay)  # fmt: skip
            for _ in range(args.local_steps):
                rows = shards[i][batches[i].next()]
                loss = F.cross_entropy(node(x[rows], upto=e)[e - 1], y[rows])
                opt.zero_grad()
                loss.backward()
                opt.step()
            trained[i] = {k: v.detach().clone() for k, v in node.state_dict().items()}
        coef = paper_coefficients(exits, sizes, lam, args.epsilon)
        server.load_state_dict(paper_aggregate(w, trained, exits, coef, args.server_lr))
    return server, initial


def run(args: argparse.Namespace) -> dict[str, object]:
    args.shares = [float(v) for v in args.serving.split("-")]
    x, y, x_test, y_test = load(Path(args.data_dir))
    if args.mode == "paper":
        cloud, _ = train_paper(args, x, y)
    else:
        cloud, _, _ = train(args, x, y)
    return {
        "strategy": args.strategy, "serving": args.serving, "seed": args.seed,
        "mode": args.mode, "rounds": args.rounds, "local_steps": args.local_steps,
        "epsilon": args.epsilon, "split": args.split,
        **evaluate(cloud, x_test, y_test, args.shares),
    }  # fmt: skip


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data-dir", required=True, help="folder with the four MNIST IDX .gz files")
    ap.add_argument("--strategy", choices=("serving", "equal"), default="serving")
    ap.add_argument("--serving", default="80-15-5", help="shares served at exits 1-2-3")
    ap.add_argument("--split", choices=sorted(SPLITS), default="equal")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--lr-min", type=float, default=0.001, help="the cosine schedule's eta_min")
    ap.add_argument("--weight-decay", type=float, default=0.0, help="the authors used 5e-4")
    ap.add_argument(
        "--epsilon",
        type=float,
        default=0.0,
        help="reference: total probability of a lower exit; paper: per lower exit",
    )
    ap.add_argument(
        "--mode",
        choices=("reference", "paper"),
        default="reference",
        help="reference: the authors' loop; paper: Algorithm 1 as printed",
    )
    ap.add_argument("--server-lr", type=float, default=1.0, help="η_s (paper mode)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
