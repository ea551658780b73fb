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

    ``__call__(params, x, y, w=None, out=None)``: ``params`` maps each parameter name to its
    stacked tensor (C, …) — a fragment's slices included —, ``x`` (C, B, …), ``y`` (C, B);
    ``w`` (C, B) the rows' weights (the weighted sum; None: the mean over B); ``out`` the
    tensors (C, …) to write the gradients into (e.g. views of one flat buffer), else new
    ones. Returns (gradients by name, loss (C,)).
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
        out: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return self.bind(params, out)(x, y, w)

    def bind(
        self, params: Mapping[str, torch.Tensor], out: Mapping[str, torch.Tensor] | None = None
    ) -> Bound:
        """The step's gradient for these parameter tensors (and ``out`` buffers), with their
        transposed and broadcast views made once: valid while the tensors are updated in
        place (a block's local steps, :meth:`VectorizedExecutor._train_steps_flat`)."""
        return Bound(self.linears, params, out)


class Bound:
    """:class:`MlpGrad` bound to a block's parameter tensors: ``(x, y, w=None)`` → (gradients
    by name, loss (C,)), the same operations as an unbound call; :meth:`step` writes the
    gradients into ``out`` and returns the loss alone (a block's local steps)."""

    def __init__(
        self,
        linears: list[tuple[str, str]],
        params: Mapping[str, torch.Tensor],
        out: Mapping[str, torch.Tensor] | None,
    ) -> None:
        self.names = [n for pair in linears for n in pair]
        self.weights = [params[wn] for wn, _ in linears]
        self.weights_t = [params[wn].transpose(1, 2) for wn, _ in linears]
        self.biases = [params[bn].unsqueeze(1) for _, bn in linears]
        self.out = None if out is None else [(out[wn], out[bn]) for wn, bn in linears]
        self._minus_one: torch.Tensor | None = None  # scatter_add_'s −1 per row, kept

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None = None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        grads, loss = self._grads(x, y, w)
        return dict(zip(self.names, grads, strict=True)), loss

    def step(self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
        """The gradients into ``out`` (bound with one); returns the loss (C,)."""
        return self._grads(x, y, w)[1]

    def _grads(
        self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        c, b = y.shape
        a = x.reshape(c, b, -1)
        inputs, pre = [a], []
        weights_t, biases = self.weights_t, self.biases
        last = len(weights_t) - 1
        for i in range(last + 1):
            z = torch.baddbmm(biases[i], a, weights_t[i])
            pre.append(z)
            if i < last:
                a = torch.relu(z)
                inputs.append(a)
        # log-softmax over the K classes of each row, taken along dim 1 of the (C, K, B)
        # view: the same values (bit for bit on the reference CPU: goldens unchanged), 2–4×
        # faster than along a short last dim (K = 10) with the copy back; made contiguous
        # again so the sums below keep their order (benchmarks/fedraa_step.py)
        logp = torch.log_softmax(pre[-1].transpose(1, 2), 1).transpose(1, 2).contiguous()
        target = y.unsqueeze(-1)
        per_row = -logp.gather(-1, target).squeeze(-1)  # cross-entropy of each row
        dz = logp.exp_()  # softmax
        minus_one = self._minus_one
        if minus_one is None or minus_one.shape != target.shape:
            minus_one = self._minus_one = torch.full(target.shape, -1.0, dtype=dz.dtype,
                                                     device=dz.device)  # fmt: skip
        dz.scatter_add_(-1, target, minus_one)
        if w is None:
            loss = per_row.mean(dim=1)
            dz.mul_(1.0 / b)
        else:
            loss = (per_row * w).sum(dim=1)
            dz.mul_(w.unsqueeze(-1))
        grads: list[torch.Tensor] = [dz] * (2 * last + 2)
        out = self.out
        for i in range(last, -1, -1):
            if out is None:
                grads[2 * i] = torch.bmm(dz.transpose(1, 2), inputs[i])
                grads[2 * i + 1] = dz.sum(dim=1)
            else:
                gw, gb = out[i]
                grads[2 * i] = torch.bmm(dz.transpose(1, 2), inputs[i], out=gw)
                grads[2 * i + 1] = torch.sum(dz, dim=1, out=gb)
            if i > 0:  # ReLU's backward: ∂L/∂a ⊙ [y > 0] (autograd's own kernel)
                dz = torch.ops.aten.threshold_backward(
                    torch.bmm(dz, self.weights[i]), pre[i - 1], 0
                )
        return grads, loss
