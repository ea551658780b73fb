"""Building the executor a run needs from what its strategy declares (:class:`Needs`) and the
local training (:class:`LocalTraining`) — kept apart from the executors themselves, so that
``executor`` and ``vectorized`` do not import each other, and so that ``run_experiment``
never inspects a strategy."""

from __future__ import annotations

import functools
import logging
from dataclasses import replace

import torch
from torch import nn

from fedclock.models.shapes import WorkShape, hidden_modules
from fedclock.train.executor import ClientData, SerialExecutor
from fedclock.train.local import LocalTraining, Needs
from fedclock.train.vectorized import VectorizedExecutor, unsupported_model_reason

log = logging.getLogger(__name__)

KINDS = ("auto", "serial", "vectorized", "ray")


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
    needs: Needs,
    model: nn.Module,
    data: ClientData,
    *,
    seed: int,
    local: LocalTraining,
    kind: str = "auto",
    device: str = "cpu",
    max_batch_clients: int | None = None,
    workers: int | None = None,
    momentum_store: dict[int, dict[str, torch.Tensor]] | None = None,
) -> SerialExecutor | VectorizedExecutor:
    """The executor for a strategy that declares ``needs``: one that runs every work shape
    from its program (``WorkShape.program``), for the ``needs.layout`` of the model.

    ``serial`` runs one task after another; ``vectorized`` and ``auto`` (the default) a
    :class:`VectorizedExecutor` that batches tasks of equal programs and runs serially (logged
    once) what it cannot batch — partial work on a model with buffers runs serially.
    ``momentum_store``: where each client's momentum buffers persist under
    ``needs.momentum_per_client`` (the strategy's ``ClientState.momentum``, checkpointed with
    it; None: a fresh dict, for an executor used alone).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown executor {kind!r}; allowed: {', '.join(KINDS)}")
    if kind == "ray":  # each actor builds the executor `auto` gives (fedclock.train.ray_executor)
        from fedclock.train.ray_executor import RayExecutor

        build = functools.partial(
            make_executor, needs, model, data, seed=seed, local=local, kind="auto",
            device=device, max_batch_clients=max_batch_clients,
        )  # fmt: skip
        return RayExecutor(  # type: ignore[return-value]
            build, workers=workers, momentum_per_client=needs.momentum_per_client
        )
    if needs.proximal_mu:  # the strategy's local objective (FedProx)
        local = replace(local, proximal_mu=needs.proximal_mu)
    if needs.terms:  # its further gradient terms (a client rule's: SCAFFOLD, FedDyn)
        local = replace(local, terms=needs.terms)
    dev = resolve_device(device)
    # a shape runs where it says what trains and is sent (WorkShape.program)
    unknown = {t for t in needs.shapes if t._program is WorkShape._program}
    if unknown:
        names = ", ".join(sorted(t.__name__ for t in unknown))
        raise ValueError(f"no executor runs the work shapes {names} yet")
    if needs.partial and needs.layout is None:
        raise ValueError("partial work needs the model's layout (Needs.layout)")
    serial = SerialExecutor(
        model, data, seed=seed, local=local, device=dev, layout=needs.layout,
        trains_fully=needs.suffix_trains_fully, persistent_momentum=needs.momentum_per_client,
        momentum_store=momentum_store if needs.momentum_per_client else None,
    )  # fmt: skip
    executor: SerialExecutor | VectorizedExecutor = serial
    reason = "serial executor asked for" if kind == "serial" else unsupported_model_reason(model)
    if reason is None and needs.partial and any(True for _ in model.buffers()):
        reason = "partial work on a model with buffers is not batched"
    if reason is None:
        executor = VectorizedExecutor(
            model, data, seed=seed, local=local, device=dev, max_batch_clients=max_batch_clients,
            delta_views=needs.synchronous, layout=needs.layout,
            trains_fully=needs.suffix_trains_fully,
            momentum_store=serial.momentum_store if needs.momentum_per_client else None,
            scaled=hidden_modules(model) if needs.partial else (), serial=serial,
        )  # fmt: skip
    elif kind != "serial":
        log.info("vectorized executor unavailable (%s); using the serial executor", reason)
    if needs.statistics:  # what the client sends up besides Δ (speed-aware selection)
        from fedclock.train.statistics import StatisticsExecutor

        wrapped = StatisticsExecutor(executor, model, data, seed=seed, loss=local.loss, device=dev)
        return wrapped  # type: ignore[return-value]
    return executor
