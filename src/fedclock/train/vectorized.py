"""The vectorized executor: many clients' local SGD in one pass with ``torch.func``.

Tasks with the same batch size are trained together, each from its own base
model version (asynchronous strategies batch tasks on many stale versions; a
block that shares one version expands it instead of stacking copies): their
parameters are stacked along a new leading "client" dimension and every SGD step runs ``vmap(grad(loss))`` over the clients
(``functional_call`` on the shared model), followed by one fused (``_foreach``)
parameter update for the whole block. The result equals
:class:`~fedclock.train.executor.SerialExecutor`'s to float tolerance:

- batch order: each client's batches come from its own stream
  ``("batches", client, base version)`` through the same
  :func:`~fedclock.train.executor.batch_positions` (one vectorized call per block);
- partial batches (the last batch of an epoch when B does not divide n) are
  padded to B with weight 0, and the loss is the mean over the real rows;
- clients with fewer local steps (unequal sizes with fractional epochs, or a
  ``local_steps`` plan mixed with epochs): a block is sorted by step count, so
  at step s the clients still training are a prefix of the block and only
  that prefix is computed and updated (finished clients are masked out by
  slicing, at no compute cost);
- the local step of every executor path (:func:`~fedclock.train.local.step_direction`:
  weight decay, proximal term, momentum, as :class:`torch.optim.SGD`), one fused update
  θ ← θ − η·d per block.

Memory: client data is held once (index views); stacked parameters, momentum
and gradients exist only for the block in flight, and each contribution owns its
own delta tensors (not views of the block's stacked tensors) — except under
synchronous rounds (``delta_views``), where every update of a block is aggregated in
the same round, so the stacked parameters become the deltas in place and the
contributions share them as views. Blocks hold at most
``max_batch_clients`` clients; the automatic default keeps the largest stacked
tensor of a block (a parameter/gradient, or an activation) under
``block_bytes`` (6 MiB): larger blocks are *slower* on CPU — tensors above glibc's
mmap threshold (32 MiB at most) are returned to the OS on every free and page-faulted
back on the next step (on the reference machine, all 100 W1 clients at once ran ≈ 1.3×
slower than blocks of 20–25), and even below it a block whose stacked tensors stay in
the caches steps faster (W1, 2 threads: 0.351 s/round at 10 clients a block against
0.465 s at the 26 of the former 16-MiB bound; docs/benchmarks.md). On a GPU, where
bigger blocks only fill the device better, the bound is ``CUDA_BLOCK_BYTES``
(256 MiB) instead.

Partial work is generic over work shapes: a task's shape gives its
:class:`~fedclock.models.shapes.Program` for the model's ``layout`` — the parameters that
train (the others are frozen inputs of the loss), the tensors whose delta is sent, a
submodel's slice of every tensor, the factor the ``scaled`` modules' outputs are divided
by — and tasks of equal program keys share a block. So SALF's layer-suffix tasks group by
depth; with ``trains_fully`` (reference mode) they train every tensor with the full tasks
and send tensors d..L_e, each client's momentum buffers read from and written back to
``momentum_store``; HeteroFL's width-r tasks stack each client's slice of its base, and
their deltas are full-shape with zeros outside. A shape without a program is refused.

A group of fewer than ``min_block`` tasks (by default: a lone task) runs through the serial
code path, which is 2–4× faster than ``vmap`` for a single client. The simulator trains
lazily (all tasks dispatched since the last arrival that needed a result, in one batch), so
asynchronous strategies that dispatch one task per arrival still send large batches.

BatchNorm models (:data:`BATCHNORM_MODULES`, e.g. VGG's conv-BN-ReLU): plain local-SGD tasks
are batched, with each client's running statistics (``num_batches_tracked`` included) stacked
along the block like its parameters (expanded from a shared base, else stacked from each
task's base) and passed to every step's ``functional_call`` in train mode, so BatchNorm
updates each client's slice in place; each contribution carries its own copy of its final
statistics, as the serial path returns them.

Fallback to the serial executor, reported once per reason in the
``fedclock`` log: models with buffers other than BatchNorm running statistics,
BatchNorm with ``momentum=None``, dropout (random masks), or a layer type
outside :data:`BATCHABLE_MODULES` and :data:`BATCHNORM_MODULES` (e.g. ``nn.LSTM``,
whose fused kernel has no batching rule and gives wrong gradients under ``vmap``);
task plans other than :class:`~fedclock.sim.types.TaskPlan` (task types this
executor cannot batch yet); and on BatchNorm models, tasks with a partial batch
(padding rows would enter the batch statistics) and partial work (``make_executor`` gives
partial work on models with buffers to the serial executor anyway).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedclock.models.shapes import (
    FULL,
    Layout,
    Program,
    Scale,
    UnsupportedShapeError,
    WorkShape,
    refuse,
)
from fedclock.sim.types import Contribution, ModelVersion, Params, Task
from fedclock.train.executor import (
    ClientData,
    SerialExecutor,
    batch_keys,
    batch_positions,
    split_batches,
)
from fedclock.train.local import STEP_STATISTICS, LocalTraining, Loss, down_lists, step_direction
from fedclock.train.mlp_grad import MlpGrad, mlp_linears

log = logging.getLogger("fedclock")

BLOCK_BYTES = 6 * 2**20
"""Default bound on the largest stacked tensor of a block on CPU (see the module docstring)."""
CUDA_BLOCK_BYTES = 256 * 2**20
"""The same bound on a CUDA device."""


# Leaf modules whose vmap(grad) is exact (each client sees its own batch, nothing is shared
# across the vmapped dimension). Anything else runs serially: e.g. nn.LSTM has no batching
# rule for its fused kernel and gives wrong gradients under vmap.
BATCHABLE_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Flatten, nn.Identity,
    nn.ReLU, nn.LeakyReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.SiLU,
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
)  # fmt: skip


BATCHNORM_MODULES: tuple[type[nn.Module], ...] = (nn.BatchNorm1d, nn.BatchNorm2d)
"""BatchNorm layers, batched for plain local-SGD tasks only (their running statistics are
stacked per client and passed to every step; see the module docstring)."""


def has_batchnorm(model: nn.Module) -> bool:
    """Whether ``model`` has a :data:`BATCHNORM_MODULES` layer."""
    return any(isinstance(m, BATCHNORM_MODULES) for m in model.modules())


def unsupported_model_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot be trained by :class:`VectorizedExecutor`, or ``None`` if it can.

    BatchNorm layers (with a fixed ``momentum``) are allowed, and their running statistics
    are the only buffers allowed: the executor then batches plain local-SGD tasks only.
    """
    bn_buffers = {
        id(b)
        for m in model.modules()
        if isinstance(m, BATCHNORM_MODULES)
        for b in m.buffers(recurse=False)
    }
    if any(id(b) not in bn_buffers for b in model.buffers()):
        return "the model has buffers other than BatchNorm running statistics"
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            return "the model uses dropout (random masks per client)"
        if isinstance(m, BATCHNORM_MODULES):
            if m.momentum is None:  # cumulative average: 1/num_batches_tracked as a float
                return "the model has a BatchNorm layer with momentum=None"
            continue
        if not any(True for _ in m.children()) and not isinstance(m, BATCHABLE_MODULES):
            return f"the model has a {type(m).__name__} layer, not known to batch exactly"
    if not any(p.requires_grad for p in model.parameters()):
        return "the model has no trainable parameters"
    return None


