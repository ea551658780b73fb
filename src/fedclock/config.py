"""Experiment configuration: a versionable YAML file validated by pydantic.

Every section forbids unknown fields, so a typo fails with one sentence naming
the field and the fields that are allowed. ``docs/config.md`` documents every
field; the defaults below are the documented defaults.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from fedclock.errors import ConfigError, short

#: bounds on sizes that no experiment means: a bigger value is a mistake, refused before
#: anything is allocated (docs/reliability.md)
BIG_WIDTH = 1 << 16  # a layer's width, a dimension, a class count
BIG_COUNT = 1_000_000_000  # samples, steps, aggregations, batch sizes
MAX_CLIENTS = 10_000_000
MAX_THREADS = 4096
MAX_SEED = (1 << 63) - 1
MAX_ELEMENTS = 1 << 31  # values of a synthetic dataset (8 GB as float32)
RESNET18_ENTRIES = 17


MAX_FLOAT = 1e30  # |x| of any number (above it torch's float32 overflows: a mistake)


def _no_huge_floats(model: BaseModel) -> None:
    for name in type(model).model_fields:
        v = getattr(model, name)
        for x in v if isinstance(v, list | tuple) else (v,):
            if isinstance(x, float) and abs(x) > MAX_FLOAT:
                raise ValueError(
                    f"its field {name} = {short(repr(x))} is beyond ±{MAX_FLOAT:g}, larger than "
                    "any setting means"
                )


class _Section(BaseModel):
    # NaN and ±inf are refused in every field (a config that says .inf means a mistake);
    # validators are built at first use (defer_build), so an import builds none of the 60
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, allow_inf_nan=False, defer_build=True
    )

    @model_validator(mode="after")
    def _bounded_floats(self) -> Any:
        _no_huge_floats(self)
        return self


class SyntheticConfig(_Section):
    num_samples: int = Field(2000, ge=10, le=BIG_COUNT)
    num_features: int = Field(20, ge=1, le=BIG_WIDTH)
    num_classes: int = Field(4, ge=2, le=BIG_WIDTH)
    separation: float = Field(2.0, ge=0)
    image_shape: list[int] | None = Field(
        None,
        min_length=1,
        max_length=4,
        description="sample shape, e.g. [3, 32, 32] for CIFAR-shaped runs; replaces num_features",
    )

    @field_validator("image_shape")
    @classmethod
    def _positive_dims(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(not 1 <= d <= BIG_WIDTH for d in v):
            raise ValueError(f"every dimension must be an integer from 1 to {BIG_WIDTH}")
        return v

    @model_validator(mode="after")
    def _fits(self) -> SyntheticConfig:
        per = math.prod(self.image_shape) if self.image_shape else self.num_features
        if self.num_samples * per > MAX_ELEMENTS:
            raise _sentence(
                f"data.synthetic: {self.num_samples} samples of {per} values each are more than "
                f"{MAX_ELEMENTS:.0e} values in all, too many to hold in memory."
            )
        return self


class TextConfig(_Section):
    seq_len: int = Field(80, ge=1, le=BIG_WIDTH, description="characters per input window")
    stride: int = Field(
        20, ge=1, le=BIG_COUNT, description="characters between successive window starts"
    )
    min_samples: int = Field(
        10,
        ge=2,
        le=BIG_COUNT,
        description="speaking roles with fewer windows than this are dropped",
    )


class DataConfig(_Section):
    name: Literal["digits", "mnist", "synthetic", "shakespeare", "cifar10", "cifar100"] = "digits"
    data_dir: str | None = None
    test_fraction: float = Field(0.2, gt=0, lt=1)
    max_train: int | None = Field(None, ge=1, le=BIG_COUNT)
    max_test: int | None = Field(None, ge=1, le=BIG_COUNT)
    synthetic: SyntheticConfig = SyntheticConfig()
    text: TextConfig = TextConfig()
    normalize: Literal["dataset", "authors"] = Field(
        "dataset",
        description="MNIST inputs: the loader's (x−0.1307)/0.3081, or the SALF authors' "
        "(x−0.5)/0.5 (formerly salf.normalize)",
    )


class PartitionConfig(_Section):
    scheme: Literal["iid", "dirichlet", "shards", "natural"] = "iid"
    num_clients: int = Field(20, ge=1, le=MAX_CLIENTS)
    alpha: float = Field(0.5, gt=0)
    shards_per_client: int = Field(2, ge=1, le=BIG_COUNT)
    sizes: Literal["equal", "lognormal", "tree"] = Field(
        "equal",
        description="client data sizes: equal, lognormal, or tree (each layer of the "
        "cis tree holds cis.split of the data, evenly among its nodes)",
    )
    size_sigma: float = Field(1.0, ge=0, le=10)
    min_samples: int = Field(1, ge=1, le=BIG_COUNT)


class ModelConfig(_Section):
    arch: Literal[
        "logreg",
        "mlp",
        "cnn",
        "fraboni_cnn",
        "lstm",
        "vgg11",
        "vgg13",
        "vgg16",
        "vgg19",
        "ee_cnn",
        "ee_resnet18",
    ] = "mlp"
    hidden: list[int] = Field([64], max_length=64)
    channels: list[int] = Field([32, 64], max_length=64)
    kernel_size: int = Field(5, ge=1, le=64)
    fc_hidden: int | None = Field(
        None,
        ge=1,
        le=BIG_WIDTH,
        description="null = the arch's default: cnn 512, fraboni_cnn 64 (256 if >10 classes)",
    )
    padding: Literal["same", "valid"] = "same"
    embed_dim: int = Field(8, ge=1, le=BIG_WIDTH, description="lstm: character embedding width")
    lstm_hidden: int = Field(100, ge=1, le=BIG_WIDTH, description="lstm: units per LSTM layer")
    lstm_layers: int = Field(2, ge=1, le=64, description="lstm: stacked LSTM layers")
    vgg_width: float = Field(
        1.0, gt=0, le=64, description="vgg*: channel multiplier (1 = the paper's)"
    )
    exits: list[int] | None = Field(
        None,
        description="ee_resnet18: the entries (1..17) followed by an exit; null = the paper's "
        "(3, 9, 17 for ≤ 10 classes, else 9, 13, 17)",
    )

    @field_validator("hidden", "channels")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(not 1 <= w <= BIG_WIDTH for w in v):
            raise ValueError(f"every width must be an integer from 1 to {BIG_WIDTH}")
        return v

    @field_validator("exits")
    @classmethod
    def _exit_entries(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (
            not v or any(not 1 <= e <= RESNET18_ENTRIES for e in v) or sorted(set(v)) != v
        ):
            raise ValueError(
                f"give the entries followed by an exit in increasing order, each from 1 to "
                f"{RESNET18_ENTRIES} (ee_resnet18's blocks)"
            )
        return v

    @model_validator(mode="after")
    def _channel_counts(self) -> ModelConfig:
        want = {"cnn": (2, "the CNN has two conv layers"), "ee_cnn": (3, "ee_cnn has three stages")}
        if self.arch in want and len(self.channels) != want[self.arch][0]:
            n, why = want[self.arch]
            raise _sentence(
                f"model.channels: {why}, so give exactly {n} channel counts "
                f"(got {len(self.channels)})."
            )
        return self


class SlowdownConfig(_Section):
    kind: Literal["none", "lognormal", "exponential"] = "none"
    sigma: float = Field(0.5, ge=0, le=10)


class DeviceClassConfig(_Section):
    fraction: float = Field(gt=0, le=1)
    speed: float = Field(gt=0)
    up_bandwidth: float | None = Field(None, gt=0, description="null: population.up_bandwidth")
    down_bandwidth: float | None = Field(None, gt=0, description="null: population.down_bandwidth")


class FaultConfig(_Section):
    """Fault injection (a test bench for ``guard``): faulty clients send corrupted updates."""

    fraction: float = Field(
        0.0, ge=0, le=1, description="share of faulty clients (round(fraction·N), seeded)"
    )
    kind: Literal["nan", "scale"] = Field(
        "nan", description="nan: every element of Δ is NaN; scale: Δ × scale"
    )
    scale: float = Field(1.0e6, gt=0, description="the factor of kind 'scale'")


class PopulationConfig(_Section):
    scenario: Literal["homogeneous", "fx", "classes", "capability", "trace"] = "homogeneous"
    trace: str | None = Field(
        None,
        description="scenario trace: a folder holding a fedclock trace (devices.csv and "
        "optionally availability.csv, docs/traces.md)",
    )
    assign: Literal["permutation", "round_robin"] = Field(
        "permutation",
        description="scenario trace: which device each client gets — permutation (a seeded "
        "shuffle of the devices, client i the i-th, wrapping) or round_robin (client i device "
        "i mod D, FedScale's rule)",
    )
    speed: float = Field(
        1.0e8, gt=0, description="FLOP/s (the slowest device under fx; capability 1's FLOP/s)"
    )
    up_bandwidth: float | None = Field(1.0e6, gt=0, description="bytes/s; null = free")
    down_bandwidth: float | None = Field(1.0e6, gt=0, description="bytes/s; null = free")
    fx_percent: float = Field(80.0, ge=0, lt=100)
    classes: list[DeviceClassConfig] = []
    beta: float = Field(
        0.5, ge=0, le=1, description="capability scenario: share β of 'extremely low' devices"
    )
    capabilities: tuple[float, float] = Field(
        (1.0, 3.0),
        description="capability scenario: capabilities of the 'extremely low' and 'low' "
        "devices (Fed-RAA: 1 and 3; the authors' code: 1 and 5), × speed FLOP/s",
    )
    slowdown: SlowdownConfig = SlowdownConfig()
    faults: FaultConfig = FaultConfig()
    straggler_ratio: float = Field(
        0.0, ge=0, le=1, description="SALF straggler-ratio scenario: fraction ρ of stragglers"
    )
    server_speed: float | None = Field(
        None,
        gt=0,
        description="FLOP/s of SplitFed's main server, which trains the layers above the cut "
        "for each client in parallel; null: 10 × the fastest device's speed",
    )

    @model_validator(mode="after")
    def _classes_given(self) -> PopulationConfig:
        if (self.scenario == "trace") != (self.trace is not None):
            raise ValueError(
                "population.trace (a trace folder) goes with scenario: trace, and scenario "
                "trace needs population.trace"
            )
        if self.scenario == "classes" and not self.classes:
            raise ValueError("scenario 'classes' needs a non-empty population.classes list")
        total = math.fsum(c.fraction for c in self.classes)
        if self.classes and abs(total - 1.0) > 1e-6:
            raise ValueError(
                f"the fractions of population.classes sum to {total:g}, not 1; give each "
                "class its share of the devices"
            )
        if any(not (math.isfinite(c) and c > 0) for c in self.capabilities):
            raise ValueError("population.capabilities must be two positive numbers")
        return self


class TrainConfig(_Section):
    local_epochs: float | None = Field(1.0, gt=0, le=10_000)
    local_steps: int | None = Field(None, ge=1, le=BIG_COUNT)
    batch_size: int = Field(32, ge=1, le=BIG_COUNT)
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _one_of(self) -> TrainConfig:
        if self.local_steps is not None and self.local_epochs is not None:
            # local_steps given explicitly wins over the default epochs
            if "local_epochs" in self.model_fields_set:
                raise ValueError("give either local_epochs or local_steps, not both")
            object.__setattr__(self, "local_epochs", None)
        if self.local_steps is None and self.local_epochs is None:
            raise ValueError("give one of local_epochs or local_steps")
        return self


# ---------------------------------------------------------------- strategy options
# One options class per strategy, each listing exactly the fields its builder reads;
# families share a base class where the fields are genuinely shared. The ``strategy``
# section is their union, discriminated by ``name``, so YAML stays flat
# (``strategy: {name: fedbuff, buffer_size: 3}``). The registry
# (``fedclock.strategies.STRATEGIES[name].options``) points at these classes: they are
# the one record of which fields each strategy reads, for validation, for the cells of
# a comparison and for sweeps.


class StrategyOptions(BaseModel):
    """What every strategy reads. A subclass adds its own fields and names the fields of
    the ``salf`` section and the other config paths that only some strategies read."""

    # extra: fields of other strategies that a comparison's base config carries for them
    # (ExperimentConfig._strategy_fields decides when that is allowed); a run of this
    # strategy never sees them (own_fields)
    model_config = ConfigDict(
        extra="allow", validate_assignment=True, allow_inf_nan=False, defer_build=True
    )

    name: str
    weights: Literal["samples", "uniform"] = Field(
        "samples",
        description="client importance p_i: ∝ data size n_i, or uniform 1/M (also the "
        "federated loss's weights, so every strategy reads it)",
    )

    #: one line on what the strategy is (`fedclock strategies`, the registry's StrategySpec)
    summary: ClassVar[str] = ""
    #: fields of the ``salf`` section this strategy reads
    salf_fields: ClassVar[tuple[str, ...]] = ()
    #: config paths outside ``strategy`` and ``salf`` that only some strategies read
    reads_elsewhere: ClassVar[tuple[str, ...]] = ()
    #: whether its rounds sample a fraction of the clients (the ``selection`` section)
    selects: ClassVar[bool] = False

    @model_validator(mode="after")
    def _bounded_floats(self) -> Any:
        _no_huge_floats(self)
        return self

    @classmethod
    def paths(cls) -> frozenset[str]:
        """Every strategy-specific config path this strategy may read."""
        return frozenset(
            [f"strategy.{f}" for f in cls.model_fields]
            + [f"salf.{f}" for f in cls.salf_fields]
            + list(cls.reads_elsewhere)
        )

    @classmethod
    def unread(cls, cfg: ExperimentConfig) -> frozenset[str]:
        """The paths of :meth:`paths` that the rest of ``cfg`` leaves unused."""
        return frozenset()

    @classmethod
    def unread_reason(cls, cfg: ExperimentConfig, path: str) -> str:
        """Why ``path`` (one of :meth:`unread`) is unread, in a few words."""
        return "see docs/config.md"

    @classmethod
    def reads(cls, cfg: ExperimentConfig, path: str) -> bool:
        """Whether a run of this strategy on ``cfg`` depends on the config field ``path``
        (False: every value of a sweep over it gives the same run)."""
        if path.startswith("selection."):  # whom its rounds ask: where they sample clients
            return cls.samples_clients(cfg) and cfg.selection.reads(path.removeprefix("selection."))
        if path not in STRATEGY_PATHS:
            return True  # data, model, training, population, budget, ...: every strategy
        return path in cls.paths() and path not in cls.unread(cfg)

    @classmethod
    def samples_clients(cls, cfg: ExperimentConfig) -> bool:
        """Whether its rounds sample a fraction of the clients on ``cfg`` (so a selection
        other than uniform applies)."""
        return cls.selects and "strategy.client_fraction" not in cls.unread(cfg)

    @classmethod
    def option(cls, cfg: ExperimentConfig, field: str) -> Any:
        """This strategy's ``field`` in ``cfg``: the value the strategy section gives
        (its own, or carried for it by another strategy's section) or the default."""
        given = cfg.strategy.model_dump()
        return given[field] if field in given else cls.model_fields[field].default


# ---- the server step (strategies/server.py)
class _ServerOptions(StrategyOptions):
    """The server step, a torch optimizer over the aggregated update, applied after every
    aggregation (strategies/server.py): every strategy's options derive from this class."""

    server_optimizer: Literal["sgd", "adam"] = Field(
        "sgd",
        description="server step on the aggregated update Δ: sgd (θ + η_g Δ; FedAvgM with "
        "server_momentum) or adam (FedAdam, Reddi et al.)",
    )
    server_momentum: float = Field(
        0.0, ge=0, lt=1, description="server momentum β (sgd; 0 = none), Adam's β₁ (adam)"
    )
    server_beta2: float = Field(0.99, gt=0, lt=1, description="Adam's β₂ (server_optimizer adam)")
    server_eps: float = Field(
        1e-3, gt=0, description="Adam's τ (ε) of θ + η_g m/(√v + τ) (server_optimizer adam)"
    )

    @classmethod
    def unread(cls, cfg: ExperimentConfig) -> frozenset[str]:
        if cls.option(cfg, "server_optimizer") == "sgd":
            return frozenset({"strategy.server_beta2", "strategy.server_eps"})
        return frozenset()


# ---- synchronous rounds
class _RoundOptions(_ServerOptions):
    """fedavg, fedprox, fednova, ram-fed and drop-stragglers: rounds over a fraction of the
    clients."""

    client_fraction: float = Field(
        1.0, gt=0, le=1, description="fraction C of clients sampled per round"
    )
    server_lr: float = Field(1.0, gt=0, description="η_g of θ ← θ + η_g Σ p_i Δ_i")

    selects = True


class FedAvgOptions(_RoundOptions):
    name: Literal["fedavg"] = "fedavg"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "synchronous FedAvg: barrier rounds over a fraction C of clients, sample-weighted average"
    )


