"""Building the executor a run needs (kept apart from the executors themselves, so that
``executor`` and ``vectorized`` do not import each other)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fedclock.train.executor import ClientData, SerialExecutor
from fedclock.train.vectorized import VectorizedExecutor, make_vectorized_or_serial


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
    delta_views: bool = False,
) -> SerialExecutor | VectorizedExecutor:
    """Build the executor named in the config.

    ``serial``: one task after another. ``vectorized`` and ``auto`` (the
    default): :class:`~fedclock.train.vectorized.VectorizedExecutor`, which
    runs tasks serially (logged once) where it cannot batch them.
    """
    kwargs: dict[str, Any] = dict(
        seed=seed, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay,
        device=resolve_device(device),
    )  # fmt: skip
    if kind == "serial":
        return SerialExecutor(model, data, **kwargs)
    if kind in ("auto", "vectorized"):
        return make_vectorized_or_serial(
            model, data, max_batch_clients=max_batch_clients, delta_views=delta_views, **kwargs
        )
    raise ValueError(f"unknown executor {kind!r}; allowed: auto, serial, vectorized")
