"""Building the executor a run needs from what its strategy declares (:class:`Needs`) and the
local training (:class:`LocalTraining`) — kept apart from the executors themselves, so that
``executor`` and ``vectorized`` do not import each other, and so that ``run_experiment``
never inspects a strategy."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from fedclock.models.shapes import WorkShape
from fedclock.train.executor import ClientData, SerialExecutor
from fedclock.train.local import LocalTraining, Needs
from fedclock.train.partial import PartialExecutor
from fedclock.train.vectorized import VectorizedExecutor, unsupported_model_reason

log = logging.getLogger(__name__)

KINDS = ("auto", "serial", "vectorized")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from fedclock.errors import ConfigError

        raise ConfigError(
            "executor.device is 'cuda' but no CUDA device is available; use 'cpu' or 'auto'."
        )
    return torch.device(name)


def make_vectorized_or_serial(
    model: nn.Module,
    data: ClientData,
    *,
    seed: int,
    local: LocalTraining,
    device: torch.device,
    max_batch_clients: int | None = None,
    delta_views: bool = False,
) -> VectorizedExecutor | SerialExecutor:
    """A :class:`VectorizedExecutor` if the model allows it, else a serial one (logged once)."""
    reason = unsupported_model_reason(model)
    kwargs: dict[str, Any] = dict(
        seed=seed, lr=local.lr, momentum=local.momentum, weight_decay=local.weight_decay,
        device=device, loss=local.loss, proximal_mu=local.proximal_mu,
    )  # fmt: skip
    if reason is not None:
        log.info("vectorized executor unavailable (%s); using the serial executor", reason)
        return SerialExecutor(model, data, **kwargs)
    return VectorizedExecutor(
        model, data, max_batch_clients=max_batch_clients, delta_views=delta_views, **kwargs
    )


def make_executor(
    needs: Needs,
    model: nn.Module,
    data: ClientData,
    *,
    seed: int,
    local: LocalTraining,
    kind: str = "auto",
    device: str = "cpu",
    max_batch_clients: int | None = None,
) -> SerialExecutor | VectorizedExecutor | PartialExecutor:
    """The executor for a strategy that declares ``needs``.

    Full-model work: ``serial`` runs one task after another; ``vectorized`` and ``auto`` (the
    default) a :class:`VectorizedExecutor`, which runs serially (logged once) what it cannot
    batch. Partial work (layer suffixes, width slices, per-client momentum): a
    :class:`PartialExecutor`, vectorized unless ``kind`` is ``serial``.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown executor {kind!r}; allowed: {', '.join(KINDS)}")
    if needs.proximal_mu:  # the strategy's local objective (FedProx)
        local = replace(local, proximal_mu=needs.proximal_mu)
    dev = resolve_device(device)
    # a shape runs where it says what trains and is sent (WorkShape.program)
    unknown = {t for t in needs.shapes if t._program is WorkShape._program}
    if unknown:
        names = ", ".join(sorted(t.__name__ for t in unknown))
        raise ValueError(f"no executor runs the work shapes {names} yet")
    if not needs.partial:
        if kind == "serial":
            return SerialExecutor(
                model, data, seed=seed, lr=local.lr, momentum=local.momentum,
                weight_decay=local.weight_decay, device=dev, loss=local.loss,
                proximal_mu=local.proximal_mu,
            )  # fmt: skip
        return make_vectorized_or_serial(
            model, data, seed=seed, local=local, device=dev,
            max_batch_clients=max_batch_clients, delta_views=needs.synchronous,
        )  # fmt: skip
    if needs.layout is None:
        raise ValueError("partial work needs the model's layout (Needs.layout)")
    return PartialExecutor(
        model, data, seed=seed, lr=local.lr, momentum=local.momentum,
        weight_decay=local.weight_decay, device=dev,
        mode="reference" if needs.suffix_trains_fully else "paper",
        units=needs.layout.units, persistent_momentum=needs.momentum_per_client,
        vectorize=kind != "serial", max_batch_clients=max_batch_clients, loss=local.loss,
        proximal_mu=local.proximal_mu,
    )  # fmt: skip