class FedProxOptions(_RoundOptions):
    """FedAvg's rounds with FedProx's local objective F_k(θ) + (μ/2)‖θ − θ^t‖² (Li et al.)."""

    name: Literal["fedprox"] = "fedprox"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "FedProx: FedAvg rounds, local objective F_k + (μ/2)‖θ − θ^t‖² (strategy.mu)"
    )
    mu: float = Field(0.01, ge=0, description="μ of the proximal term (μ/2)‖θ − θ^t‖²")


class FedNovaOptions(_RoundOptions):
    """FedAvg's rounds with FedNova's normalized averaging (Wang et al.)."""

    name: Literal["fednova"] = "fednova"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "FedNova (Wang et al.): FedAvg rounds, Δ_i weighted τ_eff·p_i/τ_i (normalized averaging)"
    )


class ScaffoldOptions(_RoundOptions):
    """SCAFFOLD (Karimireddy et al. 2020): FedAvg's rounds, each local step corrected by the
    control variates c − c_i (option II); η_g = ``server_lr``, η_l = ``train.lr``."""

    name: Literal["scaffold"] = "scaffold"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "SCAFFOLD (Karimireddy et al.): FedAvg rounds, each local step corrected by the "
        "control variates c − c_i (option II)"
    )


class FedDynOptions(_RoundOptions):
    """FedDyn (Acar et al. 2021): FedAvg's rounds with the dynamic regulariser
    −⟨∇L_i(θ_i^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖² and the server state h."""

    name: Literal["feddyn"] = "feddyn"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "FedDyn (Acar et al.): FedAvg rounds, local objective with the dynamic "
        "regulariser −⟨∇L_i, θ⟩ + (α/2)‖θ − θ^t‖², server state h (strategy.alpha)"
    )
    feddyn_alpha: float = Field(
        0.01, gt=0, description="α of FedDyn's regulariser (α/2)‖θ − θ^{t−1}‖² and of h"
    )


class RamFedOptions(_RoundOptions):
    """RAM-Fed (Wang et al., KDD 2023; our reading, docs/methods/ram-fed.md): rounds in
    which each client trains a submodel of neurons sized to its device's speed."""

    name: Literal["ram-fed"] = "ram-fed"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "RAM-Fed (Wang et al.): rounds of submodels of neurons sized to each device's "
        "speed, each client's latest update of every element averaged"
    )
    extraction: Literal["random", "static", "rolling"] = Field(
        "random",
        description="which neurons a submodel keeps: random (a fresh uniform draw per client "
        "and round: 'arbitrarily assigned neurons'), static (the first ones of every "
        "hidden layer, HeteroFL's prefix) or rolling (a window moving one unit per round, "
        "FedRolex's; the fedrolex strategy is rolling with coverage)",
    )
    aggregation: Literal["memory", "coverage"] = Field(
        "memory",
        description="memory (RAM-Fed: Σ_i p_i G_i over every client, G_i its latest update of "
        "each element) or coverage (RA-Fed: each element's p-weighted average over the clients "
        "that trained it this round)",
    )


