"""Evaluation of a global model version: on held-out data, and per client on training data."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedclock.devices.topology import Tree
from fedclock.metrics.recorder import federated_metrics
from fedclock.sim.types import ModelVersion


class Evaluator:
    """Test accuracy and mean cross-entropy of a model version (no copy of the snapshot).

    Under run batching, ``submit`` (given by the run's :class:`~fedclock.runs.lockstep.Lockstep`)
    hands the call to the group, which evaluates the versions its runs wait on together
    (:func:`evaluate_joint`); the figures are those of :meth:`measure`.
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 2048,
                 device: torch.device | str = "cpu",
                 submit: Callable[[Evaluator, ModelVersion], tuple[float, float]] | None = None,
                 ) -> None:  # fmt: skip
        self.submit = submit
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.x = x.to(self.device)
        self.y = y.to(self.device)
        self.batch_size = batch_size
        self._structure = _stack_structure(self.model)  # (for joint_key, on every call)
        # an MLP's forward pass, layer by layer on the version's tensors (_logits)
        self._layers = None if self._structure is None else _direct_layers(self._structure)

    def __call__(self, version: ModelVersion) -> tuple[float, float]:
        if self.submit is not None:
            return self.submit(self, version)
        return self.measure(version)

    def _logits(self, state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The model's output for ``state`` on ``x``: an MLP (:func:`_stack_structure`) without
        forward hooks runs its layers' own functions on the state's tensors (the operations of
        its forward pass — the same values — without swapping the tensors into the module:
        ≈ 60 µs less a call on W2's model, docs/benchmarks.md); any other model through
        ``functional_call``."""
        layers = self._layers
        if layers is None or _has_hooks(self.model):
            return functional_call(self.model, state, (x,))
        h = x
        for kind, a, b in layers:
            if kind == "linear":
                h = F.linear(h, state[a], None if b is None else state[b])
            elif kind == "relu":
                h = torch.relu(h)
            else:
                h = h.flatten(a, b)
        return h

    @torch.no_grad()
    def measure(self, version: ModelVersion) -> tuple[float, float]:
        """(accuracy, mean cross-entropy) of ``version`` on this evaluator's data."""
        self.model.eval()
        state = {**version.params, **version.buffers}
        n = len(self.y)
        if 0 < n <= self.batch_size:  # one batch: the loop's sums, without its accumulators
            logits = self._logits(state, self.x)
            got = torch.stack([
                (logits.argmax(1) == self.y).sum().double(),
                F.cross_entropy(logits, self.y, reduction="sum").double(),
            ]).tolist()  # fmt: skip
            return int(got[0]) / n, got[1] / n
        # sums kept on the device (one host sync per evaluation, not two per batch); the
        # float64 sum of the float32 batch losses, in order: a Python float's sum
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        for i in range(0, n, self.batch_size):
            xb, yb = self.x[i : i + self.batch_size], self.y[i : i + self.batch_size]
            logits = self._logits(state, xb)
            loss += F.cross_entropy(logits, yb, reduction="sum").double()
            correct += (logits.argmax(1) == yb).sum()
        got = torch.stack([correct.double(), loss]).tolist()
        return int(got[0]) / n, got[1] / n

    def joint_key(self) -> Hashable | None:
        """Evaluators with equal keys (same data tensors, batch size and stackable layer
        structure) can be evaluated together by :func:`evaluate_joint`; None: never."""
        if self._structure is None:
            return None
        return (id(self.x), id(self.y), self.batch_size, str(self.device), self._structure)


def _stack_structure(model: nn.Module) -> tuple[Hashable, ...] | None:
    """The layers of a model that :func:`_stacked_logits` runs for many versions at once
    (a ``Classifier`` over ``Flatten``, ``Linear`` and ``ReLU``: the MLPs and logistic
    regression), or None."""
    net = getattr(model, "net", None)
    if type(model).__name__ != "Classifier" or not isinstance(net, nn.Sequential):
        return None
    out: list[Hashable] = []
    stacked = False
    for name, layer in net.named_children():
        if isinstance(layer, nn.Linear):
            out.append(
                ("linear", name, layer.in_features, layer.out_features, layer.bias is not None)
            )
            stacked = True
        elif isinstance(layer, nn.ReLU):
            out.append(("relu",))
        elif isinstance(layer, nn.Flatten) and not stacked:
            out.append(("flatten", layer.start_dim, layer.end_dim))
        else:
            return None
    return tuple(out) if stacked else None


def _direct_layers(structure: tuple[Hashable, ...]) -> list[tuple[str, Any, Any]]:
    """An MLP's layers (its :func:`_stack_structure`) for :meth:`Evaluator._logits`:
    ("linear", weight name, bias name or None), ("relu", None, None), ("flatten", start, end)."""
    out: list[tuple[str, Any, Any]] = []
    for layer in structure:
        kind, *spec = cast(tuple[Any, ...], layer)
        if kind == "linear":
            name, _, _, bias = spec
            out.append(("linear", f"net.{name}.weight", f"net.{name}.bias" if bias else None))
        elif kind == "relu":
            out.append(("relu", None, None))
        else:
            out.append(("flatten", spec[0], spec[1]))
    return out


def _has_hooks(model: nn.Module) -> bool:
    """Whether a forward hook (the module's own or a global one) would run in its forward."""
    from torch.nn.modules import module as m

    if m._global_forward_hooks or m._global_forward_pre_hooks:
        return True
    return any(sub._forward_hooks or sub._forward_pre_hooks for sub in model.modules())


def _stacked_layers(net: nn.Sequential, states: Sequence[dict[str, torch.Tensor]]) -> list[Any]:
    """The layers of R versions of an MLP for :func:`_stacked_logits`: the first ``Linear``'s
    weights side by side (``(R·out, in)``), the others' stacked (``(R, in, out)``)."""
    out: list[Any] = []
    first = True
    for name, layer in net.named_children():
        if isinstance(layer, nn.Linear):
            w = [s[f"net.{name}.weight"] for s in states]
            b = [s[f"net.{name}.bias"] for s in states] if layer.bias is not None else None
            if first:
                out.append(("cat", torch.cat(w), None if b is None else torch.cat(b),
                            layer.out_features))  # fmt: skip
                first = False
            else:
                bias = None if b is None else torch.stack(b)[:, None, :]
                out.append(("bmm", torch.stack(w).transpose(1, 2), bias, layer.out_features))
        else:  # ReLU, or Flatten before the first Linear (see _stack_structure)
            out.append(("module", layer, None, 0))
    return out


def _stacked_logits(layers: list[Any], r: int, x: torch.Tensor) -> torch.Tensor:
    """``(R, B, C)``: the logits of R versions of an MLP (:func:`_stacked_layers`) on one batch
    ``x`` in one pass: the first ``Linear`` as one matrix product with the R weight matrices
    side by side, the others as batched products — each version's logits computed product by
    product as in its own forward pass (the same sums over the same inputs)."""
    h = x
    owned = False  # h is this pass's own tensor (not the data or a view of it)
    for kind, w, b, width in layers:
        if kind == "cat":
            h = F.linear(h, w, b).view(len(x), r, width).transpose(0, 1)
            owned = True
        elif kind == "bmm":
            h = torch.bmm(h, w) if b is None else torch.baddbmm(b, h, w)
        elif owned and isinstance(w, nn.ReLU):
            h = h.relu_()  # the same values, no new tensor
        else:
            h = w(h)
    return h


@torch.no_grad()
def evaluate_joint(requests: Sequence[tuple[Evaluator, ModelVersion]]) -> list[tuple[float, float]]:
    """Each (evaluator, version)'s :meth:`Evaluator.measure`, the versions of evaluators with
    equal :meth:`~Evaluator.joint_key` evaluated in one stacked pass over their shared data
    (run batching: a group's runs evaluate on one copy of the test set)."""
    out: list[tuple[float, float] | None] = [None] * len(requests)
    together: dict[Hashable, list[int]] = {}
    for k, (ev, _) in enumerate(requests):
        key = ev.joint_key()
        if key is None:
            out[k] = ev.measure(requests[k][1])
        else:
            together.setdefault(key, []).append(k)
    for members in together.values():
        if len(members) == 1:
            out[members[0]] = requests[members[0]][0].measure(requests[members[0]][1])
            continue
        lead = requests[members[0]][0]
        lead.model.eval()
        states = [{**requests[k][1].params, **requests[k][1].buffers} for k in members]
        layers = _stacked_layers(lead.model.net, states)  # type: ignore[arg-type]
        dev = lead.device  # per-version sums on the device: one host sync per group
        correct = torch.zeros(len(members), dtype=torch.int64, device=dev)
        loss = torch.zeros(len(members), dtype=torch.float64, device=dev)
        n = len(lead.y)
        for i in range(0, n, lead.batch_size):
            xb, yb = lead.x[i : i + lead.batch_size], lead.y[i : i + lead.batch_size]
            logits = _stacked_logits(layers, len(members), xb)  # (R, B, C)
            # cross_entropy is nll_loss of log_softmax: both row by row, so taken for the R
            # versions at once they equal each version's own; each sum stays per version
            log_p = torch.log_softmax(logits, -1)
            correct += (logits.argmax(-1) == yb).sum(1)
            loss += torch.stack(
                [F.nll_loss(log_p[j], yb, reduction="sum") for j in range(len(members))]
            ).double()
        hits, sums = correct.tolist(), loss.tolist()
        for j, k in enumerate(members):
            out[k] = (hits[j] / n, sums[j] / n)
    return [x for x in out if x is not None]


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
                 device: torch.device | str = "cpu",
                 also: dict[str, Tree] | None = None) -> None:  # fmt: skip
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.x = x.to(self.device)
        self.y = y.to(self.device)
        self.tree = tree
        self.also = dict(also or {})  # cis.also_serving: label → tree, routed the same way
        self.batch_size = batch_size
        self.num_exits = num_exits
        self.columns = (
            *(f"exit{e}_accuracy" for e in range(1, num_exits + 1)),
            *(("cis_accuracy",) if tree is not None else ()),
            *(f"cis_accuracy_{label}" for label in self.also),
        )
        self._cache: tuple[ModelVersion, dict[str, float]] | None = None

    @torch.no_grad()
    def _measure(self, version: ModelVersion) -> dict[str, float]:
        if self._cache is not None and self._cache[0] is version:
            return self._cache[1]
        self.model.eval()
        state = {**version.params, **version.buffers}
        n = len(self.y)
        # filled on the model's device and read once at the end (one host sync, issue 34)
        ent_t = torch.empty((self.num_exits, n), dtype=torch.float64, device=self.device)
        hit_t = torch.empty((self.num_exits, n), dtype=torch.bool, device=self.device)
        loss_t = torch.zeros((), dtype=torch.float64, device=self.device)
        for i in range(0, n, self.batch_size):
            xb, yb = self.x[i : i + self.batch_size], self.y[i : i + self.batch_size]
            logits = functional_call(self.model, state, (xb,)).double()  # (B, E, C)
            logp = F.log_softmax(logits, -1)
            h = -(logp.exp() * logp).sum(-1) / math.log(logits.shape[-1])  # normalised entropy
            ent_t[:, i : i + len(yb)] = h.T
            hit_t[:, i : i + len(yb)] = (logits.argmax(-1) == yb[:, None]).T
            loss_t += F.nll_loss(logp[:, -1], yb, reduction="sum")
        ent, hit = ent_t.cpu().numpy(), hit_t.cpu().numpy().astype(np.float64)
        out = {f"exit{e + 1}_accuracy": float(hit[e].mean()) for e in range(self.num_exits)}
        out["test_loss"] = float(loss_t) / n
        if self.tree is not None:
            out["cis_accuracy"] = cis_route(self.tree, ent, hit)[0]
        for label, other in self.also.items():
            out[f"cis_accuracy_{label}"] = cis_route(other, ent, hit)[0]
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
    are summed per client. As an observer (``eval.client_losses``) it adds to every
    evaluation row Fraboni et al.'s federated loss (eq. 2), surrogate loss (eq. 10) and the
    spread of the client losses (:func:`fedclock.metrics.recorder.federated_metrics`, with
    the client importance ``importance``); ``last`` holds the latest losses (clients.csv).
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = ("last",)

    def __init__(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        indices: Sequence[torch.Tensor],
        *,
        batch_size: int = 2048,
        device: torch.device | str = "cpu",
        importance: np.ndarray | None = None,
    ) -> None:
        self.importance = importance  # p_i of eq. 2 (default: ∝ client sizes)
        self.last: np.ndarray | None = None
        self._version: int | None = None  # the version ``last`` was measured on
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

    def on_evaluation(self, sim: Any, row: dict[str, Any]) -> None:
        if self.last is None or self._version != sim.model.version:
            self.last, self._version = self(sim.model), sim.model.version
        p = self.importance
        if p is None:
            p = (self.sizes / self.sizes.sum()).numpy()
        row.update(federated_metrics(
            self.last, p, weight_received=sim.per_client(sim.counters.weight_received),
            participations=sim.per_client(sim.counters.participation),
        ))  # fmt: skip


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
        "validations",
        "_validated",
    )

    def __init__(self, test: object, val: object, *, every: int | None = None) -> None:
        self.test = test
        self.val = val
        self.every = every  # as an observer: validate every ``every`` server steps
        self.best_val = -1.0
        self.best_val_test_accuracy = float("nan")
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
        if vacc > self.best_val:
            self.best_val = float(vacc)
            if test_accuracy is None:
                test_accuracy, _ = self.test(version)  # type: ignore[operator]
            self.best_val_test_accuracy = float(test_accuracy)

    def on_aggregation(self, sim: Any, version: ModelVersion) -> None:
        if self.every is not None and sim.counters.aggregations % self.every == 0:
            self.validate(version)


def test_evaluator(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, tree: Tree | None = None,
    also: dict[str, Tree] | None = None, batch_size: int = 2048,
    device: torch.device | str = "cpu",
    submit: Callable[[Evaluator, ModelVersion], tuple[float, float]] | None = None,
) -> tuple[Evaluator | ExitEvaluator, ExitEvaluator | None]:  # fmt: skip
    """The test evaluator of ``model`` and, for an early-exit network (``num_exits``), the
    same :class:`ExitEvaluator` as the source of its extra columns (else None); ``submit``:
    the run batching's hand-off of a plain evaluator's calls (:class:`Evaluator`)."""
    exits = getattr(model, "num_exits", None)
    if exits is None:
        return Evaluator(model, x, y, batch_size=batch_size, device=device, submit=submit), None
    ev = ExitEvaluator(model, x, y, num_exits=exits, tree=tree, also=also,
                       batch_size=batch_size, device=device)  # fmt: skip
    return ev, ev
