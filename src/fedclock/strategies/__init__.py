"""Strategies as Planner × Trigger × Aggregator, and the named presets built from them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedclock.strategies.aggregators import FedAvgAggregator, fedavg_weights
from fedclock.strategies.base import BuildInfo, Strategy
from fedclock.strategies.planners import LocalSGDPlanner, local_sgd_plan
from fedclock.strategies.triggers import SyncRounds, select_clients

if TYPE_CHECKING:
    from fedclock.config import ExperimentConfig


@dataclass(frozen=True)
class StrategySpec:
    name: str
    summary: str
    build: Callable[[ExperimentConfig, BuildInfo], Strategy]


def _local_sgd(cfg: ExperimentConfig, info: BuildInfo) -> LocalSGDPlanner:
    return LocalSGDPlanner(
        client_sizes=info.client_sizes,
        batch_size=cfg.train.batch_size,
        local_epochs=cfg.train.local_epochs,
        local_steps=cfg.train.local_steps,
        flops_per_sample=sum(info.layer_fwd_flops) + sum(info.layer_bwd_flops),
        model_bytes=info.model_bytes,
    )


def _fedavg(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    s = cfg.strategy
    return Strategy(
        name="fedavg",
        planner=_local_sgd(cfg, info),
        trigger=SyncRounds(client_fraction=s.client_fraction),
        aggregator=FedAvgAggregator(weights=s.weights, server_lr=s.server_lr),
    )


def _drop_stragglers(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    s = cfg.strategy
    if s.t_max is None:
        from fedclock.errors import ConfigError

        raise ConfigError(
            "Strategy 'drop-stragglers' needs a deadline: set strategy.t_max (virtual seconds)."
        )
    return Strategy(
        name="drop-stragglers",
        planner=_local_sgd(cfg, info),
        trigger=SyncRounds(client_fraction=s.client_fraction, t_max=s.t_max),
        aggregator=FedAvgAggregator(weights=s.weights, server_lr=s.server_lr),
    )


STRATEGIES: dict[str, StrategySpec] = {
    spec.name: spec
    for spec in [
        StrategySpec(
            "fedavg",
            "synchronous FedAvg: barrier rounds over a fraction C of clients, sample-weighted average",
            _fedavg,
        ),
        StrategySpec(
            "drop-stragglers",
            "FedAvg under a deadline t_max: updates not arrived by the deadline are discarded",
            _drop_stragglers,
        ),
    ]
}


def build_strategy(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    return STRATEGIES[cfg.strategy.name].build(cfg, info)


__all__ = [
    "STRATEGIES",
    "BuildInfo",
    "FedAvgAggregator",
    "LocalSGDPlanner",
    "Strategy",
    "StrategySpec",
    "SyncRounds",
    "build_strategy",
    "fedavg_weights",
    "local_sgd_plan",
    "select_clients",
]
