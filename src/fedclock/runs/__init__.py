"""Many experiments at once: ``fedclock compare`` and ``fedclock sweep``.

A comparison runs strategies × seeds (× learning rates) on one config, a sweep strategies ×
values of one config field × seeds; both end in one table.

- :mod:`~fedclock.runs.grid`: strategy entries (``fedfix:delta_t=0.2``), the config and run
  folder of each cell, ``OUT/grid.json`` (the entries every command ran into ``OUT``), the
  swept field and which strategies read it.
- :mod:`~fedclock.runs.cache`: the cache of finished runs — reuse a cell's finished run with
  the same config, version and source, else say why it is re-run.
- :mod:`~fedclock.runs.lr`: learning-rate selection over ``compare.lr_grid``.
- :mod:`~fedclock.runs.tables`: ``table.csv`` / ``table.md`` (mean ± std over seeds) and a
  sweep's ``pivot.md``.
- :mod:`~fedclock.runs.compare` (``run_compare``) and :mod:`~fedclock.runs.sweep`
  (``run_sweep``) run the grids; their plots live in :mod:`fedclock.metrics.plots`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# (loaded on first use: `fedclock run` reads the headline metric of .tables, and must not
# import the comparison's plotting — matplotlib — for it)
_WHERE = {
    "GRID_FILE": "fedclock.outputs",
    "reusable": "fedclock.runs.cache",
    "run_cell": "fedclock.runs.cache",
    "stale_reason": "fedclock.runs.cache",
    "run_compare": "fedclock.runs.compare",
    "cell_config": "fedclock.runs.grid",
    "entry_dir": "fedclock.runs.grid",
    "parse_over": "fedclock.runs.grid",
    "parse_strategy": "fedclock.runs.grid",
    "reads": "fedclock.runs.grid",
    "remember_entries": "fedclock.runs.grid",
    "with_value": "fedclock.runs.grid",
    "selection_loss": "fedclock.runs.lr",
    "run_sweep": "fedclock.runs.sweep",
    "aggregate_rows": "fedclock.runs.tables",
    "headline_metric": "fedclock.runs.tables",
    "write_pivot": "fedclock.runs.tables",
    "write_table": "fedclock.runs.tables",
}

if TYPE_CHECKING:
    from fedclock.outputs import GRID_FILE
    from fedclock.runs.cache import reusable, run_cell, stale_reason
    from fedclock.runs.compare import run_compare
    from fedclock.runs.grid import (
        cell_config,
        entry_dir,
        parse_over,
        parse_strategy,
        reads,
        remember_entries,
        with_value,
    )
    from fedclock.runs.lr import selection_loss
    from fedclock.runs.sweep import run_sweep
    from fedclock.runs.tables import aggregate_rows, headline_metric, write_pivot, write_table


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'fedclock.runs' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "GRID_FILE",
    "aggregate_rows",
    "cell_config",
    "entry_dir",
    "headline_metric",
    "parse_over",
    "parse_strategy",
    "reads",
    "remember_entries",
    "reusable",
    "run_cell",
    "run_compare",
    "run_sweep",
    "selection_loss",
    "stale_reason",
    "with_value",
    "write_pivot",
    "write_table",
]
