"""The server step: a torch optimizer over the aggregated update (as FLSim does).

An aggregator forms the update Δ = Σ_i ω_i Δ_i; the server treats −Δ as the gradient of
its model and takes one optimizer step (Reddi et al., "Adaptive Federated Optimization",
Alg. 2, with ServerOpt = SGD, SGD with momentum, or Adam):

- ``sgd`` (FedAvg's θ ← θ + η_g Δ; FedAvgM with ``momentum`` β: v ← β v + Δ,
  θ ← θ + η_g v);
- ``adam`` (FedAdam): m ← β₁ m + (1 − β₁) Δ, v ← β₂ v + (1 − β₂) Δ², θ ← θ + η_g m̂ / (√v̂ + τ)
  with torch's bias correction m̂, v̂ (Reddi et al. omit it; FLSim keeps torch's Adam).

The optimizer's state (momentum, moments) persists across aggregations. Model versions stay
immutable: the step runs on the server's own tensors and the new version gets copies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fedclock.sim.types import Params

SERVER_OPTIMIZERS = ("sgd", "adam")


class ServerOptimizer:
    """θ_new = one ``kind`` step from θ with gradient −Δ (see the module doc)."""

    def __init__(
        self,
        kind: str = "sgd",
        *,
        lr: float = 1.0,
        momentum: float = 0.0,
        beta2: float = 0.99,
        eps: float = 1e-3,
    ) -> None:
        if kind not in SERVER_OPTIMIZERS:
            raise ValueError(
                f"unknown server optimizer {kind!r}; allowed: {', '.join(SERVER_OPTIMIZERS)}"
            )
        self.kind, self.lr, self.momentum, self.beta2, self.eps = kind, lr, momentum, beta2, eps
        self._params: list[torch.Tensor] | None = None
        self._names: list[str] = []
        self._opt: torch.optim.Optimizer | None = None

    def _build(self, names: list[str], params: list[torch.Tensor]) -> None:
        self._names = names
        self._params = [p.detach().clone() for p in params]
        if self.kind == "sgd":
            self._opt = torch.optim.SGD(self._params, lr=self.lr, momentum=self.momentum)
        else:
            self._opt = torch.optim.Adam(
                self._params, lr=self.lr, betas=(self.momentum, self.beta2), eps=self.eps
            )

    # the optimizer's state for checkpoints (fedclock.sim.checkpoint)
    def checkpoint_state(self) -> dict[str, Any]:
        if self._opt is None:
            return {"names": None}
        assert self._params is not None
        return {"names": self._names, "params": self._params, "opt": self._opt.state_dict()}

    def restore_state(self, state: dict[str, Any]) -> None:
        if state["names"] is None:
            self._opt, self._params, self._names = None, None, []
            return
        self._build(list(state["names"]), list(state["params"]))
        assert self._opt is not None
        self._opt.load_state_dict(state["opt"])

    @property
    def stateless(self) -> bool:
        """Plain SGD: θ + η_g Δ needs no optimizer state."""
        return self.kind == "sgd" and self.momentum == 0.0

    def step(
        self, params: Mapping[str, torch.Tensor], update: Mapping[str, torch.Tensor]
    ) -> Params:
        names = list(params)
        old = [params[n] for n in names]
        upd = [update[n] for n in names]
        if not names:
            return {}
        if self.stateless:
            # torch.optim.SGD's step θ.add_(−Δ, alpha=−η_g) is θ + η_g·Δ in one fused add:
            # the same numbers, without copying θ into the optimizer and back
            return dict(zip(names, torch._foreach_add(old, upd, alpha=self.lr), strict=True))
        if self._opt is None:
            self._build(names, old)
        assert self._params is not None and self._opt is not None
        if names != self._names:
            raise ValueError("the server optimizer's parameters changed between aggregations")
        with torch.no_grad():
            torch._foreach_copy_(self._params, old)
            for p, d in zip(self._params, upd, strict=True):
                p.grad = torch.neg(d)
        self._opt.step()
        for p in self._params:
            p.grad = None
        return {n: p.detach().clone() for n, p in zip(names, self._params, strict=True)}


def server_optimizer(options: object, *, lr: float) -> ServerOptimizer:
    """The server step a strategy's options ask for (``strategy.server_optimizer``,
    ``server_momentum``, ``server_beta2``, ``server_eps``) with learning rate η_g = ``lr``."""
    return ServerOptimizer(
        options.server_optimizer,  # type: ignore[attr-defined]
        lr=lr,
        momentum=options.server_momentum,  # type: ignore[attr-defined]
        beta2=options.server_beta2,  # type: ignore[attr-defined]
        eps=options.server_eps,  # type: ignore[attr-defined]
    )
