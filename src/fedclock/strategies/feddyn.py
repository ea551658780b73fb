"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021),
Algorithm 1; docs/methods/feddyn.md.

Client i, sampled in round t, minimises from θ^{t−1} the dynamically regularised objective

    L_i(θ) − ⟨∇L_i(θ_i^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖²                  (eq. 1 / Alg. 1)

by local SGD (gradient ∇L_i(θ) − ∇L_i(θ_i^{t−1}) + α(θ − θ^{t−1})), then keeps

    ∇L_i(θ_i^t) = ∇L_i(θ_i^{t−1}) − α(θ_i^t − θ^{t−1})                   (Alg. 1)

The server keeps h and steps

    h^t = h^{t−1} − α (1/m) Σ_{i∈P_t} (θ_i^t − θ^{t−1}),
    θ^t = (1/|P_t|) Σ_{i∈P_t} θ_i^t − (1/α) h^t                           (Alg. 1)

with m the number of clients. As data: ∇L_i(θ_i^{t−1}) goes down with each task
(``Task.down["feddyn_grad"]``, 0 before a client's first round) and enters every step through
a :class:`~fedclock.train.local.Linear` term of scale −1; α(θ − θ^{t−1}) is the proximal
term (``Needs.proximal_mu = α``); ∇L_i lives in the rule's
:class:`~fedclock.strategies.client.ClientState`; h in the update's normaliser
(:class:`DynamicCorrection`). The mean over P_t uses the run's client importance p_i
(uniform in the paper; ∝ n_i by default here, equal for equal client sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from fedclock.config import FedDynOptions
from fedclock.sim.types import Contribution, ModelVersion, Params, Task
from fedclock.strategies.aggregators import Importance, Target, Update, weighted_sum
from fedclock.strategies.base import BuildInfo, Strategy
from fedclock.strategies.client import ClientState
from fedclock.strategies.planners import local_sgd_planner
from fedclock.strategies.server import server_optimizer
from fedclock.strategies.triggers import SyncRounds
from fedclock.train.local import GradientTerm, Linear, Needs

if TYPE_CHECKING:
    from fedclock.config import ExperimentConfig

#: the Task.down key of ∇L_i(θ_i^{t−1})
GRAD = "feddyn_grad"


class FedDynRule:
    """FedDyn's client side: ∇L_i(θ_i^{t−1}) down, its update on commit."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (the state is in ``state``)

    def __init__(self, *, alpha: float) -> None:
        self.terms: tuple[GradientTerm, ...] = (Linear(GRAD, -1.0),)  # − ∇L_i(θ_i^{t−1})
        self.alpha = alpha
        self.state = ClientState()

    def down(self, task: Task) -> dict[str, Params]:
        return {GRAD: self.state.get(task.client, GRAD, task.base.params)}

    def on_commit(self, contributions: Sequence[Contribution]) -> None:
        for c in contributions:
            g = c.task.down[GRAD]  # (new tensors: a task in flight keeps what it was sent)
            self.state.set(c.client, GRAD, {n: g[n] - self.alpha * c.delta[n] for n in g})


class DynamicCorrection:
    """FedDyn's server step as a normaliser: Δ = Σ_i ω_i Δ_i − h^t/α after
    h^t = h^{t−1} − α (1/m) Σ_i Δ_i (so θ + Δ = θ^t of Alg. 1 with ω_i = 1/|P_t|)."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ("h",)

    def __init__(self, *, alpha: float, num_clients: int) -> None:
        self.alpha = alpha
        self.num_clients = num_clients  # m
        self.h: Params = {}  # 0 before the first round

    def __call__(
        self, base: ModelVersion, contributions: Sequence[Contribution], w: np.ndarray,
        target: Target,
    ) -> Params:  # fmt: skip
        mean = weighted_sum(base, contributions, w, target)
        ones = np.ones(len(contributions))
        total = weighted_sum(base, contributions, ones, target)  # Σ_{i∈P_t} Δ_i
        h = self.h or {n: torch.zeros_like(v) for n, v in total.items()}
        self.h = {n: h[n] - (self.alpha / self.num_clients) * total[n] for n in total}
        return {n: mean[n] - self.h[n] / self.alpha for n in mean}


def build_feddyn(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    """FedDyn: FedAvg's rounds (a fraction C of the clients), α = ``strategy.feddyn_alpha``."""
    s = cfg.strategy
    assert isinstance(s, FedDynOptions)
    alpha: float = s.feddyn_alpha
    m = len(info.client_sizes)
    planner = local_sgd_planner(cfg, info)  # FedDyn sends what FedAvg sends
    return Strategy(
        name="feddyn",
        planner=planner,
        trigger=SyncRounds(client_fraction=s.client_fraction),
        aggregator=Update(
            Importance(s.weights),
            normaliser=DynamicCorrection(alpha=alpha, num_clients=m),
            server=server_optimizer(s, lr=s.server_lr),
        ),
        needs=Needs(synchronous=True, proximal_mu=alpha),
        client_rule=FedDynRule(alpha=alpha),
    )