class FedRolexOptions(_RoundOptions):
    """FedRolex (Alam et al., NeurIPS 2022): rounds in which each client trains a submodel
    of neurons sized to its device's speed (RAM-Fed's eq. 1), the window of kept units
    rolling one index per round; each element averaged over the clients that trained it."""

    name: Literal["fedrolex"] = "fedrolex"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "FedRolex (Alam et al.): rounds of neuron submodels sized to each device's speed, "
        "the window of kept units rolling one index per round, per-element averages"
    )


class FjordOptions(_RoundOptions):
    """FjORD (Horváth et al., NeurIPS 2021): rounds in which each client trains with
    ordered dropout up to the widest width p_max its device's speed affords, a width drawn
    per local step; each element averaged over the clients whose p_max holds it."""

    name: Literal["fjord"] = "fjord"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "FjORD (Horváth et al.): rounds of ordered dropout, a width drawn per local step up to "
        "each device's speed-sized p_max, nested slices averaged over the clients holding them"
    )
    widths: list[float] = Field(
        [0.2, 0.4, 0.6, 0.8, 1.0],
        description="the widths P a step may train (increasing, in (0, 1], ending at 1): a "
        "width-p step trains the first ⌈p·K_l⌉ units of every hidden layer l",
    )

    @field_validator("widths")
    @classmethod
    def _widths(cls, v: list[float]) -> list[float]:
        if not v or any(not 0.0 < p <= 1.0 for p in v) or v != sorted(set(v)) or v[-1] != 1.0:
            raise ValueError(
                f"must be increasing widths in (0, 1] that end at 1.0 (the full model), got {v}"
            )
        return v


class PruneFLOptions(_RoundOptions):
    """PruneFL (Jiang et al., TNNLS 2022): FedAvg's rounds on a pruned model, the mask chosen
    by an initial pruning at one client and reconfigured every ΔR rounds
    (docs/methods/prunefl.md)."""

    name: Literal["prunefl"] = "prunefl"
    selects = False  # (its pruning rounds assume the uniform draw; docs/methods/selection.md)
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "PruneFL (Jiang et al.): FedAvg rounds on a pruned model; the mask reconfigured "
        "every ΔR rounds from squared gradients against each weight's time cost"
    )
    reconfig_interval: int = Field(
        50, ge=1, description="ΔR: FL rounds between two reconfigurations of the mask"
    )
    release: float = Field(
        0.3, ge=0, le=1,
        description="fraction of the kept weights, smallest |θ| first, that a reconfiguration "
        "may prune (the others stay)",
    )  # fmt: skip
    initial_pruning: bool = Field(True, description="prune at one client before the FL rounds")
    initial_client: int | None = Field(
        None, ge=0, description="the client that prunes first (default: the fastest)"
    )
    initial_batches: int = Field(
        10, ge=1, description="batches of its data the initial pruning uses"
    )
    initial_interval: int = Field(
        50, ge=1, description="initial-pruning rounds (one step per batch) between reconfigurations"
    )
    initial_max_rounds: int = Field(1000, ge=1, description="most initial-pruning rounds")
    initial_threshold: float = Field(
        0.1, ge=0,
        description="the initial pruning stops once 5 successive reconfigurations each changed "
        "the density by at most this fraction",
    )  # fmt: skip

    initial_fields: ClassVar[tuple[str, ...]] = (
        "initial_client", "initial_batches", "initial_interval", "initial_max_rounds",
        "initial_threshold",
    )  # fmt: skip

    @classmethod
    def unread(cls, cfg: ExperimentConfig) -> frozenset[str]:
        out = super().unread(cfg)
        if not cls.option(cfg, "initial_pruning"):
            out |= {f"strategy.{f}" for f in cls.initial_fields}
        return out


class SplitFedOptions(_RoundOptions):
    """SplitFed (Thapa et al., AAAI 2022), SFL-V1: each client trains the layers below the
    cut, the main server the layers above it, batch by batch; both sides FedAvg-averaged."""

    name: Literal["splitfed"] = "splitfed"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "SplitFed (Thapa et al.), SFL-V1: FedAvg rounds, each client trains the layers "
        "below strategy.cut, the server those above, per batch"
    )
    cut: int = Field(
        1,
        ge=1,
        le=BIG_COUNT,
        description="layers on the client (the split is after layer cut; 1 ≤ cut < the "
        "model's layer count)",
    )

    reads_elsewhere = ("population.server_speed",)


class DropStragglersOptions(_RoundOptions):
    """FedAvg under a deadline; with ``salf.scenario``, SALF's drop-stragglers baseline."""

    name: Literal["drop-stragglers"] = "drop-stragglers"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "FedAvg under a deadline t_max: updates not arrived by the deadline are discarded"
    )
    t_max: float | None = Field(None, gt=0, description="round deadline in virtual seconds")

    salf_fields = ("scenario", "mode", "charge")
    reads_elsewhere = ("population.straggler_ratio",)

    @classmethod
    def unread(cls, cfg: ExperimentConfig) -> frozenset[str]:
        scenario = cfg.salf.scenario
        if scenario is None:  # FedAvg under a deadline
            return super().unread(cfg) | {"salf.mode", "salf.charge", "population.straggler_ratio"}
        # SALF's rounds: every user each round, a plain mean; depths from the scenario
        depth_source = "strategy.t_max" if scenario == "ratio" else "population.straggler_ratio"
        return _ServerOptions.unread(cfg) | {"strategy.client_fraction", depth_source}


# ---- asynchronous (docs/methods/async.md)
class AsyncOptions(_ServerOptions):
    """Every asynchronous strategy: clients kept busy, staleness-aware server steps."""

    staleness: Literal["constant", "polynomial", "hinge"] = Field(
        "constant", description="staleness function s: FedAsync's α·s, a factor on d_i otherwise"
    )
    staleness_a: float = Field(0.5, ge=0, description="a of (1+x)^-a and of the hinge")
    staleness_b: float = Field(4.0, ge=0, description="b of the hinge: s = 1 up to b versions")
    staleness_normalize_at: float | None = Field(
        None, ge=0, description="divide s by s(this staleness), as FLSim's avg_staleness"
    )
    concurrency: int | None = Field(
        None,
        ge=1,
        le=MAX_CLIENTS,
        description="at most this many clients train at once, drawn uniformly from the idle "
        "ones (FLSim's max concurrency); null = every client",
    )

    selects = True  # (with a concurrency: who fills a freed slot)

    @classmethod
    def samples_clients(cls, cfg: ExperimentConfig) -> bool:
        return cls.selects and cls.option(cfg, "concurrency") is not None

    @classmethod
    def unread(cls, cfg: ExperimentConfig) -> frozenset[str]:
        kind = cls.option(cfg, "staleness")
        server = super().unread(cfg)
        if kind == "constant":
            return server | {
                "strategy.staleness_a", "strategy.staleness_b", "strategy.staleness_normalize_at"
            }  # fmt: skip
        return server | ({"strategy.staleness_b"} if kind == "polynomial" else set())


class WeightedAsyncOptions(AsyncOptions):
    """The asynchronous strategies with aggregation weights d_i (Fraboni et al. eq. 6)."""

    server_lr: float = Field(1.0, gt=0, description="η_g of θ ← θ + η_g Σ d_i Δ_i")
    aggregation_weights: Literal[
        "auto", "identical", "time-based", "fedfix", "fedbuff", "participation", "sync"
    ] = Field("auto", description="d_i of eq. 6; auto = the strategy's own rule")
    delta_t: float | None = Field(None, gt=0, description="FedFix period Δt in virtual seconds")
    buffer_size: int | None = Field(
        None, ge=1, le=BIG_COUNT, description="FedBuff: a server step every m arrivals"
    )
    tau_source: Literal["profile", "estimated"] = Field(
        "profile", description="update times τ_i: device profile, or estimated from arrivals"
    )

    #: the d_i rule of aggregation_weights: auto
    default_weights: ClassVar[str] = ""
    #: when the server steps: on every arrival, every ``delta_t`` (FedFix) or every
    #: ``buffer_size`` arrivals (FedBuff)
    trigger: ClassVar[Literal["arrival", "period", "buffer"]] = "arrival"

    @classmethod
    def weight_rule(cls, aggregation_weights: str) -> str:
        return cls.default_weights if aggregation_weights == "auto" else aggregation_weights

    @classmethod
    def unread(cls, cfg: ExperimentConfig) -> frozenset[str]:
        kind = cls.weight_rule(cls.option(cfg, "aggregation_weights"))
        out = set(super().unread(cfg))
        if cls.trigger != "period" and kind != "fedfix":  # FedFix's trigger or weights
            out.add("strategy.delta_t")
        if cls.trigger != "buffer" and kind != "fedbuff":  # FedBuff's trigger or weights
            out.add("strategy.buffer_size")
        if kind not in ("time-based", "fedfix"):  # the rules that use τ_i
            out.add("strategy.tau_source")
        return frozenset(out)


class AsyncIdenticalOptions(WeightedAsyncOptions):
    name: Literal["async-identical"] = "async-identical"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "asynchronous FedAvg: a server step on every arrival, weight d_i = 1 (Fraboni et al.)"
    )
    default_weights = "identical"


class AsyncTimeBasedOptions(WeightedAsyncOptions):
    name: Literal["async-time-based"] = "async-time-based"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "asynchronous FedAvg with time-based weights d_i = (Σ 1/τ_j)·τ_i·p_i (Fraboni eq. 36)"
    )
    default_weights = "time-based"


class FedFixOptions(WeightedAsyncOptions):
    name: Literal["fedfix"] = "fedfix"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "FedFix: a server step every delta_t with whatever arrived, d_i = ⌈τ_i/Δt⌉·p_i (eq. 40)"
    )
    default_weights = "fedfix"
    trigger = "period"


class FedBuffOptions(WeightedAsyncOptions):
    name: Literal["fedbuff"] = "fedbuff"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "FedBuff: a server step every buffer_size arrivals, d_i = 1/m (or as configured)"
    )
    default_weights = "fedbuff"
    trigger = "buffer"


class FedAsyncOptions(AsyncOptions):
    name: Literal["fedasync"] = "fedasync"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "FedAsync (Xie et al.): on each arrival θ ← (1−α_t)θ + α_t·θ_client, α_t = α·s(staleness)"
    )
    alpha: float = Field(0.6, gt=0, le=1, description="FedAsync mixing weight α")


