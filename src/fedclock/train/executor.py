"""Executors: pure functions of (model snapshot, task, client data, random stream) → contribution.

The batch order of a task comes from the stream ``("batches", client, base
version)`` (extended by ``task.repeat`` for a client's second and later task on the same
base), so a task's contribution does not depend on which other tasks ran
before it, nor on the executor that ran it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from fedclock.models.shapes import (
    FULL,
    Layout,
    Program,
    Scale,
    UnsupportedShapeError,
    hidden_modules,
    refuse,
)
from fedclock.rng import counter_key, counter_keys, splitmix64_grid
from fedclock.sim.types import Contribution, ModelVersion, Params, Task
from fedclock.train.local import (
    STEP_STATISTICS,
    CrossEntropy,
    LocalTraining,
    Loss,
    down_lists,
    step_direction,
)


@dataclass(frozen=True)
class ClientData:
    """The training set held once, and each client's indices into it (views, never copies)."""

    x: torch.Tensor
    y: torch.Tensor
    indices: tuple[torch.Tensor, ...]  # int64 index tensor per client

    @classmethod
    def from_partition(
        cls, x: torch.Tensor, y: torch.Tensor, parts: Sequence[np.ndarray]
    ) -> ClientData:
        """Every client's indices as a view of one flat index tensor (held once)."""
        sizes = np.array([len(p) for p in parts], dtype=np.int64)
        flat = torch.as_tensor(
            np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
            if len(parts)
            else np.empty(0, dtype=np.int64)
        )
        offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        views = tuple(
            flat[o : o + n] for o, n in zip(offsets.tolist(), sizes.tolist(), strict=True)
        )
        data = cls(x=x, y=y, indices=views)
        data.__dict__["flat"] = (flat, offsets)  # the cached_property below, without a copy
        return data

    def sizes(self) -> np.ndarray:
        return np.array([len(i) for i in self.indices], dtype=np.int64)

    @functools.cached_property
    def flat(self) -> tuple[torch.Tensor, np.ndarray]:
        """(all clients' indices concatenated, each client's offset into them): the
        vectorized executor gathers a whole block's rows with one index operation."""
        sizes = self.sizes()
        offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        if not self.indices:
            return torch.empty(0, dtype=torch.int64), offsets
        return torch.cat([torch.as_tensor(i, dtype=torch.int64) for i in self.indices]), offsets


def batch_key(seed: int, task: Task) -> int:
    """The key of a task's batch order: stream ``("batches", client, base version)``, or
    ``("batches", client, base version, repeat)`` for the client's ``repeat``-th further
    task on that base (FedBuff with concurrency can give a freed slot back to the same
    client before the model changes: it must not train on the same batches again)."""
    if task.repeat:
        return counter_key(seed, "batches", task.client, task.base.version, task.repeat)
    return counter_key(seed, "batches", task.client, task.base.version)


def batch_keys(seed: int, tasks: Sequence[Task]) -> np.ndarray:
    """:func:`batch_key` of every task, in one vectorized call."""
    clients = np.fromiter((t.client for t in tasks), dtype=np.int64, count=len(tasks))
    versions = np.fromiter((t.base.version for t in tasks), dtype=np.int64, count=len(tasks))
    keys = counter_keys(seed, "batches", clients, versions)
    repeats = np.fromiter((t.repeat for t in tasks), dtype=np.int64, count=len(tasks))
    again = np.flatnonzero(repeats)
    if len(again):
        keys[again] = counter_keys(seed, "batches", clients[again], versions[again], repeats[again])
    return keys


