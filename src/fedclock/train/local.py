"""What local training is, as values: :class:`LocalTraining` (the optimiser settings and the
loss every executor uses) and :class:`Needs` (what a strategy asks of the executor).

The loss receives the model's output and the targets, so a kind of work with its own
objective (an early exit's head, a proximal term) plugs in without touching the executors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import torch
import torch.nn.functional as F

from fedclock.models.shapes import FULL, Layout, WorkShape


class Loss(Protocol):
    """A training loss: ``loss(output, target)`` is the batch mean; ``per_sample`` the
    unreduced losses (the vectorized executor weights them to mask padded rows)."""

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor: ...

    def per_sample(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor: ...


class CrossEntropy:
    """Cross-entropy on logits (every method of the four papers trains with it)."""

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def per_sample(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target, reduction="none")

    def __repr__(self) -> str:
        return "CrossEntropy()"


def model_loss(model: torch.nn.Module) -> Loss:
    """The loss of a full-model task on ``model``: every exit's of an early-exit network
    (``MultiExitLoss``), cross-entropy otherwise."""
    from fedclock.models.early_exit import EarlyExitNet, MultiExitLoss

    return MultiExitLoss() if isinstance(model, EarlyExitNet) else CrossEntropy()


#: per-step statistics a work shape's program may ask for (``Program.step_statistics``):
#: each is accumulated in place from every local step's gradient, per trained parameter,
#: ``accumulate(acc, g)`` — in both executors, on a tensor or a stacked (clients, …) one —
#: and sent up as ``Contribution.up[name]`` (parameter name → tensor). A method that needs
#: another adds it here; neither executor names any.
STEP_STATISTICS: dict[str, Callable[[torch.Tensor, torch.Tensor], object]] = {
    # Σ_k g_k² of every element, pruned ones included (PruneFL's importance, §IV-B)
    "sq_grads": lambda acc, g: acc.addcmul_(g, g),
}


class GradientTerm(Protocol):
    """A term of the local objective's gradient: ``add`` returns g + its gradient at θ.

    Every list is one tensor per trained parameter, in the same order: in the vectorized
    executor each tensor is stacked along a leading client dimension (the base's and the
    ``down`` tensors' too), so a term written with ``torch._foreach_*`` (or element-wise
    operations that broadcast) runs unchanged in both executors. ``down`` holds the task's
    :attr:`~fedclock.sim.types.Task.down` tensors of the keys in ``reads``, aligned with
    ``params``. With ``scratch`` (tensors shaped like ``params``) ``g`` is updated in place
    and nothing is allocated: the same operations, so the same values."""

    @property
    def reads(self) -> tuple[str, ...]:
        """The :attr:`Task.down <fedclock.sim.types.Task.down>` keys the term reads."""
        ...

    def add(
        self,
        g: list[torch.Tensor],
        params: list[torch.Tensor],
        base: list[torch.Tensor] | None,
        down: Mapping[str, list[torch.Tensor]],
        scratch: list[torch.Tensor] | None,
    ) -> list[torch.Tensor]: ...


@dataclass(frozen=True)
class WeightDecay:
    """λθ: torch.optim.SGD's ``weight_decay``."""

    lam: float
    reads: ClassVar[tuple[str, ...]] = ()

    def add(
        self, g: list[torch.Tensor], params: list[torch.Tensor], base: list[torch.Tensor] | None,
        down: Mapping[str, list[torch.Tensor]], scratch: list[torch.Tensor] | None,
    ) -> list[torch.Tensor]:  # fmt: skip
        if scratch is None:
            return list(torch._foreach_add(g, params, alpha=self.lam))
        torch._foreach_add_(g, params, alpha=self.lam)
        return g


@dataclass(frozen=True)
class Proximal:
    """μ(θ − θ_base): the gradient of FedProx's (μ/2)‖θ − θ_base‖² (Li et al. eq. 2;
    Fed-RAA's ρ; FedDyn's α, Acar et al. eq. 1). Without a base (``None``) it adds nothing."""

    mu: float
    reads: ClassVar[tuple[str, ...]] = ()

    def add(
        self, g: list[torch.Tensor], params: list[torch.Tensor], base: list[torch.Tensor] | None,
        down: Mapping[str, list[torch.Tensor]], scratch: list[torch.Tensor] | None,
    ) -> list[torch.Tensor]:  # fmt: skip
        if base is None:
            return g
        pull: list[torch.Tensor] | tuple[torch.Tensor, ...]
        if scratch is None:
            pull = torch._foreach_sub(params, base)
        else:
            pull = scratch
            for s, p, b in zip(scratch, params, base, strict=True):
                torch.sub(p, b, out=s)
        torch._foreach_mul_(pull, self.mu)
        if scratch is None:
            return list(torch._foreach_add(g, pull))
        torch._foreach_add_(g, pull)
        return g


@dataclass(frozen=True)
class Linear:
    """``scale``·v with v = the task's ``down[key]``: the gradient of a linear term
    ``scale``·⟨v, θ⟩ of the local objective, v fixed for the task (SCAFFOLD's correction
    c − c_i, Karimireddy et al. Alg. 1 line 10; FedDyn's −∇L_i(θ_i^{t−1}), Acar et al. eq. 1)."""

    key: str
    scale: float = 1.0

    @property
    def reads(self) -> tuple[str, ...]:
        return (self.key,)

    def add(
        self, g: list[torch.Tensor], params: list[torch.Tensor], base: list[torch.Tensor] | None,
        down: Mapping[str, list[torch.Tensor]], scratch: list[torch.Tensor] | None,
    ) -> list[torch.Tensor]:  # fmt: skip
        v = down[self.key]
        if scratch is None:
            return list(torch._foreach_add(g, v, alpha=self.scale))
        torch._foreach_add_(g, v, alpha=self.scale)
        return g