_FEDRAA_PAPER_ONLY = frozenset({
    "strategy.alpha", "strategy.rho", "strategy.staleness", "strategy.staleness_a",
    "strategy.staleness_b", "strategy.staleness_normalize_at",
})  # fmt: skip


class _FedRAAFields(AsyncOptions):
    """What Fed-RAA and its named ablations read (docs/methods/fed-raa.md)."""

    selects = False  # (its scheduler assigns fragments to whoever is idle)

    fragments: int = Field(
        4,
        ge=1,
        le=5,
        description="M: the model split into M fragments (Table 4's ratios; 1 = the whole "
        "model, an ablation)",
    )
    k: float | None = Field(
        None,
        gt=0,
        description="delay bound K in virtual seconds: a client gets only fragments it trains "
        "within K; null = the offline assignment's bound (Theorem 2)",
    )
    alpha: float = Field(0.6, gt=0, le=1, description="mixing weight α of θ ← (1−α_t)θ + α_t·θ_new")
    rho: float = Field(0.01, ge=0, description="ρ of the local proximal term (ρ/2)‖θ^j − θ^j_q‖²")
    mode: Literal["paper", "reference"] = Field(
        "paper",
        description="paper: Alg. 1 and 2 as written (neuron-group fragments, α mixing, "
        "proximal ρ); reference: the authors' code (element-wise fragments charged their "
        "share, θ + (n_i/n)·s·Δ with s = 1/(1 + duration/100), deterministic Gre-RAA)",
    )
    reference_weight: Literal["share-discount", "share", "discount", "one", "mix"] = Field(
        "share-discount",
        description="reference mode's weight a of θ + a·Δ (an ablation): share-discount "
        "(the authors' (n_i/n)·s), share (n_i/n), discount (s) or one (a = 1); mix replaces "
        "the sum by Alg. 1's θ ← (1 − α_t)θ + α_t·θ_new on the fragment (α and staleness read)",
    )
    count: Literal["assigned", "completed"] = Field(
        "assigned",
        description="the event that increments a fragment's update count q(j): assigned "
        "(handed to a client, as the authors' code counts: the scheduler spreads clients "
        "over fragments) or completed (a global update of it, Alg. 1's wording)",
    )

    #: the scheduler and synchrony of a named ablation (fed-raa has them as fields)
    fixed: ClassVar[dict[str, Any]] = {"scheduler": "gre-raa", "sync": False}

    @classmethod
    def setting(cls, cfg: ExperimentConfig, field: str) -> Any:
        """``scheduler`` or ``sync`` of this strategy's run on ``cfg``."""
        return cls.option(cfg, field) if field in cls.model_fields else cls.fixed[field]

    def own(self, field: str) -> Any:
        """``scheduler`` or ``sync`` of these options."""
        return getattr(self, field) if field in type(self).model_fields else self.fixed[field]

    @classmethod
    def unread_reason(cls, cfg: ExperimentConfig, path: str) -> str:
        scheduler, sync = cls.setting(cfg, "scheduler"), cls.setting(cfg, "sync")
        if path == "strategy.k" and scheduler != "gre-raa":
            return f"the {scheduler} scheduler ignores the delay bound K"
        if path == "strategy.count" and scheduler == "random":
            return "the random scheduler reads no update counts"
        if cls.option(cfg, "mode") == "reference" and path in _FEDRAA_PAPER_ONLY:
            if cls.option(cfg, "reference_weight") == "mix":
                return "reference mode has no proximal term"
            return "reference mode has no mixing weight, staleness or proximal term"
        if path == "strategy.reference_weight" and cls.option(cfg, "mode") != "reference":
            return "paper mode mixes with α, it has no reference-mode weight"
        if sync:
            return "synchronous rounds of every client: no mixing weight, staleness or concurrency"
        return super().unread_reason(cfg, path)

    @classmethod
    def unread(cls, cfg: ExperimentConfig) -> frozenset[str]:
        out = set(super().unread(cfg))
        if cls.setting(cfg, "scheduler") != "gre-raa":  # Random and MP-RAA ignore K
            out.add("strategy.k")
        if cls.setting(cfg, "scheduler") == "random":  # a uniform draw: no counts q(j)
            out.add("strategy.count")
        if cls.option(cfg, "mode") == "reference":  # no mixing weight, staleness or ρ
            mixing = cls.option(cfg, "reference_weight") == "mix"  # (the ablation: no ρ only)
            out |= {"strategy.rho"} if mixing else _FEDRAA_PAPER_ONLY
        else:
            out.add("strategy.reference_weight")
        if cls.setting(cfg, "sync"):  # rounds: no mixing, no staleness, every client
            out |= {
                "strategy.alpha", "strategy.staleness", "strategy.staleness_a",
                "strategy.staleness_b", "strategy.staleness_normalize_at", "strategy.concurrency",
                "strategy.reference_weight",
            }  # fmt: skip
        return frozenset(out)


class FedRAAOptions(_FedRAAFields):
    """Fed-RAA (Zhang et al.): asynchronous training of model fragments sized to each
    device; ``scheduler`` and ``sync`` give its Table 3 ablations, also named below."""

    name: Literal["fed-raa"] = "fed-raa"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "Fed-RAA (Zhang et al.): each device trains a model fragment within the delay "
        "bound K (Gre-RAA), mixed in on arrival"
    )
    scheduler: Literal["gre-raa", "random", "mp-raa"] = Field(
        "gre-raa",
        description="fragment assignment: Gre-RAA (Alg. 2), Random (uniform, ignoring K), "
        "MP-RAA (least-updated, ignoring K)",
    )
    sync: bool = Field(
        False,
        description="Sync Fed-RAA (ablation): the same fragments in synchronous rounds of "
        "every client, averaged with weights n_i/n",
    )


class FedRAARandomOptions(_FedRAAFields):
    """Fed-RAA's Random ablation (Table 3): = fed-raa with scheduler random."""

    name: Literal["fed-raa-random"] = "fed-raa-random"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "Fed-RAA's Random ablation: a uniformly drawn fragment per idle client, K ignored"
    )
    fixed = {"scheduler": "random", "sync": False}


class FedRAAMPOptions(_FedRAAFields):
    """Fed-RAA's MP-RAA ablation (Table 3): = fed-raa with scheduler mp-raa."""

    name: Literal["fed-raa-mp"] = "fed-raa-mp"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "Fed-RAA's MP-RAA ablation: the least-updated fragment per idle client, K ignored"
    )
    fixed = {"scheduler": "mp-raa", "sync": False}


class FedRAASyncOptions(_FedRAAFields):
    """Fed-RAA's Sync ablation (Table 3): = fed-raa with sync true."""

    name: Literal["fed-raa-sync"] = "fed-raa-sync"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "Fed-RAA's Sync ablation: Gre-RAA's fragments in barrier rounds, n_i/n-weighted sum"
    )
    fixed = {"scheduler": "gre-raa", "sync": True}


# ---- CIS: early exits trained across a tree of devices (docs/methods/cis.md); the cis
# section holds the tree, its serving rates and the data split
class _CisOptions(_ServerOptions):
    """Algorithm 1 of Kaplan et al. with one choice of the aggregation weights Λ̃."""

    epsilon: float = Field(
        0.0, ge=0, lt=1,
        description="node collaboration ε: p_{i,e} = ε for e < E_i, 1 − (E_i − 1)·ε for E_i "
        "(0: each node trains only its own exit)",
    )  # fmt: skip
    p_rule: Literal["paper", "code"] = Field(
        "paper",
        description="paper: ε per lower exit; code: the authors' --sampled-probability, ε in "
        "total spread evenly over the lower exits (p_{i,e} = ε/(E_i − 1))",
    )
    server_lr: float = Field(
        1.0, gt=0, description="η_s of the server update (the server step's learning rate)"
    )
    mode: Literal["paper", "reference"] = Field(
        "paper",
        description="paper: Algorithm 1's update; reference: the authors' code (the root "
        "absorbs the leftover weight per tensor, the lower exits' heads stay as the root "
        "has them, p multiplied)",
    )
    lr_schedule: Literal["cosine", "constant"] = Field(
        "cosine",
        description="local learning rate over rounds: cosine annealing from train.lr to lr_min "
        "over budget.aggregations rounds (the paper), or train.lr throughout",
    )
    lr_min: float = Field(0.001, ge=0, description="the cosine schedule's final rate")
    local_work: Literal["steps", "epoch-of-largest"] = Field(
        "steps",
        description="steps: every node runs train.local_steps (or train.local_epochs of its "
        "own data); epoch-of-largest: the paper's rule, every node runs the same number of "
        "steps, those of train.local_epochs (default 1) epochs of the largest node's data",
    )
    momentum_state: Literal["task", "node"] | None = Field(
        None,
        description="task: momentum starts at zero in each task (Algorithm 1: J SGD steps "
        "from w); node: each node's momentum buffer persists across its tasks (the authors' "
        "one optimizer per node); null: task in paper mode, node in reference mode",
    )
    p_factor: Literal["divide", "none", "multiply"] | None = Field(
        None,
        description="the factor of p_{i,e} in the server update: divide (Algorithm 1), none, "
        "multiply (the authors' code); null: as the mode",
    )
    root_in_place: bool | None = Field(
        None,
        description="the root's model is the server's, trained in place, and the others' "
        "updates are taken against it (the authors' code); null: as the mode",
    )
    lower_heads: Literal["aggregate", "root"] | None = Field(
        None,
        description="the heads of the exits below the root's: aggregate (Algorithm 1) or "
        "root (kept as the root has them, the authors' code); null: as the mode",
    )


class CisEqualOptions(_CisOptions):
    """Λ̃_e = 1/E (Equal Weight)."""

    name: Literal["cis-equal"] = "cis-equal"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "CIS (Kaplan et al.): early exits trained across a tree of devices, Λ̃_e = 1/E"
    )


