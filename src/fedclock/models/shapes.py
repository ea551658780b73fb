"""Work shapes: what a task trains, as a value (see docs/architecture.md, "Work shapes").

A :class:`WorkShape` says which part of the model a task trains and sends back:

- :data:`FULL` — every parameter (local SGD);
- :class:`Suffix` ``(depth)`` — SALF's layer suffix: units depth..L (1-based, input side
  first; a unit is a module layer in ``paper`` mode, a state-dict tensor in ``reference``);
- :class:`Width` ``(rate)`` — HeteroFL's width-r submodel: the first ⌈r·C⌉ channels or
  neurons of every hidden layer (:func:`width_shapes`);
- :class:`Fragment` ``(index, ratios)`` — Fed-RAA's model fragment: neuron group ``index``
  of every hidden layer (:func:`fragment_masks`);
- :class:`Neurons` ``(keep)`` — RAM-Fed's submodel: any chosen neurons of every hidden layer
  and the weights among them (:func:`neuron_masks`; a prefix of each layer is HeteroFL's
  width submodel without its Scaler);
- :class:`Exit` ``(exit, holds)`` — an early exit (CIS): the backbone up to exit ``exit`` and
  its head, trained on that exit's own loss;
- :class:`Mask` ``(masks)`` — PruneFL's pruned model: every tensor trains, the pruned
  elements stay zero; its cost follows the mask's density;
- :class:`OrderedDropout` ``(p_max, widths, levels)`` — FjORD's ordered dropout: the
  width-p_max prefix submodel, each local step training the prefix of the width drawn for it;
- :class:`Split` ``(cut)`` — SplitFed's split: layers 1..cut on the client, the rest on the
  main server, per batch (its cost carries the exchange; the host trains the whole model).

A shape knows, given the model's :class:`Layout`: which tensors it trains
(:meth:`WorkShape.trains`), the part of each tensor it covers (:meth:`WorkShape.coverage`:
aggregators average each element over the contributions that cover it), its cost
(:meth:`WorkShape.cost`) and its :class:`Program` (:meth:`WorkShape.program`: what an
executor trains and sends; tasks of equal ``Program.key`` batch together in the vectorized
executor). Planners choose shapes; executors run every shape with a program and refuse the
rest (:func:`refuse`); nothing else needs to know which paper a shape came from.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from fedclock.devices.cost import SplitExchange, TaskCost
from fedclock.models.early_exit import ExitLoss


class UnsupportedShapeError(ValueError):
    """An executor was given a work shape it cannot run."""


def refuse(executor: str, shape: WorkShape, supported: str) -> UnsupportedShapeError:
    return UnsupportedShapeError(
        f"The {executor} cannot run {shape.describe()} tasks (it runs {supported}); "
        "the strategy's planner and the executor do not match."
    )


def width_shapes(shapes: Sequence[tuple[int, ...]], rate: float) -> list[tuple[int, ...]]:
    """Prefix shapes of a width-``rate`` submodel (HeteroFL), tensors in forward order.

    Every tensor of ≥ 2 dims is a weight layer: its output dim keeps the first
    ⌈rate·C⌉ entries (the last weight layer keeps all outputs) and its input dim
    follows the previous selection (a prefix of the flattened features when a
    linear layer follows a convolution: channel-major flattening). 1-dim tensors
    (bias, BN) follow the current output selection.
    """
    weights = [i for i, s in enumerate(shapes) if len(s) >= 2]
    last = weights[-1] if weights else -1
    prev_full: int | None = None
    prev_keep: int | None = None
    out: list[tuple[int, ...]] = []
    cur_full = cur_keep = 0
    for i, s in enumerate(shapes):
        if len(s) >= 2:
            cur_full = s[0]
            cur_keep = s[0] if i == last else math.ceil(rate * s[0])
            fan_in = s[1]
            if prev_full is None or prev_keep is None:
                keep_in = fan_in
            else:
                keep_in = fan_in * prev_keep // prev_full  # prefix of the flattened features
            out.append((cur_keep, keep_in, *s[2:]))
            prev_full, prev_keep = cur_full, cur_keep
        elif len(s) == 1 and s[0] == cur_full and cur_full > 0:
            out.append((cur_keep,))
        else:
            out.append(tuple(s))
    return out


#: Fed-RAA's fragment sizes, % of each split layer's neurons (Zhang et al., Table 4); M = 1,
#: the whole model as one fragment, is not in the paper (an ablation: fragment vs whole model)
FRAGMENT_RATIOS: dict[int, tuple[float, ...]] = {
    1: (100.0,),
    2: (40.0, 60.0),
    3: (20.0, 30.0, 50.0),
    4: (10.0, 20.0, 30.0, 40.0),
    5: (5.0, 10.0, 20.0, 30.0, 35.0),
}


def group_bounds(count: int, ratios: Sequence[float]) -> list[int]:
    """Boundaries of consecutive groups holding ``ratios`` % of ``count`` units:
    b_j = round(count · (r_1 + … + r_j) / 100), b_0 = 0, b_M = count."""
    total, out, acc = sum(ratios), [0], 0.0
    for r in ratios:
        acc += r
        out.append(round(count * acc / total))
    return out


def fragment_masks(
    shapes: dict[str, tuple[int, ...]], ratios: Sequence[float]
) -> list[dict[str, torch.Tensor]]:
    """Fed-RAA's fragments (our reading of Zhang et al., App. C): fragment j is neuron group
    j of every hidden layer — those neurons' biases and all their incoming weights (from
    every input, or from every unit of the hidden layer below: a weight between groups
    a → b belongs to the fragment of its destination b) — and their outgoing weights into
    every output unit. Every weight of a hidden layer belongs to exactly one fragment.

    Tensors in forward order; every tensor of ≥ 2 dims is a weight layer whose first dim is
    its output units (channels for a convolution); the last weight layer is the output
    layer, whose outputs (and bias) every fragment holds. The output layer after a
    convolution takes the group's channels' flattened features (channel-major). A group
    gets ``ratios[j]`` % of each hidden layer's units (:func:`group_bounds`). Returns one
    boolean mask per tensor per fragment; together they cover every element of the hidden
    layers once, the output bias in every fragment.
    """
    names = list(shapes)
    weights = [n for n in names if len(shapes[n]) >= 2]
    if len(weights) < 2:
        raise ValueError("a model split into fragments needs a hidden layer")
    last = weights[-1]
    masks: list[dict[str, torch.Tensor]] = [
        {n: torch.zeros(shapes[n], dtype=torch.bool) for n in names} for _ in ratios
    ]
    prev: list[int] | None = None  # the previous layer's group bounds (input: none)
    prev_units = 0
    cur: list[int] | None = None
    for n in names:
        s = shapes[n]
        if len(s) >= 2:
            fan_in = s[1]
            per_unit = 1 if prev is None else fan_in // max(1, prev_units)
            cur = None if n == last else group_bounds(s[0], ratios)
            if cur is not None and any(b == a for a, b in itertools.pairwise(cur)):
                raise ValueError(
                    f"layer {n!r} has {s[0]} units: too few for {len(ratios)} fragments of "
                    f"{', '.join(f'{r:g}' for r in ratios)} %"
                )
            for j, m in enumerate(masks):
                rows = slice(None) if cur is None else slice(cur[j], cur[j + 1])
                # a hidden neuron owns every incoming weight (from every group of the layer
                # below: cross-group weights go to the destination's fragment); the output
                # layer's weights go with the hidden neuron they leave
                cols = (
                    slice(None) if prev is None or cur is not None
                    else slice(prev[j] * per_unit, prev[j + 1] * per_unit)
                )  # fmt: skip
                m[n][(rows, cols)] = True
            prev, prev_units = cur, s[0]
        elif len(s) == 1:  # a bias: its layer's group, or shared (the output layer)
            for j, m in enumerate(masks):
                m[n][slice(None) if cur is None else slice(cur[j], cur[j + 1])] = True
    return masks


def element_masks(
    initial: dict[str, torch.Tensor], ratios: Sequence[float]
) -> list[dict[str, torch.Tensor]]:
    """The authors' fragments (reference mode, spec §2.2): every weight tensor but the
    first layer's is split element-wise — the tensor flattened, ``order = argsort`` of its
    initial values, and flat position p belongs to fragment j when order[p] falls in
    [b_{j−1}, b_j) (:func:`group_bounds` of its size): a disjoint, covering, effectively
    random partition of the listed sizes. Every other tensor (the first layer, the biases)
    belongs to every fragment."""
    names = list(initial)
    weights = [n for n in names if initial[n].dim() >= 2]
    split = set(weights[1:])
    out: list[dict[str, torch.Tensor]] = [{} for _ in ratios]
    for n in names:
        t = initial[n]
        if n not in split:
            for m in out:
                m[n] = torch.ones(t.shape, dtype=torch.bool)
            continue
        order = torch.argsort(t.detach().reshape(-1).cpu(), stable=True)
        bounds = group_bounds(order.numel(), ratios)
        for j, m in enumerate(out):
            m[n] = ((order >= bounds[j]) & (order < bounds[j + 1])).reshape(t.shape)
    return out


def box_view(mask: torch.Tensor) -> tuple[slice, ...] | None:
    """The slices whose box is exactly ``mask``'s True elements (a neuron group's block of
    a tensor); None when they do not form one non-empty box."""
    bounds = []
    for d in range(mask.dim()):
        hit = (
            mask.any(dim=tuple(i for i in range(mask.dim()) if i != d)) if mask.dim() > 1 else mask
        )
        idx = torch.nonzero(hit).flatten()
        if idx.numel() == 0:
            return None
        lo, hi = int(idx[0]), int(idx[-1]) + 1
        bounds.append(slice(lo, hi))
    view = tuple(bounds)
    return view if int(mask[view].sum()) == int(mask.sum()) == mask[view].numel() else None


def hidden_widths(shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The units (neurons or channels) of every hidden weight layer, in forward order: the
    first dim of each tensor of ≥ 2 dims but the last (the output layer)."""
    weights = [s for s in shapes.values() if len(s) >= 2]
    return tuple(s[0] for s in weights[:-1])


