"""Partial work: layer-suffix tasks (SALF) and width-sliced submodels (HeteroFL).

:func:`suffix_grads` backpropagates from the loss down to layer ``depth`` only:
``torch.autograd.grad`` is asked for the parameters of layers depth..L alone,
and the parameters of the earlier layers do not require gradients during the
forward pass, so autograd records no backward graph for them and their
backward is never run (the FLOPs counted by ``torch.utils.flop_counter``
shrink with the depth; see the tests).

:class:`PartialExecutor` runs the tasks of the SALF family:

- ``paper`` mode: a ``Suffix(d)`` shape → the suffix gradient of module layers d..L,
  then one SGD step on those layers only (the others are not sent: Δ = 0);
- ``reference`` mode (the authors' code): a straggler trains fully and keeps
  only the last tensors (state-dict entries d..L_e); every other entry,
  buffers included, is reset to the global value. The momentum buffers of
  every client persist across rounds (one optimizer per client for the run);
- a ``Width(r)`` shape → a HeteroFL submodel: the first ⌈r·C⌉ channels/neurons of
  every hidden layer, activations of hidden layers divided by r in training.

For a model without buffers, full and layer-suffix tasks go to the vectorized
executor. Paper mode: one block per depth, the suffix's parameters stacked and
trained with ``vmap(grad)``, the prefix a frozen input, so the suffix-only
backward is kept. Reference mode: every task trains fully, so depths share a
block; the kept tensors are masked afterwards, and each client's momentum
buffers are read into the block and written back. HeteroFL submodels: one block
per width, each client's slice of the base stacked, the Scaler hooked on the
hidden modules during the block. Models with buffers (VGG) and
``executor.kind: serial`` run here, one task at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from fedclock.models.shapes import FULL, Layout, Program, Units, UnsupportedShapeError, refuse
from fedclock.sim.types import Contribution, Params, Task
from fedclock.train.executor import ClientData, SerialExecutor, batch_schedule, load_version
from fedclock.train.local import CrossEntropy, Loss
from fedclock.train.vectorized import Scale


def suffix_grads(
    model: nn.Module,
    suffix: Sequence[str],
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Loss | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Gradients of the loss (cross-entropy by default) for the named parameters only (and
    the loss).

    Parameters not in ``suffix`` are frozen during the forward pass, so no
    backward graph is built (or run) below the first suffix layer.
    """
    params = dict(model.named_parameters())
    wanted = set(suffix)
    saved = {n: p.requires_grad for n, p in params.items()}
    try:
        for n, p in params.items():
            p.requires_grad_(n in wanted)
        loss = (loss_fn or CrossEntropy())(model(x), y)
        names = [n for n in params if n in wanted]
        if not names:
            return {}, loss.detach()
        grads = torch.autograd.grad(loss, [params[n] for n in names])
    finally:
        for n, p in params.items():
            p.requires_grad_(saved[n])
    return dict(zip(names, grads, strict=True)), loss.detach()


