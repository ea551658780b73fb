"""``fedclock sweep``: strategies × values of one config field × seeds, one table.

Every (strategy, value, seed) cell is one run under ``OUT/runs/<strategy>/<path>=<value>/seed-<s>``;
a finished cell whose stored config matches is reused (resumable). A strategy that does not
read the swept field (``fedavg`` over t_max, SALF-family ``vanilla`` over the straggler
ratio or t_max) runs at the first value only and its results fill the other values' rows. The table
(``table.csv`` / ``table.md``, table contract of :mod:`fedclock.runs.tables`: identifying
columns ``strategy`` and the swept path, then ``<metric>_mean``/``_std`` over seeds) is
written with the comparison's helpers; ``pivot.md`` holds the headline metric as a
strategy × value grid (SALF's Table II layout) and ``sweep.png`` plots it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedclock.config import ExperimentConfig
from fedclock.errors import ConfigError
from fedclock.experiment import RunResult, reusing_data
from fedclock.runs.cache import reusable, run_cell, stale_reason
from fedclock.runs.grid import (
    cell_config,
    check_grid_folder,
    entry_dir,
    parse_strategy,
    reads,
    remember_entries,
    value_dir,
    with_value,
)
from fedclock.runs.parallel import Cell, CellFailure, CellRunner
from fedclock.runs.tables import aggregate_rows, write_pivot, write_table


@reusing_data()  # its cells read one copy of their data (see DataReuse)
# (over 80 lines: as run_compare, its phases share their locals; not split in issue 31)
def run_sweep(
    cfg: ExperimentConfig,
    path: str,
    values: Sequence[Any],
    strategies: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    *,
    progress_factory: Callable[[str], Callable[[Any], None] | None] = lambda label: None,
    on_result: Callable[[str, int, RunResult | None], None] = lambda s, seed, r: None,
    on_merged: Callable[[str], None] = lambda entry: None,
    on_rerun: Callable[[str, int, str], None] = lambda s, seed, why: None,
    runner: CellRunner | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Run the grid; return (table rows, error sentence of a cell that did not complete).

    Entries run into ``out`` by earlier commands join the table (``on_merged``) at the
    values where all their seeds are finished for this config. A finished run that cannot
    be reused is re-run after ``on_rerun`` says why.
    """
    cells = {v: with_value(cfg, path, v) for v in values}  # fail on a bad path/value early
    for entry in strategies:
        cell_config(cells[values[0]], entry, seeds[0])

    def locate(entry: str, v: Any, seed: int) -> tuple[Path, ExperimentConfig, Any]:
        # a strategy that does not read the swept field runs at the first value only; the
        # other values' rows repeat its results (their run folders are not written)
        first = cell_config(cells[values[0]], entry, seed)
        at = v if reads(first, parse_strategy(entry)[0], path) else values[0]
        run_dir = out / "runs" / entry_dir(entry) / value_dir(path, at) / f"seed-{seed}"
        return run_dir, cell_config(cells[at], entry, seed), at

    check_grid_folder(out, [locate(e, v, s)[0] for e in strategies for v in values for s in seeds])
    remember_entries(out, strategies)  # now: if this command stops, its finished cells still merge

    ran_cells: dict[Path, RunResult | CellFailure] = {}
    if runner is not None:  # every cell to run, in parallel, before the table
        todo: dict[Path, Cell] = {}
        for entry in strategies:
            for v in values:
                for seed in seeds:
                    run_dir, ccfg, at = locate(entry, v, seed)
                    if run_dir in todo or reusable(run_dir, ccfg) is not None:
                        continue
                    reason = stale_reason(run_dir, ccfg)
                    if reason is not None:
                        on_rerun(f"{entry} {path}={at}", seed, reason)
                    todo[run_dir] = Cell(f"{entry} {path}={at} seed {seed}", ccfg, run_dir)
        ran_cells = runner.run(list(todo.values()))
    rows: list[dict[str, Any]] = []
    error = failed = None
    for entry in strategies:
        name, _ = parse_strategy(entry)
        for v in values:
            summaries = []
            for seed in seeds:
                run_dir, ccfg, at = locate(entry, v, seed)
                label = f"{entry} {path}={at} seed {seed}"
                cell = f"{entry} {path}={v}"
                if at != v:
                    cell += f" (the {path}={at} run: {name} does not read {path})"
                ran = ran_cells.get(run_dir)
                if isinstance(ran, CellFailure):  # reported; the other cells go on
                    failed = failed or ran.error
                    continue
                summary = None if ran is not None else reusable(run_dir, ccfg)
                if summary is None:
                    if ran is None:
                        reason = stale_reason(run_dir, ccfg)
                        if reason is not None:
                            on_rerun(cell, seed, reason)
                        ran = run_cell(ccfg, run_dir, progress_factory(label))
                    result = ran
                    on_result(cell, seed, result)
                    summary = result.summary
                    if summary["status"] != "completed":
                        error = error or result.error
                else:
                    on_result(cell, seed, None)
                summaries.append(summary)
            rows.append(aggregate_rows(summaries, {"strategy": name, path: v}))
    for entry in remember_entries(out, strategies):  # earlier commands' finished cells
        merged = []
        for v in values:
            try:
                found = [reusable(*locate(entry, v, seed)[:2]) for seed in seeds]
            except ConfigError:
                break
            if all(f is not None for f in found):
                keys = {"strategy": parse_strategy(entry)[0], path: v}
                merged.append(aggregate_rows([f for f in found if f is not None], keys))
        if merged:
            on_merged(entry)
            rows += merged
    if rows:
        write_table(rows, out, id_cols=["strategy", path])
        write_pivot(rows, out, path, list(values))
    return rows, error or failed
