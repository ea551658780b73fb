"""Checkpoints: a run's whole state as plain data, written atomically, loaded without pickle code.

What a run holds between two events — the simulator (clock, event heap, tasks in flight and
their base model versions, results computed ahead, counters, the evaluations so far), the
strategy's parts (rounds, buffers, update counts, random streams, server optimizer state),
the strategy's per-client state (``ClientState``: momentum buffers, control variates) and the evaluator's best-validation record — is turned
into dicts, lists, tuples, numbers, strings and tensors only, so the file loads with
``torch.load(weights_only=True)``: nothing in it can run code. The file is one header line
(``fedclock-checkpoint <format> sha256:<digest>``) and then the ``torch.save`` bytes, whose
SHA-256 is checked before anything is loaded: a changed bit anywhere is refused.

Which attributes are state is declared, not guessed: a class whose instances hold run state
lists them in ``checkpoint_fields`` (or defines ``checkpoint_state`` / ``restore_state``), and
its attributes that are themselves such components are walked into (``checkpoint_skip``
names lazily built ones to leave out). Everything else is rebuilt from the config on resume,
exactly as it was built at the start. Shared objects stay shared: every model version, task
and contribution is stored once and referred to by index, and dicts and lists are restored
in place (Fed-RAA's update counts are one list held by its planner and its aggregator).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import io
import json
import math
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedclock.devices.cost import SplitExchange, TaskCost, TaskTiming
from fedclock.errors import CheckpointError
from fedclock.models.shapes import (
    FULL,
    Exit,
    Fragment,
    Full,
    Mask,
    Neurons,
    OrderedDropout,
    Split,
    Suffix,
    Width,
)
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan

FORMAT = 3
CHECKPOINT_FILE = "checkpoint.pt"
#: the first line of a checkpoint: this, the format, then ``sha256:<hex digest of the rest>``
MAGIC = b"fedclock-checkpoint"


# value types stored field by field (frozen dataclasses and named tuples of plain data)
_VALUE_TYPES: dict[str, type] = {}


def register_value_type(cls: type) -> type:
    """Admit ``cls`` (a dataclass or named tuple of storable values) into checkpoints."""
    _VALUE_TYPES[cls.__name__] = cls
    return cls


_VALUES = (TaskPlan, TaskCost, TaskTiming, SplitExchange,
           Full, Suffix, Width, Fragment, Neurons, OrderedDropout, Exit, Mask, Split)  # fmt: skip
for _cls in _VALUES:
    register_value_type(_cls)


def is_component(obj: object) -> bool:
    t = type(obj)
    return hasattr(t, "checkpoint_fields") or hasattr(t, "checkpoint_state")


def components(root: object) -> Iterator[tuple[str, object]]:
    """``(path, component)`` for ``root`` and every component reachable from it through
    attributes, depth first in attribute order, each shared component once."""
    seen: set[int] = set()

    def walk(obj: object, path: str) -> Iterator[tuple[str, object]]:
        seen.add(id(obj))
        yield path, obj
        skip = getattr(type(obj), "checkpoint_skip", ())
        for name, value in vars(obj).items():
            if name in skip or id(value) in seen:
                continue
            if is_component(value):
                yield from walk(value, f"{path}.{name}")
            elif isinstance(value, list) and name == "observers":  # the simulator's
                # (keyed by class, not position: a resume may add or drop a stateless one)
                counts: dict[str, int] = {}
                for v in value:
                    if is_component(v) and id(v) not in seen:
                        key = type(v).__name__
                        counts[key] = counts.get(key, 0) + 1
                        yield from walk(v, f"{path}.{name}.{key}{counts[key]}")

    yield from walk(root, "")


def _tensor_tree(tree: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, torch.Tensor]]:
    """A task's ``down`` or a contribution's ``up`` (kind → parameter name → tensor): stored
    as it is, whatever its keys (one encoder for every strategy's tensors)."""
    return {kind: dict(tensors) for kind, tensors in tree.items()}


class _Encoder:
    """Objects → plain data; model versions, tasks and contributions go to shared tables."""

    def __init__(self) -> None:
        self.versions: list[dict[str, Any]] = []
        self.tasks: list[dict[str, Any]] = []
        self.contributions: list[dict[str, Any]] = []
        self._index: dict[int, int] = {}  # id(object) → its table row
        self._keep: list[object] = []  # keeps encoded objects alive while ids are in use

    def _ref(self, obj: object, table: list[dict[str, Any]], make: Any) -> int:
        i = self._index.get(id(obj))
        if i is None:
            i = self._index[id(obj)] = len(table)
            self._keep.append(obj)
            table.append({})  # reserved first: the row's own encoding may refer to others
            table[i] = make(obj)
        return i

    def __call__(self, v: Any) -> Any:
        if isinstance(v, np.generic):  # (np.float64 is a float: tested first)
            return {"$": "np", "dtype": str(v.dtype), "v": v.item()}
        if v is None or isinstance(v, bool | int | float | str | torch.Tensor):
            return v
        if isinstance(v, list):
            return [self(x) for x in v]
        if isinstance(v, dict):
            if "$" in v:
                raise CheckpointError("a dict with the key '$' cannot be checkpointed.")
            return {self(k): self(x) for k, x in v.items()}
        if isinstance(v, ModelVersion):
            return {"$": "version", "i": self._ref(v, self.versions, self._version)}
        if isinstance(v, Task):
            return {"$": "task", "i": self._ref(v, self.tasks, self._task)}
        if isinstance(v, Contribution):
            return {"$": "contribution", "i": self._ref(v, self.contributions, self._contrib)}
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                raise CheckpointError("an object array cannot be checkpointed.")
            return {"$": "ndarray", "v": torch.from_numpy(np.array(v, copy=True))}
        if isinstance(v, np.random.Generator):
            bit = v.bit_generator
            return {"$": "rng", "bit": type(bit).__name__, "state": json.dumps(bit.state)}
        if isinstance(v, enum.Enum):
            return v.value
        name = type(v).__name__
        if _VALUE_TYPES.get(name) is type(v):
            if dataclasses.is_dataclass(v):
                values = {f.name: self(getattr(v, f.name)) for f in dataclasses.fields(v)}
            else:  # a named tuple
                values = {f: self(getattr(v, f)) for f in v._fields}  # type: ignore[attr-defined]
            return {"$": "value", "type": name, "f": values}
        if isinstance(v, tuple):
            return tuple(self(x) for x in v)
        if isinstance(v, set | frozenset):
            return {"$": type(v).__name__, "v": [self(x) for x in sorted(v)]}
        raise CheckpointError(f"a {type(v).__qualname__} cannot be checkpointed.")

    def _version(self, m: ModelVersion) -> dict[str, Any]:
        return {"version": m.version, "params": dict(m.params), "buffers": dict(m.buffers)}

    def _task(self, t: Task) -> dict[str, Any]:
        return {
            "task_id": t.task_id, "client": t.client, "k": t.k, "base": self(t.base),
            "plan": self(t.plan), "cost": self(t.cost), "timing": self(t.timing),
            "t_start": t.t_start, "execute": t.execute, "cancelled": t.cancelled,
            "repeat": t.repeat, "down": _tensor_tree(t.down),
        }  # fmt: skip

    def _contrib(self, c: Contribution) -> dict[str, Any]:
        return {
            "task": self(c.task), "delta": dict(c.delta), "buffers": dict(c.buffers),
            "num_samples": c.num_samples, "train_loss": c.train_loss, "weight": c.weight,
            "coverage": None if c.coverage is None else self(dict(c.coverage)),
            "up": _tensor_tree(c.up),
        }  # fmt: skip


class _Decoder:
    def __init__(self, tables: dict[str, list[dict[str, Any]]]) -> None:
        self._tables = tables
        self._made: dict[tuple[str, int], Any] = {}

    def _row(self, kind: str, i: int) -> Any:
        key = (kind, i)
        if key not in self._made:
            row = self._tables[kind][i]
            if kind == "versions":
                self._made[key] = ModelVersion(row["version"], row["params"], row["buffers"])
            elif kind == "tasks":
                t = Task(
                    row["task_id"], row["client"], row["k"], self(row["base"]), self(row["plan"]),
                    self(row["cost"]), self(row["timing"]), row["t_start"], row["execute"],
                    row["cancelled"], row["repeat"], row["down"],
                )  # fmt: skip
                self._made[key] = t
            else:
                self._made[key] = Contribution(
                    self(row["task"]), row["delta"], row["buffers"], row["num_samples"],
                    row["train_loss"], row["weight"], self(row["coverage"]), row["up"],
                )  # fmt: skip
        return self._made[key]

    def __call__(self, v: Any) -> Any:
        if isinstance(v, list):
            return [self(x) for x in v]
        if isinstance(v, tuple):
            return tuple(self(x) for x in v)
        if not isinstance(v, dict):
            return v
        kind = v.get("$")
        if kind is None:
            return {self(k): self(x) for k, x in v.items()}
        if kind == "version":
            return self._row("versions", v["i"])
        if kind == "task":
            return self._row("tasks", v["i"])
        if kind == "contribution":
            return self._row("contributions", v["i"])
        if kind == "ndarray":
            return v["v"].numpy().copy()
        if kind == "np":
            return np.dtype(v["dtype"]).type(v["v"])
        if kind == "rng":
            bit = getattr(np.random, v["bit"])()
            bit.state = json.loads(v["state"])
            return np.random.Generator(bit)
        if kind in ("set", "frozenset"):
            return (set if kind == "set" else frozenset)(self(x) for x in v["v"])
        if kind == "value":
            cls = _VALUE_TYPES.get(v["type"])
            if cls is None:
                raise CheckpointError(f"the checkpoint holds an unknown type {v['type']!r}.")
            if cls is Full:
                return FULL  # the singleton: strategies test ``shape is FULL``
            fields = {k: self(x) for k, x in v["f"].items()}
            return cls(**fields)
        raise CheckpointError(f"the checkpoint holds an unknown entry {kind!r}.")


def _assign(obj: object, name: str, value: Any) -> None:
    """Set an attribute; a dict or list already there is filled in place (it may be shared)."""
    current = getattr(obj, name, None)
    if type(current) is dict and type(value) is dict:
        current.clear()
        current.update(value)
    elif type(current) is list and type(value) is list:
        current[:] = value
    else:
        setattr(obj, name, value)


def capture(root: object) -> dict[str, Any]:
    """The state of ``root`` and every component under it, as plain data."""
    enc = _Encoder()
    state: dict[str, Any] = {}
    for path, comp in components(root):
        entry: dict[str, Any] = {}
        custom = getattr(comp, "checkpoint_state", None)
        if custom is not None:
            entry["custom"] = enc(custom())
        for name in getattr(type(comp), "checkpoint_fields", ()):
            entry[name] = enc(getattr(comp, name))
        state[path] = {"type": type(comp).__qualname__, "state": entry}
    return {
        "components": state,
        "versions": enc.versions,
        "tasks": enc.tasks,
        "contributions": enc.contributions,
    }


def restore(root: object, data: dict[str, Any]) -> None:
    """Put the state ``capture`` took back into ``root``, a freshly built equal object graph."""
    dec = _Decoder({k: data[k] for k in ("versions", "tasks", "contributions")})
    stored: dict[str, Any] = data["components"]
    found = dict(components(root))
    if set(found) != set(stored):
        missing = sorted(set(stored) ^ set(found))
        raise CheckpointError(
            f"the checkpoint does not fit this run's parts (differing: {', '.join(missing)})."
        )
    for path, comp in found.items():
        entry = stored[path]
        if entry["type"] != type(comp).__qualname__:
            raise CheckpointError(
                f"the checkpoint holds a {entry['type']} where this run has a "
                f"{type(comp).__qualname__}."
            )
        fields = dict(entry["state"])
        custom = fields.pop("custom", None)
        for name, value in fields.items():
            _assign(comp, name, dec(value))
        if custom is not None:
            comp.restore_state(dec(custom))  # type: ignore[attr-defined]


def encode(payload: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint file: the header line with the digest, then the payload."""
    buf = io.BytesIO()
    torch.save(payload, buf)
    body = buf.getvalue()
    digest = hashlib.sha256(body).hexdigest()
    return b"%s %d sha256:%s\n" % (MAGIC, FORMAT, digest.encode()) + body


def write_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """The checkpoint (:func:`encode`) written whole or not at all
    (:func:`fedclock.outputs.write_atomic`: a temporary file, fsync, rename); a failed write
    is one sentence naming it."""
    from fedclock.outputs import write_atomic

    try:
        write_atomic(path, encode(payload))
    except OSError as exc:
        raise CheckpointError(f"Could not write the checkpoint {path}: {_reason(exc)}.") from None


def _reason(exc: BaseException) -> str:
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else "the write failed"
    return text[0].lower() + text[1:]


def read(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Check a checkpoint's digest, then load it with ``weights_only=True``; one sentence if
    it is damaged or not a checkpoint."""
    start_over = "run it again without --resume to start over"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(
            f"Could not read the checkpoint {path}: {_reason(exc)}; {start_over}."
        ) from None
    head, newline, body = data.partition(b"\n")
    parts = head.split(b" ")
    if not newline or len(parts) != 3 or parts[0] != MAGIC or not parts[2].startswith(b"sha256:"):
        raise CheckpointError(
            f"{path} is not a fedclock checkpoint of format {FORMAT} (it is damaged or was "
            f"made by another version); {start_over}."
        )
    if parts[1] != str(FORMAT).encode():
        raise CheckpointError(
            f"{path} is a checkpoint of another format than {FORMAT} (made by another fedclock "
            f"version); {start_over}."
        )
    if hashlib.sha256(body).hexdigest().encode() != parts[2][len(b"sha256:") :]:
        raise CheckpointError(
            f"The checkpoint {path} is damaged (its contents do not match the digest written "
            f"with it); {start_over}."
        )
    try:
        payload = torch.load(io.BytesIO(body), map_location=map_location, weights_only=True)
    except Exception as exc:  # a pickle with code, not a torch file (with a matching digest)
        raise CheckpointError(
            f"Could not read the checkpoint {path}: it is damaged or not a fedclock checkpoint "
            f"({type(exc).__name__}); {start_over}."
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a fedclock checkpoint of format {FORMAT}.")
    return payload


class Checkpointer:
    """Writes the run's checkpoint between two events: every ``every_aggregations`` server
    steps, every ``every_seconds`` of wall time, and when Ctrl-C asked the run to stop
    (:meth:`interrupt`; the run then stops with ``KeyboardInterrupt`` right after writing).

    An observer called after every event (``on_event``); ``header`` goes into every file
    (format, versions, digests), with the number of metrics.csv rows the state covers.
    """

    def __init__(
        self,
        path: Path,
        header: dict[str, Any],
        *,
        every_aggregations: int | None,
        every_seconds: float | None,
    ) -> None:
        self.path = path
        self.header = header
        self.every_aggregations = every_aggregations
        self.every_seconds = every_seconds
        self.interrupted = False
        self.saves = 0
        self._next_aggregation: int | None = None
        self._next_wall = math.inf if every_seconds is None else time.monotonic() + every_seconds

    def interrupt(self) -> None:
        self.interrupted = True

    def on_event(self, sim: Any) -> None:
        if sim.stop_reason is not None:  # the run is ending: nothing left to resume
            return
        aggregations = sim.counters.aggregations
        if self.every_aggregations is not None and self._next_aggregation is None:
            self._next_aggregation = aggregations + self.every_aggregations
        due = self.interrupted or time.monotonic() >= self._next_wall
        if self._next_aggregation is not None and aggregations >= self._next_aggregation:
            due = True
        if not due:
            return
        self.save(sim)
        if self.interrupted:
            raise KeyboardInterrupt

    def save(self, sim: Any) -> None:
        payload = {**self.header, "format": FORMAT, "rows": len(sim.history), "state": capture(sim)}
        write_checkpoint(self.path, payload)
        self.saves += 1
        if self.every_aggregations is not None:
            self._next_aggregation = sim.counters.aggregations + self.every_aggregations
        if self.every_seconds is not None:
            self._next_wall = time.monotonic() + self.every_seconds


@contextlib.contextmanager
def stop_on_sigint(checkpointer: Checkpointer | None) -> Iterator[None]:
    """Ctrl-C asks ``checkpointer`` to write a checkpoint and stop at the next event; a
    second Ctrl-C stops at once. Without a checkpointer (or off the main thread) Ctrl-C
    keeps its usual effect."""
    if checkpointer is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, previous)  # a second Ctrl-C: at once
        checkpointer.interrupt()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