def neuron_masks(
    shapes: Mapping[str, tuple[int, ...]], keep: Sequence[Sequence[int]]
) -> dict[str, torch.Tensor]:
    """The submodel of the neurons ``keep[l]`` of every hidden layer l (RAM-Fed, our reading
    of Wang et al.): a weight is in it when both its destination unit (its row; every output
    of the last layer) and its source unit (its column; every input of the first layer) are
    kept, a bias when its unit is. A layer after a convolution takes its kept channels'
    flattened features (channel-major). With ``keep[l] = range(k_l)`` these are
    :func:`width_shapes`' prefixes (HeteroFL's width submodel). Tensors in forward order, as
    :func:`width_shapes`; one boolean mask per tensor."""
    names = list(shapes)
    widths = hidden_widths(shapes)
    if len(keep) != len(widths):
        raise ValueError(f"the model has {len(widths)} hidden layers, not {len(keep)}")
    masks = {n: torch.zeros(shapes[n], dtype=torch.bool) for n in names}
    layer = 0  # the weight layer reached
    prev: torch.Tensor | None = None  # the previous layer's kept units (input: all)
    prev_units = 0
    cur: torch.Tensor | None = None
    cur_units = 0
    for n in names:
        s = shapes[n]
        if len(s) >= 2:
            cur_units = s[0]
            cur = (
                None
                if layer == len(widths)
                else torch.as_tensor(list(keep[layer]), dtype=torch.long)
            )
            rows = torch.arange(s[0]) if cur is None else cur
            if prev is None:
                cols = torch.arange(s[1])
            else:
                per_unit = s[1] // max(1, prev_units)  # a flattened channel's features
                cols = (prev[:, None] * per_unit + torch.arange(per_unit)[None, :]).reshape(-1)
            masks[n][rows[:, None], cols[None, :]] = True
            prev, prev_units = (torch.arange(s[0]) if cur is None else cur), s[0]
            layer += 1
        elif len(s) == 1 and s[0] == cur_units and cur_units > 0:  # the layer's bias
            masks[n][torch.arange(s[0]) if cur is None else cur] = True
        else:
            masks[n][...] = True
    return masks


def prefix_mask(
    shape: tuple[int, ...], keep: tuple[int, ...], device: torch.device | str = "cpu"
) -> torch.Tensor:
    mask = torch.zeros(shape, dtype=torch.bool, device=device)
    mask[tuple(slice(0, k) for k in keep)] = True
    return mask


