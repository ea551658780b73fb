"""What travels between the server and a real device, framework-neutral, and the checks every
reply passes before it touches the model.

A :class:`Payload` is named numpy arrays plus a flat configuration of scalars (what Flower's
``ArrayRecord`` and ``ConfigRecord`` hold; :mod:`fedclock.deploy.flower` maps one onto the
other). Down: the task's base model (``base/NAME``, ``buffer/NAME``), its
:attr:`Task.down <fedclock.sim.types.Task.down>` tensors (``down/KIND/NAME``) and its plan;
up: Δ (``delta/NAME``), buffers, :attr:`Contribution.up <fedclock.sim.types.Contribution.up>`
statistics (``up/KIND/NAME``) and what the device measured.

The server trusts nothing that comes back: :func:`check_reply` accepts a reply only when it
answers a task in flight, holds exactly the tensors that task's update has, each of the
base's shape and dtype, every value finite, within a size bound; otherwise it raises
:class:`RejectedReply` naming the first problem, and the driver records the task as
``rejected`` and goes on.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedclock.models import shapes as shape_types
from fedclock.models.shapes import FULL, WorkShape
from fedclock.sim.types import ModelVersion, Params, Task, TaskPlan

Scalar = int | float | str | bool
#: the work shapes a task may carry to a device (their fields are plain numbers)
SHAPES: dict[str, type[WorkShape]] = {
    t.__name__: t
    for t in (shape_types.Full, shape_types.Suffix, shape_types.Width, shape_types.Fragment,
              shape_types.Neurons, shape_types.OrderedDropout)
}  # fmt: skip
#: a reply may be at most this many times the bytes of the tensors it answers (Δ, buffers
#: and statistics each at most the model's size), plus this slack for the configuration
MAX_REPLY_FACTOR = 4
REPLY_SLACK_BYTES = 1 << 16
#: a selection statistic (one loss per sample) holds at most this many values
MAX_SELECTION_VALUES = 1 << 20


@dataclass
class Payload:
    """Named arrays and a flat configuration of scalars: one message's content."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    config: dict[str, Scalar] = field(default_factory=dict)

    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values()) + sum(
            len(str(k)) + len(str(v)) for k, v in self.config.items()
        )


class RejectedReply(ValueError):
    """A reply the server refuses (one sentence: what is wrong with it)."""


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


def suffix_depth(shape: WorkShape) -> int | None:
    """d of a full (1) or layer-suffix task (SALF's depth), None for any other shape."""
    if shape is FULL:
        return 1
    return shape.depth if isinstance(shape, shape_types.Suffix) else None


def encode_shape(shape: WorkShape) -> str:
    """A work shape as ``Name`` or ``Name:{fields as JSON}`` (numbers, strings, lists)."""
    name = type(shape).__name__
    if SHAPES.get(name) is not type(shape):
        raise ValueError(
            f"{shape.describe()} tasks cannot be sent to a device yet (deployable shapes: "
            f"{', '.join(SHAPES)})."
        )
    fields = {f.name: getattr(shape, f.name) for f in dataclasses.fields(shape)}  # type: ignore[arg-type]
    return name if not fields else f"{name}:{json.dumps(fields, separators=(',', ':'))}"


def _tuples(x: Any) -> Any:
    """JSON's lists back as the tuples a frozen shape holds."""
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def decode_shape(text: str) -> WorkShape:
    name, _, rest = text.partition(":")
    cls = SHAPES.get(name)
    if cls is None:
        raise RejectedReply(f"unknown work shape {name!r}")
    if cls is shape_types.Full:
        return FULL
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    try:
        raw = json.loads(rest) if rest else {}
        if not isinstance(raw, dict) or not set(raw) <= names:
            raise ValueError(f"fields {sorted(raw) if isinstance(raw, dict) else raw!r}")
        return cls(**{k: _tuples(v) for k, v in raw.items()})
    except (ValueError, TypeError) as exc:
        raise RejectedReply(f"the work shape {text[:80]!r} cannot be read ({exc})") from None


def _group(p: Payload, prefix: str) -> Params:
    """The arrays named ``PREFIXname``, as tensors by name."""
    n = len(prefix)
    return {
        k[n:]: torch.from_numpy(np.array(a)) for k, a in p.arrays.items() if k.startswith(prefix)
    }


def _nested(p: Payload, prefix: str) -> dict[str, Params]:
    """The arrays named ``PREFIXkind/name``, as tensors by kind, then name."""
    out: dict[str, Params] = {}
    for key, t in _group(p, prefix).items():
        kind, _, name = key.partition("/")
        out.setdefault(kind, {})[name] = t
    return out


