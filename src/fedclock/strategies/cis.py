"""Federated training of an early-exit network for collaborative inference (CIS; Kaplan et
al., Algorithm 1; docs/methods/cis.md, specs/cis.md and reference-implementations.md §3).

- :func:`p_matrix` — which exit each node trains (node collaboration ε);
- :func:`lambda_tilde` — the aggregation weights Λ̃ of the four strategies (Equal Weight,
  FLOPS Prop, Serving Rate, Balanced Adj as the authors' code computes it);
- :func:`gradient_variance` — σ_e for Balanced Adj when the config does not give it;
- :func:`cosine_lr_scale` — the paper's per-round cosine annealing;
- :class:`ExitWork` (Planner: each round every node draws an exit e ~ p_i and trains
  :class:`~fedclock.models.shapes.Exit` ``(e)``), :func:`cis_update` (the server update
  of Algorithm 1 from :class:`CisWeighting` and, for the authors' code in ``reference``
  mode, the normaliser :class:`RootAbsorbs`), :func:`build_cis`.

The rounds are :class:`~fedclock.strategies.triggers.SyncRounds` over every node.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from fedclock.config import (
    CisBalancedOptions,
    CisEqualOptions,
    CisFlopsOptions,
    CisServingOptions,
)
from fedclock.devices.cost import TaskCost
from fedclock.devices.topology import Tree, build_tree
from fedclock.errors import ConfigError
from fedclock.models.early_exit import EarlyExitNet, ExitInfo, exit_view
from fedclock.models.shapes import Exit, Layout, build_units
from fedclock.sim.simulator import Context
from fedclock.sim.types import Contribution, ModelVersion, Params, TaskPlan
from fedclock.strategies.aggregators import Target, Update, weighted_sum
from fedclock.strategies.base import BuildInfo, Strategy, Work
from fedclock.strategies.planners import local_sgd_plan
from fedclock.strategies.server import ServerOptimizer, server_optimizer
from fedclock.strategies.triggers import SyncRounds
from fedclock.train.local import Needs

if TYPE_CHECKING:
    from fedclock.config import ExperimentConfig

Floats = Sequence[float] | np.ndarray
log = logging.getLogger(__name__)

STRATEGY_WEIGHTS = {
    "cis-equal": "equal",
    "cis-flops": "flops",
    "cis-serving": "serving",
    "cis-balanced": "balanced",
}


# ----------------------------------------------------------------------------- the math
def p_matrix(tree: Tree, epsilon: float, rule: str = "paper") -> np.ndarray:
    """p_{i,e} (nodes × exits): the probability that node i trains exit e in a round.

    ``paper`` (§4, node collaboration): ε for every e < E_i and 1 − (E_i − 1)·ε for E_i;
    ``code`` (the authors' --sampled-probability): ε in total, spread evenly over the
    lower exits, ε/(E_i − 1) each, and 1 − ε for E_i. Exits above E_i: 0.
    """
    p = np.zeros((tree.size, tree.exits))
    for i, top in enumerate(tree.exit):
        lower = top - 1
        each = (epsilon / lower if rule == "code" else epsilon) if lower else 0.0
        own = 1.0 - lower * each
        if own < -1e-12:
            raise ConfigError(
                f"strategy.epsilon {epsilon:g} is too large: node {i} holds {top} exits, so "
                f"its own exit would get probability {own:.3g} (need ε ≤ {1 / lower:.3g})."
            )
        p[i, :lower] = each
        p[i, top - 1] = max(0.0, own)
    return p


def flops_weights(ratio: Floats, t: int, rounds: int | None) -> np.ndarray:
    """FLOPS Prop: Λ̃_e ∝ r_e, or with the authors' ramp ∝ min(r_e, (t+1)/T) at round t
    (0-based) of T (equal weights at first, FLOPs-proportional by the last round)."""
    r = np.asarray(ratio, dtype=float)
    if rounds is not None:
        r = np.minimum(r, (t + 1) / rounds)
    return r / r.sum()


def balanced_weights(serving: Floats, sigma: Floats, tree: Tree, sizes: Floats) -> np.ndarray:
    """Balanced Adj as the authors' code computes it (reference-implementations.md §3.3):
    Λ̃_e = ½·(Λ_e/ΣΛ + o_e/Σo), o_e = 1/(σ_e² · Σ_{i: E_i = e} (|S_i|/|S_e|)²), with S_e the
    data of the nodes whose deepest exit is e and σ_e the average point-wise gradient
    variance of exit e."""
    s = np.asarray(serving, dtype=float)
    sig = np.asarray(sigma, dtype=float)
    if len(sig) != tree.exits:
        raise ConfigError(
            f"strategy.sigma gives {len(sig)} values but the tree has {tree.exits} exits."
        )
    o = np.zeros(tree.exits)
    for e in range(1, tree.exits + 1):
        nodes = tree.at_exit(e)
        total = float(sum(sizes[i] for i in nodes))
        concentration = sum((sizes[i] / total) ** 2 for i in nodes) if total > 0 else 1.0
        o[e - 1] = 1.0 / (sig[e - 1] ** 2 * concentration)
    w = 0.5 * (s / s.sum() + o / o.sum())
    return w / w.sum()


def lambda_tilde(
    kind: str, *, serving: Floats, t: int = 0, rounds: int | None = None,
    flops_ratio: Floats | None = None, sigma: Floats | None = None,
    tree: Tree | None = None, sizes: Floats | None = None,
) -> np.ndarray:  # fmt: skip
    """Λ̃ (one weight per exit, summing to 1) of strategy ``kind`` at round ``t``."""
    n = len(serving)
    if kind == "equal":
        return np.full(n, 1.0 / n)
    if kind == "serving":
        s = np.asarray(serving, dtype=float)
        return s / s.sum()
    if kind == "flops":
        assert flops_ratio is not None
        return flops_weights(flops_ratio, t, rounds)
    if kind == "balanced":
        assert sigma is not None and tree is not None and sizes is not None
        return balanced_weights(serving, sigma, tree, sizes)
    raise ValueError(f"unknown Λ̃ strategy {kind!r}")


def epoch_of_largest(
    sizes: Floats, batch_size: int, local_steps: int | None, local_epochs: float | None
) -> int:
    """J of the paper's local-work rule ("local steps scaled so every node does the same
    number of updates"; the authors run round(E·|S_root|/|S_i|) epochs of node i's data):
    every node runs the steps of ``local_epochs`` (default 1) epochs of the largest node's
    data, ⌊E·⌈max|S_i|/B⌉ + ½⌋ (:func:`local_sgd_plan`'s epoch, the last batch partial)."""
    if local_steps is not None:
        raise ConfigError(
            "strategy.local_work epoch-of-largest sets every node's steps from the largest "
            "node's data: drop train.local_steps, or set strategy.local_work=steps."
        )
    largest = int(max(sizes))
    return local_sgd_plan(largest, batch_size, local_epochs=local_epochs or 1.0,
                          local_steps=None).local_steps  # fmt: skip


def cosine_lr_scale(t: int, rounds: int | None, lr: float, lr_min: float) -> float:
    """lr_t / lr for round t of T under cosine annealing to ``lr_min`` (torch's
    CosineAnnealingLR with T_max = T, stepped once per round)."""
    if rounds is None or rounds <= 0 or lr <= 0:
        return 1.0
    lr_t = lr_min + (lr - lr_min) * (1 + math.cos(math.pi * min(t, rounds) / rounds)) / 2
    return lr_t / lr


def gradient_variance(
    model: EarlyExitNet, x: torch.Tensor, y: torch.Tensor, info: ExitInfo
) -> np.ndarray:
    """σ_e for each exit: the variance over samples of each per-sample gradient element of
    exit e's loss with respect to the parameters exit e uses, averaged over those elements
    ("average point-wise gradient variance", the paper's Table 3), at the model given."""
    params = {n: p.detach() for n, p in model.named_parameters()}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    out = []
    for e in range(1, model.num_exits + 1):
        own = info.params[e - 1]

        def loss(sub: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor,
                 e: int = e) -> torch.Tensor:  # fmt: skip
            logits = functional_call(model, {**params, **buffers, **sub}, (xi[None],))
            return torch.nn.functional.cross_entropy(logits[:, e - 1], yi[None])

        sub = {n: params[n] for n in own}
        was = model.training
        model.eval()
        try:
            g = vmap(grad(loss), in_dims=(None, 0, 0))(sub, x, y)
        finally:
            model.train(was)
        flat = torch.cat([v.reshape(len(x), -1) for v in g.values()], 1).double()
        out.append(float(flat.var(0, unbiased=True).mean()))
    return np.asarray(out)


# ----------------------------------------------------------------------------- planner
class ExitWork:
    """Algorithm 1, lines 3–6: each round every node i draws one exit e ~ p_i (stream
    ``("cis-exit", round)``) and runs J local steps on exit e's loss from the global model
    (the work shape :class:`Exit` ``(e, E_i)``), at the round's learning rate."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (_plans is a cache)

    def __init__(
        self, *, tree: Tree, p: np.ndarray, layout: Layout, client_sizes: np.ndarray,
        batch_size: int, local_epochs: float | None, local_steps: int | None,
        lr_scale: Any,
    ) -> None:  # fmt: skip
        self.tree, self.p, self.layout = tree, p, layout
        self.lr_scale = lr_scale  # round → factor of train.lr
        self._plans = [
            local_sgd_plan(int(n), batch_size, local_epochs=local_epochs, local_steps=local_steps)
            for n in client_sizes
        ]

    def draw(self, ctx: Context, r: int) -> np.ndarray:
        """Exit (1-based) of every node in round r."""
        u = ctx.rng("cis-exit", r).random(self.tree.size)
        cdf = np.cumsum(self.p, axis=1)
        return 1 + np.minimum((u[:, None] >= cdf).sum(1), self.tree.exits - 1)

    def _work(self, client: int, e: int, scale: float) -> tuple[TaskPlan, TaskCost]:
        base = self._plans[client]
        shape = Exit(int(e), self.tree.exit[client])
        plan = TaskPlan(base.local_steps, base.batch_size, base.samples, base.epochs, shape,
                        lr_scale=scale)  # fmt: skip
        return plan, shape.cost(self.layout, plan.samples)

    def assign(self, ctx: Context, r: int, clients: np.ndarray) -> list[Work]:
        exits = self.draw(ctx, r)
        scale = float(self.lr_scale(r))
        return [Work(*self._work(int(c), int(exits[c]), scale)) for c in clients]

    def nominal(self, client: int) -> tuple[TaskPlan, TaskCost]:
        """The node's nominal task: its own (deepest) exit."""
        return self._work(client, self.tree.exit[client], 1.0)

    def plan(self, ctx: Context | None, client: int) -> tuple[TaskPlan, TaskCost]:
        return self.nominal(client)  # a round's work comes from assign()


# ----------------------------------------------------------------------------- aggregator
class CisWeighting:
    """ω_{i,e} = Λ̃_e · |S_i| / |S_{e,p}| / p_{i,e} (Algorithm 1, line 8), with S_{e,p} the
    data of every node that may train exit e (p_{i,e} > 0) and Λ̃ at round t = the server's
    version. ``p_factor``: divide by p_{i,e} (line 8), ``none``, or ``multiply`` (the
    authors' code)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, p: np.ndarray, sizes: np.ndarray, weights: Any, p_factor: str) -> None:
        self.p, self.weights, self.p_factor = p, weights, p_factor  # weights: round → Λ̃
        self.sizes = np.asarray(sizes, dtype=float)
        # |S_{e,p}|: data of the nodes that may train exit e
        self.pool = np.array([self.sizes[p[:, e] > 0].sum() for e in range(p.shape[1])])

    def coefficient(self, t: int, client: int, e: int) -> float:
        lam = float(self.weights(t)[e - 1])
        share = lam * self.sizes[client] / self.pool[e - 1]
        p = float(self.p[client, e - 1])
        if self.p_factor == "multiply":
            return share * p
        return share / p if self.p_factor == "divide" else share

    def __call__(
        self, ctx: Context, base: ModelVersion, contributions: Sequence[Contribution]
    ) -> np.ndarray:
        out = []
        for c in contributions:
            shape = c.task.plan.shape
            assert isinstance(shape, Exit)
            out.append(self.coefficient(base.version, c.client, shape.exit))
        return np.asarray(out, dtype=np.float64)


class RootAbsorbs:
    """A special case of the normaliser, the authors' code (reference-implementations.md
    §3.4), each switch on its own:

    - ``root_in_place``: the root's model is the server's, trained in place; every other
      node's difference to it, Δ_i − Δ_root, is added with its ω, so the root absorbs the
      leftover weight of each tensor: Δ = Δ_root + Σ_{i ≠ root} ω_i (Δ_i − Δ_root);
    - ``keep_root_heads``: the heads of the exits below the root's stay as the root has
      them (Δ_root where the root trained them, 0 otherwise).

    Without either it is line 8's weighted sum."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, *, root: int, lower_heads: frozenset[str], root_in_place: bool,
        keep_root_heads: bool,
    ) -> None:  # fmt: skip
        self.root, self.lower_heads = root, lower_heads
        self.root_in_place, self.keep_root_heads = root_in_place, keep_root_heads

    def __call__(
        self, base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray,
        target: Target,
    ) -> Params:  # fmt: skip
        if not (self.root_in_place or self.keep_root_heads):
            return weighted_sum(base, contributions, w, target)
        root = next((c for c in contributions if c.client == self.root), None)
        update: Params = {}
        for n, theta in base.params.items():
            d_root = None if root is None else target(root, n, theta)
            if self.keep_root_heads and n in self.lower_heads:  # the root's update, or none
                update[n] = torch.zeros_like(theta) if d_root is None else d_root
                continue
            acc = torch.zeros_like(theta)
            if self.root_in_place and d_root is not None:
                acc.add_(d_root)
            against = d_root if self.root_in_place else None
            for c, wi in zip(contributions, w.tolist(), strict=True):
                t = None if self.root_in_place and c is root else target(c, n, theta)
                if t is not None:
                    acc.add_(t if against is None else t - against, alpha=wi)
            update[n] = acc
        return update


