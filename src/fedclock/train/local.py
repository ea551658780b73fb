"""What local training is, as values: :class:`LocalTraining` (the optimiser settings and the
loss every executor uses) and :class:`Needs` (what a strategy asks of the executor).

The loss receives the model's output and the targets, so a kind of work with its own
objective (an early exit's head, a proximal term) plugs in without touching the executors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

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


@dataclass(frozen=True)
class LocalTraining:
    """One client's local SGD: torch.optim.SGD's step (dampening 0, no Nesterov) on the
    loss's gradient plus the proximal term's. ``train_loss`` reports the loss alone."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    # FedProx's proximal term (μ/2)·‖θ − θ_base‖² (Li et al. eq. 2; Fed-RAA's ρ): its gradient
    # μ·(θ − θ_base) is added to each step's gradient; 0 = plain local SGD
    proximal_mu: float = 0.0
    loss: Loss = field(default_factory=CrossEntropy)


def step_direction(
    local: LocalTraining,
    grads: list[torch.Tensor],
    params: list[torch.Tensor],
    base: list[torch.Tensor] | None,
    bufs: list[torch.Tensor],
    scratch: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """The direction d of one local step θ ← θ − η·d, written once for every executor path
    (torch.optim.SGD's, dampening 0, no Nesterov, with the proximal term):

        g = ∇F + λθ + μ(θ − θ_base)     (weight decay λ; FedProx eq. 2's μ, Fed-RAA's ρ)
        b ← m·b + g,  d = b              (momentum m; ``bufs`` start at 0, so b₁ = g)

    ``bufs`` are updated in place (ignored without momentum); ``base`` is θ_base (``None``:
    no proximal term). With ``scratch`` (tensors shaped like ``params``) nothing is
    allocated: ``grads`` are overwritten with g and the proximal pull is formed in
    ``scratch`` — the same operations, so the same values."""
    with torch.no_grad():
        g = grads
        if local.weight_decay:
            if scratch is None:
                g = list(torch._foreach_add(g, params, alpha=local.weight_decay))
            else:
                torch._foreach_add_(g, params, alpha=local.weight_decay)
        if local.proximal_mu and base is not None:
            pull: list[torch.Tensor] | tuple[torch.Tensor, ...]
            if scratch is None:
                pull = torch._foreach_sub(params, base)
            else:
                pull = scratch
                for s, p, b in zip(scratch, params, base, strict=True):
                    torch.sub(p, b, out=s)
            torch._foreach_mul_(pull, local.proximal_mu)
            if scratch is None:
                g = list(torch._foreach_add(g, pull))
            else:
                torch._foreach_add_(g, pull)
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
    (FedProx; overrides :attr:`LocalTraining.proximal_mu`).
    """

    shapes: frozenset[type[WorkShape]] = frozenset({type(FULL)})
    layout: Layout | None = None
    suffix_trains_fully: bool = False
    momentum_per_client: bool = False
    synchronous: bool = False
    deadline: float | None = None
    proximal_mu: float = 0.0

    @property
    def partial(self) -> bool:
        """Whether any task is not the full model (or carries per-client momentum)."""
        return self.shapes != {type(FULL)} or self.momentum_per_client
