"""Layer view of a model: parameters and measured FLOPs per layer.

A *layer* is a module that holds trainable parameters directly (weight and
bias together), as the SALF paper counts layers; parameter-free modules
(ReLU, pooling, Flatten) are not layers. Batch-norm modules hold a trainable
weight and bias, so each one *is* a layer (with 0 FLOPs, below); its running
statistics are buffers, not parameters, and are not listed. An embedding is a
layer too (a table lookup: 0 FLOPs). Layers are listed in forward execution
order, recorded with forward pre-hooks on a dry run, not in definition order.

FLOPs come from :class:`torch.utils.flop_counter.FlopCounterMode` on one
forward and one backward pass of a batch of zeros, read per module from its
hierarchical breakdown and divided by the batch size; nothing is hand-typed.
Conventions of that counter, which these numbers inherit:

* Only matrix products and convolutions are counted, at 2 FLOPs per
  multiply-add: a ``Linear(i, o)`` costs ``2·i·o`` forward and a ``Conv2d``
  costs ``2·C_in·C_out·k²·H_out·W_out`` forward per sample. Bias adds,
  activations (ReLU), pooling, softmax and the loss are not counted.
* Backward counts the weight gradient (same cost as the forward) plus the
  input gradient (again the same) where the layer's input requires a
  gradient. The first layer's input is the data, which needs no gradient, so
  its backward equals its forward (``2·i·o`` for a Linear) while every later
  layer's backward is twice its forward (``4·i·o``). Bias gradients are sums
  and are not counted. Batch norm and embedding lookups count 0.

**The one exception: recurrent layers.** ``FlopCounterMode`` has no formula
for the fused RNN kernels (``aten::lstm`` / ``mkldnn_rnn_layer`` on CPU,
cuDNN's RNN on GPU) and reports 0 FLOPs for an ``nn.LSTM`` (checked with
torch 2.13). For ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` modules the counter
is therefore replaced by :func:`rnn_flops`, an exact count under the same
convention (only the gate matrix products, 2 FLOPs per multiply-add) applied
to the sequence length and input-gradient need observed on the dry run; a
test checks it against ``FlopCounterMode`` on an LSTM written out in matrix
products.

The backward pass uses :func:`torch.autograd.grad`, so parameters' ``.grad``
fields are untouched; buffers (e.g. batch-norm statistics) are restored and
the RNG is forked, so :func:`layer_view` has no side effects on the model.
It takes a few milliseconds per call (about 20 ms for the CNN on 28×28). torch's
counter guards its dispatch handler against ``torch.compile`` by importing
``torch._dynamo`` on first use (about 1 s and 70 MB, for a process that never
compiles); :func:`layer_view` runs the same handler without that guard (see
:func:`_flop_counter`), and falls back to the plain counter on a torch where that
is not possible.
Attribution relies on torch's module tracker, which is exact for
feed-forward stacks such as the models in :mod:`fedclock.models.zoo`; for a
module holding parameters *and* submodules, its own FLOPs are its total minus
its direct children's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence
from torch.utils.flop_counter import FlopCounterMode

RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
"""Gate blocks of each recurrent cell: the weight matrices are ``G·hidden`` rows tall."""


def rnn_flops(
    *,
    seq_len: int,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    bidirectional: bool = False,
    gates: int = 4,
    input_requires_grad: bool = True,
) -> tuple[int, int]:
    """Per-sample (forward, backward) FLOPs of a recurrent layer stack over ``seq_len`` steps.

    The same convention as ``torch.utils.flop_counter`` for matrix products
    (2 FLOPs per multiply-add; element-wise gate nonlinearities, bias adds
    and the cell update are not counted). For each layer and direction, with
    ``G`` gate blocks (LSTM 4, GRU 3, plain RNN 1), input width ``i`` and
    hidden width ``h``, every time step computes ``W_ih·x_t`` and
    ``W_hh·h_{t−1}``:

    - forward: ``T·G·(2·i·h + 2·h·h)``;
    - backward: the weight gradients cost the same as the forward,
      ``T·G·(2·i·h + 2·h·h)``; the gradient to the recurrent state
      ``W_hhᵀ·δ`` costs ``(T−1)·G·2·h·h`` (the initial state is a constant zero
      and needs none); the gradient to the input ``W_ihᵀ·δ`` costs
      ``T·G·2·i·h`` where the input requires a gradient, which is always
      the case for layers above the first and, for the first, when
      ``input_requires_grad`` (e.g. an embedding below it).

    Layer ``l > 0`` has ``i = h·directions``.
    """
    dirs = 2 if bidirectional else 1
    fwd = bwd = 0
    for layer in range(num_layers):
        i = input_size if layer == 0 else hidden_size * dirs
        h = hidden_size
        step = gates * (2 * i * h + 2 * h * h)
        input_grad = gates * 2 * i * h if (layer > 0 or input_requires_grad) else 0
        fwd += dirs * seq_len * step
        bwd += dirs * (
            seq_len * step + max(seq_len - 1, 0) * gates * 2 * h * h + seq_len * input_grad
        )
    return fwd, bwd


def _rnn_module_flops(mod: nn.RNNBase, calls: list[tuple[int, bool]]) -> tuple[int, int]:
    if mod.proj_size:
        raise ValueError("layer_view cannot count FLOPs of an LSTM with proj_size > 0")
    fwd = bwd = 0
    for seq_len, needs_grad in calls:
        f, b = rnn_flops(
            seq_len=seq_len, input_size=mod.input_size, hidden_size=mod.hidden_size,
            num_layers=mod.num_layers, bidirectional=mod.bidirectional,
            gates=RNN_GATES[mod.mode], input_requires_grad=needs_grad,
        )  # fmt: skip
        fwd, bwd = fwd + f, bwd + b
    return fwd, bwd


@dataclass(frozen=True)
class LayerInfo:
    """One layer of a model (see the module docstring for what counts)."""

    index: int
    """0-based position in forward execution order, input side first."""
    name: str
    """The module's qualified name in ``model.named_modules()``, e.g. ``"net.1"``."""
    param_names: tuple[str, ...]
    """Its trainable parameters' names as in ``model.named_parameters()``."""
    num_params: int
    """Number of scalars in those parameters."""
    fwd_flops: float
    """Forward FLOPs per sample."""
    bwd_flops: float
    """Backward FLOPs per sample (weight gradients, plus input gradients where needed)."""
    in_numel: float = 0.0
    """Elements per sample of the layer's input on the dry run (its first call; 0 if never
    called): what crosses a split of the model just below this layer (SplitFed's
    activations, and their gradients back)."""


