"""Paired comparisons: several strategies × seeds on one config, one table, one plot.

Every strategy runs with the same seed, hence the same keyed random streams:
the same device slowdown draws, client samples, data partition, initial model
and batch orders (common random numbers). Finished cells whose stored config
matches are reused (:mod:`fedclock.runs.cache`), so an interrupted comparison
resumes where it stopped.

A strategy entry may carry overrides after colons (``fedfix:delta_t=0.2``,
:mod:`fedclock.runs.grid`); every overridden field becomes a column of the table.
With a learning-rate grid every entry runs at every ``train.lr`` of the grid and
the table keeps each entry's best rate (:mod:`fedclock.runs.lr`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedclock.config import ExperimentConfig
from fedclock.errors import ConfigError
from fedclock.experiment import RunResult, reusing_data
from fedclock.metrics.plots import LOSS_PANELS, plot_groups, plot_loss_panels
from fedclock.metrics.readers import read_metrics
from fedclock.runs.cache import reusable, run_cell, stale_reason
from fedclock.runs.grid import (
    _cells,
    cell_config,
    check_grid_folder,
    parse_strategy,
    remember_entries,
)
from fedclock.runs.lr import selection_loss, write_lr_grid
from fedclock.runs.parallel import Cell, CellFailure, CellRunner
from fedclock.runs.tables import aggregate_rows, lead, write_table


@reusing_data()  # its cells read one copy of their data (see DataReuse)
# (over 80 lines: cached cells, the rate grid, reruns and the table share a dozen locals;
# not split in issue 31, which did not change it)
def run_compare(
    cfg: ExperimentConfig,
    strategies: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    *,
    lr_grid: Sequence[float] = (),
    lr_tune_on: str | None = None,
    progress_factory: Callable[[str], Callable[[Any], None] | None] = lambda label: None,
    on_result: Callable[[str, int, RunResult | None], None] = lambda s, seed, r: None,
    on_merged: Callable[[str], None] = lambda entry: None,
    on_rerun: Callable[[str, int, str], None] = lambda s, seed, why: None,
    runner: CellRunner | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Run the grid; return (table rows, error sentence of a cell that stopped early).

    Without a learning-rate grid a diverged cell stops the comparison (its
    sentence is returned); with one, divergence only disqualifies that rate.
    Entries run into ``out`` by earlier commands join the table (``on_merged``)
    when every cell of theirs is finished for this config and these seeds. A finished
    run that cannot be reused is re-run after ``on_rerun`` says why.
    """
    parsed = {e: parse_strategy(e) for e in strategies}
    if lr_tune_on is not None and lr_tune_on not in strategies:
        raise ConfigError(
            f"The learning rate is tuned on '{lr_tune_on}', which is not among the "
            f"compared strategies ({', '.join(strategies)})."
        )
    if lr_tune_on is not None:  # run it first: its best rate is everyone's
        strategies = [lr_tune_on, *(e for e in strategies if e != lr_tune_on)]
    for entry in strategies:  # fail on a bad entry before any compute
        cell_config(cfg, entry, seeds[0])
    lrs: list[float | None] = list(lr_grid) or [None]
    check_grid_folder(
        out, [d for e in strategies for lr in lrs for d, _ in _cells(cfg, out, e, lr, seeds)]
    )
    remember_entries(out, strategies)  # now: if this command stops, its finished cells still merge
    accept = ("completed", "diverged") if lr_grid else ("completed",)
    ran_cells: dict[Path, RunResult | CellFailure] = {}
    if runner is not None:  # every cell to run, in parallel, before the tables
        todo = []
        for entry in strategies:
            for lr in lrs:
                label = entry if lr is None else f"{entry} lr {lr:g}"
                for seed, (run_dir, ccfg) in zip(
                    seeds, _cells(cfg, out, entry, lr, seeds), strict=True
                ):
                    if reusable(run_dir, ccfg, accept) is None:
                        reason = stale_reason(run_dir, ccfg, accept)
                        if reason is not None:
                            on_rerun(label, seed, reason)
                        todo.append(Cell(f"{label} seed {seed}", ccfg, run_dir))
        ran_cells = runner.run(todo)
    summaries: dict[tuple[str, float | None], list[dict[str, Any]]] = {}
    curves: dict[tuple[str, float | None], list[dict[str, np.ndarray]]] = {}
    error = failed = None
    for entry in strategies:
        for lr in lrs:
            cell = (entry, lr)
            summaries[cell], curves[cell] = [], []
            for seed, (run_dir, ccfg) in zip(
                seeds, _cells(cfg, out, entry, lr, seeds), strict=True
            ):
                label = entry if lr is None else f"{entry} lr {lr:g}"
                ran = ran_cells.get(run_dir)
                if isinstance(ran, CellFailure):  # reported; the other cells go on
                    failed = failed or ran.error
                    continue
                summary = None if ran is not None else reusable(run_dir, ccfg, accept)
                if summary is None:
                    if ran is None:
                        reason = stale_reason(run_dir, ccfg, accept)
                        if reason is not None:
                            on_rerun(label, seed, reason)
                        ran = run_cell(ccfg, run_dir, progress_factory(f"{label} seed {seed}"))
                    result = ran
                    on_result(label, seed, result)
                    summary = result.summary
                    if summary["status"] != "completed" and not lr_grid:
                        error = result.error
                else:
                    on_result(label, seed, None)
                summaries[cell].append(summary)
                curves[cell].append(read_metrics(run_dir))
                if error or summary["status"] != "completed":
                    break  # a diverged rate is out; no need for its other seeds
            if error:
                break
        if error:
            break
    # entries of earlier commands into OUT join the table when all their cells are finished
    for entry in remember_entries(out, strategies):
        found: dict[float | None, list[tuple[dict[str, Any], Path]]] = {}
        try:
            for lr in lrs:
                found[lr] = []
                for run_dir, ccfg in _cells(cfg, out, entry, lr, seeds):
                    summary = reusable(run_dir, ccfg, accept)
                    if summary is None:
                        raise LookupError(entry)
                    found[lr].append((summary, run_dir))
                    if summary["status"] != "completed":
                        break  # as above: a diverged rate's other seeds never ran
        except (ConfigError, LookupError):
            continue
        parsed[entry] = parse_strategy(entry)
        strategies = [*strategies, entry]
        on_merged(entry)
        for lr, done in found.items():
            summaries[(entry, lr)] = [summary for summary, _ in done]
            curves[(entry, lr)] = [read_metrics(run_dir) for _, run_dir in done]
    swept: list[str] = []
    for _, overrides in parsed.values():
        swept += [k for k in overrides if k not in swept]

    def keys(entry: str) -> dict[str, Any]:
        name, overrides = parsed[entry]
        return {"strategy": name, **{k: overrides.get(k, "") for k in swept}}

    rows: list[dict[str, Any]] = []
    chosen: dict[str, tuple[str, float | None]] = {}
    grid_rows: list[dict[str, Any]] = []
    for entry in strategies:
        cells = [(entry, lr) for lr in lrs if summaries.get((entry, lr))]
        if not cells:
            continue
        losses = {c: selection_loss(summaries[c]) for c in cells}
        best = min(cells, key=lambda c: losses[c][1])  # ties: the smaller index (grid order)
        if lr_tune_on is not None and lr_tune_on in chosen:
            tuned = (entry, chosen[lr_tune_on][1])
            best = tuned if tuned in losses else best
        chosen[entry] = best
        if lr_grid:
            for c in cells:
                metric, value = losses[c]
                grid_rows.append(
                    {
                        **keys(entry),
                        "lr": c[1],
                        "selected_by": metric,
                        "selection_loss": value,
                        "selected": int(c == best),
                        "status": "completed" if math.isfinite(value) else "diverged",
                        "n_seeds": len(summaries[c]),
                    }
                )
            rows.append(aggregate_rows(summaries[best], {**keys(entry), "lr": best[1]}))
        else:
            rows.append(aggregate_rows(summaries[best], keys(entry)))
    id_cols = ["strategy", *swept, *(["lr"] if lr_grid else [])]
    if rows:
        write_table(rows, out, id_cols=id_cols)
    if grid_rows:
        write_lr_grid(grid_rows, out, cfg.name)
    groups = {entry: curves[cell] for entry, cell in chosen.items()}
    seeds_text = ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))
    runs = [r for rs in groups.values() for r in rs if r]
    if runs:
        # the headline accuracy's curve (runs.tables.lead): the routed CIS accuracy for
        # early-exit runs (test_accuracy there is the last exit's alone), else the test
        # accuracy; Fraboni et al.'s losses go to losses.png
        head = lead(set.intersection(*(set(r) for r in runs)), curves=True, accuracy=True)
        assert head.curve is not None
        plot_groups(
            groups, out / "accuracy.png", metric=head.curve,
            title=f"{cfg.name}: {head.curve_label} ({seeds_text})",
        )  # fmt: skip
    if runs and all(LOSS_PANELS[0][0] in r for r in runs):
        plot_loss_panels(groups, out / "losses.png", title=f"{cfg.name} ({seeds_text})")
    return rows, error or failed
