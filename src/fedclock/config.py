"""Experiment configuration: a versionable YAML file validated by pydantic.

Every section forbids unknown fields, so a typo fails with one sentence naming
the field and the fields that are allowed. ``docs/config.md`` documents every
field; the defaults below are the documented defaults.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from fedclock.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SyntheticConfig(_Section):
    num_samples: int = Field(2000, ge=10)
    num_features: int = Field(20, ge=1)
    num_classes: int = Field(4, ge=2)
    separation: float = Field(2.0, ge=0)
    image_shape: list[int] | None = Field(
        None,
        min_length=1,
        description="sample shape, e.g. [3, 32, 32] for CIFAR-shaped runs; replaces num_features",
    )

    @field_validator("image_shape")
    @classmethod
    def _positive_dims(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(d < 1 for d in v):
            raise ValueError("every dimension must be a positive integer")
        return v


class TextConfig(_Section):
    seq_len: int = Field(80, ge=1, description="characters per input window")
    stride: int = Field(20, ge=1, description="characters between successive window starts")
    min_samples: int = Field(
        10, ge=2, description="speaking roles with fewer windows than this are dropped"
    )


class DataConfig(_Section):
    name: Literal["digits", "mnist", "synthetic", "shakespeare", "cifar10", "cifar100"] = "digits"
    data_dir: str | None = None
    test_fraction: float = Field(0.2, gt=0, lt=1)
    max_train: int | None = Field(None, ge=1)
    max_test: int | None = Field(None, ge=1)
    synthetic: SyntheticConfig = SyntheticConfig()
    text: TextConfig = TextConfig()
    normalize: Literal["dataset", "authors"] = Field(
        "dataset",
        description="MNIST inputs: the loader's (x−0.1307)/0.3081, or the SALF authors' "
        "(x−0.5)/0.5 (formerly salf.normalize)",
    )


class PartitionConfig(_Section):
    scheme: Literal["iid", "dirichlet", "shards", "natural"] = "iid"
    num_clients: int = Field(20, ge=1)
    alpha: float = Field(0.5, gt=0)
    shards_per_client: int = Field(2, ge=1)
    sizes: Literal["equal", "lognormal"] = "equal"
    size_sigma: float = Field(1.0, ge=0)
    min_samples: int = Field(1, ge=1)


class ModelConfig(_Section):
    arch: Literal[
        "logreg", "mlp", "cnn", "fraboni_cnn", "lstm", "vgg11", "vgg13", "vgg16", "vgg19"
    ] = "mlp"
    hidden: list[int] = [64]
    channels: list[int] = [32, 64]
    kernel_size: int = Field(5, ge=1)
    fc_hidden: int | None = Field(
        None,
        ge=1,
        description="null = the arch's default: cnn 512, fraboni_cnn 64 (256 if >10 classes)",
    )
    padding: Literal["same", "valid"] = "same"
    embed_dim: int = Field(8, ge=1, description="lstm: character embedding width")
    lstm_hidden: int = Field(100, ge=1, description="lstm: units per LSTM layer")
    lstm_layers: int = Field(2, ge=1, description="lstm: stacked LSTM layers")
    vgg_width: float = Field(1.0, gt=0, description="vgg*: channel multiplier (1 = the paper's)")

    @field_validator("hidden", "channels")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(w < 1 for w in v):
            raise ValueError("every width must be a positive integer")
        return v

    @field_validator("channels")
    @classmethod
    def _two_convs(cls, v: list[int]) -> list[int]:
        if len(v) != 2:
            raise ValueError("the CNN has two conv layers, so give exactly two channel counts")
        return v


class SlowdownConfig(_Section):
    kind: Literal["none", "lognormal", "exponential"] = "none"
    sigma: float = Field(0.5, ge=0)


class DeviceClassConfig(_Section):
    fraction: float = Field(gt=0, le=1)
    speed: float = Field(gt=0)
    up_bandwidth: float | None = Field(None, gt=0, description="null: population.up_bandwidth")
    down_bandwidth: float | None = Field(None, gt=0, description="null: population.down_bandwidth")


class PopulationConfig(_Section):
    scenario: Literal["homogeneous", "fx", "classes"] = "homogeneous"
    speed: float = Field(1.0e8, gt=0, description="FLOP/s (the slowest device under fx)")
    up_bandwidth: float | None = Field(1.0e6, gt=0, description="bytes/s; null = free")
    down_bandwidth: float | None = Field(1.0e6, gt=0, description="bytes/s; null = free")
    fx_percent: float = Field(80.0, ge=0, lt=100)
    classes: list[DeviceClassConfig] = []
    slowdown: SlowdownConfig = SlowdownConfig()
    straggler_ratio: float = Field(
        0.0, ge=0, le=1, description="SALF straggler-ratio scenario: fraction ρ of stragglers"
    )

    @model_validator(mode="after")
    def _classes_given(self) -> PopulationConfig:
        if self.scenario == "classes" and not self.classes:
            raise ValueError("scenario 'classes' needs a non-empty population.classes list")
        return self


class TrainConfig(_Section):
    local_epochs: float | None = Field(1.0, gt=0)
    local_steps: int | None = Field(None, ge=1)
    batch_size: int = Field(32, ge=1)
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


class StrategyConfig(_Section):
    name: str = "fedavg"
    client_fraction: float = Field(1.0, gt=0, le=1)
    t_max: float | None = Field(None, gt=0, description="round deadline in virtual seconds")
    weights: Literal["samples", "uniform"] = Field(
        "samples", description="client importance p_i: ∝ data size n_i, or uniform 1/M"
    )
    server_lr: float = Field(1.0, gt=0, description="η_g of θ ← θ + η_g Σ d_i Δ_i")
    # ---- asynchronous family (docs/methods/async.md)
    aggregation_weights: Literal[
        "auto", "identical", "time-based", "fedfix", "fedbuff", "participation", "sync"
    ] = Field("auto", description="d_i of eq. 6; auto = the strategy's own rule")
    delta_t: float | None = Field(None, gt=0, description="FedFix period Δt in virtual seconds")
    buffer_size: int | None = Field(
        None, ge=1, description="FedBuff: a server step every m arrivals"
    )
    server_momentum: float = Field(0.0, ge=0, lt=1, description="server momentum β (0 = none)")
    alpha: float = Field(0.6, gt=0, le=1, description="FedAsync mixing weight α")
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
        description="asynchronous family: at most this many clients train at once, drawn "
        "uniformly from the idle ones (FLSim's max concurrency); null = every client",
    )
    tau_source: Literal["profile", "estimated"] = Field(
        "profile", description="update times τ_i: device profile, or estimated from arrivals"
    )

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from fedclock.strategies import STRATEGIES

        if v not in STRATEGIES:
            raise ValueError(f"unknown strategy '{v}'; allowed: {', '.join(sorted(STRATEGIES))}")
        return v


class BudgetConfig(_Section):
    virtual_time: float | None = Field(None, gt=0)
    aggregations: int | None = Field(None, ge=1)
    updates: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _some(self) -> BudgetConfig:
        if self.virtual_time is None and self.aggregations is None and self.updates is None:
            raise ValueError("set at least one of virtual_time, aggregations or updates")
        return self


class EvalConfig(_Section):
    every_aggregations: int | None = Field(1, ge=1)
    every_virtual_seconds: float | None = Field(None, gt=0)
    batch_size: int = Field(2048, ge=1)
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
        description="training samples held out for validation; the summary then has the test "
        "accuracy of the best-validation model (SALF reference: 10000; formerly salf.val_holdout)",
    )


class ExecutorConfig(_Section):
    kind: Literal["auto", "serial", "vectorized"] = Field(
        "auto",
        description="auto/vectorized: many clients per pass (torch.func), serial where it "
        "cannot batch; serial: one task after another",
    )
    max_batch_clients: int | None = Field(
        None, ge=1, description="clients per vectorized block; null = automatic from model size"
    )
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    threads: int | None = Field(
        None, ge=1, description="torch intra-op threads; null = torch default"
    )


class CompareConfig(_Section):
    strategies: list[str] = []
    seeds: list[int] = []
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
        if any(not x > 0 for x in v):
            raise ValueError("every learning rate must be > 0")
        return v


class SalfConfig(_Section):
    """SALF and its baselines (docs/methods/salf.md); off unless ``scenario`` is set."""

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


class ExperimentConfig(_Section):
    name: str = "experiment"
    description: str = ""
    seed: int = Field(0, ge=0)
    data: DataConfig = DataConfig()
    partition: PartitionConfig = PartitionConfig()
    model: ModelConfig = ModelConfig()
    population: PopulationConfig = PopulationConfig()
    train: TrainConfig = TrainConfig()
    strategy: StrategyConfig = StrategyConfig()
    budget: BudgetConfig = BudgetConfig(aggregations=20)
    eval: EvalConfig = EvalConfig()
    executor: ExecutorConfig = ExecutorConfig()
    compare: CompareConfig = CompareConfig()
    salf: SalfConfig = SalfConfig()
    output_dir: str = "runs"

    @model_validator(mode="before")
    @classmethod
    def _moved_fields(cls, data: Any) -> Any:
        return _move_deprecated(dict(data)) if isinstance(data, dict) else data


# moved fields: old path → new path (the old one is still read, with a FutureWarning)
MOVED: dict[str, str] = {"salf.normalize": "data.normalize", "salf.val_holdout": "eval.val_holdout"}


def _sentence(text: str) -> PydanticCustomError:
    """A validation error whose message is the whole sentence shown to the user."""
    return PydanticCustomError("config_sentence", "{sentence}", {"sentence": text})


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
        target = data.get(section, {})
        if field not in salf or not isinstance(target, dict):
            continue
        value = salf.pop(field)
        if key in target and target[key] != value:
            raise _sentence(
                f"Config field '{old}' is now '{new}', and the config gives both with "
                f"different values ({value!r} and {target[key]!r}); keep only '{new}'."
            )
        data[section] = {**target, key: value}
        owner = DataConfig if section == "data" else EvalConfig
        if value != owner.model_fields[key].default:
            _moved_warning(old, new)
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


def describe_validation_error(err: ValidationError) -> str:
    """One sentence for the first problem in a pydantic ValidationError."""
    errors = err.errors()
    # an unknown field explains a "missing" one that was misspelt: report it first
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    if e["type"] == "config_sentence":
        return str(e["ctx"]["sentence"])
    loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    path = ".".join(str(p) for p in loc) or "config"
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
    shown = "" if isinstance(got, dict) or e["type"] == "missing" else f" (got {got!r})"
    return f"Invalid config field '{path}': {msg}{shown}."


def _set_path(raw: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = raw
    for p in parts[:-1]:
        child = node.get(p)
        if child is None:
            child = node[p] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"Cannot set '{dotted}': '{p}' is not a section.")
        node = child
    node[parts[-1]] = value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a raw config dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"Override '{item}' is not of the form key.path=value.")
        key, _, text = item.partition("=")
        key = key.strip()
        if not key:
            raise ConfigError(f"Override '{item}' has an empty key.")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"Override '{item}' has a value that is not valid YAML ({exc.__class__.__name__})."
            ) from None
        if key in MOVED:  # the new path, so that it replaces what the file gives there
            _moved_warning(key, MOVED[key])
            key = MOVED[key]
        _set_path(raw, key, value)
    return raw


def validate(raw: dict[str, Any]) -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(describe_validation_error(err)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"Config file not found: {p}.")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"Config file {p} is not valid YAML{where}.") from None
    if raw is None:
        return {}
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
) -> ExperimentConfig:
    """Load a config from YAML (or a raw dict), apply overrides, validate."""
    data = copy.deepcopy(raw) if raw is not None else (read_yaml(path) if path is not None else {})
    return validate(apply_overrides(data, list(overrides or [])))


def to_yaml(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