class CisFlopsOptions(_CisOptions):
    """Λ̃_e ∝ FLOPs up to exit e (FLOPS Prop)."""

    name: Literal["cis-flops"] = "cis-flops"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "CIS with Λ̃_e ∝ FLOPs up to exit e (FLOPS Prop; the authors' ramp by default)"
    )
    flops_ramp: bool = Field(
        True,
        description="the authors' schedule Λ̃_e ∝ min(r_e, (t+1)/T) (equal at first, FLOPs-"
        "proportional by the last round); false: ∝ r_e throughout",
    )


class CisServingOptions(_CisOptions):
    """Λ̃_e = Λ_e (Serving Rate)."""

    name: Literal["cis-serving"] = "cis-serving"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = "CIS with Λ̃_e = Λ_e, the rate served at exit e (Serving Rate)"


class CisBalancedOptions(_CisOptions):
    """Λ̃_e = ½(Λ_e/ΣΛ + o_e/Σo), o_e = 1/(σ_e²·Σ_{i: E_i=e}(|S_i|/|S_e|)²) (Balanced Adj, as
    the authors' code computes it)."""

    name: Literal["cis-balanced"] = "cis-balanced"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "CIS with Balanced Adj: ½(serving rate + inverse gradient variance), the authors' formula"
    )
    sigma: list[float] | None = Field(
        None,
        description="σ_e per exit: average point-wise gradient variance (the paper's Table 3); "
        "null = measured on the initial model",
    )
    sigma_samples: int = Field(
        256, ge=2, le=BIG_COUNT, description="training samples used to measure σ_e (sigma: null)"
    )

    @field_validator("sigma")
    @classmethod
    def _positive_sigma(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (not v or any(not (0 < x < math.inf) for x in v)):
            raise ValueError("every σ_e must be a finite number > 0")
        return v


# ---- SALF and its baselines (docs/methods/salf.md); the salf section holds their settings
class _SalfFamilyOptions(_ServerOptions):
    salf_fields: ClassVar[tuple[str, ...]] = ("scenario", "mode", "charge")

    server_lr: float = Field(
        1.0, gt=0, description="η_g of the server step on eq. 9's update (1: eq. 9 as written)"
    )


class VanillaOptions(_SalfFamilyOptions):
    """Every user a full update each round: no deadline, no stragglers to depth."""

    name: Literal["vanilla"] = "vanilla"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "SALF's vanilla FL: every user a full update each round, no deadline (needs salf.scenario)"
    )


class _SalfDepthOptions(_SalfFamilyOptions):
    """The SALF-family methods whose stragglers come from the scenario."""

    t_max: float | None = Field(
        None, gt=0, description="round deadline in virtual seconds (salf.scenario: deadline)"
    )

    reads_elsewhere = ("population.straggler_ratio",)

    @classmethod
    def unread(cls, cfg: ExperimentConfig) -> frozenset[str]:
        server = super().unread(cfg)
        if cfg.salf.scenario == "ratio":
            return server | {"strategy.t_max"}
        if cfg.salf.scenario == "deadline":
            return server | {"population.straggler_ratio"}
        return server


class SalfOptions(_SalfDepthOptions):
    name: Literal["salf"] = "salf"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "SALF (Lang et al.): stragglers send the layers their backprop reached; eq. 9"
    )
    salf_fields = ("scenario", "mode", "p_rule", "charge")

    client_fraction: float = Field(
        1.0, gt=0, le=1,
        description="fraction of the users asked per round (1: every user, the paper's; "
        "below 1 or with a selection: the deadline scenario in paper mode, eq. 9's p_l over "
        "the round's users)",
    )  # fmt: skip

    selects = True


class HeteroFLOptions(_SalfDepthOptions):
    name: Literal["heterofl"] = "heterofl"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "HeteroFL: stragglers train a width-r submodel; per-element average over holders"
    )
    salf_fields = ("scenario", "mode", "heterofl_rate", "charge")


class AsyncFLOptions(_SalfDepthOptions):
    name: Literal["asyncfl"] = "asyncfl"
    #: one line of `fedclock strategies`
    summary: ClassVar[str] = (
        "AsyncFL (SALF's baseline): a straggler of depth l sends a stale full update "
        "every 2l rounds"
    )


StrategyOptionsUnion = Annotated[
    FedAvgOptions
    | FedProxOptions
    | FedNovaOptions
    | ScaffoldOptions
    | FedDynOptions
    | RamFedOptions
    | FedRolexOptions
    | FjordOptions
    | PruneFLOptions
    | SplitFedOptions
    | DropStragglersOptions
    | AsyncIdenticalOptions
    | AsyncTimeBasedOptions
    | FedFixOptions
    | FedBuffOptions
    | FedAsyncOptions
    | FedRAAOptions
    | FedRAARandomOptions
    | FedRAAMPOptions
    | FedRAASyncOptions
    | VanillaOptions
    | SalfOptions
    | HeteroFLOptions
    | AsyncFLOptions
    | CisEqualOptions
    | CisFlopsOptions
    | CisServingOptions
    | CisBalancedOptions,
    Field(discriminator="name"),
]

#: strategy name → its options class, in the registry's order
STRATEGY_OPTIONS: dict[str, type[StrategyOptions]] = {
    cls.model_fields["name"].default: cls for cls in get_args(get_args(StrategyOptionsUnion)[0])
}
#: the config paths that some strategies read and others do not
STRATEGY_PATHS: frozenset[str] = frozenset().union(*(o.paths() for o in STRATEGY_OPTIONS.values()))


def readers_of(path: str) -> list[str]:
    """The strategies that may read the config field ``path`` (registry order)."""
    return [n for n, o in STRATEGY_OPTIONS.items() if path in o.paths()]


class BudgetConfig(_Section):
    virtual_time: float | None = Field(None, gt=0)
    aggregations: int | None = Field(None, ge=1, le=BIG_COUNT)
    updates: int | None = Field(None, ge=1, le=BIG_COUNT)

    @model_validator(mode="after")
    def _some(self) -> BudgetConfig:
        if self.virtual_time is None and self.aggregations is None and self.updates is None:
            raise ValueError("set at least one of virtual_time, aggregations or updates")
        return self


class GuardConfig(_Section):
    """Guarded aggregation: updates checked before the aggregator sees them; a rejected
    update is counted (``updates_rejected``) and its compute wasted."""

    reject_nonfinite: bool = Field(
        False,
        description="reject an update whose training loss or Δ holds NaN or inf (off: such "
        "an update stops the run as diverged)",
    )
    max_update_norm: float | None = Field(
        None, gt=0, description="reject an update with ‖Δ‖₂ above this (null: no bound)"
    )


class CheckpointConfig(_Section):
    """Checkpoints of the whole run state (``checkpoint.pt`` in the run folder), from which
    ``fedclock run --resume`` and ``compare``/``sweep`` continue an interrupted run exactly;
    Ctrl-C writes one before stopping. Both null: no checkpoints."""

    every_aggregations: int | None = Field(
        None, ge=1, le=BIG_COUNT, description="write a checkpoint every this many server steps"
    )
    every_seconds: float | None = Field(
        60.0, gt=0, description="write a checkpoint every this many wall-clock seconds"
    )


class EvalConfig(_Section):
    every_aggregations: int | None = Field(1, ge=1, le=BIG_COUNT)
    every_virtual_seconds: float | None = Field(None, gt=0)
    batch_size: int = Field(2048, ge=1, le=BIG_COUNT)
    target_accuracy: float | None = Field(None, gt=0, le=1)
    divergence_factor: float | None = Field(
        100.0,
        gt=1,
        description="stop as diverged when the test loss exceeds this × the initial loss",
    )
    client_losses: bool = Field(
        False,
        description="also evaluate every client's training loss: federated (eq. 2), surrogate "
        "(eq. 10) and participation-weighted losses, and their spread",
    )
    val_holdout: int = Field(
        0,
        ge=0,
        le=BIG_COUNT,
        description="training samples held out for validation; the summary then has the test "
        "accuracy of the best-validation model (SALF reference: 10000; formerly salf.val_holdout)",
    )
    val_every_aggregations: int | None = Field(
        None,
        ge=1,
        le=BIG_COUNT,
        description="with val_holdout: validate every k aggregations to pick the best model, "
        "testing only the improvements (null: validate with each test evaluation)",
    )

    @model_validator(mode="after")
    def _validation_split(self) -> EvalConfig:
        if self.val_every_aggregations is not None and not self.val_holdout:
            raise ValueError("val_every_aggregations needs a validation split: set val_holdout")
        return self


class ExecutorConfig(_Section):
    kind: Literal["auto", "serial", "vectorized", "ray"] = Field(
        "auto",
        description="auto/vectorized: many clients per pass (torch.func), serial where it "
        "cannot batch; serial: one task after another; ray: blocks of tasks on Ray actors "
        "(each running auto)",
    )
    workers: int | None = Field(
        None,
        ge=1,
        le=MAX_THREADS,
        description="kind ray: the actors (null: every CPU of the Ray cluster)",
    )
    max_batch_clients: int | None = Field(
        None,
        ge=1,
        le=MAX_CLIENTS,
        description="clients per vectorized block; null = automatic from model size",
    )
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    threads: int | None = Field(
        None, ge=1, le=MAX_THREADS, description="torch intra-op threads; null = torch default"
    )


class CompareConfig(_Section):
    strategies: list[str] = Field([], max_length=1000)
    seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] = Field([], max_length=10_000)
    over: list[str] = Field(
        [], description="fedclock sweep's default grid, e.g. population.straggler_ratio=0.3,0.5"
    )
    lr_grid: list[float] = Field(
        [], description="train.lr values to try per strategy; the best final federated loss wins"
    )
    lr_tune_on: str | None = Field(
        None, description="use the rate selected for this strategy entry for every strategy"
    )

    @field_validator("lr_grid")
    @classmethod
    def _positive_rates(cls, v: list[float]) -> list[float]:
        if any(not 0 < x < math.inf for x in v):
            raise ValueError("every learning rate must be a finite number > 0")
        return v