def _largest_activation(
    model: nn.Module, input_shape: tuple[int, ...], device: torch.device
) -> int:
    """Elements of the largest module output for one sample (a dry run on zeros)."""
    largest = 0

    def hook(_m: nn.Module, _i: Any, out: Any) -> None:
        nonlocal largest
        if isinstance(out, torch.Tensor):
            largest = max(largest, out.numel())

    ref = next(model.parameters())
    handles = [m.register_forward_hook(hook) for m in model.modules()]
    training = model.training
    model.eval()  # BatchNorm: no running-statistics update, and one sample is allowed
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape, dtype=ref.dtype, device=device))
    finally:
        model.train(training)
        for h in handles:
            h.remove()
    return largest


def auto_max_batch_clients(
    model: nn.Module,
    input_shape: tuple[int, ...],
    batch_size: int,
    *,
    block_bytes: int = BLOCK_BYTES,
    device: torch.device | str = "cpu",
) -> int:
    """Clients per block so that the largest stacked tensor stays under ``block_bytes``.

    Per client, the largest tensor is the largest parameter (its gradient,
    momentum and stacked copy have the same size) or the largest activation of
    a batch (``batch_size`` × the largest per-sample module output).
    """
    ref = next(model.parameters())
    largest_param = max(p.numel() for p in model.parameters())
    act = _largest_activation(model, input_shape, torch.device(device))
    per_client = ref.element_size() * max(largest_param, batch_size * act)
    return max(1, block_bytes // per_client)


class VectorizedExecutor:
    """Runs a batch of tasks as blocks of clients trained together (see the module docstring).

    Same interface and same results (to float tolerance) as
    :class:`~fedclock.train.executor.SerialExecutor`.
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (the momentum store is the strategy's)
    checkpoint_skip: ClassVar[tuple[str, ...]] = ("_serial",)  # built lazily, stateless

    # (over 80 lines: one attribute per setting and per running-block mode, each with its
    # reason beside it)
    def __init__(
        self,
        model: nn.Module,
        data: ClientData,
        *,
        seed: int,
        local: LocalTraining,
        device: torch.device | str = "cpu",
        max_batch_clients: int | None = None,
        block_bytes: int | None = None,
        min_block: int = 2,
        layout: Layout | None = None,
        trains_fully: bool = False,
        momentum_store: dict[int, dict[str, torch.Tensor]] | None = None,
        scaled: Sequence[nn.Module] = (),
        serial: Any = None,
        delta_views: bool = False,
    ) -> None:
        if max_batch_clients is not None and max_batch_clients < 1:
            raise ValueError(
                f"executor.max_batch_clients must be a positive integer, got {max_batch_clients}"
            )
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.data = data
        self.seed = seed
        self.local = local
        self.loss: Loss = local.loss
        self._block_loss: Loss = self.loss  # the running block's (a Program may bring its own)
        self._block_lr = local.lr  # the running block's rate (train.lr × its tasks' lr_scale)
        self.max_batch_clients = max_batch_clients
        if block_bytes is None:
            block_bytes = CUDA_BLOCK_BYTES if self.device.type == "cuda" else BLOCK_BYTES
        self.block_bytes = block_bytes
        self.min_block = min_block
        self._x = data.x.to(self.device)
        self._y = data.y.to(self.device)
        self._names = [n for n, _ in model.named_parameters()]
        # partial work: each shape's Program (WorkShape.program) says which parameters
        # train (the others are frozen inputs of the loss), which deltas are sent, and a
        # submodel's slices; with ``trains_fully`` (SALF reference mode, the authors' code)
        # a layer-suffix task trains every tensor and sends tensors d..L_e, so depths share
        # blocks
        self._layout = layout
        self._trains_fully = trains_fully
        # the block key of full tasks: a Program that trains every parameter, unscaled
        # (a reference-mode suffix task's too: it shares their blocks)
        every = tuple(n for n, _ in model.named_parameters())
        self._full_key: Hashable = Program(trains=every, sends=frozenset(every)).key
        # momentum buffers kept per client across tasks (reference mode), read at a block's
        # start and written back at its end; None: every task starts from zero momentum
        self._momentum_store = momentum_store
        # the modules whose outputs a Program's ``scale`` divides (HeteroFL's Scaler)
        self._scaled = tuple(scaled)
        self._serial_fallback = serial  # run_one for lone or unbatchable tasks
        # synchronous rounds (every update of a batch is aggregated in the same round): the
        # block's stacked parameters become its deltas in place and each contribution holds
        # a view, instead of one copy per client (see _contributions)
        self._delta_views = delta_views
        self._split_steps: dict[tuple[bool, bool], Any] = {}
        self._reason = unsupported_model_reason(model)
        # BatchNorm models: plain local-SGD tasks only, with each client's running statistics
        # stacked along the block and updated in place by every step (see _run_block)
        self._bn = has_batchnorm(model)
        self._buffer_names = [n for n, _ in model.named_buffers()]
        self._bn_salf = self._bn and (layout is not None or momentum_store is not None)
        self._logged: set[str] = set()
        self._serial: SerialExecutor | None = None
        self._auto: dict[int, int] = {}
        # plain MLPs: a fragment's (sliced) block steps with the gradient written out by
        # hand (train/mlp_grad.py: no vmap, autograd or pytree cost per step)
        linears = mlp_linears(model) if MlpGrad.applies(model, self.loss) else None
        self._mlp_grad = MlpGrad(linears) if linears is not None else None
        self._block_grad: MlpGrad | None = None  # the running block's, when it uses it
        # the running block's mode (_block_mode): its fragment masks (index in its tensors,
        # mask), whether they are each task's own (C, ...) (transient shapes), whether
        # masked-out elements stay at the base (else zero)
        self._block_masks: list[tuple[int, torch.Tensor]] = []
        self._block_flat: torch.Tensor | None = None  # the block's parameters, when one buffer
        self._scratch_bufs: dict[str, torch.Tensor] = {}  # (_scratch)
        self._masks_per_task = False
        self._mask_base = False
        # the program's per-step statistics (Program.step_statistics), per name one stacked
        # (C, …) accumulator per trained tensor
        self._block_up: dict[str, list[torch.Tensor]] = {}
        # ordered dropout (Program.levels): per trained tensor its levels' masks stacked
        # (L, …) in the parameters' dtype, and each task's level at each step (C, S)
        self._block_levels: list[torch.Tensor] | None = None
        self._block_level_of: torch.Tensor | None = None
        self._x_rows = self._x.reshape(len(self._x), -1)  # (a view: one row per sample)
        self._step = vmap(grad_and_value(self._loss))
        self._step_weighted = vmap(grad_and_value(self._loss_weighted))
        self._step_bn = vmap(grad_and_value(self._loss_bn))
        self._step_bn_weighted = vmap(grad_and_value(self._loss_bn_weighted))

    # ------------------------------------------------------------ losses
    def _loss(self, params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self._block_loss(functional_call(self.model, params, (x,)), y)

    def _loss_weighted(
        self, params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        # w = 1/count on the real rows, 0 on padding: the mean over the real rows
        ce = self._block_loss.per_sample(functional_call(self.model, params, (x,)), y)
        return (ce * w).sum()

    def _loss_bn(
        self, params: Params, buffers: Params, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        # train mode: BatchNorm updates this client's slice of the stacked buffers in place
        return self._block_loss(functional_call(self.model, {**params, **buffers}, (x,)), y)

    def _loss_bn_weighted(
        self, params: Params, buffers: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        out = functional_call(self.model, {**params, **buffers}, (x,))
        return (self._block_loss.per_sample(out, y) * w).sum()

    def _loss_split(
        self, params: Params, frozen: Params, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        return self._block_loss(functional_call(self.model, {**frozen, **params}, (x,)), y)

    def _loss_split_weighted(
        self, params: Params, frozen: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        out = functional_call(self.model, {**frozen, **params}, (x,))
        return (self._block_loss.per_sample(out, y) * w).sum()

    def _split_step(self, weighted: bool, frozen_shared: bool) -> Any:
        """vmap(grad) over the trainable suffix only: the frozen prefix builds no backward."""
        key = (weighted, frozen_shared)
        step = self._split_steps.get(key)
        if step is None:
            f = self._loss_split_weighted if weighted else self._loss_split
            dims = (0, None if frozen_shared else 0, 0, 0) + ((0,) if weighted else ())
            step = self._split_steps[key] = vmap(grad_and_value(f), in_dims=dims)
        return step

    # ------------------------------------------------------------ public
    def block_size(self, batch_size: int) -> int:
        """Clients per block for tasks with this batch size (``max_batch_clients`` or automatic)."""
        if self.max_batch_clients is not None:
            return self.max_batch_clients
        size = self._auto.get(batch_size)
        if size is None:
            size = self._auto[batch_size] = auto_max_batch_clients(
                self.model, tuple(self._x.shape[1:]), batch_size,
                block_bytes=self.block_bytes, device=self.device,
            )  # fmt: skip
        return size

    def run(self, tasks: Sequence[Task]) -> list[Contribution]:
        out, groups = self.plan_blocks(tasks)
        for members in groups.values():
            size = self.block_size(tasks[members[0]].plan.batch_size)
            for start in range(0, len(members), size):
                block = members[start : start + size]
                for i, c in zip(block, self._run_block([tasks[i] for i in block]), strict=True):
                    out[i] = c
        return [c for c in out if c is not None]

    def plan_blocks(
        self, tasks: Sequence[Task]
    ) -> tuple[list[Contribution | None], dict[tuple[int, Hashable, float], list[int]]]:
        """Run what goes serially now; group the rest by (batch size, work shape's program
        key, learning-rate scale), each group's members sorted by most local steps first.

        Returns (contributions so far, None where a task waits for its block; the groups).
        """
        out: list[Contribution | None] = [None] * len(tasks)
        groups: dict[tuple[int, Hashable, float], list[int]] = {}
        for i, task in enumerate(tasks):
            shape = task.plan.shape
            # a shape without a program is refused here, not run serially
            prog = None if shape is FULL else self._program(shape)
            key = self._full_key if prog is None else prog.key
            if prog is not None and getattr(shape, "transient", False):  # drawn per task
                # (RAM-Fed's submodels): one block whatever the masks, stacked per task
                key = (prog.trains, prog.scale, prog.loss, prog.mask_fill, type(shape).__name__)
            reason = self._why_serial(task)
            if reason is not None:
                self._log_once(reason)
                out[i] = self._serial_executor().run_one(task)
                continue
            groups.setdefault((task.plan.batch_size, key, task.plan.lr_scale), []).append(i)
        for key, members in list(groups.items()):
            # vmap's overhead does not pay for one client (the hand-written MLP step has none)
            if len(members) < self.min_block and not self._by_hand(tasks[members[0]].plan.shape):
                for i in members:
                    out[i] = self._serial_executor().run_one(tasks[i])
                del groups[key]
                continue
            # most steps first: at every step the clients still training are a prefix
            members.sort(key=lambda i: -tasks[i].plan.local_steps)
        return out, groups

    def joint_signature(self) -> Hashable | None:
        """What must be equal for another executor's tasks to share this one's blocks (run
        batching, :mod:`fedclock.train.joint`): the same training set tensors, model
        structure, optimiser and loss; None: its tasks never share blocks (BatchNorm models)."""
        if self._bn or self._reason is not None:
            return None
        return (
            id(self._x), id(self._y), str(self.model), repr(self.loss), self.device,
            self.local.lr, self.local.momentum, self.local.weight_decay,
            self.local.proximal_mu, self.local.terms, self.block_bytes,
            self.max_batch_clients, self._trains_fully, self._momentum_store is None,
            self._delta_views, len(self._scaled), self._layout is None,
            tuple((n, tuple(p.shape), p.dtype) for n, p in self.model.named_parameters()),
        )  # fmt: skip

    # ------------------------------------------------------------ internals
    def _program(self, shape: WorkShape) -> Program:
        try:
            return shape.program(self._layout, trains_fully=self._trains_fully)
        except UnsupportedShapeError:
            raise refuse(
                "vectorized executor", shape, "full, layer-suffix and width tasks"
            ) from None

    def _by_hand(self, shape: WorkShape) -> bool:
        """Whether a block of this shape steps with :class:`MlpGrad`: a plain MLP trained
        whole on the run's loss, unscaled — the full model (FedAvg's tasks: 1.3× less CPU
        than vmap on the Fed-RAA MNIST MLP, docs/benchmarks.md), a sliced submodel (Fed-RAA's
        neuron fragments) or the full tensors holding only a fragment's elements, zero
        elsewhere (the authors' element-wise fragments: the step's gradient is the full one,
        masked after the update as on the vmap path)."""
        if self._mlp_grad is None:
            return False
        if shape is FULL:
            return True
        prog = self._program(shape)
        sliced = prog.views is not None and not prog.masks
        zero_masked = prog.views is None and bool(prog.masks) and prog.mask_fill == "zero"
        whole = prog.views is None and not prog.masks  # e.g. SplitFed's Split: the full step
        return (
            (sliced or zero_masked or whole) and prog.scale is None and prog.loss is None
            and len(prog.trains) == len(self._names)
        )  # fmt: skip

    def _why_serial(self, task: Task) -> str | None:
        shape = task.plan.shape
        if self._reason is not None:
            return self._reason
        if self._bn:
            if self._bn_salf or shape is not FULL:
                return "SALF-family tasks on a BatchNorm model are not batched"
            if self._has_partial_batch(task):
                return "a BatchNorm model's batch statistics would include padded rows"
            if any(n not in task.base.buffers for n in self._buffer_names):
                return "the task's base version lacks the model's BatchNorm buffers"
        return None

    def _has_partial_batch(self, task: Task) -> bool:
        """Whether a task's batches include a short one (the last of an epoch when B ∤ n)."""
        n, b = len(self.data.indices[task.client]), task.plan.batch_size
        return n % b != 0 and task.plan.local_steps >= -(-n // b)

    def _log_once(self, reason: str) -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            log.info("vectorized executor: running tasks serially because %s", reason)

    def _serial_executor(self) -> Any:
        if self._serial_fallback is not None:
            return self._serial_fallback
        if self._serial is None:
            self._serial = SerialExecutor(
                self.model, self.data, seed=self.seed, local=self.local, device=self.device,
            )  # fmt: skip
        return self._serial

    def _rows(self, tasks: Sequence[Task], steps: list[int], b: int) -> torch.Tensor:
        """Global row of every (client, step, slot) of the block; −1 marks padding.

        The batch positions of tasks with the same client size and step count are drawn in
        one vectorized call (the same values as each task alone: ``batch_positions``).
        """
        n_clients, n_steps = len(tasks), steps[0]
        sizes = [len(self.data.indices[t.client]) for t in tasks]
        groups: dict[tuple[int, int], list[int]] = {}
        for j in range(n_clients):
            groups.setdefault((sizes[j], steps[j]), []).append(j)
        positions = {
            (n, k): batch_positions(batch_keys(self.seed, [tasks[j] for j in members]), n, k, b)
            for (n, k), members in groups.items()
        }
        if all(p.shape[1] == n_steps * b for p in positions.values()):
            # no padding anywhere (e.g. an IID split's sizes n and n + 1): one gather
            if len(groups) == 1:
                pos = next(iter(positions.values()))  # every client of the block, in order
            else:
                pos = np.empty((n_clients, n_steps * b), dtype=np.int64)
                for key, members in groups.items():
                    pos[members] = positions[key]
            all_idx, offsets = self.data.flat
            clients = np.fromiter((t.client for t in tasks), dtype=np.int64, count=n_clients)
            at = torch.from_numpy(offsets[clients][:, None] + pos)
            return all_idx[at].view(n_clients, n_steps, b)
        flat: list[torch.Tensor] = [torch.empty(0, dtype=torch.int64)] * n_clients
        for key, members in groups.items():
            for r, j in enumerate(members):
                flat[j] = torch.from_numpy(positions[key][r])
        idx = [self.data.indices[t.client] for t in tasks]
        rows = torch.full((n_clients, n_steps, b), -1, dtype=torch.int64)
        for j in range(n_clients):
            if flat[j].numel() == steps[j] * b:
                rows[j, : steps[j]] = idx[j][flat[j]].view(steps[j], b)
            else:
                for s, local in enumerate(split_batches(flat[j], sizes[j], steps[j], b)):
                    rows[j, s, : len(local)] = idx[j][local]
        return rows

    def _run_block(
        self, tasks: Sequence[Task], owners: Sequence[VectorizedExecutor] | None = None
    ) -> list[Contribution]:
        """Train one block. ``owners``: the executor of each task when the block joins tasks
        of several runs (run batching; equal :meth:`joint_signature`): each task's batches,
        client size and momentum buffers are its own run's. The setup — rows, the block's
        mode, the stacked tensors, momentum — reads in the order the hot loop needs it."""
        base: ModelVersion = tasks[0].base
        shared = all(t.base is base for t in tasks)
        n_clients = len(tasks)
        steps = [t.plan.local_steps for t in tasks]  # non-increasing
        n_steps = steps[0] if steps else 0
        got = self._block_rows(tasks, owners, steps)
        if got is None:  # not expected: _why_serial sends such tasks serially
            self._log_once("a BatchNorm model's batch statistics would include padded rows")
            return [self._serial_executor().run_one(t) for t in tasks]
        rows, active, partial, weights = got
        names, fixed, views, rate = self._block_mode(tasks)

        def cut(t: torch.Tensor, n: str) -> torch.Tensor:  # a submodel's slice of a tensor
            return t[views[n]] if views is not None else t

        params, base_params, frozen, stats = self._block_tensors(tasks, names, fixed, cut, shared)
        bufs = self._block_momentum(tasks, owners, names, params, cut)
        loss_sum = torch.zeros(n_clients, dtype=torch.float64, device=self.device)
        shape = tasks[0].plan.shape
        if shape is not FULL:
            for key in self._program(shape).step_statistics:
                self._block_up[key] = [torch.zeros_like(p) for p in params]
        if not self._mask_base:
            with torch.no_grad():  # a fragment's model holds only its elements
                for i, m in self._block_masks:
                    params[i].mul_(m)
        down = self._stack_down(tasks, names, cut)
        scale = Scale(rate) if rate is not None else None
        hooks = [m.register_forward_hook(scale) for m in self._scaled] if scale else []
        flat = (
            self._block_grad is not None and not fixed and stats is None
            and all(k == n_clients for k in active) and self._block_levels is None
            and n_clients * sum(p[0].numel() for p in params) <= FLAT_ELEMENTS
        )  # fmt: skip
        try:
            if flat:
                self._train_steps_flat(
                    n_steps, rows, params, names, shared, partial, weights, bufs, loss_sum,
                    base_params, down,
                )  # fmt: skip
            else:
                self._train_steps(
                    n_steps, active, rows, params, names, fixed, frozen, shared, partial,
                    weights, bufs, loss_sum, n_clients, stats, base_params, down,
                )  # fmt: skip
        finally:
            for h in hooks:
                h.remove()
        return self._contributions(tasks, names, fixed, params, base_params, shared, bufs,
                                   loss_sum, steps, views, stats, owners)  # fmt: skip

    def _block_rows(
        self, tasks: Sequence[Task], owners: Sequence[VectorizedExecutor] | None,
        steps: list[int],
    ) -> tuple[torch.Tensor, list[int], list[bool], torch.Tensor | None] | None:  # fmt: skip
        """The block's rows (C, S, B) on the device, the clients still training at each step
        (a prefix), which steps have a short batch, and the row weights of those (1/count on
        real rows, 0 on padding; None: no short batch). None: a BatchNorm block with a short
        batch (its statistics would include padded rows)."""
        b = tasks[0].plan.batch_size
        n_steps = steps[0] if steps else 0
        rows_cpu = (
            self._rows(tasks, steps, b)
            if owners is None
            else self._joint_rows(tasks, steps, b, owners)
        )
        active = [sum(1 for k in steps if k > s) for s in range(n_steps)]
        padded = steps[-1] < n_steps or bool((rows_cpu < 0).any())
        if padded:
            counts = (rows_cpu >= 0).sum(-1)  # (C, S) real rows per batch
            partial = ((counts < b) & (counts > 0)).any(0).tolist()
        else:
            partial = [False] * n_steps
        if self._bn and any(partial):
            return None
        rows = rows_cpu.to(self.device)
        weights = None
        if any(partial):
            dtype = tasks[0].base.params[self._names[0]].dtype  # not the input's (tokens: int64)
            weights = torch.where(  # 1/count in the parameters' dtype (float64 models: exact)
                rows >= 0, 1.0 / counts.clamp(min=1).to(self.device, dtype).unsqueeze(-1), 0.0
            )
            rows = rows.clamp(min=0)
        return rows, active, partial, weights

    def _block_mode(
        self, tasks: Sequence[Task]
    ) -> tuple[list[str], list[str], Mapping[str, tuple[slice, ...]] | None, float | None]:
        """What the block's work shape trains: the trained and the frozen tensors' names, a
        submodel's slices and its Scaler rate; sets the running block's step (``_block_grad``),
        rate, loss, masks and whether masked-out elements stay at the base."""
        shape = tasks[0].plan.shape
        base = tasks[0].base
        self._block_grad = self._mlp_grad if self._by_hand(shape) else None
        self._block_lr = self.local.lr * tasks[0].plan.lr_scale
        self._block_loss = self.loss
        self._block_masks = []
        self._masks_per_task = False
        self._mask_base = False
        self._block_up = {}
        self._block_levels = self._block_level_of = None
        if shape is FULL:
            return self._names, [], None, None
        # e.g. a SALF suffix: units d..L train, the prefix is a frozen input
        prog = self._program(shape)
        trains = set(prog.trains)
        names = [n for n in self._names if n in trains]
        fixed = [n for n in self._names if n not in trains]
        if prog.loss is not None:
            self._block_loss = prog.loss
        self._mask_base = prog.mask_fill == "base"
        if getattr(shape, "transient", False):  # each task's masks, stacked (C, ...)
            progs = [self._program(t.plan.shape) for t in tasks]
            masked = {n for p in progs for n in (p.masks or {})}
            self._masks_per_task = True
            self._block_masks = [
                (i, torch.stack([
                    p.masks[n] if p.masks and n in p.masks
                    else torch.ones(base.params[n].shape, dtype=torch.bool)
                    for p in progs
                ]).to(self.device))
                for i, n in enumerate(names) if n in masked
            ]  # fmt: skip
        elif prog.masks:  # a model fragment: (index in names, its element mask)
            self._block_masks = [
                (i, prog.masks[n].to(self.device)) for i, n in enumerate(names)
                if n in prog.masks
            ]  # fmt: skip
        if prog.levels is not None:  # ordered dropout: every task's level at every step
            self._block_levels = [
                torch.stack([lv[n] for lv in prog.levels]).to(self.device, base.params[n].dtype)
                for n in names
            ]  # fmt: skip
            of = torch.zeros((len(tasks), tasks[0].plan.local_steps), dtype=torch.long)
            for j, t in enumerate(tasks):
                got = t.plan.shape.step_levels() or ()
                of[j, : len(got)] = torch.as_tensor(got, dtype=torch.long)
            self._block_level_of = of.to(self.device)
        return names, fixed, prog.views, prog.scale

    def _block_tensors(
        self, tasks: Sequence[Task], names: list[str], fixed: list[str],
        cut: Callable[[torch.Tensor, str], torch.Tensor], shared: bool,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], Params, Params | None]:  # fmt: skip
        """The stacked (C, …) trained parameters, their base (one expanded copy when the
        block shares a snapshot), the frozen tensors, and BatchNorm's running statistics (one
        slice per client, updated in place by each step; None without BatchNorm)."""
        base = tasks[0].base
        n_clients = len(tasks)
        self._block_flat = None
        if shared:  # one snapshot: expand it, every client's copy in one flat buffer
            base_params = [cut(base.params[n], n).to(self.device) for n in names]
            flat = torch.empty(
                n_clients * sum(p.numel() for p in base_params),
                dtype=base_params[0].dtype, device=self.device,
            )  # fmt: skip
            params, at = [], 0
            for p in base_params:
                v = flat[at : at + n_clients * p.numel()].view(n_clients, *p.shape)
                v.copy_(p.unsqueeze(0).expand(n_clients, *p.shape))
                params.append(v)
                at += v.numel()
            self._block_flat = flat  # (the flat step trains it in place: no second copy)
            frozen = {n: base.params[n].to(self.device) for n in fixed}
        else:  # tasks on different (stale) versions: stack each task's own base
            params = [
                torch.stack([cut(t.base.params[n], n) for t in tasks]).to(self.device)
                for n in names
            ]
            base_params = [p.clone() for p in params]
            frozen = {
                n: torch.stack([t.base.params[n] for t in tasks]).to(self.device) for n in fixed
            }
        if not self._bn:
            return params, base_params, frozen, None
        if shared:
            stats = {
                n: base.buffers[n].to(self.device).unsqueeze(0)
                .expand(n_clients, *base.buffers[n].shape).clone()
                for n in self._buffer_names
            }  # fmt: skip
        else:
            stats = {
                n: torch.stack([t.base.buffers[n] for t in tasks]).to(self.device)
                for n in self._buffer_names
            }
        self.model.train()
        return params, base_params, frozen, stats

    def _block_momentum(
        self, tasks: Sequence[Task], owners: Sequence[VectorizedExecutor] | None,
        names: list[str], params: list[torch.Tensor],
        cut: Callable[[torch.Tensor, str], torch.Tensor],
    ) -> list[torch.Tensor]:  # fmt: skip
        """The block's momentum buffers: none without momentum, zeros when each task starts
        afresh, else each client's kept buffers (its run's store; 0 for a client without one
        yet, torch.optim.SGD's first step)."""
        stores = self._stores(tasks, owners)
        if not self.local.momentum:
            return []
        if stores is None:
            return [torch.zeros_like(p) for p in params]
        return [
            torch.stack([
                cut(st[t.client][n], n) if n in st.get(t.client, {})
                else torch.zeros_like(p[0])
                for t, st in zip(tasks, stores, strict=True)
            ])
            for n, p in zip(names, params, strict=True)
        ]  # fmt: skip

    def _stack_down(
        self, tasks: Sequence[Task], names: list[str],
        cut: Callable[[torch.Tensor, str], torch.Tensor],
    ) -> dict[str, list[torch.Tensor]]:  # fmt: skip
        """The tasks' ``down`` tensors the local terms read, stacked (C, …) per trained
        tensor as the block's parameters are (a submodel's slices through ``cut``)."""
        if not self.local.reads:
            return {}
        each = [down_lists(self.local, t.down, names, cut) for t in tasks]
        return {
            key: [torch.stack([d[key][i] for d in each]).to(self.device) for i in range(len(names))]
            for key in self.local.reads
        }

    def _stores(
        self, tasks: Sequence[Task], owners: Sequence[VectorizedExecutor] | None
    ) -> list[dict[int, dict[str, torch.Tensor]]] | None:
        """Each task's momentum store (its run's), or None when buffers start at zero."""
        if self._momentum_store is None:
            return None
        if owners is None:
            return [self._momentum_store] * len(tasks)
        return [o._momentum_store for o in owners]  # type: ignore[misc]

    def _joint_rows(
        self, tasks: Sequence[Task], steps: list[int], b: int,
        owners: Sequence[VectorizedExecutor],
    ) -> torch.Tensor:  # fmt: skip
        """:meth:`_rows` of a block of several runs' tasks: each run's rows from its own
        client indices and batch streams (the same rows as in the run alone)."""
        rows = torch.full((len(tasks), steps[0], b), -1, dtype=torch.int64)
        by_owner: dict[int, list[int]] = {}
        for j, o in enumerate(owners):
            by_owner.setdefault(id(o), []).append(j)
        for members in by_owner.values():
            o = owners[members[0]]
            sub = o._rows([tasks[j] for j in members], [steps[j] for j in members], b)
            rows[members, : sub.shape[1]] = sub
        return rows

    def _train_steps(
        self, n_steps: int, active: list[int], rows: torch.Tensor, params: list[torch.Tensor],
        names: list[str], fixed: list[str], frozen: Params, shared: bool, partial: list[bool],
        weights: torch.Tensor | None, bufs: list[torch.Tensor], loss_sum: torch.Tensor,
        n_clients: int, stats: Params | None = None,
        base_params: list[torch.Tensor] | None = None,
        down: Mapping[str, list[torch.Tensor]] | None = None,
    ) -> None:  # fmt: skip
        lr = self._block_lr
        for s in range(n_steps):
            k = active[s]
            r = rows[:k, s]
            p_k = params if k == n_clients else [p[:k] for p in params]
            state = dict(zip(names, p_k, strict=True))
            held = None  # ordered dropout: this step's part of each task's model, (k, …)
            if self._block_levels is not None and self._block_level_of is not None:
                at = self._block_level_of[:k, s]
                held = [lv.index_select(0, at) for lv in self._block_levels]
                state = {n: p * m for (n, p), m in zip(state.items(), held, strict=True)}
            w_s = weights[:k, s] if partial[s] and weights is not None else None
            if fixed:
                fz = frozen if shared or k == n_clients else {n: v[:k] for n, v in frozen.items()}
                step = self._split_step(partial[s], shared)
                extra = (w_s,) if w_s is not None else ()
                grads, loss = step(state, fz, self._x[r], self._y[r], *extra)
            elif stats is not None:  # BatchNorm: each client's running statistics
                st = stats if k == n_clients else {n: v[:k] for n, v in stats.items()}
                if w_s is not None:
                    grads, loss = self._step_bn_weighted(state, st, self._x[r], self._y[r], w_s)
                else:
                    grads, loss = self._step_bn(state, st, self._x[r], self._y[r])
            elif self._block_grad is not None:  # (index_select: a cheaper gather than x[r])
                xb = self._x_rows.index_select(0, r.reshape(-1)).view(*r.shape, -1)
                grads, loss = self._block_grad(state, xb, self._y[r], w_s)
            elif w_s is not None:
                grads, loss = self._step_weighted(state, self._x[r], self._y[r], w_s)
            else:
                grads, loss = self._step(state, self._x[r], self._y[r])
            if held is not None:  # (θ ⊙ m's gradient with respect to θ)
                grads = {n: grads[n] * m for n, m in zip(names, held, strict=True)}
            b0 = None
            if base_params is not None:
                b0 = [b if shared or k == n_clients else b[:k] for b in base_params]
            b_k = bufs if k == n_clients else [m[:k] for m in bufs]
            if self._block_up:
                with torch.no_grad():
                    for key, accs in self._block_up.items():
                        accumulate = STEP_STATISTICS[key]
                        for acc, n in zip(accs, names, strict=True):
                            accumulate(acc if k == n_clients else acc[:k], grads[n])
            d_k = down if not down or k == n_clients else {
                key: [v[:k] for v in vs] for key, vs in down.items()
            }  # fmt: skip
            g = step_direction(self.local, [grads[n] for n in names], p_k, b0, b_k, down=d_k)
            with torch.no_grad():
                torch._foreach_add_(p_k, g, alpha=-lr)
                for i, m in self._block_masks:  # outside its fragment: 0, or the base
                    if self._masks_per_task and k != n_clients:
                        m = m[:k]
                    if self._mask_base and base_params is not None:
                        b = base_params[i] if shared or k == n_clients else base_params[i][:k]
                        p_k[i].copy_(torch.where(m, p_k[i], b))
                    else:
                        p_k[i].mul_(m)
                loss_sum[:k] += loss.detach()

    def _train_steps_flat(
        self, n_steps: int, rows: torch.Tensor, params: list[torch.Tensor], names: list[str],
        shared: bool, partial: list[bool], weights: torch.Tensor | None,
        bufs: list[torch.Tensor], loss_sum: torch.Tensor, base_params: list[torch.Tensor],
        down: Mapping[str, list[torch.Tensor]],
    ) -> None:  # fmt: skip
        """:meth:`_train_steps` of a small hand-stepped block (:class:`MlpGrad`) whose clients
        all take every step: the parameters, gradients, momentum and proximal pull each live
        in one flat buffer (``params`` and ``bufs`` become views of theirs, in place), so a
        local step (:func:`~fedclock.train.local.step_direction` on the one-tensor lists) is a
        few element-wise passes, not a ``foreach`` call per pass over every tensor — the same
        operations in the same order, so the same values bit for bit. On Fed-RAA's MNIST fragments (blocks
        of about two tasks) that per-call cost was a fifth of the step (docs/benchmarks.md)."""
        grad = self._block_grad
        assert grad is not None and not self._mask_base  # (_by_hand: masked elements are 0)
        local, lr = self.local, self._block_lr

        def flat_of(
            ts: Sequence[torch.Tensor], fill: bool = True
        ) -> tuple[torch.Tensor, list[torch.Tensor]]:
            # one buffer, tensor after tensor, each a contiguous (C, …) view (``fill``: of
            # ``ts``' values; else of ``ts``' shapes, its values unset: the kept scratch one)
            numel = sum(t.numel() for t in ts)
            buf = (
                torch.empty(numel, dtype=ts[0].dtype, device=ts[0].device)
                if fill
                else self._scratch("grad", numel, ts[0].dtype)
            )
            views, at = [], 0
            for t in ts:
                v = buf[at : at + t.numel()].view(t.shape)
                if fill:
                    v.copy_(t)
                views.append(v)
                at += t.numel()
            return buf, views

        if self._block_flat is not None:  # the block's parameters are one buffer already
            p_flat, p_views = self._block_flat, list(params)
        else:
            p_flat, p_views = flat_of(params)
            params[:] = p_views
        g_flat, g_views = flat_of(params, fill=False)  # (every step overwrites the gradient)
        out = dict(zip(names, g_views, strict=True))
        state = dict(zip(names, p_views, strict=True))
        moms: list[torch.Tensor] = []
        if local.momentum:
            b_flat, b_views = flat_of(bufs)
            bufs[:] = b_views
            moms = [b_flat]
        base = None
        if local.proximal_mu:  # the base, one copy per client (expanded when shared)
            c = params[0].shape[0]
            base = [flat_of([b.expand(c, *b.shape) if shared else b for b in base_params])[0]]
        # the tasks' down tensors, one flat buffer per key, aligned with the parameters'
        flat_down = {key: [flat_of(vs)[0]] for key, vs in down.items()}
        ups = [(STEP_STATISTICS[key], accs) for key, accs in self._block_up.items()]
        masks = self._block_masks
        step = grad.bind(state, out).step
        x_rows = self._x_rows
        c, b = rows.shape[0], rows.shape[2]
        by_step = rows.transpose(0, 1).reshape(n_steps, c * b)  # each step's rows, in order
        ys = self._y.index_select(0, by_step.reshape(-1)).view(n_steps, c, b)
        xb = self._scratch("batch", c * b * x_rows.shape[1], x_rows.dtype).view(c * b, -1)
        xb_view = xb.view(c, b, -1)
        gs, ps = [g_flat], [p_flat]
        scratch = [torch.empty_like(p_flat)] if base is not None else None  # the pull
        with torch.no_grad():
            for s in range(n_steps):
                torch.index_select(x_rows, 0, by_step[s], out=xb)
                w_s = weights[:, s] if partial[s] and weights is not None else None
                loss = step(xb_view, ys[s], w_s)
                for accumulate, accs in ups:
                    for acc, gn in zip(accs, g_views, strict=True):
                        accumulate(acc, gn)
                (d,) = step_direction(local, gs, ps, base, moms, scratch, flat_down)
                p_flat.add_(d, alpha=-lr)
                for i, m in masks:  # outside its fragment: 0 (_by_hand)
                    p_views[i].mul_(m)
                loss_sum += loss

    def _scratch(self, what: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A buffer of ``numel`` elements that no tensor outside a block's steps refers to (the
        flat step's gradients, each step's gathered batch), kept from block to block: a new
        one every round is fresh memory for the allocator to map and the CPU to fault in
        (a W2 round's 4.6 MB; docs/benchmarks.md)."""
        buf = self._scratch_bufs.get(what)
        if buf is None or buf.numel() != numel or buf.dtype != dtype:
            buf = self._scratch_bufs[what] = torch.empty(numel, dtype=dtype, device=self.device)
        return buf

    # (over 80 lines: the momentum write-back, the deltas — in place as views under
    # synchronous rounds, else one fused subtraction — and each contribution's record)
    def _contributions(
        self, tasks: Sequence[Task], names: list[str], fixed: list[str],
        params: list[torch.Tensor], base_params: list[torch.Tensor], shared: bool,
        bufs: list[torch.Tensor], loss_sum: torch.Tensor, steps: list[int],
        views: Mapping[str, tuple[slice, ...]] | None, stats: Params | None = None,
        owners: Sequence[VectorizedExecutor] | None = None,
    ) -> list[Contribution]:  # fmt: skip
        losses = loss_sum.tolist()
        stores = self._stores(tasks, owners)
        if stores is not None and bufs:
            for j, task in enumerate(tasks):
                kept = stores[j].setdefault(task.client, {})
                for n, m in zip(names, bufs, strict=True):
                    if views is None:
                        kept[n] = m[j].clone()
                    else:  # a submodel's buffer lives in its slice of a full-shape one
                        full = kept.get(n)
                        if full is None:
                            full = kept[n] = torch.zeros_like(task.base.params[n])
                        full[views[n]] = m[j]
        # by default each client's delta is its own tensor, not a view of the block: a
        # contribution that waits long for its arrival must not keep the whole block alive
        # (one fused subtraction for the whole block). Under synchronous rounds the block's
        # contributions are all aggregated together, so the stacked parameters are turned
        # into deltas in place and shared as views (same values, no copies)
        k = len(names)
        with torch.no_grad():
            if self._delta_views:
                for p, ref in zip(params, base_params, strict=True):
                    p.sub_(ref)  # (C, ...) − (...) broadcasts over the block when shared
                for i, m in self._block_masks:  # Δ = 0 outside the fragment
                    params[i].mul_(m)
                # each client's row of every tensor (views), client after client
                flat = [v for row in zip(*(p.unbind(0) for p in params), strict=True) for v in row]
            else:
                rows = [p[j] for j in range(len(tasks)) for p in params]
                refs = (
                    base_params * len(tasks)
                    if shared
                    else [b[j] for j in range(len(tasks)) for b in base_params]
                )
                flat = list(torch._foreach_sub(rows, refs))
                for i, m in self._block_masks:  # Δ = 0 outside the fragment
                    for j in range(len(tasks)):
                        flat[j * len(names) + i].mul_(m[j] if self._masks_per_task else m)
        out = []
        plain = views is None and not fixed and stats is None and not self._block_up
        for j, task in enumerate(tasks):
            delta = dict(zip(names, flat[j * k : (j + 1) * k], strict=True))
            shape = task.plan.shape
            prog = None if shape is FULL else self._program(shape)
            indices = (self if owners is None else owners[j]).data.indices[task.client]
            if plain and prog is None:  # (a full task's Δ as trained: W2's every task)
                out.append(
                    Contribution(task, delta, {}, len(indices), losses[j] / max(1, steps[j]))
                )
                continue
            if views is not None:  # a submodel's delta, zero outside its slice
                full_delta = {}
                for n, d in delta.items():
                    fd = torch.zeros_like(task.base.params[n])
                    fd[views[n]] = d
                    full_delta[n] = fd
                delta = full_delta
            sends = None if prog is None else prog.sends
            if sends is not None and len(sends) < len(delta):  # trained, not sent: Δ = 0
                delta = {n: d if n in sends else torch.zeros_like(d) for n, d in delta.items()}
            if fixed:  # the frozen prefix is not sent: Δ = 0, in the model's order
                delta = {
                    n: delta[n] if n in delta else torch.zeros_like(task.base.params[n])
                    for n in self._names
                }
            out.append(
                Contribution(
                    task=task,
                    delta=delta,
                    # as SerialExecutor: each client's own copy of its final statistics
                    buffers={} if stats is None else {n: v[j].clone() for n, v in stats.items()},
                    num_samples=len(indices),
                    train_loss=losses[j] / max(1, steps[j]),
                    coverage=None if prog is None else prog.coverage,
                    up={
                        key: {n: a[j].clone() for n, a in zip(names, accs, strict=True)}
                        for key, accs in self._block_up.items()
                    },
                )
            )
        return out


#: the largest block (clients × parameters) whose local steps use one flat buffer per
#: quantity (:meth:`VectorizedExecutor._train_steps_flat`); a larger model's arithmetic
#: dwarfs the per-call cost it saves
FLAT_ELEMENTS = 1 << 21

__all__ = [
    "BATCHABLE_MODULES",
    "BATCHNORM_MODULES",
    "BLOCK_BYTES",
    "CUDA_BLOCK_BYTES",
    "VectorizedExecutor",
    "auto_max_batch_clients",
    "has_batchnorm",
    "unsupported_model_reason",
]
