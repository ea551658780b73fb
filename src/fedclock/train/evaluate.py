"""Evaluation of a global model version: on held-out data, and per client on training data."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedclock.devices.topology import Tree
from fedclock.sim.types import ModelVersion


class Evaluator:
    """Test accuracy and mean cross-entropy of a model version (no copy of the snapshot)."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 2048,
                 device: torch.device | str = "cpu") -> None:  # fmt: skip
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.x = x.to(self.device)
        self.y = y.to(self.device)
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(self, version: ModelVersion) -> tuple[float, float]:
        self.model.eval()
        state = {**version.params, **version.buffers}
        correct = 0
        loss = 0.0
        n = len(self.y)
        for i in range(0, n, self.batch_size):
            xb, yb = self.x[i : i + self.batch_size], self.y[i : i + self.batch_size]
            logits = functional_call(self.model, state, (xb,))
            loss += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(1) == yb).sum())
        return correct / n, loss / n


def cis_route(tree: Tree, entropy: np.ndarray, correct: np.ndarray) -> tuple[float, np.ndarray]:
    """Routed inference in a collaborative inference system (specs/reference-implementations.md
    §3.5): every node with arrivals receives each test point with mass λ^a_i / N; going from
    the leaves to the root, a node sorts the points it holds from its exit's lowest normalised
    entropy up, serves the shortest prefix whose mass reaches its served rate λ^s_i (the last
    point split), and forwards the rest to its parent (the root serves all it receives).

    ``entropy`` and ``correct`` are (E, N): each exit's normalised entropy and top-1 hit per
    test point. Returns (CIS accuracy = Σ served mass × hit / total mass, mass served at each
    exit as a share of the total).
    """
    n_exits, n = entropy.shape
    _, served_rate = tree.rates()
    forwarded = np.zeros((tree.size, n))
    hits = 0.0
    per_exit = np.zeros(n_exits)
    total = float(sum(tree.arrival))
    for i in tree.order():
        mass = np.full(n, tree.arrival[i] / n)
        for j in tree.children(i):
            mass += forwarded[j]
        e = tree.exit[i] - 1
        rate = float(mass.sum()) if tree.parent[i] < 0 else float(served_rate[i])
        order = np.argsort(entropy[e], kind="stable")
        m = mass[order]
        before = np.cumsum(m) - m  # mass ahead of each point
        take = np.clip(rate - before, 0.0, m)
        served = np.zeros(n)
        served[order] = take
        forwarded[i] = mass - served
        hits += float((served * correct[e]).sum())
        per_exit[e] += float(served.sum())
    return hits / total, per_exit / total