@dataclass(frozen=True)
class LocalTraining:
    """One client's local SGD: torch.optim.SGD's step (dampening 0, no Nesterov) on the
    loss's gradient plus its :attr:`gradient_terms`. ``train_loss`` reports the loss alone."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    # FedProx's proximal term (μ/2)·‖θ − θ_base‖² (Li et al. eq. 2; Fed-RAA's ρ): its gradient
    # μ·(θ − θ_base) is added to each step's gradient; 0 = plain local SGD
    proximal_mu: float = 0.0
    loss: Loss = field(default_factory=CrossEntropy)
    # further gradient terms a strategy's local objective adds (Needs.terms), after the two
    # above: SCAFFOLD's and FedDyn's corrections
    terms: tuple[GradientTerm, ...] = ()

    @functools.cached_property  # (read at every local step: built once)
    def gradient_terms(self) -> tuple[GradientTerm, ...]:
        """Weight decay, the proximal term (each when non-zero), then :attr:`terms`."""
        first: list[GradientTerm] = []
        if self.weight_decay:
            first.append(WeightDecay(self.weight_decay))
        if self.proximal_mu:
            first.append(Proximal(self.proximal_mu))
        return (*first, *self.terms)

    @functools.cached_property
    def reads(self) -> tuple[str, ...]:
        """The :attr:`Task.down <fedclock.sim.types.Task.down>` keys the terms read."""
        return tuple(k for t in self.terms for k in t.reads)

    @property
    def needs_base(self) -> bool:
        """Whether a step needs θ_base (the proximal term)."""
        return bool(self.proximal_mu)


def down_lists(
    local: LocalTraining,
    down: Mapping[str, Mapping[str, torch.Tensor]],
    names: list[str],
    cut: Callable[[torch.Tensor, str], torch.Tensor] | None = None,
) -> dict[str, list[torch.Tensor]]:
    """The task's ``down`` tensors the terms read, as lists aligned with ``names`` (each
    tensor through ``cut``: a submodel's slice); one sentence if the task lacks one."""
    out: dict[str, list[torch.Tensor]] = {}
    for key in local.reads:
        got = down.get(key)
        if got is None or any(n not in got for n in names):
            raise ValueError(
                f"the local objective reads the task's down[{key!r}] tensors, which the task "
                "does not carry (the strategy's client rule attaches them at dispatch)"
            )
        out[key] = [got[n] if cut is None else cut(got[n], n) for n in names]
    return out


def step_direction(
    local: LocalTraining,
    grads: list[torch.Tensor],
    params: list[torch.Tensor],
    base: list[torch.Tensor] | None,
    bufs: list[torch.Tensor],
    scratch: list[torch.Tensor] | None = None,
    down: Mapping[str, list[torch.Tensor]] | None = None,
) -> list[torch.Tensor]:
    """The direction d of one local step θ ← θ − η·d, written once for every executor path
    (torch.optim.SGD's, dampening 0, no Nesterov, with the local objective's terms):

        g = ∇F + Σ_terms            (λθ, μ(θ − θ_base), then the strategy's: c − c_i, …)
        b ← m·b + g,  d = b          (momentum m; ``bufs`` start at 0, so b₁ = g)

    ``bufs`` are updated in place (ignored without momentum); ``base`` is θ_base (``None``:
    no proximal term); ``down`` the task's tensors the terms read, aligned with ``params``.
    With ``scratch`` (tensors shaped like ``params``) nothing is allocated: ``grads`` are
    overwritten with g and the proximal pull is formed in ``scratch`` — the same
    operations, so the same values."""
    with torch.no_grad():
        g = grads
        for term in local.gradient_terms:
            g = term.add(g, params, base, down or {}, scratch)
        if local.momentum:
            torch._foreach_mul_(bufs, local.momentum)
            torch._foreach_add_(bufs, g)
            return bufs
        return g


@dataclass(frozen=True)
class Needs:
    """What a strategy asks of the executor; ``make_executor`` picks one that can do it.

    ``shapes``: the work shapes its planner dispatches; ``layout``: the model as those
    shapes see it (needed by any shape but ``FULL``); ``suffix_trains_fully``: a layer-suffix
    task trains every unit and sends units d..L (SALF's reference mode, the authors' code)
    instead of backpropagating to d only; ``momentum_per_client``: each client's momentum
    buffers persist across its tasks (the authors' one optimizer per user);
    ``synchronous``: every update of an executor batch is aggregated in the same round
    (contributions may share the block's memory);
    ``deadline``: the t_max no client may be unable to meet (checked before the run);
    ``proximal_mu``: the μ of a proximal term the strategy's local objective adds
    (FedProx; overrides :attr:`LocalTraining.proximal_mu`); ``terms``: further gradient
    terms of its local objective (:class:`GradientTerm`, e.g. SCAFFOLD's correction), which
    read the tensors its tasks carry down (:attr:`Task.down <fedclock.sim.types.Task.down>`);
    ``statistics``: each contribution carries the client's selection statistics
    (:mod:`fedclock.train.statistics`: losses of the received model on its first epoch's
    samples), which speed-aware selection reads.
    """

    shapes: frozenset[type[WorkShape]] = frozenset({type(FULL)})
    layout: Layout | None = None
    suffix_trains_fully: bool = False
    momentum_per_client: bool = False
    synchronous: bool = False
    deadline: float | None = None
    proximal_mu: float = 0.0
    terms: tuple[GradientTerm, ...] = ()
    statistics: bool = False

    @property
    def partial(self) -> bool:
        """Whether any task is not the full model (or carries per-client momentum)."""
        return self.shapes != {type(FULL)} or self.momentum_per_client