class CisBuffers:
    """Floating-point buffers (BatchNorm statistics) by line 8's rule, b + η_s Σ ω (b_i − b)
    (against the root's with ``root_in_place``); integer ones are the deepest task's."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, root: int, root_in_place: bool) -> None:
        self.root, self.root_in_place = root, root_in_place

    def __call__(
        self, base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray,
        lr: float,
    ) -> Params:  # fmt: skip
        root = next((c for c in contributions if c.client == self.root), None)
        deepest = max(contributions, key=lambda c: c.task.plan.shape.exit, default=None)  # type: ignore[attr-defined]
        in_place = self.root_in_place and root is not None
        out: Params = {}
        for n, b in base.buffers.items():
            if not b.is_floating_point():
                out[n] = deepest.buffers[n].clone() if deepest is not None else b.clone()
                continue
            start = root.buffers[n] if in_place and root is not None else b
            acc = start.clone()
            for c, wi in zip(contributions, w.tolist(), strict=True):
                if in_place and c is root:
                    continue
                d = c.buffers[n] - start
                if bool(d.any()):
                    acc.add_(d, alpha=wi)
            out[n] = acc if lr == 1.0 else b + lr * (acc - b)  # η_s
        return out


def cis_update(
    *, tree: Tree, p: np.ndarray, sizes: np.ndarray, weights: Any, server: ServerOptimizer,
    mode: str, head_params: Sequence[Sequence[str]], p_factor: str | None = None,
    root_in_place: bool | None = None, lower_heads: str | None = None,
) -> Update:  # fmt: skip
    """The server update of Algorithm 1 (line 8), η_s = the ``server`` step's rate:

        w ← w + η_s · Σ_{(i,e)} Λ̃_e · |S_i| / |S_{e,p}| · Δ_{i,e} / p_{i,e}

    Δ is zero outside the part a task trained; Π_W is the identity (W = ℝ^d); momentum or
    Adam in ``server`` make it FedAvgM / FedAdam on the same update. ``reference`` (the
    authors' code) is three departures, each of which can be turned on alone (None: as the
    mode): ``p_factor`` (:class:`CisWeighting`), ``root_in_place`` and
    ``lower_heads="root"`` (:class:`RootAbsorbs`)."""
    ref = mode == "reference"
    in_place = ref if root_in_place is None else root_in_place
    root = tree.parent.index(-1)
    normaliser = RootAbsorbs(
        root=root, lower_heads=frozenset(n for names in head_params[:-1] for n in names),
        root_in_place=in_place,
        keep_root_heads=(lower_heads or ("root" if ref else "aggregate")) == "root",
    )  # fmt: skip
    return Update(
        CisWeighting(p=p, sizes=sizes, weights=weights,
                     p_factor=p_factor or ("multiply" if ref else "divide")),
        normaliser=normaliser, buffers=CisBuffers(root=root, root_in_place=in_place),
        server=server, step_when_empty=True,
    )  # fmt: skip


# ----------------------------------------------------------------------------- builder
def _lambda_schedule(
    cfg: ExperimentConfig, info: BuildInfo, tree: Tree, exits: ExitInfo, serving: np.ndarray,
    sizes: np.ndarray,
) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """Round t → Λ̃ of the strategy's weighting, and what it measured (summary.json)."""
    s = cfg.strategy
    kind = STRATEGY_WEIGHTS[s.name]
    if kind == "flops":
        assert isinstance(s, CisFlopsOptions)
        ramp_rounds = cfg.budget.aggregations if s.flops_ramp else None
        ratio = exits.flops_ratio
        return (lambda t: flops_weights(ratio, t, ramp_rounds)), {}
    if kind != "balanced":
        fixed = lambda_tilde(kind, serving=serving)
        return (lambda t: fixed), {}
    assert isinstance(s, CisBalancedOptions)
    if s.sigma is not None:
        sigma = np.asarray(s.sigma)
    else:
        if info.train is None:
            raise ConfigError("cis-balanced needs strategy.sigma or the training data.")
        x, y = info.train
        g = torch.Generator().manual_seed(cfg.seed)
        pick = torch.randperm(len(y), generator=g)[: s.sigma_samples]
        sigma = gradient_variance(info.model, x[pick], y[pick], exits)
    balanced = balanced_weights(serving, sigma, tree, sizes)
    log.info("cis-balanced: σ = %s (%s), Λ̃ = %s",
             " / ".join(f"{v:.3g}" for v in sigma),
             "given" if s.sigma is not None else "measured",
             " / ".join(f"{v:.3f}" for v in balanced))  # fmt: skip
    report = {"cis_sigma": [float(v) for v in sigma],
              "cis_lambda_tilde": [float(v) for v in balanced]}  # fmt: skip
    return (lambda t: balanced), report