def _tracker_names(model: nn.Module) -> dict[int, str]:
    """The names torch's ModuleTracker gives each submodule (keyed by ``id``).

    Mirrors ``torch.utils.module_tracker.ModuleTracker._get_mod_name``: the
    root is called by its class name and children ``f"{parent}.{attr}"``.
    """
    names: dict[int, str] = {id(model): type(model).__name__}
    seen: set[int] = set()

    def walk(mod: nn.Module) -> None:
        if id(mod) in seen:
            return
        for attr, child in mod.named_children():
            names[id(child)] = f"{names[id(mod)]}.{attr}"
            walk(child)
        seen.add(id(mod))

    walk(model)
    return names


def _quiet_counter_class() -> type[FlopCounterMode] | None:
    """``FlopCounterMode`` whose dispatch mode does not import ``torch._dynamo``.

    torch wraps every ``TorchDispatchMode.__torch_dispatch__`` in ``_disable_dynamo``,
    which imports ``torch._dynamo`` on the first call, unless the class's
    ``_should_skip_dynamo()`` is false. This subclass of torch's own mode keeps its
    handler, unwrapped (``__wrapped__``), so the counts are torch's exactly. ``None`` on a
    torch without these internals (the plain counter is used then).
    """
    try:
        from torch.utils.flop_counter import _FlopCounterMode

        handler = _FlopCounterMode.__dict__["__torch_dispatch__"]
    except (ImportError, KeyError):
        return None
    raw = getattr(handler, "__wrapped__", handler)

    class QuietMode(_FlopCounterMode):
        __torch_dispatch__ = raw

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False

    class QuietCounter(FlopCounterMode):
        def __enter__(self) -> QuietCounter:  # FlopCounterMode.__enter__ with QuietMode
            self.flop_counts.clear()
            self.mod_tracker.__enter__()
            self.mode = QuietMode(self)
            self.mode.__enter__()
            return self

    return QuietCounter


_QUIET_COUNTER = _quiet_counter_class()


def _flop_counter() -> FlopCounterMode:
    """A flop counter (no table printed) that does not import ``torch._dynamo`` where possible."""
    return (_QUIET_COUNTER or FlopCounterMode)(display=False)


def _count(counts: dict[str, dict[object, int]], key: str | None) -> int:
    if key is None:
        return 0
    return sum(counts.get(key, {}).values())


