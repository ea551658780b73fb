"""The client side of a strategy, as data: what a task carries down, what a client keeps.

A :class:`ClientRule` is the optional fourth part of a :class:`~fedclock.strategies.base.Strategy`
(docs/architecture.md, "Client update"):

- its ``terms`` are the local objective's gradient terms
  (:class:`~fedclock.train.local.GradientTerm`) that both executors add to every local step;
- ``down(task)`` gives the tensors a task carries down with the model
  (:attr:`Task.down <fedclock.sim.types.Task.down>`), attached when the task is dispatched;
- ``on_commit(contributions)`` updates what the rule keeps — each client's tensors in a
  :class:`ClientState` and any server-side state — once the server step used them.

Everything a rule keeps is checkpointed like any other part (``checkpoint_fields``), so a run
that is killed and resumed continues with the same per-client state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

import torch

from fedclock.sim.types import Contribution, Params, Task
from fedclock.train.local import GradientTerm


class ClientRule(Protocol):
    """The client side of a strategy (see the module doc)."""

    terms: tuple[GradientTerm, ...]

    def down(self, task: Task) -> dict[str, Params]: ...

    def on_commit(self, contributions: Sequence[Contribution]) -> None: ...


class ClientState:
    """Tensors kept per client between its tasks: ``client → key → parameter name → tensor``
    (SCAFFOLD's control variate c_i, FedDyn's ∇L_i(θ_i)). A client never seen holds zeros
    (:meth:`get` with ``like``). Checkpointed; only the clients that have state take memory.

    ``momentum`` (``client → parameter name → buffer``) is the local optimizer's momentum of
    each client under ``Needs.momentum_per_client`` (SALF's and CIS's reference modes: the
    authors' one optimizer per user): the executors read and write it in place, the strategy
    owns it (``Strategy.client_state``)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ("store", "momentum")

    def __init__(self) -> None:
        self.store: dict[int, dict[str, Params]] = {}
        self.momentum: dict[int, Params] = {}

    def get(self, client: int, key: str, like: Params) -> Params:
        """The client's ``key`` tensors, or zeros shaped like ``like`` if it has none yet."""
        got = self.store.get(client, {}).get(key)
        if got is None:
            return {n: torch.zeros_like(v) for n, v in like.items()}
        return got

    def set(self, client: int, key: str, tensors: Params) -> None:
        self.store.setdefault(client, {})[key] = tensors

    def __len__(self) -> int:
        return len(self.store)