class SalfConfig(_Section):
    """Settings of SALF and its baselines (docs/methods/salf.md), read by the SALF family
    (vanilla, salf, heterofl, asyncfl, and drop-stragglers when ``scenario`` is set): each
    strategy's options class names the fields it reads (``salf_fields``)."""

    scenario: Literal["ratio", "deadline"] | None = Field(
        None,
        description="where depths come from: ratio (population.straggler_ratio) or "
        "deadline (strategy.t_max and the cost model); null = not a SALF experiment",
    )
    mode: Literal["paper", "reference"] = Field(
        "paper", description="paper: eq. 9, module layers; reference: the authors' code"
    )
    p_rule: Literal["exact", "eq10", "zero"] = Field("exact", description="p_l of eq. 9")
    heterofl_rate: float = Field(0.5, gt=0, le=1, description="HeteroFL stragglers' width r")
    charge: Literal["work", "suffix"] = Field(
        "work",
        description="compute charged to a depth-d task: work = what the executor runs (in "
        "reference mode the full step, as the authors' code), suffix = forward + backward of "
        "layers d..L only (the paper's accounting; the same as work in paper mode)",
    )


class SelectionConfig(_Section):
    """Whom a round asks (docs/methods/selection.md): uniformly (``random``), by Oort's
    utility and speed, or by TiFL's latency tiers. Read by the strategies whose rounds sample
    a fraction of the clients (``strategy.client_fraction``); the Oort fields by ``oort``,
    the TiFL fields by ``tifl``. Defaults: FedScale's for Oort, ours for TiFL where the
    paper gives none."""

    name: Literal["random", "oort", "tifl", "refl"] = Field(
        "random", description="random (uniform, McMahan et al.), oort, tifl or refl"
    )
    over_commit: float = Field(
        1.0,
        ge=1,
        le=100,
        description="K-of-N rounds: ask ⌈o·m⌉ clients, close at the first m updates, cut the "
        "rest (FedScale's 1.3; 1: ask m, wait for all)",
    )
    exploration_factor: float = Field(
        0.9, gt=0, le=1, description="Oort: initial share ε of slots given to unexplored clients"
    )
    exploration_decay: float = Field(0.98, gt=0, le=1, description="Oort: ε ← ε·decay per round")
    exploration_min: float = Field(0.3, ge=0, le=1, description="Oort: ε's floor")
    round_threshold: float = Field(
        30.0, ge=0, le=100, description="Oort: preferred duration T = this percentile of durations"
    )
    round_penalty: float = Field(
        2.0, ge=0, description="Oort: α of (T/t_i)^α for clients slower than T"
    )
    clip_bound: float = Field(
        0.9, ge=0, le=1, description="Oort: utilities clipped at this quantile"
    )
    cut_off_util: float = Field(
        0.05, ge=0, le=1, description="Oort: exploit pool down to this share of the k-th score"
    )
    pacer_step: int = Field(20, ge=1, le=BIG_COUNT, description="Oort: the pacer's window W")
    pacer_delta: float = Field(5.0, ge=0, le=100, description="Oort: the pacer's step Δ on T")
    sample_window: float = Field(
        5.0, ge=1, description="Oort: explore among the top window·k unexplored clients"
    )
    blacklist_rounds: int = Field(
        -1, ge=-1, le=BIG_COUNT, description="Oort: leave out clients picked more often (−1: never)"
    )
    blacklist_max_len: float = Field(
        0.3, ge=0, le=1, description="Oort: at most this share of clients left out"
    )
    uncertainty: float = Field(
        0.1, ge=0, le=1e3, description="Oort: c of the bonus √(c·ln r / L_i) (FedScale's 0.1)"
    )
    pacer_flat: float = Field(
        0.1, ge=0, le=1e3, description="Oort: utility change below this share widens T by Δ"
    )
    pacer_sharp: float = Field(
        5.0, ge=0, le=1e3, description="Oort: utility change above this multiple narrows T by Δ"
    )
    round_threshold_max: float = Field(
        100.0, ge=0, le=100, description="Oort: the pacer's cap on T's percentile"
    )
    exploit_pool: float = Field(
        10.0, ge=0, le=1e6, description="Oort: the exploit pool keeps at least this·k + 1 clients"
    )
    tiers: int = Field(5, ge=1, le=1000, description="TiFL: latency tiers")
    interval: int = Field(
        10, ge=1, le=BIG_COUNT, description="TiFL: rounds between probability updates (I)"
    )
    credits: int | None = Field(
        None,
        ge=1,
        le=MAX_CLIENTS,
        description="TiFL: rounds each tier may be chosen (null: no limit)",
    )
    prohibit_reselect: int = Field(
        5, ge=0, le=BIG_COUNT, description="REFL: not asked again within this many rounds"
    )
    availability_probability: float = Field(
        0.0, ge=0, le=1, description="REFL: share of each list seen (0: all; the authors' 0.9)"
    )
    deadline_alpha: float = Field(
        0.25, ge=0, le=1, description="REFL: a of the window's moving average (no deadline)"
    )
    stale_updates: bool = Field(
        True, description="REFL: late updates train on and are used stale (SAA); false: IPS only"
    )
    stale_beta: float = Field(0.35, ge=0, le=1, description="REFL: β of the stale weight s_c")
    scale_coff: float = Field(10.0, gt=0, description="REFL: the scale of s_c's deviation term")

    #: the fields each selection reads (``name`` is read by every selecting strategy)
    OORT: ClassVar[tuple[str, ...]] = (
        "exploration_factor", "exploration_decay", "exploration_min", "round_threshold",
        "round_penalty", "clip_bound", "cut_off_util", "pacer_step", "pacer_delta",
        "sample_window", "blacklist_rounds", "blacklist_max_len", "uncertainty", "pacer_flat",
        "pacer_sharp", "round_threshold_max", "exploit_pool",
    )  # fmt: skip
    TIFL: ClassVar[tuple[str, ...]] = ("tiers", "interval", "credits")
    REFL: ClassVar[tuple[str, ...]] = (
        "prohibit_reselect", "availability_probability", "deadline_alpha", "stale_updates",
        "stale_beta", "scale_coff",
    )  # fmt: skip

    def reads(self, field: str) -> bool:
        """Whether this selection depends on its field ``field``."""
        if field in ("name", "over_commit"):
            return True
        if field in ("stale_beta", "scale_coff") and not self.stale_updates:
            return False
        return field in {"oort": self.OORT, "tifl": self.TIFL, "refl": self.REFL}.get(self.name, ())


class CisNodeConfig(_Section):
    parent: int = Field(..., ge=-1, le=MAX_CLIENTS, description="the parent node (−1: the root)")
    exit: int = Field(..., ge=1, le=64, description="E_i: the deepest exit the node holds")
    arrival: float = Field(0.0, ge=0, description="λ^a_i: requests per second arriving here")
    capacity: float | None = Field(
        None, ge=0, description="μ^max_i: requests per second it may forward (null: unlimited)"
    )


#: nodes of the cis section's named trees
CIS_TREE_SIZES = {"4-2-1": 7, "12-4-1": 17}