class ExitEvaluator:
    """Test metrics of an early-exit network (``(B, E, C)`` logits): accuracy and loss of the
    last exit (``test_accuracy``, ``test_loss``), each exit's accuracy (``exit<e>_accuracy``)
    and, with a ``tree``, the routed CIS accuracy (:func:`cis_route`: ``cis_accuracy``)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # a cache of the last version only

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, num_exits: int,
                 tree: Tree | None = None, batch_size: int = 2048,
                 device: torch.device | str = "cpu") -> None:  # fmt: skip
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.x = x.to(self.device)
        self.y = y.to(self.device)
        self.tree = tree
        self.batch_size = batch_size
        self.num_exits = num_exits
        self.columns = (
            *(f"exit{e}_accuracy" for e in range(1, num_exits + 1)),
            *(("cis_accuracy",) if tree is not None else ()),
        )
        self._cache: tuple[ModelVersion, dict[str, float]] | None = None

    @torch.no_grad()
    def _measure(self, version: ModelVersion) -> dict[str, float]:
        if self._cache is not None and self._cache[0] is version:
            return self._cache[1]
        self.model.eval()
        state = {**version.params, **version.buffers}
        n = len(self.y)
        ent = np.zeros((self.num_exits, n))
        hit = np.zeros((self.num_exits, n))
        loss = 0.0
        for i in range(0, n, self.batch_size):
            xb, yb = self.x[i : i + self.batch_size], self.y[i : i + self.batch_size]
            logits = functional_call(self.model, state, (xb,)).double()  # (B, E, C)
            logp = F.log_softmax(logits, -1)
            h = -(logp.exp() * logp).sum(-1) / math.log(logits.shape[-1])  # normalised entropy
            ent[:, i : i + len(yb)] = h.T.cpu().numpy()
            hit[:, i : i + len(yb)] = (logits.argmax(-1) == yb[:, None]).T.cpu().numpy()
            loss += float(F.nll_loss(logp[:, -1], yb, reduction="sum"))
        out = {f"exit{e + 1}_accuracy": float(hit[e].mean()) for e in range(self.num_exits)}
        out["test_loss"] = loss / n
        if self.tree is not None:
            out["cis_accuracy"] = cis_route(self.tree, ent, hit)[0]
        self._cache = (version, out)
        return out

    def __call__(self, version: ModelVersion) -> tuple[float, float]:
        m = self._measure(version)
        return m[f"exit{self.num_exits}_accuracy"], m["test_loss"]

    def more(self, version: ModelVersion) -> dict[str, float]:
        """The extra metrics.csv columns (:attr:`columns`) of ``version``."""
        m = self._measure(version)
        return {k: m[k] for k in self.columns}


class ClientLossEvaluator:
    """Each client's training loss L_i(θ) (mean cross-entropy over its own samples).

    One pass over the clients' training samples per call; the per-sample losses
    are summed per client. Fraboni et al.'s federated loss (eq. 2) and surrogate
    loss (eq. 10) are weighted sums of these (see
    :func:`fedclock.metrics.recorder.federated_metrics`).
    """

    def __init__(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        indices: Sequence[torch.Tensor],
        *,
        batch_size: int = 2048,
        device: torch.device | str = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device)
        rows = torch.cat([torch.as_tensor(i, dtype=torch.int64) for i in indices])
        owner = torch.repeat_interleave(
            torch.arange(len(indices)), torch.tensor([len(i) for i in indices])
        )
        self.x = x.to(self.device)  # held once (no copy on CPU); rows gathered per batch
        self.rows = rows.to(self.device)
        self.y = y[rows].to(self.device)
        self.owner = owner.to(self.device)
        self.sizes = torch.tensor([len(i) for i in indices], dtype=torch.float64)
        self.num_clients = len(indices)
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(self, version: ModelVersion) -> np.ndarray:
        self.model.eval()
        state = {**version.params, **version.buffers}
        total = torch.zeros(self.num_clients, dtype=torch.float64, device=self.device)
        for i in range(0, len(self.y), self.batch_size):
            sl = slice(i, i + self.batch_size)
            logits = functional_call(self.model, state, (self.x[self.rows[sl]],))
            loss = F.cross_entropy(logits, self.y[sl], reduction="none")
            total.index_add_(0, self.owner[sl], loss.to(torch.float64))
        return (total.cpu() / self.sizes.clamp(min=1)).numpy()


class BestValidation:
    """An evaluator that reports test (accuracy, loss) and tracks the test accuracy of the
    best-validation model (the authors' ``model.best.t7``, evaluated on the test set).

    Calling it evaluates test and validation; :meth:`validate` evaluates validation alone
    (for a validation schedule denser than the test curve's) and the test set only when
    validation improves, so the model chosen is the same as if both ran every time.
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = (
        "best_val",
        "best_val_test_accuracy",
        "last_val_accuracy",
        "validations",
        "_validated",
    )

    def __init__(self, test: object, val: object) -> None:
        self.test = test
        self.val = val
        self.best_val = -1.0
        self.best_val_test_accuracy = float("nan")
        self.last_val_accuracy = float("nan")
        self.validations = 0
        self._validated: int | None = None  # the version last validated

    def __call__(self, version: ModelVersion) -> tuple[float, float]:
        acc, loss = self.test(version)  # type: ignore[operator]
        self.validate(version, test_accuracy=acc)
        return acc, loss

    def validate(self, version: ModelVersion, test_accuracy: float | None = None) -> None:
        if self._validated == version.version:
            return
        self._validated = version.version
        self.validations += 1
        vacc, _ = self.val(version)  # type: ignore[operator]
        self.last_val_accuracy = float(vacc)
        if vacc > self.best_val:
            self.best_val = float(vacc)
            if test_accuracy is None:
                test_accuracy, _ = self.test(version)  # type: ignore[operator]
            self.best_val_test_accuracy = float(test_accuracy)