def od_counts(rate: float, widths: Sequence[int]) -> tuple[int, ...]:
    """FjORD's width-p submodel keeps the first ⌈p·K_l⌉ of the K_l units of every hidden
    layer l (Horváth et al. 2021, §3.1, eq. 1), at least one; p·K_l is rounded to 9 decimals
    first, so that 0.6·5 keeps 3 units, not 4."""
    return tuple(max(1, math.ceil(round(rate * k, 9))) for k in widths)


class Scale:
    """HeteroFL's Scaler: a hidden module's output divided by the width rate in training."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def __call__(self, module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
        return output / self.rate


def hidden_modules(model: nn.Module) -> list[nn.Module]:
    """The modules a width submodel's Scaler divides: every Linear/Conv2d but the last."""
    found: list[nn.Module] = [m for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    return found[:-1]


# --------------------------------------------------------------------- units
@dataclass(frozen=True)
class Units:
    """The model's "layers" in the mode in force, input side first (1-based in the docs).

    ``of_param``/``of_buffer`` give each tensor's 1-based unit; ``bwd_flops`` the
    backward FLOPs per sample of each unit; ``fwd_flops`` the whole forward.
    """

    count: int
    of_param: dict[str, int]
    of_buffer: dict[str, int]
    bwd_flops: tuple[float, ...]
    fwd_flops: float
    param_bytes: tuple[int, ...]
    # backward FLOPs of a unit when it is the deepest computed: its input gradient is not
    # needed, so only the weight gradient (= its forward FLOPs) is charged
    bwd_first: tuple[float, ...] = ()
    # forward FLOPs per sample of each unit (paper mode; a model fragment's cost)
    unit_fwd: tuple[float, ...] = ()
    # bytes per sample of each unit's input (paper mode; what crosses a split below it),
    # in its parameters' dtype (the activations a layer takes are of its weights' type)
    in_bytes: tuple[float, ...] = ()

    def suffix_bwd(self, depth: int) -> float:
        """Backward FLOPs per sample of a task of this depth (units depth..L)."""
        if depth > self.count:
            return 0.0
        first = self.bwd_first[depth - 1] if self.bwd_first else self.bwd_flops[depth - 1]
        return first + sum(self.bwd_flops[depth:])

    def suffix_bytes(self, depth: int) -> int:
        """Bytes of units depth..L: what a task of this depth uploads."""
        return int(sum(self.param_bytes[depth - 1 :]))


def build_units(model: torch.nn.Module, layers: Sequence[Any], mode: str) -> Units:
    """Units from :func:`fedclock.models.layer_view` (``paper``) or the state dict (``reference``)."""
    fwd = float(sum(layer.fwd_flops for layer in layers))
    owner = {name: layer for layer in layers for name in layer.param_names}
    params = dict(model.named_parameters())
    if mode == "paper":
        of_param = {n: layer.index + 1 for layer in layers for n in layer.param_names}
        module_unit = {layer.name: layer.index + 1 for layer in layers}
        of_buffer = {}
        for name, _ in model.named_buffers():
            mod = name.rsplit(".", 1)[0]
            of_buffer[name] = module_unit.get(mod, len(layers))
        nbytes = tuple(
            sum(params[n].numel() * params[n].element_size() for n in layer.param_names)
            for layer in layers
        )
        bwd_first = tuple(min(lay.fwd_flops, lay.bwd_flops) for lay in layers)
        return Units(
            len(layers), of_param, of_buffer, tuple(lay.bwd_flops for lay in layers), fwd, nbytes,
            bwd_first, tuple(lay.fwd_flops for lay in layers),
            tuple(lay.in_numel * params[lay.param_names[0]].element_size() for lay in layers),
        )  # fmt: skip
    entries = list(model.state_dict().items())
    of_param, of_buffer, bwd, nb = {}, {}, [], []
    for i, (name, tensor) in enumerate(entries):
        is_param = name in params
        (of_param if is_param else of_buffer)[name] = i + 1
        layer = owner.get(name)
        # a layer's backward FLOPs are charged to its weight tensor (bias gradients are sums)
        first = layer is not None and layer.param_names[0] == name
        bwd.append(float(layer.bwd_flops) if first and layer is not None else 0.0)
        nb.append(tensor.numel() * tensor.element_size())
    return Units(len(entries), of_param, of_buffer, tuple(bwd), fwd, tuple(nb))


# --------------------------------------------------------------------- layout and shapes
@dataclass(frozen=True)
class Layout:
    """What a work shape needs to know about the model."""

    units: Units
    param_shapes: dict[str, tuple[int, ...]]  # forward order
    model_bytes: int  # parameters only: what a full download or upload moves
    # reference mode (the authors' code): a depth-d task trains the full step, then keeps
    # units d..L_e; with ``charge_full_step`` its cost counts that full step
    charge_full_step: bool = False
    _width_masks: dict[float, dict[str, tuple[int, ...]]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _programs: dict[tuple[Any, bool], Program] = field(
        default_factory=dict, compare=False, repr=False
    )
    _fragments: dict[tuple[tuple[float, ...], str], list[dict[str, torch.Tensor]]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _prefixes: dict[float, dict[str, torch.Tensor]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _prefix_costs: dict[float, TaskCost] = field(default_factory=dict, compare=False, repr=False)
    # the keys of cached programs of transient shapes (drawn afresh per task), oldest first
    _transient: list[tuple[Any, bool]] = field(default_factory=list, compare=False, repr=False)
    # the initial parameters (CPU copies), where element-wise fragments are asked for
    initial: dict[str, torch.Tensor] | None = field(default=None, compare=False, repr=False)
    # an early-exit network's exits (fedclock.models.early_exit.ExitInfo), for Exit shapes
    exits: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, model: nn.Module, units: Units, model_bytes: int, **kw: Any) -> Layout:
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        return cls(units=units, param_shapes=shapes, model_bytes=model_bytes, **kw)

    def fragment(
        self, ratios: tuple[float, ...], index: int, kind: str = "neurons"
    ) -> dict[str, torch.Tensor]:
        """Fragment ``index``'s element masks, cached per ratios: neuron groups
        (:func:`fragment_masks`) or the authors' element-wise split (:func:`element_masks`,
        which needs the ``initial`` parameters)."""
        got = self._fragments.get((ratios, kind))
        if got is None:
            if kind == "elements":
                if self.initial is None:
                    raise ValueError("element-wise fragments need the layout's initial parameters")
                got = element_masks(self.initial, ratios)
            else:
                got = fragment_masks(self.param_shapes, ratios)
            self._fragments[(ratios, kind)] = got
        return got[index]

    def prefix_units(self, rate: float) -> dict[str, torch.Tensor]:
        """The element masks of the width-``rate`` prefix submodel (:func:`od_counts` units of
        every hidden layer, :func:`neuron_masks`), cached per rate."""
        got = self._prefixes.get(rate)
        if got is None:
            counts = od_counts(rate, hidden_widths(self.param_shapes))
            keep = tuple(tuple(range(k)) for k in counts)
            got = self._prefixes[rate] = neuron_masks(self.param_shapes, keep)
        return got

    def prefix_cost(self, rate: float) -> TaskCost:
        """One sample's :func:`masked_cost` of the width-``rate`` prefix submodel (cached)."""
        got = self._prefix_costs.get(rate)
        if got is None:
            got = self._prefix_costs[rate] = masked_cost(self, self.prefix_units(rate), 1)
        return got

    def width_keep(self, rate: float) -> dict[str, tuple[int, ...]]:
        """The prefix each tensor keeps in a width-``rate`` submodel (cached per rate)."""
        keep = self._width_masks.get(rate)
        if keep is None:
            names = list(self.param_shapes)
            kept = width_shapes([self.param_shapes[n] for n in names], rate)
            keep = self._width_masks[rate] = dict(zip(names, kept, strict=True))
        return keep


@dataclass(frozen=True)
class Program:
    """How an executor runs a task of one shape (:meth:`WorkShape.program`): the parameters
    that train (the others are frozen inputs of the loss), the tensors whose delta is sent
    (Δ = 0 for the rest), a submodel's slice of every tensor, and the factor the hidden
    modules' outputs are divided by in training (HeteroFL's Scaler), and the task's own
    loss if it has one. Tasks whose programs share a ``key`` train in one vectorized
    block."""

    trains: tuple[str, ...]
    sends: frozenset[str]
    views: dict[str, tuple[slice, ...]] | None = None
    scale: float | None = None
    # what a contribution of this shape covers (Contribution.coverage): per parameter,
    # True / False (the whole tensor or none of it) or a boolean mask (on the CPU);
    # None: everything
    coverage: Mapping[str, torch.Tensor | bool] | None = None
    # the task's objective (a ``fedclock.train.local.Loss``, e.g. an early exit's head) in
    # place of the run's; None: the run's loss
    loss: Any = None
    # element masks (a model fragment): the task's model holds only these elements of
    # each named tensor (the others are zero while it trains, and their Δ is 0)
    masks: Mapping[str, torch.Tensor] | None = None
    # what the masked-out elements hold while the task trains: "zero" (the authors'
    # element-wise fragments: the model holds only its elements) or "base" (frozen at the
    # downloaded values: a deeper model's neuron fragment computes through every unit)
    mask_fill: str = "zero"
    tag: Hashable = None  # tells apart programs that differ only in their masks
    # statistics the task accumulates over its local steps from each step's gradient and
    # reports in Contribution.up (names of fedclock.train.local.STEP_STATISTICS; PruneFL's
    # "sq_grads": Σ_k g_k² of every element, pruned ones included)
    step_statistics: tuple[str, ...] = ()
    # per level, the elements a local step at that level trains, in the program's
    # coordinates (its views' slices): the step's forward pass uses θ ⊙ m, its gradient is 0
    # outside m (FjORD's ordered dropout; the shape's step_levels() gives each step's level)
    levels: tuple[Mapping[str, torch.Tensor], ...] | None = None

    @property
    def key(self) -> Hashable:
        return (self.trains, self.scale, self.loss, self.tag)


def held_bytes(layout: Layout, masks: Mapping[str, torch.Tensor]) -> int:
    """The bytes of the elements ``masks`` hold: their share of the model's bytes."""
    total = sum(math.prod(s) for s in layout.param_shapes.values())
    held = sum(int(m.sum()) for m in masks.values())
    return int(layout.model_bytes * held / max(1, total))


def masked_cost(layout: Layout, masks: Mapping[str, torch.Tensor], samples: int) -> TaskCost:
    """A task that trains the elements ``masks`` hold (a submodel of units): each unit's
    forward and backward FLOPs scaled by the share of its weights held (a product with a
    smaller weight matrix); the held elements' bytes down and up."""
    u = layout.units
    nbytes = held_bytes(layout, masks)
    share = [0.0] * u.count
    for n, m in masks.items():
        if len(layout.param_shapes[n]) >= 2:  # a unit's weight tensor
            share[u.of_param[n] - 1] = int(m.sum()) / m.numel()
    fwd = u.unit_fwd or (u.fwd_flops / u.count,) * u.count
    # as a full task: the input layer's backward is its weight gradient only
    bwd = (u.bwd_first[0] if u.bwd_first else u.bwd_flops[0], *u.bwd_flops[1:])
    flops = sum((f + b) * s for f, b, s in zip(fwd, bwd, share, strict=True))
    return TaskCost(flops=samples * flops, bytes_down=nbytes, bytes_up=nbytes)


def _program_coverage(
    shape: WorkShape, layout: Layout, name: str, like: torch.Tensor
) -> torch.Tensor | bool:
    """What a shape covers of parameter ``name``, read from its (cached) program."""
    got = shape.program(layout).coverage
    assert got is not None
    c = got[name]
    return c.to(like.device) if isinstance(c, torch.Tensor) else c


#: how many programs of transient shapes a layout keeps (RAM-Fed's random submodels)
TRANSIENT_PROGRAMS = 64


class WorkShape:
    """Base of the work shapes (frozen dataclasses: hashable, comparable values)."""

    #: drawn afresh for most tasks (a random submodel): its programs are cached briefly
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return repr(self)

    def trains(self, layout: Layout, name: str) -> bool:
        """Whether the task trains (and sends) parameter ``name``."""
        raise NotImplementedError

    def holds_buffer(self, layout: Layout, name: str) -> bool:
        """Whether the task's buffer ``name`` (e.g. BatchNorm statistics) counts in the average."""
        raise NotImplementedError

    def coverage(self, layout: Layout, name: str, like: torch.Tensor) -> torch.Tensor | bool:
        """The elements of parameter ``name`` the task covers: True (all), False (none) or a
        boolean mask shaped like ``like``."""
        return self.trains(layout, name)

    def cost(self, layout: Layout, samples: int) -> TaskCost:
        raise NotImplementedError

    def step_levels(self) -> tuple[int, ...] | None:
        """Per local step, its index into the program's ``levels`` (the part of the task's
        model that step trains); None: every step trains the whole program."""
        return None

    def program(self, layout: Layout | None, *, trains_fully: bool = False) -> Program:
        """What an executor trains and sends for this shape (cached per layout); a shape
        without one raises :class:`UnsupportedShapeError`. ``trains_fully``: a layer-suffix
        task trains every unit and sends units d..L (SALF's reference mode)."""
        if layout is None:
            raise UnsupportedShapeError(
                f"{self.describe()} tasks need the model's layout (Needs.layout)."
            )
        key = (self, trains_fully)
        got = layout._programs.get(key)
        if got is None:
            got = layout._programs[key] = self._program(layout, trains_fully)
            if self.transient:  # a bounded cache: such shapes rarely come back
                layout._transient.append(key)
                if len(layout._transient) > TRANSIENT_PROGRAMS:
                    del layout._programs[layout._transient.pop(0)]
        return got

    def _program(self, layout: Layout, trains_fully: bool) -> Program:
        raise UnsupportedShapeError(f"No executor knows how to run {self.describe()} tasks.")


@dataclass(frozen=True)
class Full(WorkShape):
    """The whole model."""

    def describe(self) -> str:
        return "full-model"

    def __reduce__(self) -> str:
        return "FULL"  # unpickled as the module's singleton (executors test ``shape is FULL``)

    def trains(self, layout: Layout, name: str) -> bool:
        return True

    def holds_buffer(self, layout: Layout, name: str) -> bool:
        return True

    def _program(self, layout: Layout, trains_fully: bool) -> Program:
        names = tuple(layout.param_shapes)
        return Program(trains=names, sends=frozenset(names))

    def cost(self, layout: Layout, samples: int) -> TaskCost:
        u = layout.units
        bwd = samples * u.suffix_bwd(1)
        return TaskCost(
            flops=samples * u.fwd_flops + bwd,
            bytes_down=layout.model_bytes,
            bytes_up=layout.model_bytes,
        )


FULL = Full()


@dataclass(frozen=True)
class Suffix(WorkShape):
    """SALF's layer suffix: units ``depth``..L train and are sent (eq. 8: the user is in
    U^l for l ≥ depth); the forward pass runs through every unit."""

    depth: int

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"a layer suffix starts at depth ≥ 1, got {self.depth}")

    def describe(self) -> str:
        return f"layer-suffix (depth {self.depth})"

    def trains(self, layout: Layout, name: str) -> bool:
        return layout.units.of_param[name] >= self.depth

    def holds_buffer(self, layout: Layout, name: str) -> bool:
        u = layout.units
        return u.of_buffer.get(name, u.count) >= self.depth

    def _program(self, layout: Layout, trains_fully: bool) -> Program:
        names = tuple(layout.param_shapes)
        sent = tuple(n for n in names if self.trains(layout, n))
        return Program(
            trains=names if trains_fully else sent, sends=frozenset(sent),
            coverage={n: n in sent for n in names},
        )  # fmt: skip

    def cost(self, layout: Layout, samples: int) -> TaskCost:
        """Forward of every unit, backward of units depth..L (or of the full step, when the
        executor trains it: ``Layout.charge_full_step``), upload of units depth..L."""
        u = layout.units
        bwd = samples * u.suffix_bwd(1 if layout.charge_full_step else self.depth)
        return TaskCost(
            flops=samples * u.fwd_flops + bwd,
            bytes_down=layout.model_bytes,
            bytes_up=u.suffix_bytes(self.depth),
        )


@dataclass(frozen=True)
class Width(WorkShape):
    """HeteroFL's width-``rate`` submodel (:func:`width_shapes`)."""

    rate: float

    def __post_init__(self) -> None:
        if not 0.0 < self.rate <= 1.0:
            raise ValueError(f"a submodel's width rate lies in (0, 1], got {self.rate}")

    def describe(self) -> str:
        return f"width-{self.rate:g} submodel"

    def trains(self, layout: Layout, name: str) -> bool:
        return True

    def holds_buffer(self, layout: Layout, name: str) -> bool:
        return False  # HeteroFL refuses models with buffers; the base's are kept

    def coverage(self, layout: Layout, name: str, like: torch.Tensor) -> torch.Tensor | bool:
        return prefix_mask(tuple(like.shape), layout.width_keep(self.rate)[name], like.device)

    def _program(self, layout: Layout, trains_fully: bool) -> Program:
        names = tuple(layout.param_shapes)
        keep = layout.width_keep(self.rate)
        views = {n: tuple(slice(0, k) for k in keep[n]) for n in names}
        cover = {n: prefix_mask(layout.param_shapes[n], keep[n]) for n in names}
        return Program(
            trains=names, sends=frozenset(names), views=views, scale=self.rate, coverage=cover
        )

    def cost(self, layout: Layout, samples: int) -> TaskCost:
        """r² of the full task: hidden×hidden layers shrink by r² (documented approximation)."""
        u = layout.units
        scale = self.rate**2
        return TaskCost(
            flops=scale * samples * (u.fwd_flops + sum(u.bwd_flops)),
            bytes_down=int(scale * layout.model_bytes),
            bytes_up=int(scale * layout.model_bytes),
        )


@dataclass(frozen=True)
class Fragment(WorkShape):
    """Fed-RAA's model fragment ``index`` (0-based) of ``len(ratios)``: neuron group
    ``index`` of every hidden layer (:func:`fragment_masks`). With one split hidden layer the
    task's model is the fragment alone (the other hidden neurons are absent); with more, it
    computes through the other groups frozen at the downloaded values. It trains and sends
    the fragment's elements, the output bias included (every fragment holds it)."""

    index: int
    ratios: tuple[float, ...]
    # "neurons" (our reading of the paper) or "elements" (the authors' code: an element-wise
    # split of every weight tensor but the first layer's, charged its share of the full
    # task as their time model does)
    kind: str = "neurons"

    def __post_init__(self) -> None:
        if not 0 <= self.index < len(self.ratios):
            raise ValueError(f"fragment {self.index} of {len(self.ratios)} does not exist")
        if self.kind not in ("neurons", "elements"):
            raise ValueError(f"unknown fragment kind {self.kind!r}")

    def describe(self) -> str:
        return f"fragment {self.index + 1} of {len(self.ratios)} ({self.ratios[self.index]:g} %)"

    def _masks(self, layout: Layout) -> dict[str, torch.Tensor]:
        return layout.fragment(self.ratios, self.index, self.kind)

    def trains(self, layout: Layout, name: str) -> bool:
        return bool(self._masks(layout)[name].any())

    def holds_buffer(self, layout: Layout, name: str) -> bool:
        return False  # models with buffers are not split

    def coverage(self, layout: Layout, name: str, like: torch.Tensor) -> torch.Tensor | bool:
        m = self._masks(layout)[name]
        return True if bool(m.all()) else m.to(like.device)

    def _program(self, layout: Layout, trains_fully: bool) -> Program:
        masks = self._masks(layout)
        names = tuple(n for n in layout.param_shapes if bool(masks[n].any()))
        partial = {n: masks[n] for n in names if not bool(masks[n].all())}
        cover: dict[str, torch.Tensor | bool] = {
            n: (partial[n] if n in partial else bool(masks[n].any())) for n in layout.param_shapes
        }
        tag = (self.index, self.ratios, self.kind)
        if self.kind == "elements":  # the authors' split: the model holds only its elements
            return Program(trains=names, sends=frozenset(names), coverage=cover,
                           masks=partial, tag=tag)  # fmt: skip
        # one split hidden layer (the paper's MLPs): the fragment is a block of every tensor
        # and a network of its own — the task trains the narrower network of its slices (the
        # absent neurons cost nothing). Deeper models: its neurons' inputs come from every
        # unit below, so the task computes through the whole model, the other groups
        # frozen at the downloaded values, and trains its own elements only
        split = [
            n
            for n, m in masks.items()
            if m.dim() >= 2 and not bool(m.reshape(m.shape[0], -1).any(1).all())
        ]  # fmt: skip  (weight tensors of which the fragment holds only some units)
        views = {n: box_view(masks[n]) for n in layout.param_shapes}
        if len(split) <= 1 and all(v is not None for v in views.values()):
            boxes = {n: v for n, v in views.items() if v is not None}
            return Program(
                trains=tuple(layout.param_shapes), sends=frozenset(layout.param_shapes),
                views=boxes, coverage=cover, tag=tag,
            )  # fmt: skip
        return Program(trains=names, sends=frozenset(names), coverage=cover, masks=partial,
                       mask_fill="base", tag=tag)  # fmt: skip

    def cost(self, layout: Layout, samples: int) -> TaskCost:
        """Each unit's forward and backward FLOPs scaled by the share of its weights the
        fragment holds; the fragment's bytes down and up. ``elements``: the full task's
        FLOPs times the fragment's ratio (the authors' simulated duration, measured time ×
        part/100 / cmp)."""
        masks = self._masks(layout)
        if self.kind == "elements":
            nbytes = held_bytes(layout, masks)
            full = FULL.cost(layout, samples)
            part = self.ratios[self.index] / sum(self.ratios)
            return TaskCost(flops=full.flops * part, bytes_down=nbytes, bytes_up=nbytes)
        return masked_cost(layout, masks, samples)


@dataclass(frozen=True)
class Neurons(WorkShape):
    """RAM-Fed's submodel (our reading of Wang et al., KDD 2023): the neurons (channels)
    ``keep[l]`` of every hidden layer l, in forward order, and the weights among them
    (:func:`neuron_masks`); every output unit. The task's model holds only these elements
    (zero elsewhere: a dropped unit outputs act(0) = 0 with ReLU, so it is the narrower
    network) and trains and sends them; no Scaler. It is HeteroFL's ``Width`` submodel
    without the Scaler when every ``keep[l]`` is a prefix, but any units may be kept."""

    keep: tuple[tuple[int, ...], ...]

    transient: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for units in self.keep:
            if not units or list(units) != sorted(set(units)) or units[0] < 0:
                raise ValueError(
                    "a neuron submodel keeps a non-empty, increasing list of units per hidden "
                    f"layer, got {units!r}"
                )

    def describe(self) -> str:
        return f"neuron submodel ({', '.join(str(len(k)) for k in self.keep)} hidden units)"

    def masks(self, layout: Layout) -> dict[str, torch.Tensor]:
        return neuron_masks(layout.param_shapes, self.keep)

    def trains(self, layout: Layout, name: str) -> bool:
        return True  # every tensor keeps some element (each layer keeps ≥ 1 unit)

    def holds_buffer(self, layout: Layout, name: str) -> bool:
        return False  # models with buffers are refused; the base's are kept

    def coverage(self, layout: Layout, name: str, like: torch.Tensor) -> torch.Tensor | bool:
        return _program_coverage(self, layout, name, like)

    def _program(self, layout: Layout, trains_fully: bool) -> Program:
        masks = self.masks(layout)
        names = tuple(layout.param_shapes)
        partial = {n: m for n, m in masks.items() if not bool(m.all())}
        cover: dict[str, torch.Tensor | bool] = {n: partial.get(n, True) for n in names}
        return Program(trains=names, sends=frozenset(names), coverage=cover, masks=partial,
                       mask_fill="zero", tag=("neurons", self.keep))  # fmt: skip

    def cost(self, layout: Layout, samples: int) -> TaskCost:
        """:func:`masked_cost`: each unit's FLOPs scaled by the share of its weights kept
        (k_l·k_(l−1)/(C_l·C_(l−1)) for a layer between two hidden layers); the kept
        elements' bytes down and up."""
        return masked_cost(layout, self.masks(layout), samples)


@dataclass(frozen=True)
class OrderedDropout(WorkShape):
    """FjORD's ordered dropout (Horváth et al., NeurIPS 2021, §3): the device holds the
    width-``p_max`` prefix submodel — the first ⌈p_max·K_l⌉ units of every hidden layer
    (:func:`od_counts`) and the weights among them — and local step s trains the width
    ``widths[levels[s]]`` ≤ p_max drawn for it: that width's prefix, the other held units
    dropped from the step's forward pass (no gradient; the optimiser's own terms still apply
    to every held element, as torch.optim.SGD does to a parameter with a zero gradient). The
    task sends the p_max submodel, which is what it covers: every narrower width is a prefix
    of it (nested). Its program (what an executor trains) depends on ``p_max`` and ``widths``
    only, so ``levels`` is not part of the shape's identity (equality, hash)."""

    p_max: float
    widths: tuple[float, ...]
    levels: tuple[int, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        w = self.widths
        if not w or any(not 0.0 < p <= 1.0 for p in w) or list(w) != sorted(set(w)):
            raise ValueError(f"ordered dropout's widths increase within (0, 1], got {w!r}")
        if self.p_max not in w:
            raise ValueError(f"p_max {self.p_max:g} is not one of the widths {w!r}")
        top = w.index(self.p_max)
        if any(not 0 <= lv <= top for lv in self.levels):
            raise ValueError(f"a step's width must be one of {w[: top + 1]!r} (≤ p_max)")

    def describe(self) -> str:
        return f"ordered-dropout (width ≤ {self.p_max:g})"

    def _masks(self, layout: Layout) -> list[dict[str, torch.Tensor]]:
        """The prefix submodel of every width up to p_max, narrowest first."""
        return [layout.prefix_units(p) for p in self.widths if p <= self.p_max]

    def trains(self, layout: Layout, name: str) -> bool:
        return True  # every tensor keeps some element (each layer keeps ≥ 1 unit)

    def holds_buffer(self, layout: Layout, name: str) -> bool:
        return False  # models with buffers are refused; the base's are kept

    def coverage(self, layout: Layout, name: str, like: torch.Tensor) -> torch.Tensor | bool:
        return _program_coverage(self, layout, name, like)

    def step_levels(self) -> tuple[int, ...]:
        return self.levels

    def _program(self, layout: Layout, trains_fully: bool) -> Program:
        masks = self._masks(layout)
        held = masks[-1]
        names = tuple(layout.param_shapes)
        views: dict[str, tuple[slice, ...]] = {}
        for n in names:
            v = box_view(held[n])
            assert v is not None  # a prefix of every dimension
            views[n] = v
        cover: dict[str, torch.Tensor | bool] = {
            n: True if bool(held[n].all()) else held[n] for n in names
        }
        levels = tuple({n: m[n][views[n]] for n in names} for m in masks)
        return Program(trains=names, sends=frozenset(names), views=views, coverage=cover,
                       levels=levels, tag=("ordered-dropout", self.p_max, self.widths))  # fmt: skip

    def cost(self, layout: Layout, samples: int) -> TaskCost:
        """FLOPs of the widths the steps trained: each width's :func:`masked_cost` per
        sample, averaged over the steps (every step at ``p_max`` when ``levels`` is empty),
        times the samples; the p_max submodel's bytes down and up."""
        per = [layout.prefix_cost(p) for p in self.widths if p <= self.p_max]
        levels = self.levels or (len(per) - 1,)
        flops = samples * sum(per[lv].flops for lv in levels) / len(levels)
        held = per[-1]
        return TaskCost(flops=flops, bytes_down=held.bytes_down, bytes_up=held.bytes_up)


@dataclass(frozen=True)
class Exit(WorkShape):
    """Early exit ``exit`` (1-based) of an early-exit network (Kaplan et al., Algorithm 1):
    the task trains the entries up to that exit and its head on the exit's own loss
    (:class:`fedclock.models.early_exit.ExitLoss`) and sends them; the node holds the model up
    to its deepest exit ``holds`` (E_i), which it downloads."""

    exit: int
    holds: int

    def __post_init__(self) -> None:
        if not 1 <= self.exit <= self.holds:
            raise ValueError(f"exit {self.exit} is not one of the node's exits 1..{self.holds}")

    def describe(self) -> str:
        return f"early exit {self.exit}"

    def _info(self, layout: Layout) -> Any:
        if layout.exits is None:
            raise UnsupportedShapeError(
                f"{self.describe()} tasks need an early-exit model (model.arch ee_cnn or "
                "ee_resnet18)."
            )
        if self.holds > len(layout.exits.params):
            raise UnsupportedShapeError(
                f"the model has {len(layout.exits.params)} exits, not {self.holds}."
            )
        return layout.exits

    def trains(self, layout: Layout, name: str) -> bool:
        return name in self._info(layout).params[self.exit - 1]

    def holds_buffer(self, layout: Layout, name: str) -> bool:
        return name in self._info(layout).buffers[self.exit - 1]

    def _program(self, layout: Layout, trains_fully: bool) -> Program:
        own = self._info(layout).params[self.exit - 1]
        return Program(
            trains=own, sends=frozenset(own), coverage={n: n in own for n in layout.param_shapes},
            loss=ExitLoss(self.exit),
        )  # fmt: skip

    def cost(self, layout: Layout, samples: int) -> TaskCost:
        """Forward and backward of the model up to the exit; the node's model (exits up to
        ``holds``) down, the trained part up."""
        info = self._info(layout)
        e = self.exit - 1
        return TaskCost(
            flops=samples * (info.fwd_flops[e] + info.bwd_flops[e]),
            bytes_down=int(info.param_bytes[self.holds - 1]),
            bytes_up=int(info.param_bytes[e]),
        )


def mask_digest(masks: Mapping[str, torch.Tensor]) -> str:
    """A digest of element masks (name, shape and bits of each): equal masks, equal digest."""
    h = hashlib.sha256()
    for n in sorted(masks):
        m = masks[n].detach().to("cpu", torch.bool).contiguous()
        h.update(f"{n}:{tuple(m.shape)};".encode())
        h.update(m.numpy().tobytes())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class Mask(WorkShape):
    """PruneFL's pruned model (Jiang et al.): every parameter tensor trains and is sent, the
    elements outside ``masks`` held at zero (before and after each step, so their Δ is 0);
    a tensor absent from ``masks`` is dense. The task's FLOPs and bytes follow the mask's
    density (sparse cost; the host computes densely). ``reports``: the task also uploads the
    squared gradients of every parameter (PruneFL's reconfiguration rounds), dense.

    Equal masks are equal shapes (compared by :func:`mask_digest`)."""

    masks: dict[str, torch.Tensor] = field(compare=False, repr=False)
    reports: bool = False
    digest: str = ""

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", mask_digest(self.masks))

    def describe(self) -> str:
        return "pruned-model (mask)"

    def trains(self, layout: Layout, name: str) -> bool:
        return True

    def holds_buffer(self, layout: Layout, name: str) -> bool:
        return True

    def coverage(self, layout: Layout, name: str, like: torch.Tensor) -> torch.Tensor | bool:
        m = self.masks.get(name)
        return True if m is None else m.to(like.device)

    def density(self, layout: Layout) -> float:
        """Kept elements over all parameter elements."""
        total = sum(math.prod(s) for s in layout.param_shapes.values())
        return self.kept(layout) / max(1, total)

    def kept(self, layout: Layout) -> int:
        """Parameter elements the mask keeps."""
        return sum(
            int(self.masks[n].sum()) if n in self.masks else math.prod(s)
            for n, s in layout.param_shapes.items()
        )

    def _program(self, layout: Layout, trains_fully: bool) -> Program:
        names = tuple(layout.param_shapes)
        masks = {n: self.masks[n].to("cpu", torch.bool) for n in names if n in self.masks}
        cover: dict[str, torch.Tensor | bool] = {n: masks.get(n, True) for n in names}
        return Program(
            trains=names, sends=frozenset(names), coverage=cover, masks=masks,
            mask_fill="zero", tag=("mask", self.digest), step_statistics=("sq_grads",),
        )  # fmt: skip

    def cost(self, layout: Layout, samples: int) -> TaskCost:
        """Each unit's forward and backward FLOPs times the density of its weight tensor
        (a sparse layer computes only its kept weights); the kept values down and up, and
        with ``reports`` every parameter's squared gradient up (dense, the model's size)."""
        u = layout.units
        share = [1.0] * u.count
        for n, s in layout.param_shapes.items():
            if len(s) >= 2 and n in self.masks:  # a unit's weight tensor
                share[u.of_param[n] - 1] = int(self.masks[n].sum()) / math.prod(s)
        fwd = u.unit_fwd or (u.fwd_flops / u.count,) * u.count
        # as a full task: the input layer's backward is its weight gradient only
        bwd = (u.bwd_first[0] if u.bwd_first else u.bwd_flops[0], *u.bwd_flops[1:])
        flops = sum((f + b) * s for f, b, s in zip(fwd, bwd, share, strict=True))
        nbytes = int(layout.model_bytes * self.density(layout))
        up = nbytes + (layout.model_bytes if self.reports else 0)
        return TaskCost(flops=samples * flops, bytes_down=nbytes, bytes_up=up)


@dataclass(frozen=True)
class Split(WorkShape):
    """SplitFed's split learning (Thapa et al., AAAI 2022, §3): the client trains layers
    1..``cut`` (its client-side model), the main server layers cut+1..L (the server-side
    model), batch by batch — the client's forward pass, its activations (and labels,
    ``label_bytes`` per sample) up, the server's forward and backward, the gradients of the
    activations down, the client's backward. The update the task sends covers the whole
    model: the client-side model from the client, the server-side model from the main
    server's copy for this client (SFL-V1); on the host both are one local SGD of the whole
    model on the client's batches (the same arithmetic), so the program is the full one."""

    cut: int
    label_bytes: int = 0

    def __post_init__(self) -> None:
        if self.cut < 1:
            raise ValueError(f"a split leaves at least one layer on the client, got cut {self.cut}")
        if self.label_bytes < 0:
            raise ValueError(f"a label has a size ≥ 0 bytes, got {self.label_bytes}")

    def describe(self) -> str:
        return f"split (cut after layer {self.cut})"

    def check(self, layout: Layout) -> None:
        """Refuses a cut that leaves the server no layer, or a layout without layers'
        activation sizes (reference-mode units)."""
        u = layout.units
        if not u.in_bytes or not u.unit_fwd:
            raise UnsupportedShapeError(
                f"{self.describe()} tasks need the model's layers (paper-mode units)."
            )
        if self.cut >= u.count:
            raise UnsupportedShapeError(
                f"a cut after layer {self.cut} leaves the server none of the model's "
                f"{u.count} layers."
            )

    def trains(self, layout: Layout, name: str) -> bool:
        return True

    def holds_buffer(self, layout: Layout, name: str) -> bool:
        return True

    def _program(self, layout: Layout, trains_fully: bool) -> Program:
        self.check(layout)
        names = tuple(layout.param_shapes)
        return Program(trains=names, sends=frozenset(names))

    def client_flops(self, layout: Layout) -> float:
        """Per sample: forward and backward of layers 1..cut (layer 1's backward is its
        weight gradient only: its input is the data)."""
        u = layout.units
        c = self.cut
        first = u.bwd_first[0] if u.bwd_first else u.bwd_flops[0]
        return sum(u.unit_fwd[:c]) + first + sum(u.bwd_flops[1:c])

    def server_flops(self, layout: Layout) -> float:
        """Per sample: forward and backward of layers cut+1..L, the backward including layer
        cut+1's input gradient (the gradient sent down)."""
        u = layout.units
        return sum(u.unit_fwd[self.cut :]) + sum(u.bwd_flops[self.cut :])

    def cost(self, layout: Layout, samples: int) -> TaskCost:
        """The client's FLOPs at its speed; the client-side model (layers 1..cut) down and
        up; per sample the activations at the cut (layer cut+1's input) and a label up,
        the activations' gradients (as many bytes) down, and the server's FLOPs
        (``devices.cost``: the training phase adds them all, batch after batch)."""
        self.check(layout)
        u = layout.units
        act = u.in_bytes[self.cut]  # layer cut+1's input, per sample
        client_bytes = int(sum(u.param_bytes[: self.cut]))
        return TaskCost(
            flops=samples * self.client_flops(layout),
            bytes_down=client_bytes,
            bytes_up=client_bytes,
            split=SplitExchange(
                server_flops=samples * self.server_flops(layout),
                bytes_up=round(samples * (act + self.label_bytes)),
                bytes_down=round(samples * act),
            ),
        )
