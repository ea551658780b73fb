"""Strategies as Planner × Trigger × Aggregator, and the named presets built from them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedclock.config import (
    AsyncFLOptions,
    AsyncIdenticalOptions,
    AsyncTimeBasedOptions,
    CisBalancedOptions,
    CisEqualOptions,
    CisFlopsOptions,
    CisServingOptions,
    DropStragglersOptions,
    FedAsyncOptions,
    FedAvgOptions,
    FedBuffOptions,
    FedDynOptions,
    FedFixOptions,
    FedNovaOptions,
    FedProxOptions,
    FedRAAMPOptions,
    FedRAAOptions,
    FedRAARandomOptions,
    FedRAASyncOptions,
    FedRolexOptions,
    FjordOptions,
    HeteroFLOptions,
    PruneFLOptions,
    RamFedOptions,
    SalfOptions,
    ScaffoldOptions,
    SplitFedOptions,
    StrategyOptions,
    VanillaOptions,
    own_fields,
)
from fedclock.errors import ConfigError
from fedclock.strategies.aggregators import (
    Importance,
    Update,
    client_importance,
    delta,
    mix,
    mix_buffers,
    weighted_sum,
)
from fedclock.strategies.asynchronous import (
    ArrivalBuffer,
    FixedPeriod,
    StalenessWeighting,
    UpdateTimes,
    WeightRule,
    build_async,
)
from fedclock.strategies.base import BuildInfo, Strategy
from fedclock.strategies.cis import build_cis
from fedclock.strategies.feddyn import build_feddyn
from fedclock.strategies.fednova import FedNovaWeighting, normalized_buffers
from fedclock.strategies.fedraa import build_fedraa
from fedclock.strategies.fjord import build_fjord
from fedclock.strategies.planners import LocalSGDPlanner, local_sgd_plan, local_sgd_planner
from fedclock.strategies.prunefl import build_prunefl
from fedclock.strategies.ramfed import build_ramfed
from fedclock.strategies.salf import build_salf_family
from fedclock.strategies.scaffold import build_scaffold
from fedclock.strategies.server import ServerOptimizer, server_optimizer
from fedclock.strategies.splitfed import build_splitfed
from fedclock.strategies.triggers import SyncRounds, select_clients
from fedclock.train.local import Needs

if TYPE_CHECKING:
    from fedclock.config import ExperimentConfig


@dataclass(frozen=True)
class StrategySpec:
    """A named strategy: its options class (the fields it reads, see
    :class:`fedclock.config.StrategyOptions`) and its builder, which gets the config with
    the strategy section validated as those options."""

    name: str
    build: Callable[[ExperimentConfig, BuildInfo], Strategy]
    options: type[StrategyOptions]

    @property
    def summary(self) -> str:
        """One line on what it is (its options class's, so `fedclock strategies` lists the
        strategies from config.py without importing torch)."""
        return self.options.summary

    def reads(self, cfg: ExperimentConfig, path: str) -> bool:
        """Whether this strategy's run on ``cfg`` depends on the config field ``path``."""
        return self.options.reads(cfg, path)


def _local_sgd(cfg: ExperimentConfig, info: BuildInfo) -> LocalSGDPlanner:
    return local_sgd_planner(cfg, info)


