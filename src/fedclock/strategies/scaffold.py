"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020), Algorithm 1 with option II control variates; docs/methods/scaffold.md.

Each round the server sends the model x and its control variate c; client i runs K local
steps of

    y ← y − η_l (g_i(y) − c_i + c)                                   (Alg. 1, line 10)

and updates its own control variate by option II,

    c_i⁺ = c_i − c + (x − y_i) / (K η_l)                              (line 12, II)

sending Δy_i = y_i − x and Δc_i = c_i⁺ − c_i. The server takes

    x ← x + η_g · Σ_i p_i Δy_i,   c ← c + (1/N) Σ_{i∈S} Δc_i           (lines 16–17)

with p_i the run's client importance (uniform 1/|S| in the paper; ∝ n_i by default here,
equal for equal client sizes) and N the number of clients.

As data: the correction c − c_i goes down with each task (``Task.down["control"]``), the
local objective's :class:`~fedclock.train.local.Linear` term adds it to every step, and
c_i lives in the rule's :class:`~fedclock.strategies.client.ClientState`. Since
c_i⁺ = −(c − c_i) − Δy_i / (K η_l) depends only on what the task carried down and on Δy_i,
the rule computes it when the update is committed; a client computes the same numbers.
Twice the model travels each way (x and c down, Δy_i and Δc_i up).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import torch

from fedclock.config import ScaffoldOptions
from fedclock.sim.types import Contribution, Params, Task
from fedclock.strategies.aggregators import Importance, Update
from fedclock.strategies.base import BuildInfo, Strategy
from fedclock.strategies.client import ClientState
from fedclock.strategies.planners import local_sgd_planner
from fedclock.strategies.server import server_optimizer
from fedclock.strategies.triggers import SyncRounds
from fedclock.train.local import GradientTerm, Linear, Needs

if TYPE_CHECKING:
    from fedclock.config import ExperimentConfig

#: the Task.down key of the correction c − c_i
CONTROL = "control"


class ScaffoldRule:
    """SCAFFOLD's client side: c − c_i down, option II's c_i⁺ and the server's c on commit."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ("c",)

    def __init__(self, *, num_clients: int, lr: float) -> None:
        self.terms: tuple[GradientTerm, ...] = (Linear(CONTROL, 1.0),)  # g_i(y) + (c − c_i)
        self.num_clients = num_clients  # N
        self.lr = lr  # η_l before a task's lr_scale
        self.c: Params = {}  # the server's control variate; {} = 0 before the first round
        self.state = ClientState()  # c_i per client ("c_i"), 0 until its first update

    def down(self, task: Task) -> dict[str, Params]:
        base = task.base.params
        c_i = self.state.get(task.client, "c_i", base)
        c = self.c or {n: torch.zeros_like(v) for n, v in base.items()}
        return {CONTROL: {n: c[n] - c_i[n] for n in base}}

    def on_commit(self, contributions: Sequence[Contribution]) -> None:
        if not contributions:
            return
        total: Params | None = None  # Σ_{i∈S} Δc_i
        for con in contributions:
            task = con.task
            steps_lr = task.plan.local_steps * self.lr * task.plan.lr_scale  # K η_l
            sent = task.down[CONTROL]  # c − c_i as the task saw them
            old = self.state.get(task.client, "c_i", con.delta)
            new = {n: -sent[n] - con.delta[n] / steps_lr for n in con.delta}  # option II
            self.state.set(task.client, "c_i", new)
            change = {n: new[n] - old[n] for n in new}
            total = change if total is None else {n: total[n] + change[n] for n in total}
        assert total is not None
        c = self.c or {n: torch.zeros_like(v) for n, v in total.items()}
        self.c = {n: c[n] + total[n] / self.num_clients for n in total}


def build_scaffold(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    """SCAFFOLD: FedAvg's rounds (a fraction C of the clients), server step size η_g
    (``strategy.server_lr``), client step size η_l = ``train.lr``."""
    s = cfg.strategy
    assert isinstance(s, ScaffoldOptions)
    rule = ScaffoldRule(num_clients=len(info.client_sizes), lr=cfg.train.lr)
    planner = local_sgd_planner(cfg, info, copies=2)  # (x, c) down, (Δy_i, Δc_i) up
    return Strategy(
        name="scaffold",
        planner=planner,
        trigger=SyncRounds(client_fraction=s.client_fraction),
        aggregator=Update(
            Importance(s.weights),
            server=server_optimizer(s, lr=s.server_lr),
        ),
        needs=Needs(synchronous=True),
        client_rule=rule,
    )
