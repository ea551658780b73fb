"""Config validation: every user mistake is one sentence naming the field."""

from __future__ import annotations

import warnings

import pytest

from fedclock.config import ExperimentConfig, apply_overrides, load_config, to_yaml
from fedclock.errors import ConfigError
from fedclock.presets import list_presets, load_preset, preset_names


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            {"strategy": {"tmax": 3}},
            "Unknown config field 'strategy.tmax'; allowed fields in strategy: name, ",
        ),
        ({"bogus": 1}, "Unknown config field 'bogus'; allowed fields in the top level: name,"),
        (
            {"strategy": {"name": "fedsgd"}},
            "Invalid config field 'strategy.name': unknown strategy 'fedsgd'; allowed: ",
        ),
        (
            {"strategy": {"t_max": -1}},
            "Invalid config field 'strategy.t_max': Input should be greater than 0 (got -1).",
        ),
        (
            {"data": {"name": "cifar"}},
            "Invalid config field 'data.name': Input should be 'digits', 'mnist', 'synthetic', 'shakespeare', 'cifar10' or 'cifar100' (got 'cifar').",
        ),
        ({"partition": {"num_clients": 0}}, "Invalid config field 'partition.num_clients'"),
        (
            {"train": {"local_epochs": 1, "local_steps": 3}},
            "give either local_epochs or local_steps, not both",
        ),
        (
            {"budget": {"aggregations": None}},
            "set at least one of virtual_time, aggregations or updates",
        ),
        ({"population": {"scenario": "classes"}}, "needs a non-empty population.classes list"),
        (
            {"population": {"classes": [{"fraction": 0.5, "speed": 1, "colour": "red"}]}},
            "Unknown config field 'population.classes.0.colour'; allowed fields in population.classes.0: fraction, speed",
        ),
        ({"model": {"hidden": "wide"}}, "Invalid config field 'model.hidden'"),
    ],
)
def test_invalid_configs_fail_with_one_sentence(raw, expected):
    with pytest.raises(ConfigError) as info:
        load_config(raw=raw)
    msg = str(info.value)
    assert expected in msg
    assert "\n" not in msg
    assert msg.endswith(".")


def test_defaults_validate_and_round_trip():
    cfg = load_config(raw={})
    again = ExperimentConfig.model_validate(__import__("yaml").safe_load(to_yaml(cfg)))
    assert again == cfg


def test_overrides_parse_yaml_values():
    raw = apply_overrides(
        {},
        [
            "strategy.name=drop-stragglers",
            "strategy.t_max=2.5",
            "model.hidden=[8, 8]",
            "name=x",
            "data.data_dir=/tmp/m",
        ],
    )
    cfg = load_config(raw=raw)
    assert cfg.strategy.t_max == 2.5 and cfg.model.hidden == [8, 8] and cfg.name == "x"
    assert cfg.data.data_dir == "/tmp/m"


def test_override_errors():
    with pytest.raises(ConfigError, match=r"not of the form key\.path=value"):
        apply_overrides({}, ["strategy.t_max"])
    with pytest.raises(ConfigError, match=r"Unknown config field 'strategy\.deadline'"):
        load_config(raw={}, overrides=["strategy.deadline=3"])


def test_local_steps_replaces_default_epochs():
    cfg = load_config(raw={"train": {"local_steps": 5}})
    assert cfg.train.local_steps == 5 and cfg.train.local_epochs is None


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="Config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("strategy: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML at line"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(listy)


def test_every_shipped_preset_validates():
    names = preset_names()
    assert {"demo", "digits-fedavg", "mnist-fedavg"} <= set(names)
    for name in names:
        load_config(raw=load_preset(name))
    assert all(desc for _, desc in list_presets())


def test_unknown_preset():
    with pytest.raises(ConfigError, match="Unknown preset 'nope'; available: "):
        load_preset("nope")


def test_moved_fields_keep_their_old_paths():
    """salf.normalize is now data.normalize, salf.val_holdout eval.val_holdout."""
    with pytest.warns(FutureWarning, match=r"'salf\.val_holdout' is now 'eval\.val_holdout'"):
        cfg = load_config(raw={"salf": {"val_holdout": 30}})
    assert cfg.eval.val_holdout == 30 and "val_holdout" not in to_yaml(cfg).split("salf:")[1]
    # an override of the old path replaces what the file gives at the new one
    with pytest.warns(FutureWarning, match=r"'salf\.normalize' is now 'data\.normalize'"):
        cfg = load_config(
            raw={"data": {"normalize": "dataset"}}, overrides=["salf.normalize=authors"]
        )
    assert cfg.data.normalize == "authors"
    with pytest.raises(ConfigError, match=r"keep only 'eval\.val_holdout'\.$"):
        load_config(raw={"salf": {"val_holdout": 3}, "eval": {"val_holdout": 4}})
    # the defaults that earlier versions wrote in every config.yaml: moved without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_config(raw={"salf": {"val_holdout": 0, "normalize": "dataset"}})
    assert cfg.eval.val_holdout == 0 and cfg.data.normalize == "dataset"