def _fedavg(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    s = cfg.strategy
    assert isinstance(s, FedAvgOptions)
    return Strategy(
        name="fedavg",
        planner=_local_sgd(cfg, info),
        trigger=SyncRounds(client_fraction=s.client_fraction),
        aggregator=Update(Importance(s.weights), server=server_optimizer(s, lr=s.server_lr)),
        needs=Needs(synchronous=True),
    )


def _fedprox(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    """FedProx (Li et al., MLSys 2020): FedAvg's rounds and weighted average; each client
    minimises h_k(θ; θ^t) = F_k(θ) + (μ/2)‖θ − θ^t‖² (eq. 2) by local SGD from θ^t."""
    s = cfg.strategy
    assert isinstance(s, FedProxOptions)
    return Strategy(
        name="fedprox",
        planner=_local_sgd(cfg, info),
        trigger=SyncRounds(client_fraction=s.client_fraction),
        aggregator=Update(Importance(s.weights), server=server_optimizer(s, lr=s.server_lr)),
        needs=Needs(synchronous=True, proximal_mu=s.mu),
    )


def _fednova(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    """FedNova (Wang et al. 2020, §4): FedAvg's rounds, the update weighted by
    ω_i = τ_eff · p_i / τ_i (normalized averaging of plain local SGD)."""
    s = cfg.strategy
    assert isinstance(s, FedNovaOptions)
    if cfg.train.momentum:
        raise ConfigError(
            "Strategy 'fednova' normalizes plain local SGD (‖a_i‖₁ = τ_i): set train.momentum: 0."
        )
    return Strategy(
        name="fednova",
        planner=_local_sgd(cfg, info),
        trigger=SyncRounds(client_fraction=s.client_fraction),
        aggregator=Update(
            FedNovaWeighting(s.weights),
            buffers=normalized_buffers,
            server=server_optimizer(s, lr=s.server_lr),
        ),
        needs=Needs(synchronous=True),
    )


def _drop_stragglers(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    s = cfg.strategy
    assert isinstance(s, DropStragglersOptions)
    if cfg.salf.scenario is not None:  # SALF's straggler-ratio / deadline-depth scenarios
        return build_salf_family(cfg, info, "drop-stragglers")
    if s.t_max is None:
        raise ConfigError(
            "Strategy 'drop-stragglers' needs a deadline: set strategy.t_max (virtual seconds)."
        )
    return Strategy(
        name="drop-stragglers",
        planner=_local_sgd(cfg, info),
        trigger=SyncRounds(client_fraction=s.client_fraction, t_max=s.t_max),
        aggregator=Update(Importance(s.weights), server=server_optimizer(s, lr=s.server_lr)),
        needs=Needs(synchronous=True, deadline=s.t_max),
    )


def _salf(name: str) -> Callable[[ExperimentConfig, BuildInfo], Strategy]:
    def build(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
        strategy: Strategy = build_salf_family(cfg, info, name)
        return strategy

    return build


def _async(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    return build_async(cfg, info, _local_sgd(cfg, info))


STRATEGIES: dict[str, StrategySpec] = {
    spec.name: spec
    for spec in [
        StrategySpec("fedavg", _fedavg, FedAvgOptions),
        StrategySpec("fedprox", _fedprox, FedProxOptions),
        StrategySpec("fednova", _fednova, FedNovaOptions),
        StrategySpec("scaffold", build_scaffold, ScaffoldOptions),
        StrategySpec("feddyn", build_feddyn, FedDynOptions),
        StrategySpec("ram-fed", build_ramfed, RamFedOptions),
        StrategySpec("fedrolex", build_ramfed, FedRolexOptions),
        StrategySpec("fjord", build_fjord, FjordOptions),
        StrategySpec("prunefl", build_prunefl, PruneFLOptions),
        StrategySpec("splitfed", build_splitfed, SplitFedOptions),
        StrategySpec("drop-stragglers", _drop_stragglers, DropStragglersOptions),
        StrategySpec("async-identical", _async, AsyncIdenticalOptions),
        StrategySpec("async-time-based", _async, AsyncTimeBasedOptions),
        StrategySpec("fedfix", _async, FedFixOptions),
        StrategySpec("fedbuff", _async, FedBuffOptions),
        StrategySpec("fedasync", _async, FedAsyncOptions),
        StrategySpec("fed-raa", build_fedraa, FedRAAOptions),
        StrategySpec("fed-raa-random", build_fedraa, FedRAARandomOptions),
        StrategySpec("fed-raa-mp", build_fedraa, FedRAAMPOptions),
        StrategySpec("fed-raa-sync", build_fedraa, FedRAASyncOptions),
        StrategySpec("vanilla", _salf("vanilla"), VanillaOptions),
        StrategySpec("salf", _salf("salf"), SalfOptions),
        StrategySpec("heterofl", _salf("heterofl"), HeteroFLOptions),
        StrategySpec("asyncfl", _salf("asyncfl"), AsyncFLOptions),
        StrategySpec("cis-equal", build_cis, CisEqualOptions),
        StrategySpec("cis-flops", build_cis, CisFlopsOptions),
        StrategySpec("cis-serving", build_cis, CisServingOptions),
        StrategySpec("cis-balanced", build_cis, CisBalancedOptions),
    ]
}


def build_strategy(cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    """The strategy ``cfg`` names, built from the fields it reads (those its strategy section
    carries for the other strategies of a comparison left out), with the selection
    ``cfg.selection`` names on its rounds."""
    strategy = STRATEGIES[cfg.strategy.name].build(own_fields(cfg), info)
    if cfg.selection.name != "random" or cfg.selection.over_commit > 1.0:
        strategy = with_selection(strategy, cfg, info)
    return strategy


def with_selection(strategy: Strategy, cfg: ExperimentConfig, info: BuildInfo) -> Strategy:
    """``strategy`` assembled again with the selection of ``cfg.selection`` on its rounds
    (its trigger's ``choose_with``, before any round) and K-of-N rounds with
    ``over_commit``; its contributions then carry the client statistics the selection reads
    (``Needs.statistics``; Oort, TiFL), and REFL's stale-aware update replaces the
    aggregator under a deadline."""
    from dataclasses import replace

    from fedclock.strategies.asynchronous import _AllClients
    from fedclock.strategies.selection import REFL, Oort, Selection, StaleAwareWeighting, TiFL

    sel = cfg.selection
    trigger = strategy.trigger
    if not isinstance(trigger, SyncRounds | _AllClients) or (
        sel.over_commit > 1.0 and not isinstance(trigger, SyncRounds)
    ):
        what = f"selection.name is {sel.name}" if sel.name != "random" else (
            f"selection.over_commit is {sel.over_commit:g}"
        )  # fmt: skip
        raise ConfigError(
            f"{what}, but strategy {strategy.name!r} has no rounds that sample clients."
        )
    planner = strategy.planner
    aggregator, needs, keep_late = strategy.aggregator, strategy.needs, False
    selection: Selection | None = None
    if sel.name == "oort":
        selection = Oort(planner, sizes=info.client_sizes, **{f: getattr(sel, f) for f in sel.OORT})
    elif sel.name == "tifl":
        selection = TiFL(planner, **{f: getattr(sel, f) for f in sel.TIFL})
    elif sel.name == "refl":
        selection = REFL(
            planner, t_max=getattr(trigger, "t_max", None),
            prohibit_reselect=sel.prohibit_reselect,
            availability_probability=sel.availability_probability,
            deadline_alpha=sel.deadline_alpha,
        )  # fmt: skip
        t_max = trigger.t_max if isinstance(trigger, SyncRounds) else None
        if sel.stale_updates and t_max is not None:  # late updates, used stale (SAA)
            agg = strategy.aggregator
            plain = (
                isinstance(agg, Update) and isinstance(agg.weighting, Importance)
                and agg.target is delta and agg.normaliser is weighted_sum
                and strategy.client_rule is None
            )  # fmt: skip
            if not plain:
                raise ConfigError(
                    f"REFL's staleness-aware aggregation averages FedAvg-weighted models, but "
                    f"strategy {strategy.name!r} aggregates otherwise; set "
                    "selection.stale_updates: false (its participant selection alone)."
                )
            assert isinstance(agg, Update) and isinstance(agg.weighting, Importance)
            aggregator = Update(
                StaleAwareWeighting(agg.weighting.scheme, beta=sel.stale_beta,
                                    scale=sel.scale_coff),
                target=mix, buffers=mix_buffers, server=agg.server,
            )  # fmt: skip
            keep_late = True
            # a round's late tasks train on: their updates may not share the block's memory
            needs = replace(needs, synchronous=False)
    if isinstance(trigger, SyncRounds):
        trigger.choose_with(selection, keep_late=keep_late, over_commit=sel.over_commit)
    else:
        trigger.choose_with(selection)
    if selection is not None and selection.reads_statistics:
        needs = replace(needs, statistics=True)
    return replace(strategy, aggregator=aggregator, needs=needs)


__all__ = [
    "STRATEGIES",
    "ArrivalBuffer",
    "BuildInfo",
    "FixedPeriod",
    "Importance",
    "LocalSGDPlanner",
    "ServerOptimizer",
    "StalenessWeighting",
    "Strategy",
    "StrategySpec",
    "SyncRounds",
    "Update",
    "UpdateTimes",
    "WeightRule",
    "build_strategy",
    "client_importance",
    "local_sgd_plan",
    "select_clients",
]
