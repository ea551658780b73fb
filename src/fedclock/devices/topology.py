"""A collaborative inference system's tree of devices (Kaplan et al., §3; specs/cis.md).

Node i (a device of the population: client i) has a parent (−1 for the root), holds the
exits 1..E_i of one early-exit network and answers with exit E_i; requests arrive at rate
λ^a_i and at most μ^max_i per second can be forwarded to the parent. Serving fractions
offload as much as allowed (problem P2, eq. 5 and its footnote 2):

    λ^t_i = min(μ^max_i, λ^a_i + Σ_{children j} λ^t_j)          (transfer rate, eq. 3)
    λ^s_i = λ^a_i + Σ_{children j} λ^t_j − λ^t_i                (served rate, eq. 2)
    Λ_e   = Σ_{i: E_i = e} λ^s_i                                 (serving rate of exit e, eq. 4)

Pure numpy; the strategies (:mod:`fedclock.strategies.cis`), the data split and the routed
evaluation (:func:`fedclock.train.evaluate.cis_accuracy`) read it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedclock.errors import ConfigError

#: share of the training data held by each exit layer (leaves first), specs/cis.md
SPLITS: dict[str, tuple[float, ...]] = {
    "equal": (1 / 3, 1 / 3, 1 / 3),
    "biased": (0.143, 0.286, 0.571),
    "highly-biased": (0.034, 0.199, 0.767),
}


@dataclass(frozen=True)
class Tree:
    """Nodes 0..n−1: ``parent[i]`` (−1: the root), deepest exit ``exit[i]`` (1-based),
    arrival rate ``arrival[i]`` and transfer capacity ``capacity[i]`` (inf: unlimited)."""

    parent: tuple[int, ...]
    exit: tuple[int, ...]
    arrival: tuple[float, ...]
    capacity: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.parent)
        if not (len(self.exit) == len(self.arrival) == len(self.capacity) == n) or n == 0:
            raise ConfigError(
                "cis: every node needs a parent, an exit, an arrival rate and a capacity."
            )
        roots = [i for i, p in enumerate(self.parent) if p < 0]
        if len(roots) != 1:
            raise ConfigError(
                f"cis: the tree needs exactly one root (parent -1), got {len(roots)}."
            )
        for i, p in enumerate(self.parent):
            if p >= n:
                raise ConfigError(f"cis: node {i}'s parent {p} is not a node of the tree.")
            if p >= 0 and self.exit[p] <= self.exit[i]:
                raise ConfigError(
                    f"cis: node {i} holds exit {self.exit[i]} but its parent {p} holds exit "
                    f"{self.exit[p]}; a parent must hold a deeper exit than its children."
                )
            if self.exit[i] < 1:
                raise ConfigError(f"cis: node {i}'s exit must be at least 1, got {self.exit[i]}.")
            if self.arrival[i] < 0 or self.capacity[i] < 0:
                raise ConfigError(f"cis: node {i}'s arrival rate and capacity must be ≥ 0.")
        self.order()  # refuses cycles

    # -------------------------------------------------------------- structure
    @property
    def size(self) -> int:
        return len(self.parent)

    @property
    def exits(self) -> int:
        """E: the number of exits (the root's)."""
        return max(self.exit)

    def children(self, i: int) -> list[int]:
        return [j for j, p in enumerate(self.parent) if p == i]

    def order(self) -> list[int]:
        """Nodes leaves-first: every node after all of its children."""
        depth = []
        for i in range(self.size):
            d, j = 0, i
            while self.parent[j] >= 0:
                j, d = self.parent[j], d + 1
                if d > self.size:
                    raise ConfigError("cis: the parent links form a cycle.")
            depth.append(d)
        return sorted(range(self.size), key=lambda i: (-depth[i], i))

    def at_exit(self, e: int) -> list[int]:
        return [i for i in range(self.size) if self.exit[i] == e]

    # -------------------------------------------------------------- rates, eqs. 2–5
    def rates(self) -> tuple[np.ndarray, np.ndarray]:
        """(λ^t, λ^s) per node: transfer as much as allowed (eq. 3), serve the rest (eq. 2)."""
        t = np.zeros(self.size)
        s = np.zeros(self.size)
        for i in self.order():
            inflow = self.arrival[i] + sum(t[j] for j in self.children(i))
            cap = 0.0 if self.parent[i] < 0 else self.capacity[i]
            t[i] = min(cap, inflow)
            s[i] = inflow - t[i]
        return t, s

    def serving_rates(self) -> np.ndarray:
        """Λ_e for e = 1..E (eq. 4): the rate served at each exit."""
        _, s = self.rates()
        out = np.zeros(self.exits)
        for i in range(self.size):
            out[self.exit[i] - 1] += s[i]
        return out

    def with_serving(self, shares: Sequence[float]) -> Tree:
        """The same tree with rates that serve ``shares`` (one per exit, any scale) of the
        requests: unit total arrival spread evenly over the leaves (nodes without children),
        each exit's share split evenly over its nodes, the rest forwarded."""
        if len(shares) != self.exits:
            raise ConfigError(
                f"cis.serving gives {len(shares)} shares but the tree has {self.exits} exits."
            )
        total = float(sum(shares))
        if total <= 0 or min(shares) < 0:
            raise ConfigError("cis.serving shares must be ≥ 0 and not all 0.")
        leaves = [i for i in range(self.size) if not self.children(i)]
        arrival = [1.0 / len(leaves) if i in leaves else 0.0 for i in range(self.size)]
        served = [shares[self.exit[i] - 1] / total / len(self.at_exit(self.exit[i]))
                  for i in range(self.size)]  # fmt: skip
        t = np.zeros(self.size)
        for i in self.order():
            inflow = arrival[i] + sum(t[j] for j in self.children(i))
            if served[i] > inflow + 1e-12 or (self.parent[i] < 0 and inflow > served[i] + 1e-9):
                raise ConfigError(
                    f"cis.serving {'-'.join(f'{s:g}' for s in shares)} cannot be served by this "
                    f"tree: node {i} receives {inflow:.3g} of the requests and should serve "
                    f"{served[i]:.3g}."
                )
            t[i] = max(0.0, inflow - served[i])
        cap = tuple(float(t[i]) if self.parent[i] >= 0 else math.inf for i in range(self.size))
        return Tree(self.parent, self.exit, tuple(arrival), cap)

    # -------------------------------------------------------------- data split
    def data_shares(self, split: str | Sequence[float]) -> np.ndarray:
        """Each node's share of the training data: exit layer e holds ``split[e−1]``
        (leaves' layer first), spread evenly over its nodes."""
        layer = SPLITS[split] if isinstance(split, str) else tuple(split)
        if len(layer) != self.exits:
            raise ConfigError(
                f"cis.split gives {len(layer)} layer shares but the tree has {self.exits} exits."
            )
        out = np.array([layer[self.exit[i] - 1] / len(self.at_exit(self.exit[i]))
                        for i in range(self.size)])  # fmt: skip
        return out / out.sum()


def _layered(widths: Sequence[int], leaf_arrival: float, capacities: Sequence[float]) -> Tree:
    """A tree whose layer k (root = 0) has ``widths[k]`` nodes, children split evenly."""
    parent: list[int] = []
    exit_: list[int] = []
    first = [0]
    for w in widths:
        first.append(first[-1] + w)
    n_exits = len(widths)
    for k, w in enumerate(widths):
        for m in range(w):
            if k == 0:
                parent.append(-1)
            else:
                per = w // widths[k - 1]
                parent.append(first[k - 1] + m // per)
            exit_.append(n_exits - k)
    leaves = set(range(first[-2], first[-1]))
    arrival = tuple(leaf_arrival if i in leaves else 0.0 for i in range(len(parent)))
    cap = tuple(capacities[n_exits - 1 - k] if k > 0 else math.inf
                for k, w in enumerate(widths) for _ in range(w))  # fmt: skip
    return Tree(tuple(parent), tuple(exit_), arrival, cap)


#: the paper's trees, with the authors' 80-15-5 rates (leaf arrival 2.5, leaf capacity 0.5,
#: edge capacity 0.25; specs/reference-implementations.md §3.2)
TREES: dict[str, Tree] = {
    "4-2-1": _layered((1, 2, 4), 2.5, (0.5, 0.25)),
    "12-4-1": _layered((1, 4, 12), 2.5, (0.5, 0.25)),
}


def parse_serving(text: str) -> tuple[float, ...]:
    """``"80-15-5"`` → (80, 15, 5): the shares served at exits 1, 2, … (any scale)."""
    try:
        vals = tuple(float(v) for v in str(text).split("-"))
    except ValueError:
        raise ConfigError(f"cis.serving {text!r} is not a list of shares like '80-15-5'.") from None
    if not vals or min(vals) < 0 or sum(vals) <= 0:
        raise ConfigError(f"cis.serving {text!r}: the shares must be ≥ 0 and not all 0.")
    return vals


def also_trees(cis: Any, tree: Tree | None) -> dict[str, Tree]:
    """``cis.also_serving``: label → the tree with rates that serve those shares."""
    if tree is None:
        return {}
    return {s: tree.with_serving(parse_serving(s)) for s in getattr(cis, "also_serving", [])}


def build_tree(cis: Any) -> Tree | None:
    """The tree of the config's ``cis`` section (a :class:`fedclock.config.CisConfig`), with
    rates serving ``cis.serving`` when it is given; None when ``cis.tree`` is null."""
    if cis.tree is None:
        return None
    if cis.tree == "custom":
        nodes = cis.nodes or []
        tree = Tree(
            tuple(n.parent for n in nodes), tuple(n.exit for n in nodes),
            tuple(float(n.arrival) for n in nodes),
            tuple(math.inf if n.capacity is None else float(n.capacity) for n in nodes),
        )  # fmt: skip
    else:
        tree = TREES[cis.tree]
    if cis.serving is not None:
        tree = tree.with_serving(parse_serving(cis.serving))
    elif sum(tree.arrival) <= 0:
        raise ConfigError("cis: no requests arrive anywhere; give arrival rates or cis.serving.")
    return tree


__all__ = ["SPLITS", "TREES", "Tree", "also_trees", "build_tree", "parse_serving"]
