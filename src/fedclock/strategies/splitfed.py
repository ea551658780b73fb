"""SplitFed (Thapa et al., *SplitFed: When Federated Learning Meets Split Learning*, AAAI
2022), SFL-V1: FedAvg's synchronous rounds whose clients train split (docs/methods/splitfed.md).

Each selected client trains layers 1..cut of the model (its client-side model W^C), and the
main server trains layers cut+1..L (the server-side model W^S) on the client's activations,
batch by batch; in SFL-V1 the main server keeps one copy of W^S per client and trains them
in parallel. After the round the fed server averages the client-side models and the main
server the server-side models, both FedAvg-style (§3, Algorithm 1).

What is simulated and what is computed: the task's duration is the split schedule's
(:class:`~fedclock.models.shapes.Split`, :mod:`fedclock.devices.cost`); its update is
computed on the host as one local SGD of the whole model on the client's batches — the
arithmetic of split training (the client's forward, the server's forward and backward from
the activations, the activations' gradient back through the client's layers) is the chain
rule of that step, so the client-side and the server-side copy end where the whole model
does. Averaging both sides with the same weights p_i is FedAvg of the whole model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from fedclock.config import SplitFedOptions
from fedclock.devices.cost import TaskCost
from fedclock.errors import ConfigError
from fedclock.models.shapes import Layout, Split, UnsupportedShapeError, build_units
from fedclock.sim.types import TaskPlan
from fedclock.strategies.aggregators import Importance, Update
from fedclock.strategies.base import BuildInfo, Strategy
from fedclock.strategies.planners import LocalSGDPlanner
from fedclock.strategies.server import server_optimizer
from fedclock.strategies.triggers import SyncRounds
from fedclock.train.local import Needs

if TYPE_CHECKING:
    from fedclock.config import ExperimentConfig


class SplitPlanner(LocalSGDPlanner):
    """Every client's local SGD (``train``'s epochs or steps, as FedAvg's) as a split task:
    the plan's shape is the :class:`Split`, its cost the split schedule's."""

    def __init__(
        self, *, client_sizes: np.ndarray, batch_size: int, local_epochs: float | None,
        local_steps: int | None, shape: Split, layout: Layout,
    ) -> None:  # fmt: skip
        super().__init__(
            client_sizes=client_sizes, batch_size=batch_size, local_epochs=local_epochs,
            local_steps=local_steps, flops_per_sample=0.0, model_bytes=0,
        )  # fmt: skip
        self.shape, self.layout = shape, layout

    def _priced(self, plan: TaskPlan) -> tuple[TaskPlan, TaskCost]:
        plan = replace(plan, shape=self.shape)
        return plan, self.shape.cost(self.layout, plan.samples)


def split_layout(cfg: ExperimentConfig, info: BuildInfo, cut: int) -> tuple[Split, Layout]:
    """The split after layer ``cut`` and the model's layout (its layers, paper mode); a cut
    the model cannot take is refused in one sentence."""
    if cfg.model.arch in ("ee_cnn", "ee_resnet18"):
        raise ConfigError(
            f"Strategy 'splitfed' splits a feed-forward model; model.arch {cfg.model.arch} is "
            "an early-exit network (its exits cross any cut)."
        )
    layers = info.layers
    if cut >= len(layers):
        raise ConfigError(
            f"strategy.cut = {cut} leaves the server no layer: model {cfg.model.arch} has "
            f"{len(layers)} layers, so cut lies in 1..{len(layers) - 1}."
        )
    labels = 0 if info.train is None else int(info.train[1].element_size())
    shape = Split(cut, label_bytes=labels)
    layout = Layout.of(info.model, build_units(info.model, layers, "paper"), info.model_bytes)
    try:
        shape.check(layout)
    except UnsupportedShapeError as e:
        raise ConfigError(f"Strategy 'splitfed' cannot split this model: {e}") from None
    return shape, layout


def build_splitfed(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    """SplitFed's SFL-V1 (Thapa et al., §3, Algorithm 1): synchronous rounds over a fraction
    C of the clients; each trains split after ``cut`` layers; the client-side and the
    server-side models are averaged with the FedAvg weights p_i (``weights``: n_k/n, the
    paper's Algorithm 1, or uniform, the authors' code) — together, FedAvg of the model."""
    s = cfg.strategy
    assert isinstance(s, SplitFedOptions)
    shape, layout = split_layout(cfg, info, s.cut)
    t = cfg.train
    planner = SplitPlanner(
        client_sizes=info.client_sizes, batch_size=t.batch_size, local_epochs=t.local_epochs,
        local_steps=t.local_steps, shape=shape, layout=layout,
    )  # fmt: skip
    return Strategy(
        name="splitfed",
        planner=planner,
        trigger=SyncRounds(client_fraction=s.client_fraction),
        aggregator=Update(Importance(s.weights), server=server_optimizer(s, lr=s.server_lr)),
        needs=Needs(shapes=frozenset({Split}), layout=layout, synchronous=True),
    )