class CisConfig(_Section):
    """The collaborative inference system (docs/methods/cis.md): a tree of devices (node i
    = client i), its serving rates and the data split over its layers. Read by the cis-*
    strategies, by ``partition.sizes: tree`` and by the evaluation of an early-exit model
    (``cis_accuracy``)."""

    tree: Literal["4-2-1", "12-4-1", "custom"] | None = Field(
        None,
        description="the paper's trees (leaves → edge → root), custom (cis.nodes), or null: "
        "not a collaborative inference system",
    )
    nodes: list[CisNodeConfig] | None = Field(None, description="tree: custom: node i's links")
    serving: str | None = Field(
        None,
        description="'x-y-z': the shares served at exits 1, 2, 3 (Table 1's settings); null = "
        "from the nodes' arrival rates and capacities (eqs. 2–5; the named trees: 80-15-5)",
    )
    split: Literal["equal", "biased", "highly-biased"] | list[float] = Field(
        "equal",
        description="share of the training data per exit layer, leaves' first: equal "
        "(1/3 each), biased (14.3/28.6/57.1 %), highly-biased (3.4/19.9/76.7 %), or a list",
    )
    also_serving: list[str] = Field(
        [],
        description="more 'x-y-z' serving settings at which each evaluation routes the test "
        "set too: a column cis_accuracy_<x-y-z> each (cis-equal and cis-flops train the same "
        "whatever the serving rates, so one run gives every column of Table 1)",
    )

    @field_validator("serving")
    @classmethod
    def _shares(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            vals = [float(x) for x in v.split("-")]
        except ValueError:
            raise ValueError(
                "give the shares served at each exit as numbers, e.g. '80-15-5'"
            ) from None
        if len(vals) > 64 or any(not 0 <= x < math.inf for x in vals) or sum(vals) <= 0:
            raise ValueError("the shares must be finite numbers ≥ 0, not all 0 (e.g. '80-15-5')")
        return v

    @field_validator("split")
    @classmethod
    def _layer_shares(cls, v: Any) -> Any:
        if isinstance(v, list) and (
            not v or len(v) > 64 or any(not 0 <= x < math.inf for x in v) or sum(v) <= 0
        ):
            raise ValueError("the layer shares must be finite numbers ≥ 0, not all 0")
        return v

    @property
    def size(self) -> int | None:
        if self.tree is None:
            return None
        if self.tree == "custom":
            return len(self.nodes or [])
        return CIS_TREE_SIZES[self.tree]


class ExperimentConfig(_Section):
    name: str = "experiment"
    description: str = ""
    seed: int = Field(0, ge=0, le=MAX_SEED)
    data: DataConfig = DataConfig()
    partition: PartitionConfig = PartitionConfig()
    model: ModelConfig = ModelConfig()
    population: PopulationConfig = PopulationConfig()
    train: TrainConfig = TrainConfig()
    strategy: StrategyOptionsUnion = FedAvgOptions()
    budget: BudgetConfig = BudgetConfig(aggregations=20)
    eval: EvalConfig = EvalConfig()
    guard: GuardConfig = GuardConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    executor: ExecutorConfig = ExecutorConfig()
    compare: CompareConfig = CompareConfig()
    salf: SalfConfig = SalfConfig()
    cis: CisConfig = CisConfig()
    selection: SelectionConfig = SelectionConfig()
    output_dir: str = "runs"

    @field_validator("name")
    @classmethod
    def _folder_name(cls, v: str) -> str:
        """The name starts the run folder's name: one plain name inside output_dir."""
        if not v or len(v) > 100:
            raise ValueError("give a name of 1 to 100 characters (it names the run folder)")
        if v in (".", "..") or any(c in "/\\" or not c.isprintable() for c in v):
            raise ValueError(
                "the name becomes a folder inside output_dir, so it cannot be '.' or '..' or "
                "hold a slash, a backslash or a control character"
            )
        return v

    @model_validator(mode="before")
    @classmethod
    def _strategy_fields(cls, data: Any, info: ValidationInfo) -> Any:
        """Moved fields to their new place; the strategy section split into the fields its
        strategy reads and those it carries for the other strategies of a comparison."""
        if not isinstance(data, dict):
            return data
        data = _move_deprecated(dict(data))
        raw = data.get("strategy")
        if isinstance(raw, dict):
            data["strategy"] = _split_strategy(dict(raw), _role(info), _compared(data))
        return data

    @model_validator(mode="after")
    def _cis_tree(self) -> ExperimentConfig:
        """A tree of devices needs one client per node; CIS strategies need a tree."""
        c = self.cis
        if c.tree == "custom" and not c.nodes:
            raise _sentence("cis.tree is custom, so list its nodes in cis.nodes.")
        if c.tree is not None and c.tree != "custom" and c.nodes:
            raise _sentence(f"cis.nodes is given but cis.tree is {c.tree!r}; set cis.tree: custom.")
        if c.size is not None and self.partition.num_clients != c.size:
            raise _sentence(
                f"partition.num_clients is {self.partition.num_clients} but the cis tree "
                f"{c.tree} has {c.size} nodes (one client per node)."
            )
        if self.partition.sizes == "tree" and c.tree is None:
            raise _sentence("partition.sizes is tree, so set cis.tree (the tree whose layers "
                            "split the data).")  # fmt: skip
        if c.tree is not None and self.model.arch in ("ee_cnn", "ee_resnet18"):
            model_exits = (
                len(self.model.exits or (1, 2, 3)) if self.model.arch == "ee_resnet18" else 3
            )
            deepest = max((n.exit for n in c.nodes or ()), default=3)
            if deepest > model_exits:
                raise _sentence(
                    f"cis: a node holds exit {deepest} but model {self.model.arch} has "
                    f"{model_exits} exits."
                )
        concurrency = getattr(self.strategy, "concurrency", None)
        if concurrency is not None and concurrency > self.partition.num_clients:
            raise _sentence(
                f"strategy.concurrency = {concurrency} exceeds the {self.partition.num_clients} "
                "clients; set at most partition.num_clients (or null: every client)."
            )
        b, e = self.budget, self.eval
        if (
            b.virtual_time
            and e.every_virtual_seconds
            and b.virtual_time / e.every_virtual_seconds > 1e6
        ):
            raise _sentence(
                f"eval.every_virtual_seconds {e.every_virtual_seconds:g} asks for more than a "
                f"million evaluations over budget.virtual_time {b.virtual_time:g}; evaluate less often."
            )
        if self.strategy.name.startswith("cis-"):
            if c.tree is None:
                raise _sentence(
                    f"Strategy {self.strategy.name!r} trains across a tree of devices: set "
                    "cis.tree (4-2-1, 12-4-1 or custom)."
                )
            if self.model.arch not in ("ee_cnn", "ee_resnet18"):
                raise _sentence(
                    f"Strategy {self.strategy.name!r} trains early exits: set model.arch to "
                    f"ee_cnn or ee_resnet18 (got {self.model.arch})."
                )
        return self

    @model_validator(mode="after")
    def _selection(self, info: ValidationInfo) -> ExperimentConfig:
        """A selection other than uniform, or over-commitment, needs rounds that sample a
        fraction of clients."""
        name = self.selection.name
        if _role(info) == "grid":
            return self
        own = STRATEGY_OPTIONS[self.strategy.name]
        if self.selection.over_commit > 1.0:
            if not own.selects or getattr(self.strategy, "concurrency", None) is not None:
                raise _sentence(
                    f"selection.over_commit is {self.selection.over_commit:g}, but strategy "
                    f"{self.strategy.name!r} has no rounds that sample clients (K-of-N rounds "
                    "are synchronous: "
                    + ", ".join(n for n, o in STRATEGY_OPTIONS.items() if o.selects and
                                "concurrency" not in o.model_fields)
                    + "); leave it 1."
                )  # fmt: skip
            if getattr(self.strategy, "client_fraction", 1.0) >= 1.0:
                raise _sentence(
                    f"selection.over_commit is {self.selection.over_commit:g}, but "
                    "strategy.client_fraction is 1: every client is asked already, so there is "
                    "nobody more to ask; set a fraction below 1."
                )
        if name == "random":
            return self
        if not own.samples_clients(self):
            raise _sentence(
                f"selection.name is {name}, but strategy {self.strategy.name!r} does not sample "
                "clients (strategies that do: "
                + ", ".join(n for n, o in STRATEGY_OPTIONS.items() if o.selects)
                + ", the asynchronous ones with strategy.concurrency); leave selection.name "
                "random."
            )
        concurrency = getattr(self.strategy, "concurrency", None)
        if concurrency is not None:
            if concurrency >= self.partition.num_clients:
                raise _sentence(
                    f"selection.name is {name}, but strategy.concurrency is the whole "
                    "population: every client trains all the time, so there is nobody to "
                    "choose; set a concurrency below partition.num_clients."
                )
        elif getattr(self.strategy, "client_fraction", 1.0) >= 1.0:
            raise _sentence(
                f"selection.name is {name}, but strategy.client_fraction is 1: every client "
                "takes part each round, so there is nobody to choose; set a fraction below 1."
            )
        return self

    @model_validator(mode="after")
    def _salf_fields(self, info: ValidationInfo) -> ExperimentConfig:
        """A ``salf`` field set away from its default must be one the strategy reads."""
        role = _role(info)
        if role == "grid":
            return self
        own = STRATEGY_OPTIONS[self.strategy.name]
        compared = _entry_names(self.compare.strategies)
        for f, field in SalfConfig.model_fields.items():
            if f in own.salf_fields or getattr(self.salf, f) == field.default:
                continue
            readers = readers_of(f"salf.{f}")
            if role == "run" and compared & set(readers):
                continue  # a comparison's base config: kept for the strategies that read it
            raise _sentence(_foreign(f"salf.{f}", readers, self.strategy.name))
        return self


# ---------------------------------------------------------------- strategy fields
#
# A field of another strategy's options in the strategy section (``t_max`` for fedavg):
# - left at the default every strategy gives it: dropped (the full configs that earlier
#   versions wrote list every field of the old flat section);
# - in the base config of a comparison or sweep (role "grid"): carried, and each cell keeps
#   the fields its own strategy reads (cell_raw), so a field no strategy of the grid reads
#   changes nothing (one grid may be run by several commands, split by strategy);
# - in a single run (role "run"): an error, unless a strategy listed in
#   compare.strategies reads it (the config is then a comparison's base, as the demo
#   preset: fedavg with the t_max drop-stragglers uses); the run does not see it;
# - in a cell of a comparison (role "cell"): an error.
# The salf section is checked the same way (after validation, against the defaults).

Role = Literal["run", "grid", "cell"]

# moved fields: old path → new path (the old one is still read, with a FutureWarning)
MOVED: dict[str, str] = {"salf.normalize": "data.normalize", "salf.val_holdout": "eval.val_holdout"}


def _sentence(text: str) -> PydanticCustomError:
    """A validation error whose message is the whole sentence shown to the user."""
    return PydanticCustomError("config_sentence", "{sentence}", {"sentence": text})


def _role(info: ValidationInfo) -> Role:
    role = (info.context or {}).get("role", "run")
    assert role in ("run", "grid", "cell"), role
    return role


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _foreign(path: str, readers: Sequence[str], name: str) -> str:
    return f"Config field '{path}' is read by {_and(readers)}, not by {name}."


def _entry_names(entries: Any) -> set[str]:
    """Strategy names of compare entries (``fedfix:delta_t=0.5`` → ``fedfix``)."""
    if not isinstance(entries, list):
        return set()
    return {e.split(":")[0].strip() for e in entries if isinstance(e, str)}


def _compared(data: dict[str, Any]) -> set[str]:
    compare = data.get("compare")
    return _entry_names(compare.get("strategies")) if isinstance(compare, dict) else set()


def _default(field: str) -> Any:
    """The default of a strategy field (the same in every options class that has it)."""
    return STRATEGY_OPTIONS[readers_of(f"strategy.{field}")[0]].model_fields[field].default


def _split_strategy(raw: dict[str, Any], role: Role, compared: set[str]) -> dict[str, Any]:
    name = raw.setdefault("name", "fedavg")
    own = STRATEGY_OPTIONS.get(name) if isinstance(name, str) else None
    if own is None:
        return raw  # pydantic names the unknown strategy
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in own.model_fields:
            out[key] = value
            continue
        readers = readers_of(f"strategy.{key}")
        if not readers:
            raise _sentence(
                f"Unknown config field 'strategy.{short(str(key))}'; allowed fields in strategy: "
                f"{', '.join(own.model_fields)} (the options of {name})."
            )
        try:  # checked as the field of a strategy that reads it
            reader = STRATEGY_OPTIONS[readers[0]]
            value = getattr(reader.model_validate({"name": readers[0], key: value}), key)
        except ValidationError as err:
            raise _sentence(describe_validation_error(err, prefix=("strategy",))) from None
        if value == _default(key):
            continue
        if role == "grid" or (role == "run" and compared & set(readers)):
            out[key] = value
            continue
        raise _sentence(_foreign(f"strategy.{key}", readers, name))
    return out


def _moved_warning(old: str, new: str) -> None:
    warnings.warn(
        f"Config field '{old}' is now '{new}'; the old path still works but is deprecated.",
        FutureWarning,
        stacklevel=2,
    )


def _move_deprecated(data: dict[str, Any]) -> dict[str, Any]:
    """``salf.normalize`` → ``data.normalize``, ``salf.val_holdout`` → ``eval.val_holdout``."""
    salf = data.get("salf")
    if not isinstance(salf, dict):
        return data
    salf = data["salf"] = dict(salf)
    for old, new in MOVED.items():
        field = old.split(".")[1]
        section, key = new.split(".")
        target = data.get(section) or {}
        if field not in salf or not isinstance(target, dict):
            continue
        value = salf.pop(field)
        if key in target and target[key] != value:
            raise _sentence(
                f"Config field '{old}' is now '{new}', and the config gives both with "
                f"different values ({short(repr(value))} and {short(repr(target[key]))}); keep "
                f"only '{new}'."
            )
        data[section] = {**target, key: value}
        owner = DataConfig if section == "data" else EvalConfig
        if value != owner.model_fields[key].default:
            _moved_warning(old, new)
    return data


def own_fields(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` as its strategy's run sees it: without the fields it carries for others."""
    s = cfg.strategy
    if not s.model_extra:
        return cfg
    own = type(s).model_validate(s.model_dump(exclude=set(s.model_extra)))
    return cfg.model_copy(update={"strategy": own})


def cell_raw(cfg: ExperimentConfig, name: str) -> dict[str, Any]:
    """``cfg`` as a raw dict for a run of strategy ``name``: its strategy section and its
    ``salf`` section keep only the fields ``name`` reads (a comparison's cell)."""
    data = cfg.model_dump()
    own = STRATEGY_OPTIONS.get(name)
    if own is None:
        data["strategy"]["name"] = name  # validation names the unknown strategy
        return data
    given = data["strategy"]
    data["strategy"] = {k: given[k] for k in own.model_fields if k in given} | {"name": name}
    data["salf"] = {k: v for k, v in data["salf"].items() if k in own.salf_fields}
    return data


# ---------------------------------------------------------------- loading


def _section_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: Any = ExperimentConfig
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        elif ann is not None and getattr(ann, "__origin__", None) is list:
            (inner,) = ann.__args__
            model = inner
        else:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def describe_validation_error(err: ValidationError, *, prefix: tuple[str, ...] = ()) -> str:
    """One sentence for the first problem in a pydantic ValidationError (``prefix``: the
    location of the validated section in the config)."""
    errors = err.errors()
    # an unknown field explains a "missing" one that was misspelt: report it first
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    if e["type"] == "config_sentence":
        return str(e["ctx"]["sentence"])
    loc = prefix + tuple(
        p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))
    )
    if len(loc) > 1 and loc[0] == "strategy" and loc[1] in STRATEGY_OPTIONS:
        loc = loc[:1] + loc[2:]  # the union's tag: the strategy's options class
    path = ".".join(short(str(p)) for p in loc) or "config"
    if e["type"] == "union_tag_invalid" and loc == ("strategy",):
        name = e["input"].get("name") if isinstance(e["input"], dict) else e["input"]
        allowed = ", ".join(sorted(STRATEGY_OPTIONS))
        return (
            f"Invalid config field 'strategy.name': unknown strategy {short(repr(name))}; "
            f"allowed: {allowed}."
        )
    if e["type"] == "extra_forbidden":
        parent_loc = tuple(p for p in loc[:-1] if not isinstance(p, int))
        section = _section_at(parent_loc)
        allowed = ", ".join(section.model_fields) if section else "see docs/config.md"
        where = ".".join(str(p) for p in loc[:-1]) or "the top level"
        return f"Unknown config field '{path}'; allowed fields in {where}: {allowed}."
    msg = e["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    got = e.get("input")
    shown = "" if isinstance(got, dict) or e["type"] == "missing" else f" (got {short(repr(got))})"
    return f"Invalid config field '{path}': {msg}{shown}."


# ---------------------------------------------------------------- bounded YAML
#
# A config is small: YAML that no config needs is refused before it can cost memory or
# recursion (docs/reliability.md): aliases (``*a``, so no "billion laughs"), nesting deeper
# than MAX_DEPTH, a key given twice in one mapping (PyYAML keeps the last silently),
# integers outside int64, files over MAX_CONFIG_BYTES.

MAX_DEPTH = 20
MAX_CONFIG_BYTES = 1 << 20
_INT64 = 1 << 63


class YamlLimit(yaml.YAMLError):
    """YAML that a config may not hold; ``str()`` is the end of a sentence."""


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` within the limits above."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise YamlLimit(
                f"uses a YAML alias at line {mark.line + 1} (*name), which a config may not"
            )
        self._depth += 1
        if self._depth > MAX_DEPTH:
            mark = self.peek_event().start_mark
            raise YamlLimit(f"nests deeper than {MAX_DEPTH} levels (line {mark.line + 1})")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: SafeConstructor says so
                break
            if duplicate:
                raise YamlLimit(
                    f"gives '{short(str(key))}' twice in one mapping (line "
                    f"{key_node.start_mark.line + 1}); keep one"
                )
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        digits = sum(c.isdigit() for c in str(node.value))
        value = super().construct_yaml_int(node) if digits <= 40 else _INT64
        if not -_INT64 <= value < _INT64:
            raise YamlLimit(
                f"holds an integer too large for any field ({short(str(node.value), 20)}, line "
                f"{node.start_mark.line + 1})"
            )
        return value

    def construct_other(self, node: Any) -> Any:
        """A date, bytes, set or ordered pairs: no config field holds one."""
        kind = node.tag.rsplit(":", 1)[-1]
        raise YamlLimit(
            f"holds a YAML {kind} at line {node.start_mark.line + 1}, which no config field "
            "takes (quote it to give text)"
        )


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)
for _tag in ("timestamp", "binary", "set", "omap", "pairs"):
    _BoundedLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _BoundedLoader.construct_other)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` within the limits above (YamlLimit, or another YAMLError)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except RecursionError:
        raise YamlLimit(f"nests deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()


def _set_path(raw: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = raw
    for p in parts[:-1]:
        child = node.get(p)
        if child is None:
            child = node[p] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"Cannot set '{short(dotted)}': '{short(p)}' is not a section.")
        node = child
    node[parts[-1]] = value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a raw config dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"Override '{short(item)}' is not of the form key.path=value.")
        key, _, text = item.partition("=")
        key = key.strip()
        if not key:
            raise ConfigError(f"Override '{short(item)}' has an empty key.")
        if any(not part.strip() for part in key.split(".")):
            raise ConfigError(f"Override '{short(item)}' has an empty part in its key path.")
        try:
            value = load_yaml(text) if text.strip() else None
        except YamlLimit as exc:
            raise ConfigError(f"Override '{short(item)}' {exc}.") from None
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"Override '{short(item)}' has a value that is not valid YAML "
                f"({exc.__class__.__name__})."
            ) from None
        if key in MOVED:  # the new path, so that it replaces what the file gives there
            _moved_warning(key, MOVED[key])
            key = MOVED[key]
        _set_path(raw, key, value)
    return raw


def validate(raw: dict[str, Any], *, role: Role = "run") -> ExperimentConfig:
    """Validate a raw config. ``role``: ``run`` (one strategy's run), ``grid`` (the base
    config of a comparison or sweep: it may carry fields for every strategy of the grid),
    ``cell`` (one cell of a grid: only its strategy's fields)."""
    try:
        return ExperimentConfig.model_validate(raw, context={"role": role})
    except ValidationError as err:
        raise ConfigError(describe_validation_error(err)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        what = "is a folder, not a config file" if p.is_dir() else "not found"
        raise ConfigError(f"Config file {what}: {p}." if what == "not found" else f"{p} {what}.")
    try:
        with p.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise ConfigError(f"Config file {p} could not be read ({reason}).") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"Config file {p} is larger than {MAX_CONFIG_BYTES >> 20} MiB; a config is a few "
            "hundred lines."
        )
    try:
        raw = load_yaml(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"Config file {p} is not UTF-8 text (byte {exc.start} cannot be decoded)."
        ) from None
    except YamlLimit as exc:
        raise ConfigError(f"Config file {p} {exc}.") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"Config file {p} is not valid YAML{where}.") from None
    if raw is None:
        raise ConfigError(
            f"Config file {p} is empty; give at least one section (`fedclock presets demo` "
            "prints a complete config)."
        )
    if not isinstance(raw, dict):
        raise ConfigError(
            f"Config file {p} must hold a mapping of sections, not a {type(raw).__name__}."
        )
    return raw


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    raw: dict[str, Any] | None = None,
    grid: bool = False,
) -> ExperimentConfig:
    """Load a config from YAML (or a raw dict), apply overrides, validate. ``grid``: the
    config is the base of a comparison or sweep (see :func:`validate`)."""
    data = copy.deepcopy(raw) if raw is not None else (read_yaml(path) if path is not None else {})
    cfg = validate(apply_overrides(data, list(overrides or [])), role="grid" if grid else "run")
    if not grid:
        check_explicit(cfg, overrides or [])
    return cfg


def check_explicit(cfg: ExperimentConfig, overrides: Sequence[str]) -> None:
    """A ``--set strategy.<field>`` of a single run that the run cannot read is refused:
    a field of another strategy (carried for a comparison, e.g. ``strategy.scheduler``
    with ``fed-raa-random``, which fixes it) or one its own settings leave unread (e.g.
    ``strategy.alpha`` in Fed-RAA's reference mode)."""
    own = type(cfg.strategy)
    name = cfg.strategy.name
    unread = own.unread(cfg)
    for item in overrides:
        key = item.partition("=")[0].strip()
        if not key.startswith("strategy.") or key == "strategy.name":
            continue
        field = key.split(".", 1)[1]
        if field not in own.model_fields:
            fixed = getattr(own, "fixed", {})
            why = (
                f"{name} fixes it to {fixed[field]!r}" if field in fixed
                else f"it is read by {_and(readers_of(key))}"
            )  # fmt: skip
            raise ConfigError(f"--set {key} has no effect on a {name} run ({why}); remove it.")
        if key in unread:
            raise ConfigError(
                f"--set {key} has no effect on this {name} run: its other settings leave "
                f"it unread ({own.unread_reason(cfg, key)}); remove it."
            )


def to_yaml(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