def batch_positions(keys: np.ndarray, n: int, steps: int, b: int) -> np.ndarray:
    """Local positions (0..n−1) used by ``steps`` batches of ``b``, one row per key.

    Epoch e of a client is the permutation that sorts SplitMix64 draws at positions
    e·n … e·n+n−1 of the client's key (ties by position); successive epochs are cut into
    ⌈n/b⌉ batches (the last one short when b ∤ n). Row r is the concatenation of the
    batches of ``keys[r]``; vectorized over clients, and the same for one client alone.
    """
    per_epoch = -(-n // b)
    epochs, tail = divmod(steps, per_epoch)
    out = []
    pos = np.arange(n, dtype=np.uint64)
    for e in range(epochs + (tail > 0)):
        u = splitmix64_grid(keys, pos + np.uint64(e * n))  # draws e·n … e·n+n−1 of each key
        take = n if e < epochs else min(n, tail * b)
        if take == n:
            out.append(np.argsort(u, axis=1, kind="stable"))
        else:  # only the first `take` of the permutation
            out.append(_smallest(u, take))
    if not out:
        return np.empty((len(keys), 0), dtype=np.int64)
    return out[0] if len(out) == 1 else np.concatenate(out, axis=1)


def _smallest(u: np.ndarray, take: int) -> np.ndarray:
    """Per row, the positions of the ``take`` smallest draws, in increasing order (ties by
    position): the first ``take`` entries of the stable argsort, without sorting whole rows.

    The draws are uniform on [0, 2⁶⁴), so when take ≪ n the smallest lie below a threshold
    that keeps ≈ 2·take + 16 candidates a row; only those are sorted (one ``lexsort`` for the
    block). Otherwise (take not ≪ n, or a row with too few candidates) whole rows are sorted.
    """
    n = u.shape[1]
    if take * 8 <= n:
        thr = np.uint64(min(2**64 - 1, int((2 * take + 16) / n * 2.0**64)))
        at = np.flatnonzero(u < thr)  # row-major: positions increase within a row
        r = at // n
        count = np.bincount(r, minlength=u.shape[0])
        if (count >= take).all():
            c = at - r * n
            v = u.ravel()[at]
            if u.shape[0] * int(thr) < 2**64:
                # every candidate is < thr, so r·thr + v orders by (row, draw) in one uint64:
                # one stable argsort, ~10× faster than the lexsort below on W2's shape
                order = np.argsort(r.astype(np.uint64) * thr + v, kind="stable")
            else:
                order = np.lexsort((v, r))  # stable: equal draws keep position order
            start = np.concatenate(([0], np.cumsum(count)[:-1]))
            return c[order][start[:, None] + np.arange(take)]
    return np.argsort(u, axis=1, kind="stable")[:, :take]


def split_batches(flat: torch.Tensor, n: int, steps: int, b: int) -> list[torch.Tensor]:
    """Cut one client's :func:`batch_positions` row into its ``steps`` batches."""
    per_epoch = -(-n // b)
    out = []
    start = 0
    for s in range(steps):
        size = b if s % per_epoch < per_epoch - 1 else n - (per_epoch - 1) * b
        out.append(flat[start : start + size])
        start += size
    return out


def batch_schedule(seed: int, task: Task, n: int) -> list[torch.Tensor]:
    """Local positions (0..n−1) of each step's batch of ``task`` on a client with n samples:
    successive shuffles cut into ⌈n/B⌉ batches (see :func:`batch_positions`)."""
    b, steps = task.plan.batch_size, task.plan.local_steps
    keys = np.array([batch_key(seed, task)], dtype=np.uint64)
    flat = torch.from_numpy(batch_positions(keys, n, steps, b)[0])
    return split_batches(flat, n, steps, b)


def load_version(model: nn.Module, version: ModelVersion) -> None:
    """Copy a snapshot's tensors into a working model (the snapshot is left untouched)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(version.params[name])
        if version.buffers:
            for name, buf in model.named_buffers():
                buf.copy_(version.buffers[name])


def snapshot(model: nn.Module, version: int) -> ModelVersion:
    return ModelVersion(
        version=version,
        params={k: v.detach().clone() for k, v in model.named_parameters()},
        buffers={k: v.detach().clone() for k, v in model.named_buffers()},
    )


def suffix_grads(
    model: nn.Module,
    suffix: Sequence[str],
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Loss | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Gradients of the loss (cross-entropy by default) for the named parameters only (and
    the loss).

    Parameters not in ``suffix`` are frozen during the forward pass, so autograd records no
    backward graph below the first suffix layer and that backward is never run (the FLOPs
    counted by ``torch.utils.flop_counter`` shrink with a SALF task's depth; see the tests).
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


def _no_time_for_another(stop_at: float, started: float, done: int) -> bool:
    """A real device's budget (fedclock.deploy.device): whether one more step, as long as the
    mean of the ``done`` so far, would end past ``stop_at`` (time.monotonic())."""
    now = time.monotonic()
    return now + (now - started) / done >= stop_at


class SerialExecutor:
    """Runs tasks one after another on one working copy of the model.

    A full-model task is local SGD on the run's loss, each step's direction from
    :func:`~fedclock.train.local.step_direction` (weight decay, proximal term, momentum: the
    one local step of every executor path) and θ ← θ − η·d as torch.optim.SGD. Partial work
    runs from its shape's :class:`~fedclock.models.shapes.Program` for the model's
    ``layout``: only the program's parameters train (:func:`suffix_grads` backpropagates to
    them alone), a submodel's slices train with the Scaler hooked on the hidden modules,
    the program's own loss replaces the run's, and the tensors it does not send get Δ = 0;
    the same step on those tensors.
    ``trains_fully``: a layer-suffix task trains every tensor and sends tensors d..L_e (SALF's
    reference mode); ``persistent_momentum``: each client's momentum buffers persist across
    its tasks in ``momentum_store`` (the authors' one optimizer per user) — the strategy's
    :class:`~fedclock.strategies.client.ClientState` ``momentum`` dict, which the strategy
    owns and the checkpoint stores; the executor keeps no run state of its own (without
    persistence its buffers live for one task).
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (momentum_store is the strategy's)
    # a real device's budget (fedclock.deploy.device): full and layer-suffix tasks stop at
    # the first step boundary past this time.monotonic() (never set in simulation)
    stop_at: float | None = None
    # a device emulating a slower one (fedclock.deploy.device): called after each step with
    # the steps done so far (never set in simulation)
    after_step: Callable[[int], None] | None = None

    def __init__(
        self,
        model: nn.Module,
        data: ClientData,
        *,
        seed: int,
        local: LocalTraining,
        device: torch.device | str = "cpu",
        layout: Layout | None = None,
        trains_fully: bool = False,
        persistent_momentum: bool = False,
        momentum_store: dict[int, dict[str, torch.Tensor]] | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.data = data
        self.seed = seed
        self.local = local
        self.loss: Loss = local.loss
        self.layout = layout
        self.trains_fully = trains_fully
        self.persistent_momentum = persistent_momentum
        self.momentum_store: dict[int, dict[str, torch.Tensor]] = (
            {} if momentum_store is None else momentum_store
        )
        self._x = data.x.to(self.device)
        self._y = data.y.to(self.device)
        self._names = [n for n, _ in model.named_parameters()]
        self._hidden = hidden_modules(model)
        self._full = Program(trains=tuple(self._names), sends=frozenset(self._names))

    def run(self, tasks: Sequence[Task]) -> list[Contribution]:
        return [self.run_one(t) for t in tasks]

    def _budget_spent(self, task: Task, done: int, started: float) -> bool:
        """A real device after its ``done``-th step (fedclock.deploy.device): its emulated
        pace (``after_step``), then whether another step would pass ``stop_at`` — if so the
        task's plan records the steps taken."""
        if self.after_step is not None:
            self.after_step(done)
        if self.stop_at is None or not _no_time_for_another(self.stop_at, started, done):
            return False
        task.plan = replace(task.plan, local_steps=done)
        return True

    def run_one(self, task: Task) -> Contribution:
        shape = task.plan.shape
        if shape is FULL and not self.persistent_momentum and not self.trains_fully:
            return self._run_full(task)
        if shape is FULL:
            prog = self._full
        else:
            try:
                prog = shape.program(self.layout, trains_fully=self.trains_fully)
            except UnsupportedShapeError:
                runs = (
                    "full-model tasks" if self.layout is None else "tasks of a shape with a program"
                )
                raise refuse("serial executor", shape, runs) from None
        if prog.views is not None:
            return self._run_sliced(task, prog)
        if prog.levels is not None:  # (per-step parts are run on a submodel's slices only)
            raise refuse("serial executor", shape, "ordered dropout on a submodel's slices")
        return self._run_program(task, prog)

    def _run_full(self, task: Task) -> Contribution:
        model = self.model
        load_version(model, task.base)
        model.train()
        params: list[torch.Tensor] = list(model.parameters())
        base = [task.base.params[n] for n in self._names] if self.local.proximal_mu else None
        bufs = [torch.zeros_like(p) for p in params] if self.local.momentum else []
        down = down_lists(self.local, task.down, self._names) if self.local.reads else {}
        lr = self.local.lr * task.plan.lr_scale
        idx = self.data.indices[task.client]
        total = 0.0
        steps = batch_schedule(self.seed, task, len(idx))
        device = self.stop_at is not None or self.after_step is not None
        started = time.monotonic()
        for done, local in enumerate(steps, 1):
            rows = idx[local].to(self.device)
            loss = self.loss(model(self._x[rows]), self._y[rows])
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            # as torch.optim.SGD, a parameter without a gradient (an unused head) is skipped
            used = [i for i, g in enumerate(grads) if g is not None]
            d = step_direction(
                self.local, [grads[i] for i in used], [params[i] for i in used],
                None if base is None else [base[i] for i in used],
                [bufs[i] for i in used] if bufs else [],
                down=(
                    {k: [v[i] for i in used] for k, v in down.items()}
                    if len(used) < len(params) else down
                ),
            )  # fmt: skip
            with torch.no_grad():
                torch._foreach_add_([params[i] for i in used], d, alpha=-lr)
            total += float(loss.detach())
            if device and self._budget_spent(task, done, started):  # (a real device)
                steps = steps[:done]
                break
        delta: Params = {
            name: (p.detach() - task.base.params[name]) for name, p in model.named_parameters()
        }
        buffers: Params = {name: b.detach().clone() for name, b in model.named_buffers()}
        return Contribution(
            task=task,
            delta=delta,
            buffers=buffers,
            num_samples=len(idx),
            train_loss=total / max(1, len(steps)),
        )

    # ---- partial work: the same step on the chosen tensors (a submodel's: their slices)
    def _step(
        self,
        client: int,
        params: Mapping[str, torch.Tensor],
        grads: dict[str, torch.Tensor],
        views: Mapping[str, tuple[slice, ...]] | None = None,
        base: Mapping[str, torch.Tensor] | None = None,
        lr_scale: float = 1.0,
        down: Mapping[str, Params] | None = None,
    ) -> None:
        names = list(grads)
        ps = [params[n] for n in names]
        b0 = None
        if base is not None and self.local.proximal_mu:
            b0 = [(base[n][views[n]] if views is not None else base[n]).to(p.device)
                  for n, p in zip(names, ps, strict=True)]  # fmt: skip
        bufs = []
        if self.local.momentum:
            # per client: kept across tasks (persistent_momentum) or reset at each task's start
            store = self.momentum_store.setdefault(client, {})
            for n, p in zip(names, ps, strict=True):
                full = store.get(n)
                if full is None:
                    full = store[n] = torch.zeros(
                        self.model.get_parameter(n).shape, device=p.device
                    )
                bufs.append(full[views[n]] if views is not None else full)
        dl = None
        if self.local.reads:
            dl = down_lists(
                self.local,
                down or {},
                names,
                lambda t, n: (t[views[n]] if views is not None else t).to(self.device),
            )
        d = step_direction(self.local, [grads[n] for n in names], ps, b0, bufs, down=dl)
        lr = self.local.lr * lr_scale
        with torch.no_grad():
            torch._foreach_add_(ps, d, alpha=-lr)  # θ ← θ − η·d, as the full path's step

    def _run_program(self, task: Task, prog: Program) -> Contribution:
        """A task that trains ``prog.trains`` of the model (a layer suffix: the prefix is frozen)."""
        model = self.model
        load_version(model, task.base)
        model.train()
        params = dict(model.named_parameters())
        trains = list(prog.trains)
        loss_fn = prog.loss or self.loss
        masks = {n: m.to(self.device) for n, m in (prog.masks or {}).items()}
        keep_base = prog.mask_fill == "base"  # masked-out elements frozen at the base
        if not keep_base:
            with torch.no_grad():  # a fragment's model holds only its elements
                for n, m in masks.items():
                    params[n].mul_(m)
        idx = self.data.indices[task.client]
        steps = batch_schedule(self.seed, task, len(idx))
        if not self.persistent_momentum:
            self.momentum_store.pop(task.client, None)
        total = 0.0
        # the program's per-step statistics (Contribution.up), accumulated from each gradient
        up: dict[str, Params] = {
            k: {n: torch.zeros_like(params[n]) for n in trains} for k in prog.step_statistics
        }
        device = self.stop_at is not None or self.after_step is not None
        started = time.monotonic()
        for done, local in enumerate(steps, 1):
            rows = idx[local].to(self.device)
            grads, loss = suffix_grads(model, trains, self._x[rows], self._y[rows], loss_fn)
            for k, acc in up.items():
                accumulate = STEP_STATISTICS[k]
                for n, g in grads.items():
                    accumulate(acc[n], g)
            self._step(
                task.client,
                params,
                grads,
                base=task.base.params,
                lr_scale=task.plan.lr_scale,
                down=task.down,
            )
            with torch.no_grad():  # outside its fragment the model stays 0, or the base
                for n, m in masks.items():
                    if keep_base:
                        base = task.base.params[n].to(self.device)
                        params[n].copy_(torch.where(m, params[n], base))
                    else:
                        params[n].mul_(m)
            total += float(loss)
            if device and self._budget_spent(task, done, started):  # (a real device)
                steps = steps[:done]
                break
        if not self.persistent_momentum:
            self.momentum_store.pop(task.client, None)
        delta: Params = {}
        for n, p in params.items():
            keep = n in prog.sends
            delta[n] = (p.detach() - task.base.params[n]) if keep else torch.zeros_like(p)
            if n in masks:  # Δ = 0 outside the fragment
                delta[n].mul_(masks[n])
        buffers: Params = {}
        shape = task.plan.shape
        for n, b in model.named_buffers():
            keep = shape is FULL or (self.layout is not None and shape.holds_buffer(self.layout, n))
            buffers[n] = b.detach().clone() if keep else task.base.buffers[n].clone()
        return Contribution(
            task=task, delta=delta, buffers=buffers, num_samples=len(idx),
            train_loss=total / max(1, len(steps)), coverage=prog.coverage,
            up=up,
        )  # fmt: skip

    def _run_sliced(self, task: Task, prog: Program) -> Contribution:
        """A submodel task: each tensor's slice (``prog.views``) trains, the Scaler hooked;
        with ``prog.levels`` each step trains its level's part of the slices."""
        model = self.model
        base = task.base.params
        views = prog.views
        assert views is not None
        sub = {
            n: base[n][views[n]].detach().clone().to(self.device).requires_grad_(True)
            for n in self._names
        }
        load_version(model, task.base)
        model.train()
        hooks = (
            [m.register_forward_hook(Scale(prog.scale)) for m in self._hidden]
            if prog.scale is not None else []
        )  # fmt: skip
        loss_fn = prog.loss or self.loss
        idx = self.data.indices[task.client]
        steps = batch_schedule(self.seed, task, len(idx))
        if not self.persistent_momentum:
            self.momentum_store.pop(task.client, None)
        total = 0.0
        # ordered dropout: step s's forward pass uses θ ⊙ m (so its gradient is 0 outside m)
        levels = task.plan.shape.step_levels() if prog.levels is not None else None
        level_masks = [
            {n: m.to(self.device) for n, m in lv.items()} for lv in (prog.levels or ())
        ]  # fmt: skip
        try:
            for s, local in enumerate(steps):
                rows = idx[local].to(self.device)
                held = sub
                if levels:
                    m = level_masks[levels[s]]
                    held = {n: sub[n] * m[n] for n in self._names}
                out = functional_call(model, held, (self._x[rows],))
                loss = loss_fn(out, self._y[rows])
                grads = torch.autograd.grad(loss, [sub[n] for n in self._names])
                self._step(
                    task.client, sub, dict(zip(self._names, grads, strict=True)), views,
                    base=task.base.params, lr_scale=task.plan.lr_scale, down=task.down,
                )  # fmt: skip
                total += float(loss.detach())
        finally:
            for h in hooks:
                h.remove()
        if not self.persistent_momentum:
            self.momentum_store.pop(task.client, None)
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
