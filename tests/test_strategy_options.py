"""One options class per strategy: a field another strategy reads is an error naming both,
grids give each cell its own strategy's fields, sweeps ask the registry what a strategy
reads, and moved fields keep their old paths."""

from __future__ import annotations

import warnings

import pytest
import yaml

from fedclock.config import (
    STRATEGY_OPTIONS,
    STRATEGY_PATHS,
    ExperimentConfig,
    SalfConfig,
    load_config,
    own_fields,
    readers_of,
    to_yaml,
)
from fedclock.errors import ConfigError
from fedclock.experiment import run_experiment
from fedclock.presets import load_preset
from fedclock.runs import cell_config, reads, with_value
from fedclock.strategies import STRATEGIES
from tests.conftest import tiny_raw


def _error(raw: dict, *, grid: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(raw=raw, grid=grid)
    msg = str(info.value)
    assert "\n" not in msg and msg.endswith(".")
    return msg


@pytest.mark.parametrize(
    ("strategy", "salf", "expected"),
    [
        (
            {"name": "fedavg", "buffer_size": 3},
            {},
            "Config field 'strategy.buffer_size' is read by async-identical, async-time-based, "
            "fedfix and fedbuff, not by fedavg.",
        ),
        (
            {"name": "fedavg", "t_max": 3.0},
            {},
            "Config field 'strategy.t_max' is read by drop-stragglers, salf, heterofl and "
            "asyncfl, not by fedavg.",
        ),
        (
            {"name": "vanilla", "t_max": 3.0},
            {"scenario": "ratio"},
            "Config field 'strategy.t_max' is read by drop-stragglers, salf, heterofl and "
            "asyncfl, not by vanilla.",
        ),
        (
            {"name": "fedbuff", "buffer_size": 2, "alpha": 0.3},
            {},
            "Config field 'strategy.alpha' is read by fedasync, fed-raa, fed-raa-random, fed-raa-mp "
            "and fed-raa-sync, not by fedbuff.",
        ),
        (
            {"name": "salf", "concurrency": 2},
            {"scenario": "ratio"},
            "Config field 'strategy.concurrency' is read by async-identical, async-time-based, "
            "fedfix, fedbuff, fedasync, fed-raa, fed-raa-random, fed-raa-mp and fed-raa-sync, not by salf.",
        ),
        (
            {"name": "fedfix", "delta_t": 1.0, "client_fraction": 0.5},
            {},
            "Config field 'strategy.client_fraction' is read by fedavg, fedprox, fednova, scaffold, feddyn, ram-fed, fedrolex, fjord, prunefl, splitfed, "
            "drop-stragglers and salf, not by fedfix.",
        ),
        (
            {"name": "fedavg"},
            {"scenario": "ratio"},
            "Config field 'salf.scenario' is read by drop-stragglers, vanilla, salf, heterofl "
            "and asyncfl, not by fedavg.",
        ),
        (
            {"name": "salf"},
            {"scenario": "ratio", "heterofl_rate": 0.25},
            "Config field 'salf.heterofl_rate' is read by heterofl, not by salf.",
        ),
    ],
)
def test_a_field_of_another_strategy_fails_naming_both(strategy, salf, expected):
    assert _error({"strategy": strategy, "salf": salf}) == expected


def test_unknown_and_invalid_strategy_fields():
    msg = _error({"strategy": {"name": "fedbuff", "buffer_sise": 3}})
    assert msg.startswith("Unknown config field 'strategy.buffer_sise'; allowed fields in ")
    assert "buffer_size" in msg and "alpha" not in msg and "(the options of fedbuff)" in msg
    # a field of another strategy is still checked as that strategy's field
    assert _error({"strategy": {"name": "fedavg", "t_max": -1}}) == (
        "Invalid config field 'strategy.t_max': Input should be greater than 0 (got -1)."
    )
    assert _error({"strategy": {"name": "fedbuff", "buffer_size": 0}}).startswith(
        "Invalid config field 'strategy.buffer_size': Input should be greater than or equal to 1"
    )


def test_the_registry_names_each_strategys_options():
    assert list(STRATEGIES) == list(STRATEGY_OPTIONS)
    for name, spec in STRATEGIES.items():
        assert spec.options is STRATEGY_OPTIONS[name]
        assert spec.options().name == name  # the union's tag
        assert set(spec.options.salf_fields) <= set(SalfConfig.model_fields)
    # a field shared by several strategies has one meaning: the same default everywhere
    for path in STRATEGY_PATHS:
        section, _, field = path.partition(".")
        if section == "strategy" and field != "name":
            defaults = {
                repr(STRATEGY_OPTIONS[n].model_fields[field].default) for n in readers_of(path)
            }
            assert len(defaults) == 1, path
    # every strategy-specific path has a reader, and every strategy reads its name
    assert all(readers_of(p) for p in STRATEGY_PATHS)
    assert readers_of("strategy.name") == list(STRATEGIES)


def test_old_full_configs_still_load():
    """Earlier versions wrote every field of the old flat strategy section (and of salf):
    fields left at their defaults are dropped, moved ones go to their new place."""
    old = {
        "strategy": {
            "name": "fedfix", "client_fraction": 1.0, "t_max": None, "weights": "uniform",
            "server_lr": 1.0, "aggregation_weights": "auto", "delta_t": 0.5, "buffer_size": 5,
            "server_momentum": 0.0, "alpha": 0.6, "staleness": "constant", "staleness_a": 0.5,
            "staleness_b": 4.0, "staleness_normalize_at": None, "concurrency": None,
            "tau_source": "profile",
        },
        "salf": {
            "scenario": None, "mode": "paper", "p_rule": "exact", "heterofl_rate": 0.5,
            "val_holdout": 0, "normalize": "dataset", "charge": "work",
        },
    }  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # defaults: nothing to warn about
        cfg = load_config(raw=old)
    assert cfg.strategy.name == "fedfix" and cfg.strategy.weights == "uniform"
    assert not cfg.strategy.model_extra and "alpha" not in cfg.strategy.model_dump()


def test_a_comparison_base_carries_fields_for_its_strategies(tmp_path):
    # the demo preset: fedavg, with the t_max drop-stragglers uses in its comparison
    cfg = load_config(raw=load_preset("demo"))
    assert cfg.strategy.name == "fedavg" and cfg.strategy.model_extra == {"t_max": 3.0}
    assert not own_fields(cfg).strategy.model_extra  # what the fedavg run reads
    assert to_yaml(cfg) == to_yaml(load_config(raw=yaml.safe_load(to_yaml(cfg))))
    # cells keep their own strategy's fields
    assert "t_max" not in cell_config(cfg, "fedavg", 0).strategy.model_dump()
    assert cell_config(cfg, "drop-stragglers", 0).strategy.model_dump()["t_max"] == 3.0
    # without the comparison, t_max is foreign to fedavg's run
    raw = load_preset("demo")
    del raw["compare"]
    assert "not by fedavg" in _error(raw)
    # a grid's base (compare, sweep) may carry any strategy's fields; a cell may not
    base = load_config(raw=tiny_raw(strategy={"buffer_size": 2, "alpha": 0.3}), grid=True)
    assert cell_config(base, "fedbuff", 1).strategy.model_dump()["buffer_size"] == 2
    assert cell_config(base, "fedasync", 1).strategy.model_dump()["alpha"] == 0.3
    with pytest.raises(
        ConfigError,
        match="is read by fedasync, fed-raa, fed-raa-random, fed-raa-mp and fed-raa-sync, not by fedbuff",
    ):
        cell_config(base, "fedbuff:alpha=0.5", 1)
    # the salf section follows its readers too
    salf = load_config(raw=tiny_raw(salf={"scenario": "ratio", "heterofl_rate": 0.25}), grid=True)
    assert cell_config(salf, "heterofl", 1).salf.heterofl_rate == 0.25
    assert cell_config(salf, "salf", 1).salf.heterofl_rate == 0.5
    assert cell_config(salf, "fedavg", 1).salf == SalfConfig()
    # a run never sees what it carries
    run = run_experiment(
        load_config(raw=tiny_raw(strategy={"t_max": 0.001}, budget={"aggregations": 1},
                                 compare={"strategies": ["drop-stragglers"]})),
        run_dir=tmp_path / "r",
    )  # fmt: skip
    assert run.summary["status"] == "completed"  # t_max 0.001 would be impossible


def test_sweeps_ask_the_registry_what_a_strategy_reads():
    cfg = load_config(raw=tiny_raw(), grid=True)
    assert not reads(cfg, "fedavg", "strategy.t_max") and reads(
        cfg, "drop-stragglers", "strategy.t_max"
    )
    assert all(reads(cfg, n, "train.lr") for n in STRATEGIES)
    assert not reads(cfg, "fedavg", "population.straggler_ratio")
    ratio = load_config(raw=tiny_raw(salf={"scenario": "ratio"}), grid=True)
    deadline = load_config(raw=tiny_raw(salf={"scenario": "deadline"}), grid=True)
    for c in (ratio, deadline):  # vanilla: no deadline, no stragglers
        assert not reads(c, "vanilla", "strategy.t_max")
        assert not reads(c, "vanilla", "population.straggler_ratio")
    assert reads(ratio, "salf", "population.straggler_ratio")
    assert not reads(ratio, "salf", "strategy.t_max") and reads(deadline, "salf", "strategy.t_max")
    assert not reads(ratio, "drop-stragglers", "strategy.client_fraction")
    assert reads(cfg, "drop-stragglers", "strategy.client_fraction")
    assert reads(ratio, "salf", "salf.p_rule") and not reads(ratio, "heterofl", "salf.p_rule")
    weights = load_config(raw=tiny_raw(strategy={"aggregation_weights": "fedbuff"}), grid=True)
    assert not reads(cfg, "fedfix", "strategy.buffer_size")
    assert reads(weights, "fedfix", "strategy.buffer_size")


# ---- every "does not read" the registry claims, checked by running the strategy at two values

_VALUES = {
    "strategy.t_max": (0.5, 5.0),
    "strategy.client_fraction": (0.5, 1.0),
    "strategy.server_beta2": (0.9, 0.99),
    "strategy.server_eps": (1e-3, 1e-2),
    "strategy.k": (0.5, 5.0),
    "strategy.count": ("assigned", "completed"),
    "strategy.reference_weight": ("share-discount", "one"),
    "strategy.alpha": (0.3, 0.9),
    "strategy.rho": (0.0, 0.5),
    "strategy.staleness": ("constant", "polynomial"),
    "strategy.concurrency": (None, 3),
    "strategy.staleness_a": (0.5, 2.0),
    "strategy.staleness_b": (1.0, 4.0),
    "strategy.staleness_normalize_at": (None, 2.0),
    "strategy.delta_t": (0.3, 1.0),
    "strategy.buffer_size": (2, 3),
    "strategy.tau_source": ("profile", "estimated"),
    "population.straggler_ratio": (0.2, 0.8),
    "salf.mode": ("paper", "reference"),
    "salf.charge": ("work", "suffix"),
}
_CONTEXTS = {
    "drop-stragglers": [{}, {"salf": {"scenario": "ratio"}}, {"salf": {"scenario": "deadline"}}],
    "salf": [{"salf": {"scenario": "ratio"}}, {"salf": {"scenario": "deadline"}}],
    "heterofl": [{"salf": {"scenario": "ratio"}}, {"salf": {"scenario": "deadline"}}],
    "asyncfl": [{"salf": {"scenario": "ratio"}}, {"salf": {"scenario": "deadline"}}],
    "async-identical": [{}, {"strategy": {"staleness": "polynomial"}}],
    "async-time-based": [{}],
    "fedfix": [{}],
    "fedbuff": [{"strategy": {"aggregation_weights": "time-based"}}],
    "fedasync": [{"strategy": {"staleness": "polynomial"}}],
    "fed-raa": [
        {"strategy": {"scheduler": "random"}},
        {"strategy": {"sync": True}},
        {"strategy": {"mode": "reference"}},
    ],
    "fed-raa-random": [{}],
    "fed-raa-mp": [{"strategy": {"mode": "reference"}}],
    "fed-raa-sync": [{}],
}


def _grid(name: str, context: int):
    """A sweep's base config for ``name`` in its ``context``-th setting."""
    extra = _CONTEXTS[name][context]
    strategy = {"name": name, "delta_t": 0.4, "buffer_size": 2, "t_max": 1.0}
    raw = tiny_raw(
        executor={"threads": 1}, budget={"aggregations": 2}, salf=extra.get("salf", {}),
        strategy={**strategy, **extra.get("strategy", {})},
    )  # fmt: skip
    return load_config(raw=raw, grid=True)


_CLAIMS = [
    (name, i, path)
    for name, contexts in _CONTEXTS.items()
    for i in range(len(contexts))
    for path in sorted(
        STRATEGY_OPTIONS[name].paths()
        & STRATEGY_OPTIONS[name].unread(cell_config(_grid(name, i), name, 1))
    )
]


def test_the_claims_cover_every_dynamic_rule():
    assert {p for _, _, p in _CLAIMS} == set(_VALUES)


@pytest.mark.parametrize(("name", "context", "path"), _CLAIMS)
def test_a_field_the_registry_calls_unread_changes_nothing(tmp_path, name, context, path):
    grid = _grid(name, context)
    histories = []
    for i, v in enumerate(_VALUES[path]):
        cfg = cell_config(with_value(grid, path, v), name, 1)
        assert not reads(cfg, name, path)
        res = run_experiment(cfg, run_dir=tmp_path / str(i))
        assert res.summary["status"] == "completed"
        histories.append(
            [{k: x for k, x in row.items() if k != "wall_time"} for row in res.history]
        )
    assert histories[0] == histories[1]


def test_default_config_round_trips():
    cfg = ExperimentConfig()
    assert ExperimentConfig.model_validate(yaml.safe_load(to_yaml(cfg))) == cfg


def test_vanilla_needs_no_deadline(tmp_path):
    """Vanilla trains every user fully each round: under the deadline scenario it runs
    without strategy.t_max, exactly as under the ratio scenario."""
    runs = []
    for scenario in ("deadline", "ratio"):
        raw = tiny_raw(executor={"threads": 1}, budget={"aggregations": 3},
                       strategy={"name": "vanilla"}, salf={"scenario": scenario})  # fmt: skip
        res = run_experiment(load_config(raw=raw), run_dir=tmp_path / scenario)
        runs.append([{k: x for k, x in row.items() if k != "wall_time"} for row in res.history])
    assert runs[0] == runs[1]