class PartialExecutor(SerialExecutor):
    """Serial execution of full, layer-suffix and width-sliced tasks (see the module doc)."""

    def __init__(
        self,
        model: nn.Module,
        data: ClientData,
        *,
        seed: int,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        device: torch.device | str = "cpu",
        mode: str = "paper",
        units: Units,
        persistent_momentum: bool = False,
        vectorize: bool = False,
        max_batch_clients: int | None = None,
        loss: Loss | None = None,
        proximal_mu: float = 0.0,
    ) -> None:
        super().__init__(
            model, data, seed=seed, lr=lr, momentum=momentum, weight_decay=weight_decay,
            device=device, loss=loss, proximal_mu=proximal_mu,
        )  # fmt: skip
        self.mode = mode
        self.units = units
        # the model as work shapes see it: each shape's Program says what trains and is sent
        self.layout = Layout.of(model, units, 0)
        self._trains_fully = mode == "reference"
        self.persistent_momentum = persistent_momentum
        self._momentum: dict[int, dict[str, torch.Tensor]] = {}
        names = [n for n, _ in model.named_parameters()]
        self._names = names
        self._hidden = [m for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d)][:-1]
        # full and layer-suffix tasks are batched by the vectorized executor (paper mode:
        # one block per depth; reference mode: full training, the kept tensors masked, the
        # clients' momentum buffers read and written back), falling back to run_one
        self._vectorized: Any = None
        if vectorize and not any(True for _ in model.buffers()):
            from fedclock.train.vectorized import VectorizedExecutor, unsupported_model_reason

            if unsupported_model_reason(model) is None:
                self._vectorized = VectorizedExecutor(
                    model, data, seed=seed, lr=lr, momentum=momentum, weight_decay=weight_decay,
                    device=device, max_batch_clients=max_batch_clients,
                    layout=self.layout, trains_fully=self._trains_fully,
                    momentum_store=self._momentum if persistent_momentum else None,
                    scaled=self._hidden, serial=self,
                    loss=self.loss, proximal_mu=proximal_mu,
                )  # fmt: skip

    def run(self, tasks: Sequence[Task]) -> list[Contribution]:
        if self._vectorized is None:
            return super().run(tasks)
        return list(self._vectorized.run(tasks))

    # ---- SGD with torch.optim.SGD's semantics (dampening 0, no Nesterov), on chosen tensors
    def _step(
        self,
        client: int,
        params: Mapping[str, torch.Tensor],
        grads: dict[str, torch.Tensor],
        views: dict[str, tuple[slice, ...]] | None = None,
        base: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        # per client: kept across rounds (reference mode) or reset at each task's start and end
        bufs = self._momentum.setdefault(client, {})
        with torch.no_grad():
            for n, g in grads.items():
                p = params[n]
                if self.weight_decay:
                    g = g + self.weight_decay * p
                if self.proximal_mu and base is not None:  # μ(θ − θ_base): FedProx's term
                    b0 = base[n][views[n]] if views is not None else base[n]
                    g = g + self.proximal_mu * (p - b0.to(p.device))
                if self.momentum:
                    full = bufs.get(n)
                    sl = views[n] if views is not None else None
                    if full is None:
                        shape = self.model.get_parameter(n).shape
                        full = torch.zeros(shape, device=p.device)
                        fresh = True
                        bufs[n] = full
                    else:
                        fresh = False
                    b = full[sl] if sl is not None else full
                    if fresh:
                        b.copy_(g)
                    else:
                        b.mul_(self.momentum).add_(g)
                    g = b
                p.sub_(self.lr * g)

    def run_one(self, task: Task) -> Contribution:
        shape = task.plan.shape
        if shape is FULL and not self.persistent_momentum and self.mode == "paper":
            return super().run_one(task)
        try:
            prog = shape.program(self.layout, trains_fully=self._trains_fully)
        except UnsupportedShapeError:
            raise refuse(
                "partial-work executor", shape, "full, layer-suffix and width tasks"
            ) from None
        if prog.views is not None:
            return self._run_width(task, prog)
        model = self.model
        load_version(model, task.base)
        model.train()
        params = dict(model.named_parameters())
        suffix = list(prog.trains)  # reference mode: every tensor (the authors keep d..L_e)
        loss_fn = prog.loss or self.loss
        idx = self.data.indices[task.client]
        steps = batch_schedule(self.seed, task, len(idx))
        if not self.persistent_momentum:
            self._momentum.pop(task.client, None)
        total = 0.0
        for local in steps:
            rows = idx[local].to(self.device)
            grads, loss = suffix_grads(model, suffix, self._x[rows], self._y[rows], loss_fn)
            self._step(task.client, params, grads, base=task.base.params)
            total += float(loss)
        if not self.persistent_momentum:
            self._momentum.pop(task.client, None)
        delta: Params = {}
        for n, p in params.items():
            keep = n in prog.sends
            delta[n] = (p.detach() - task.base.params[n]) if keep else torch.zeros_like(p)
        buffers: Params = {}
        for n, b in model.named_buffers():
            keep = shape.holds_buffer(self.layout, n)
            buffers[n] = b.detach().clone() if keep else task.base.buffers[n].clone()
        return Contribution(
            task=task, delta=delta, buffers=buffers, num_samples=len(idx),
            train_loss=total / max(1, len(steps)), coverage=prog.coverage,
        )  # fmt: skip

    def _run_width(self, task: Task, prog: Program) -> Contribution:
        model = self.model
        base = task.base.params
        views = prog.views
        rate = prog.scale
        assert views is not None and rate is not None
        sub = {
            n: base[n][views[n]].detach().clone().to(self.device).requires_grad_(True)
            for n in self._names
        }
        load_version(model, task.base)
        model.train()
        hooks = [m.register_forward_hook(Scale(rate)) for m in self._hidden]
        idx = self.data.indices[task.client]
        steps = batch_schedule(self.seed, task, len(idx))
        if not self.persistent_momentum:
            self._momentum.pop(task.client, None)
        total = 0.0
        try:
            for local in steps:
                rows = idx[local].to(self.device)
                out = functional_call(model, sub, (self._x[rows],))
                loss = (prog.loss or self.loss)(out, self._y[rows])
                grads = torch.autograd.grad(loss, [sub[n] for n in self._names])
                self._step(
                    task.client, sub, dict(zip(self._names, grads, strict=True)), views,
                    base=task.base.params,
                )  # fmt: skip
                total += float(loss.detach())
        finally:
            for h in hooks:
                h.remove()
        if not self.persistent_momentum:
            self._momentum.pop(task.client, None)
        delta: Params = {}
        for n in self._names:
            d = torch.zeros_like(base[n])
            d[views[n]] = sub[n].detach() - base[n][views[n]]
            delta[n] = d
        buffers = {n: b.clone() for n, b in task.base.buffers.items()}
        return Contribution(
            task=task, delta=delta, buffers=buffers, num_samples=len(idx),
            train_loss=total / max(1, len(steps)), coverage=prog.coverage,
        )  # fmt: skip
