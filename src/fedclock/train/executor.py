"""Executors: pure functions of (model snapshot, task, client data, random stream) → contribution.

The batch order of a task comes from the stream ``("batches", client, base
version)``, so a task's contribution does not depend on which other tasks ran
before it, nor on the executor that ran it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedclock.rng import torch_generator
from fedclock.sim.types import Contribution, ModelVersion, Params, Task, TaskPlan

if TYPE_CHECKING:
    from fedclock.train.vectorized import VectorizedExecutor


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
        return cls(x=x, y=y, indices=tuple(torch.as_tensor(p, dtype=torch.int64) for p in parts))

    def sizes(self) -> np.ndarray:
        return np.array([len(i) for i in self.indices], dtype=np.int64)


def batch_schedule(plan: TaskPlan, n: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Local positions (0..n−1) of each step's batch: successive shuffles cut into ⌈n/B⌉ batches."""
    b = plan.batch_size
    per_epoch = -(-n // b)
    out: list[torch.Tensor] = []
    perm = torch.empty(0, dtype=torch.int64)
    for s in range(plan.local_steps):
        pos = s % per_epoch
        if pos == 0:
            perm = torch.randperm(n, generator=generator)
        out.append(perm[pos * b : (pos + 1) * b])
    return out


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


class SerialExecutor:
    """Runs tasks one after another on one working copy of the model."""

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
    ) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.data = data
        self.seed = seed
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self._x = data.x.to(self.device)
        self._y = data.y.to(self.device)

    def run(self, tasks: Sequence[Task]) -> list[Contribution]:
        return [self.run_one(t) for t in tasks]

    def run_one(self, task: Task) -> Contribution:
        model = self.model
        load_version(model, task.base)
        model.train()
        opt = torch.optim.SGD(
            model.parameters(), lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )
        idx = self.data.indices[task.client]
        g = torch_generator(self.seed, "batches", task.client, task.base.version)
        total = 0.0
        steps = batch_schedule(task.plan, len(idx), g)
        for local in steps:
            rows = idx[local].to(self.device)
            loss = F.cross_entropy(model(self._x[rows]), self._y[rows])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach())
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


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from fedclock.errors import ConfigError

        raise ConfigError(
            "executor.device is 'cuda' but no CUDA device is available; use 'cpu' or 'auto'."
        )
    return torch.device(name)


def make_executor(
    kind: str,
    model: nn.Module,
    data: ClientData,
    *,
    seed: int,
    train,
    device: str,
    max_batch_clients: int | None = None,
) -> SerialExecutor | VectorizedExecutor:
    """Build the executor named in the config.

    ``serial``: one task after another. ``vectorized`` and ``auto`` (the
    default): :class:`~fedclock.train.vectorized.VectorizedExecutor`, which
    runs tasks serially (logged once) where it cannot batch them.
    """
    from fedclock.train.vectorized import make_vectorized_or_serial

    kwargs: dict[str, Any] = dict(
        seed=seed, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay,
        device=resolve_device(device),
    )  # fmt: skip
    if kind == "serial":
        return SerialExecutor(model, data, **kwargs)
    if kind in ("auto", "vectorized"):
        return make_vectorized_or_serial(model, data, max_batch_clients=max_batch_clients, **kwargs)
    raise ValueError(f"unknown executor {kind!r}; allowed: auto, serial, vectorized")