def build_cis(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    """cis-equal / cis-flops / cis-serving / cis-balanced: Algorithm 1 over the cis tree."""
    s = cfg.strategy
    assert isinstance(s, CisEqualOptions | CisFlopsOptions | CisServingOptions | CisBalancedOptions)
    tree = build_tree(cfg.cis)
    model = info.model
    if tree is None or not isinstance(model, EarlyExitNet):
        raise ConfigError(f"Strategy {s.name!r} needs cis.tree and an early-exit model.")
    if model.num_exits != tree.exits:
        raise ConfigError(
            f"The model has {model.num_exits} exits but the cis tree's root holds {tree.exits}."
        )
    exits = exit_view(model, tuple(model.input_shape))
    layout = Layout.of(model, build_units(model, info.layers, "paper"), info.model_bytes,
                       exits=exits)  # fmt: skip
    p = p_matrix(tree, s.epsilon, s.p_rule)
    sizes = np.asarray(info.client_sizes, dtype=float)
    serving = tree.serving_rates()
    weights, report = _lambda_schedule(cfg, info, tree, exits, serving, sizes)
    lr = cfg.train.lr
    rounds = cfg.budget.aggregations
    if s.lr_schedule == "cosine":
        lr_scale: Any = lambda r: cosine_lr_scale(r, rounds, lr, s.lr_min)  # noqa: E731
    else:
        lr_scale = lambda r: 1.0  # noqa: E731
    local_epochs, local_steps = cfg.train.local_epochs, cfg.train.local_steps
    if s.local_work == "epoch-of-largest":
        local_epochs, local_steps = (
            None,
            epoch_of_largest(
                sizes, cfg.train.batch_size, cfg.train.local_steps, cfg.train.local_epochs
            ),
        )
    work = ExitWork(
        tree=tree, p=p, layout=layout, client_sizes=info.client_sizes,
        batch_size=cfg.train.batch_size, local_epochs=local_epochs,
        local_steps=local_steps, lr_scale=lr_scale,
    )  # fmt: skip
    heads = [
        tuple(n for n in exits.params[e] if n.startswith(f"heads.{e}.")) for e in range(tree.exits)
    ]
    aggregator = cis_update(
        tree=tree, p=p, sizes=sizes, weights=weights,
        server=server_optimizer(s, lr=s.server_lr), mode=s.mode,
        head_params=heads, p_factor=s.p_factor, root_in_place=s.root_in_place,
        lower_heads=s.lower_heads,
    )  # fmt: skip
    momentum = s.momentum_state or ("node" if s.mode == "reference" else "task")
    sync = SyncRounds(work=work)
    # the tree's rates and serving shares assume every device trains each round: a fleet
    # whose devices go offline is refused (Strategy: no on_lost), not silently reweighted
    sync.on_lost = None  # type: ignore[method-assign,assignment]
    return Strategy(
        name=s.name, planner=work, trigger=sync, aggregator=aggregator,
        needs=Needs(shapes=frozenset({Exit}), layout=layout,
                    momentum_per_client=momentum == "node", synchronous=True),
        summary=report,
    )  # fmt: skip


__all__ = [
    "CisWeighting",
    "ExitWork",
    "RootAbsorbs",
    "balanced_weights",
    "build_cis",
    "cis_update",
    "cosine_lr_scale",
    "epoch_of_largest",
    "flops_weights",
    "gradient_variance",
    "lambda_tilde",
    "p_matrix",
]