def encode_task(
    task: Task, *, budget_s: float | None, cut: str, seed: int, speed: float | None = None
) -> Payload:
    """The message that starts ``task`` on its device: the base model, the tensors sent
    down, the plan, and a *relative* time budget (clocks are not synchronised)."""
    p = Payload()
    for name, t in task.base.params.items():
        p.arrays[f"base/{name}"] = _np(t)
    for name, t in task.base.buffers.items():
        p.arrays[f"buffer/{name}"] = _np(t)
    for kind, tensors in task.down.items():
        for name, t in tensors.items():
            p.arrays[f"down/{kind}/{name}"] = _np(t)
    plan = task.plan
    p.config.update(
        task_id=task.task_id, client=task.client, k=task.k, repeat=task.repeat,
        version=task.base.version, local_steps=plan.local_steps, batch_size=plan.batch_size,
        samples=plan.samples, lr_scale=plan.lr_scale, shape=encode_shape(plan.shape),
        budget_s=-1.0 if budget_s is None else float(budget_s), cut=cut, seed=seed,
    )  # fmt: skip
    if plan.epochs is not None:
        p.config["epochs"] = float(plan.epochs)
    if speed is not None:  # what the device measured last (it need not calibrate again)
        p.config["speed"] = float(speed)
    return p


def decode_task(p: Payload) -> tuple[Task, float | None, str, float | None]:
    """The device's view of a task message: the task (its cost and timing unknown: the
    device measures them), its budget in seconds (None: none), its cut rule and the speed
    the device reported last (None: not known)."""
    from fedclock.devices.cost import TaskCost, TaskTiming

    c = p.config
    down = _nested(p, "down/")
    plan = TaskPlan(
        local_steps=int(c["local_steps"]), batch_size=int(c["batch_size"]),
        samples=int(c["samples"]), epochs=float(c["epochs"]) if "epochs" in c else None,
        shape=decode_shape(str(c["shape"])), lr_scale=float(c["lr_scale"]),
    )  # fmt: skip
    base = ModelVersion(int(c["version"]), _group(p, "base/"), _group(p, "buffer/"))
    task = Task(
        int(c["task_id"]), int(c["client"]), int(c["k"]), base, plan,
        TaskCost(0.0, 0, 0), TaskTiming(0.0, 0.0, 0.0), 0.0, repeat=int(c["repeat"]), down=down,
    )  # fmt: skip
    budget = float(c["budget_s"])
    speed = float(c["speed"]) if "speed" in c else None
    return task, (None if budget < 0 else budget), str(c["cut"]), speed


@dataclass(frozen=True)
class Reply:
    """A checked reply: everything the server builds the contribution from."""

    delta: Params
    buffers: Params
    up: dict[str, Params]
    num_samples: int
    train_loss: float
    shape: WorkShape  # the work the device did (a SALF device's layer suffix may be shorter)
    compute_s: float  # the device's own clock: training
    busy_s: float  # the device's own clock: from the message's receipt to its reply
    speed: float | None = None  # the FLOP/s the device measured (its next task's estimate)
    local_steps: int = 1  # the steps it took (fewer than sent: it stopped at its budget)


