"""Strategy entries and grid cells: what one cell of a comparison or sweep runs, and where.

A strategy entry may carry ``strategy.*`` overrides after colons, e.g.
``fedfix:delta_t=0.2`` or ``fedbuff:buffer_size=5:staleness=polynomial``, and
any other field by its dotted path (``async-identical:train.local_steps=5``);
every overridden field becomes a column of the table (FedFix's Δt, FedBuff's m).
A sweep's ``--over section.field=v1,v2,...`` names the field and its values
(:func:`parse_over`); :func:`reads` says which strategies depend on that field.
``OUT/grid.json`` lists every entry ever run into ``OUT`` (:func:`remember_entries`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from fedclock.config import ExperimentConfig, apply_overrides, cell_raw, load_yaml, validate
from fedclock.errors import ConfigError, short
from fedclock.outputs import (
    check_no_links,
    check_run_folder,
    check_writable,
    clean_temporaries,
    read_grid_json,
    write_grid_json,
)


def parse_strategy(entry: str) -> tuple[str, dict[str, Any]]:
    """``"fedfix:delta_t=0.2"`` → ``("fedfix", {"delta_t": 0.2})`` (values parsed as YAML)."""
    name, *parts = entry.split(":")
    overrides: dict[str, Any] = {}
    for part in parts:
        key, eq, text = part.partition("=")
        if not eq or not key.strip():
            raise ConfigError(
                f"Strategy entry '{short(entry)}' must look like name:field=value[:field=value]."
            )
        try:
            overrides[key.strip()] = load_yaml(text)
        except yaml.YAMLError:
            raise ConfigError(
                f"Strategy entry '{short(entry)}' has a value that is not valid YAML."
            ) from None
    return name.strip(), overrides


def _folder_name(text: str) -> str:
    """``text`` as one folder name inside the grid's folder: no separators, not ``.``/``..``,
    a long one cut and told apart by a digest."""
    name = "".join("_" if c in "/\\\0" or not c.isprintable() else c for c in text)
    if name in ("", ".", ".."):
        name = name.replace(".", "_") or "_"
    if len(name) > 100:
        name = f"{name[:80]}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    return name


def entry_dir(entry: str) -> str:
    """A folder name for a strategy entry (``fedfix:delta_t=0.2`` → ``fedfix-delta_t=0.2``)."""
    return _folder_name(entry.replace(":", "-"))


def value_dir(path: str, value: Any) -> str:
    """A sweep's folder for one value of the swept field (``t_max=2.0``)."""
    return _folder_name(f"{path}={value}")


def remember_entries(out: Path, entries: Sequence[str]) -> list[str]:
    """Record ``entries`` in ``OUT/grid.json``; return the earlier commands' other entries.

    The table of a comparison or sweep lists every entry ever run into ``OUT`` whose cells
    are all finished for the current config and seeds, so running the strategies in two
    commands (or two processes) gives one table. Entries that no longer parse are dropped.
    """
    grid = read_grid_json(out) or {"entries": []}  # (ConfigError: a grid.json not fedclock's)
    known = [str(e) for e in grid["entries"]]
    earlier = []
    for e in known:
        if e in entries:
            continue
        try:
            parse_strategy(e)
        except ConfigError:
            continue
        earlier.append(e)
    out.mkdir(parents=True, exist_ok=True)
    grid["entries"] = [*known, *(e for e in entries if e not in known)]
    write_grid_json(out, grid)  # atomic: a process beside this one never reads half a file
    return earlier


def check_grid_folder(out: Path, run_dirs: Sequence[Path]) -> None:
    """Before any compute: ``out`` may take a comparison's or sweep's files (none there that
    fedclock did not make) and each cell's run folder is new, empty or a fedclock run."""
    from fedclock.runs.tables import GRID_OUTPUTS

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder for the comparison or sweep.")
    check_writable(out / name for name in GRID_OUTPUTS)
    if out.is_dir():
        clean_temporaries(out)  # (left by a process killed while writing)
    for run_dir in run_dirs:
        check_no_links(out, run_dir)
        check_run_folder(run_dir)


def cell_config(
    cfg: ExperimentConfig, strategy: str, seed: int, *, lr: float | None = None
) -> ExperimentConfig:
    """The config of one cell: ``strategy`` is an entry (name and optional overrides).

    The cell keeps the fields of ``cfg``'s strategy and ``salf`` sections that its own
    strategy reads: the base config of a comparison may carry options for several
    strategies (``t_max`` for drop-stragglers beside fedavg), each cell takes its own.
    """
    name, overrides = parse_strategy(strategy)
    data = cell_raw(cfg, name)
    for key, value in overrides.items():
        if key in ("train.local_steps", "train.local_epochs"):  # one replaces the other
            data["train"]["local_epochs" if key.endswith("steps") else "local_steps"] = None
        if "." in key:  # a full path, e.g. train.local_steps
            apply_overrides(
                data, [f"{key}={yaml.safe_dump(value, default_flow_style=True).strip()}"]
            )
        else:
            data["strategy"][key] = value
    if lr is not None:
        data["train"]["lr"] = lr
    data["seed"] = seed
    return validate(data, role="cell")


def _cells(
    cfg: ExperimentConfig, out: Path, entry: str, lr: float | None, seeds: Sequence[int]
) -> list[tuple[Path, ExperimentConfig]]:
    """(run folder, config) of each seed of one (entry, lr) cell of a comparison."""
    base = out / "runs" / entry_dir(entry)
    if lr is not None:
        base = base / f"lr-{lr:g}"
    return [(base / f"seed-{seed}", cell_config(cfg, entry, seed, lr=lr)) for seed in seeds]


def parse_over(text: str) -> tuple[str, list[Any]]:
    """``"population.straggler_ratio=0.3,0.5"`` → ``("population.straggler_ratio", [0.3, 0.5])``."""
    path, eq, values = text.partition("=")
    if not eq or not path.strip() or not values.strip():
        raise ConfigError(f"--over must look like section.field=v1,v2,..., got '{short(text)}'.")
    try:
        vals = [load_yaml(v) for v in values.split(",")]
    except yaml.YAMLError:
        raise ConfigError(f"--over '{short(text)}' has a value that is not valid YAML.") from None
    return path.strip(), vals


def with_value(cfg: ExperimentConfig, path: str, value: Any) -> ExperimentConfig:
    data = cfg.model_dump()
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    if text.endswith("..."):
        text = text[: -len("...")].strip()
    return validate(apply_overrides(data, [f"{path}={text}"]), role="grid")


def reads(cfg: ExperimentConfig, strategy: str, path: str) -> bool:
    """Whether ``strategy``'s runs on ``cfg`` depend on the config field ``path`` (False: one
    run per seed serves every value of a sweep over it). The registry says: each strategy's
    options class lists the fields it reads (:meth:`fedclock.config.StrategyOptions.reads`),
    e.g. FedAvg has no deadline and SALF's vanilla neither a deadline nor stragglers."""
    from fedclock.strategies import STRATEGIES

    return STRATEGIES[strategy].reads(cfg, path)