# (over 80 lines: one forward/backward pass under the flop counter, whose hooks and
# per-module bookkeeping share their state; split when it next changes)
def layer_view(
    model: nn.Module, input_shape: tuple[int, ...], *, batch: int = 8
) -> tuple[LayerInfo, ...]:
    """The model's layers, in forward order, with parameter counts and per-sample FLOPs.

    ``input_shape`` is one sample's shape; a batch of ``batch`` zeros (of the
    model's ``input_dtype`` when it is not a floating type, e.g. int64 token ids,
    else of its parameters' type, so a float64 model gets float64 zeros) is pushed forward, ``logits.sum()`` is differentiated
    with respect to the trainable parameters, and FLOPs are read per module
    (see the module docstring for the counting convention and for recurrent
    layers). Layers whose module is never called in the forward pass come
    last, with zero FLOPs.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    modules = dict(model.named_modules())
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    # Group parameter names by the module that owns them (same walk as named_modules).
    owned: dict[str, list[str]] = {}
    for pname, _ in trainable:
        owner = pname.rpartition(".")[0]
        owned.setdefault(owner, []).append(pname)
    if not owned:
        return ()

    order: list[str] = []
    in_numel: dict[str, float] = {}
    by_id = {id(modules[n]): n for n in owned}

    def record(mod: nn.Module, args: tuple[Any, ...]) -> None:
        name = by_id[id(mod)]
        if name not in order:
            order.append(name)
            x = args[0] if args else None
            if isinstance(x, torch.Tensor):
                in_numel[name] = x.numel() / batch

    rnn_calls: dict[int, list[tuple[int, bool]]] = {}

    def record_rnn(mod: nn.Module, args: tuple[Any, ...]) -> None:
        assert isinstance(mod, nn.RNNBase)
        data = args[0]
        if isinstance(data, PackedSequence):
            raise ValueError("layer_view cannot count FLOPs of an RNN fed a PackedSequence")
        batched = data.dim() == 3
        seq_len = int(data.shape[1] if (batched and mod.batch_first) else data.shape[0])
        rnn_calls.setdefault(id(mod), []).append((seq_len, bool(data.requires_grad)))

    params = [p for _, p in trainable]
    ref = params[0]
    dtype = getattr(model, "input_dtype", None)
    if not isinstance(dtype, torch.dtype) or dtype.is_floating_point:
        dtype = ref.dtype if ref.is_floating_point() else torch.get_default_dtype()
    x = torch.zeros(batch, *input_shape, dtype=dtype, device=ref.device)
    saved_buffers = [(b, b.detach().clone()) for b in model.buffers()]
    rng_devices = [ref.device] if ref.device.type == "cuda" else []
    hooks = [modules[n].register_forward_pre_hook(record) for n in owned]
    hooks += [
        m.register_forward_pre_hook(record_rnn)
        for m in model.modules()
        if isinstance(m, nn.RNNBase)
    ]
    try:
        with (
            torch.random.fork_rng(devices=rng_devices),
            torch.enable_grad(),
            _flop_counter() as counter,
        ):
            logits = model(x)
            fwd_counts = counter.get_flop_counts()
            torch.autograd.grad(logits.sum(), params, allow_unused=True)
            all_counts = counter.get_flop_counts()
    finally:
        for h in hooks:
            h.remove()
        with torch.no_grad():
            for buf, value in saved_buffers:
                buf.copy_(value)

    names = _tracker_names(model)
    order += [n for n in owned if n not in order]
    sizes = {n: p.numel() for n, p in trainable}
    layers = []
    for index, name in enumerate(order):
        mod = modules[name]
        key = names.get(id(mod))
        child_keys = [names.get(id(c)) for c in mod.children()]
        fwd = _count(fwd_counts, key) - sum(_count(fwd_counts, k) for k in child_keys)
        tot = _count(all_counts, key) - sum(_count(all_counts, k) for k in child_keys)
        fwd_per, bwd_per = fwd / batch, (tot - fwd) / batch
        if isinstance(mod, nn.RNNBase):  # the counter sees 0 here: count exactly instead
            f, b = _rnn_module_flops(mod, rnn_calls.get(id(mod), []))
            fwd_per, bwd_per = float(f), float(b)
        layers.append(
            LayerInfo(
                index=index,
                name=name,
                param_names=tuple(owned[name]),
                num_params=sum(sizes[p] for p in owned[name]),
                fwd_flops=fwd_per,
                bwd_flops=bwd_per,
                in_numel=in_numel.get(name, 0.0),
            )
        )
    return tuple(layers)


def param_bytes(model: nn.Module) -> int:
    """Bytes taken by all of the model's parameters (float32: ``4·numel``), trainable or not."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def total_flops(layers: Iterable[LayerInfo], *, forward_only: bool = False) -> float:
    """Per-sample FLOPs of one training step (forward + backward), or of the forward only."""
    if forward_only:
        return sum(layer.fwd_flops for layer in layers)
    return sum(layer.fwd_flops + layer.bwd_flops for layer in layers)
