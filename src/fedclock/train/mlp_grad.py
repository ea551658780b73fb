"""The gradient of an MLP's cross-entropy for a block of clients, written out by hand.

For a block of C clients, each with its own parameters of a
``[Flatten] → Linear → ReLU → … → Linear`` network and its own batch, :class:`MlpGrad`
returns what ``vmap(grad_and_value(loss))`` returns — every parameter's gradient of each
client's mean cross-entropy (or of its weighted sum, padded rows weighing 0) and the loss —
with one batched matrix product per layer and direction (``baddbmm`` / ``bmm``) and no
autograd graph, functional call or pytree. On the small sub-networks of model fragments
(Fed-RAA: a tenth of a 784-200-10 MLP) vmap's fixed cost per step is larger than the
arithmetic (``benchmarks/fedraa_fragments.py``); the values are the same to float rounding
(``tests/test_mlp_grad.py``).

Backward of y = a·Wᵀ + b, a' = ReLU(y), for a batch (rows) and one client:
∂L/∂W = (∂L/∂y)ᵀ·a, ∂L/∂b = Σ_rows ∂L/∂y, ∂L/∂a = (∂L/∂y)·W, ∂L/∂y = ∂L/∂a' ⊙ [y > 0];
cross-entropy on logits z: ∂L/∂z = (softmax(z) − onehot(y)) · w_row (w_row = 1/B, or the
row's weight).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import nn

from fedclock.train.local import CrossEntropy


def mlp_linears(model: nn.Module) -> list[tuple[str, str]] | None:
    """(weight, bias) parameter names of each Linear of ``model`` when it is a classifier
    whose ``net`` is ``[Flatten] (Linear ReLU)* Linear`` with biases; None for any other
    model (which then trains through autograd)."""
    net = getattr(model, "net", None)
    if not isinstance(net, nn.Sequential):
        return None
    mods = list(net.named_children())
    if mods and isinstance(mods[0][1], nn.Flatten):
        if mods[0][1].start_dim != 1 or mods[0][1].end_dim != -1:
            return None
        mods = mods[1:]
    if not mods or len(mods) % 2 != 1:
        return None
    out = []
    for i, (name, m) in enumerate(mods):
        if i % 2 == 1:
            if type(m) is not nn.ReLU:
                return None
            continue
        if type(m) is not nn.Linear or m.bias is None:
            return None
        out.append((f"net.{name}.weight", f"net.{name}.bias"))
    return out


class MlpGrad:
    """``vmap(grad_and_value(cross-entropy ∘ MLP))`` of a block, by hand (module docstring).

    ``__call__(params, x, y, w=None)``: ``params`` maps each parameter name to its stacked
    tensor (C, …) — a fragment's slices included —, ``x`` (C, B, …), ``y`` (C, B); ``w``
    (C, B) the rows' weights (the weighted sum; None: the mean over B). Returns (gradients
    by name, loss (C,)).
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # stateless

    def __init__(self, linears: list[tuple[str, str]]) -> None:
        self.linears = linears

    @staticmethod
    def applies(model: nn.Module, loss: object) -> bool:
        return type(loss) is CrossEntropy and mlp_linears(model) is not None

    def __call__(
        self,
        params: Mapping[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        w: torch.Tensor | None = None,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        c, b = y.shape
        a = x.reshape(c, b, -1)
        inputs, pre = [a], []
        last = len(self.linears) - 1
        for i, (wn, bn) in enumerate(self.linears):
            z = torch.baddbmm(params[bn].unsqueeze(1), a, params[wn].transpose(1, 2))
            pre.append(z)
            if i < last:
                a = torch.relu(z)
                inputs.append(a)
        logp = torch.log_softmax(pre[-1], dim=-1)  # (C, B, K)
        target = y.unsqueeze(-1)
        per_row = -logp.gather(-1, target).squeeze(-1)  # cross-entropy of each row
        dz = logp.exp_()  # softmax
        dz.scatter_add_(-1, target, torch.full_like(per_row, -1.0).unsqueeze(-1))
        if w is None:
            loss = per_row.mean(dim=1)
            dz.mul_(1.0 / b)
        else:
            loss = (per_row * w).sum(dim=1)
            dz.mul_(w.unsqueeze(-1))
        grads: dict[str, torch.Tensor] = {}
        for i in range(last, -1, -1):
            wn, bn = self.linears[i]
            grads[wn] = torch.bmm(dz.transpose(1, 2), inputs[i])
            grads[bn] = dz.sum(dim=1)
            if i > 0:
                dz = torch.bmm(dz, params[wn]).mul_(pre[i - 1] > 0)
        return grads, loss