def check_reply(p: Payload, task: Task, *, max_depth: int | None = None) -> Reply:
    """``p`` as a :class:`Reply` to ``task`` (in flight), or :class:`RejectedReply`.

    Accepted only when: it names ``task`` (id and base version); it holds a Δ for exactly
    the base's parameters and exactly its buffers, each of the base's shape and dtype;
    its statistics are of parameter shapes; every number is finite; its size is bounded
    (:data:`MAX_REPLY_FACTOR`); the work shape it reports is a layer suffix no longer than
    what was sent (``max_depth``: the model's unit count, for SALF's cut) or the one sent.
    """
    c = p.config
    base = task.base
    limit = MAX_REPLY_FACTOR * sum(t.numel() * t.element_size() for t in base.params.values())
    if p.nbytes() > limit + REPLY_SLACK_BYTES:
        raise RejectedReply(f"the reply holds {p.nbytes()} bytes, more than the bound {limit}")
    for key in ("task_id", "version", "num_samples", "train_loss", "shape", "compute_s", "busy_s"):
        if key not in c:
            raise RejectedReply(f"the reply has no {key!r}")
    if c["task_id"] != task.task_id or c["version"] != base.version:
        raise RejectedReply(
            f"the reply answers task {c['task_id']!r} on version {c['version']!r}, not task "
            f"{task.task_id} on version {base.version}"
        )
    expected = {f"delta/{n}": t for n, t in base.params.items()}
    expected.update({f"buffer/{n}": t for n, t in base.buffers.items()})
    got = {k for k in p.arrays if not k.startswith("up/")}
    if got != set(expected):
        extra, missing = sorted(got - set(expected)), sorted(set(expected) - got)
        raise RejectedReply(
            f"the reply's tensors do not match the model: unexpected {extra[:3]}, missing {missing[:3]}"
        )
    params = base.params
    for key, a in p.arrays.items():
        ref = expected.get(key)
        if ref is None:  # up/KIND/NAME: a statistic of a parameter's shape, or selection's
            parts = key.split("/", 2)
            if len(parts) == 3 and parts[1] == "selection":  # per-sample losses (Oort)
                if a.ndim != 1 or a.dtype.kind != "f" or len(a) > MAX_SELECTION_VALUES:
                    raise RejectedReply(f"the reply's {key!r} is not a list of losses")
                if not np.isfinite(a).all():
                    raise RejectedReply(f"the reply's {key!r} holds non-finite values")
                continue
            ref = params.get(parts[2]) if len(parts) == 3 else None
            if ref is None:
                raise RejectedReply(f"the reply's statistic {key!r} names no parameter")
        if tuple(a.shape) != tuple(ref.shape) or str(a.dtype) != str(ref.dtype).removeprefix(
            "torch."
        ):
            raise RejectedReply(
                f"the reply's {key!r} is {a.dtype}{list(a.shape)}, not "
                f"{str(ref.dtype).removeprefix('torch.')}{list(ref.shape)}"
            )
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise RejectedReply(f"the reply's {key!r} holds non-finite values")
    loss, n = c["train_loss"], c["num_samples"]
    numbers = (loss, c["compute_s"], c["busy_s"])
    if not all(isinstance(x, int | float) and math.isfinite(x) for x in numbers):
        raise RejectedReply("the reply's loss or times are not finite numbers")
    if not isinstance(n, int) or n < 0:
        raise RejectedReply(f"the reply's sample count {n!r} is not a count")
    shape = decode_shape(str(c["shape"]))
    if shape != task.plan.shape:
        sent, d = suffix_depth(task.plan.shape), suffix_depth(shape)
        if sent is None or d is None or d < sent or (max_depth is not None and d > max_depth):
            raise RejectedReply(f"the reply's work {shape.describe()} is not what was sent")

    up = _nested(p, "up/")
    steps = c.get("local_steps", task.plan.local_steps)
    if not isinstance(steps, int) or not 1 <= steps <= task.plan.local_steps:
        raise RejectedReply(f"the reply's {steps!r} local steps are not 1..{task.plan.local_steps}")
    speed = c.get("speed")
    if speed is not None and not (isinstance(speed, int | float) and 0 < speed < math.inf):
        raise RejectedReply(f"the reply's speed {speed!r} is not a positive number")
    return Reply(
        delta=_group(p, "delta/"), buffers=_group(p, "buffer/"), up=up, num_samples=n,
        train_loss=float(loss), shape=shape, compute_s=float(c["compute_s"]),
        busy_s=float(c["busy_s"]), speed=None if speed is None else float(speed),
        local_steps=steps,
    )  # fmt: skip


def encode_reply(
    task: Task,
    contribution: Any,
    *,
    shape: WorkShape,
    compute_s: float,
    busy_s: float,
    speed: float | None = None,
) -> Payload:
    """A device's reply: Δ, buffers, statistics and what it measured."""
    p = Payload()
    for name, t in contribution.delta.items():
        p.arrays[f"delta/{name}"] = _np(t)
    for name, t in contribution.buffers.items():
        p.arrays[f"buffer/{name}"] = _np(t)
    for kind, tensors in contribution.up.items():
        if not isinstance(tensors, dict):
            continue
        for name, t in tensors.items():
            if isinstance(t, torch.Tensor):
                p.arrays[f"up/{kind}/{name}"] = _np(t)
    p.config.update(
        task_id=task.task_id, version=task.base.version, num_samples=int(contribution.num_samples),
        train_loss=float(contribution.train_loss), shape=encode_shape(shape),
        compute_s=float(compute_s), busy_s=float(busy_s), local_steps=task.plan.local_steps,
    )  # fmt: skip
    if speed is not None:
        p.config["speed"] = float(speed)
    return p
