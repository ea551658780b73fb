"""Paired comparisons: several strategies × seeds on one config, one table, one plot.

Every strategy runs with the same seed, hence the same keyed random streams:
the same device slowdown draws, client samples, data partition, initial model
and batch orders (common random numbers). Finished cells whose stored config
matches are reused, so an interrupted comparison resumes where it stopped.

A strategy entry may carry ``strategy.*`` overrides after colons, e.g.
``fedfix:delta_t=0.2`` or ``fedbuff:buffer_size=5:staleness=polynomial``, and
any other field by its dotted path (``async-identical:train.local_steps=5``);
every overridden field becomes a column of the table (FedFix's Δt, FedBuff's m).

With a learning-rate grid (``--lr-grid`` / ``compare.lr_grid``) every entry runs
at every ``train.lr`` of the grid on every seed, and the table keeps, per entry,
the learning rate whose runs end with the lowest federated loss (eq. 2): the
mean over seeds of ``federated_loss_tail``, the federated loss averaged over the
last 10% of the virtual time — or of ``final_test_loss`` when client losses are
not evaluated. A learning rate with a diverged seed is never selected. With
``lr_tune_on`` every entry uses the rate selected for that one entry (Fraboni et
al. tune η_l on *Identical* and run *Time-based* at the same rate). Every
(entry, lr) cell is listed in ``lr_grid.csv`` and plotted in ``lr_grid.png``.
"""

from __future__ import annotations

import csv
import gc
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedclock.config import ExperimentConfig, apply_overrides, cell_raw, to_yaml, validate
from fedclock.errors import ConfigError
from fedclock.experiment import RunResult, run_experiment
from fedclock.metrics.plots import colour, plot_groups, read_metrics

# summary.json fields that identify a run rather than measure it
_NOT_METRICS = {"seed", "num_clients", "target_accuracy"}


def parse_strategy(entry: str) -> tuple[str, dict[str, Any]]:
    """``"fedfix:delta_t=0.2"`` → ``("fedfix", {"delta_t": 0.2})`` (values parsed as YAML)."""
    name, *parts = entry.split(":")
    overrides: dict[str, Any] = {}
    for part in parts:
        key, eq, text = part.partition("=")
        if not eq or not key.strip():
            raise ConfigError(
                f"Strategy entry '{entry}' must look like name:field=value[:field=value]."
            )
        try:
            overrides[key.strip()] = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ConfigError(
                f"Strategy entry '{entry}' has a value that is not valid YAML."
            ) from None
    return name.strip(), overrides


def entry_dir(entry: str) -> str:
    """A folder name for a strategy entry (``fedfix:delta_t=0.2`` → ``fedfix-delta_t=0.2``)."""
    return entry.replace(":", "-").replace("/", "_")


GRID_FILE = "grid.json"


def remember_entries(out: Path, entries: Sequence[str]) -> list[str]:
    """Record ``entries`` in ``OUT/grid.json``; return the earlier commands' other entries.

    The table of a comparison or sweep lists every entry ever run into ``OUT`` whose cells
    are all finished for the current config and seeds, so running the strategies in two
    commands (or two processes) gives one table. Entries that no longer parse are dropped.
    """
    path = out / GRID_FILE
    try:
        known = [str(e) for e in json.loads(path.read_text())["entries"]]
    except (OSError, ValueError, KeyError, TypeError):
        known = []
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
    merged = [*known, *(e for e in entries if e not in known)]
    tmp = path.with_name(f".{GRID_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"entries": merged}, indent=1) + "\n")
    tmp.replace(path)  # atomic: a process running beside this one never reads half a file
    return earlier


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


def selection_loss(summaries: Sequence[dict[str, Any]]) -> tuple[str, float]:
    """(metric, mean over seeds) used to pick the best learning rate; inf if any seed failed."""
    key = "final_test_loss"
    for candidate in ("federated_loss_tail", "federated_loss"):
        if all(candidate in s for s in summaries):
            key = candidate
            break
    vals = [s.get(key) for s in summaries]
    bad = any(
        s.get("status") != "completed" or v is None or not math.isfinite(float(v))
        for s, v in zip(summaries, vals, strict=True)
    )
    return key, (math.inf if bad or not vals else float(np.mean(np.asarray(vals, dtype=float))))


def _finished(
    run_dir: Path, cfg: ExperimentConfig, accept: tuple[str, ...]
) -> tuple[dict[str, Any] | None, str | None]:
    """(summary, None) if the run in ``run_dir`` can be reused for ``cfg``; (None, why not)
    if a run there cannot; (None, None) if there is no finished run."""
    from fedclock import __version__
    from fedclock.metrics.recorder import source_digest

    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        meta = json.loads((run_dir / "meta.json").read_text())
        config = (run_dir / "config.yaml").read_text()
    except (OSError, ValueError):
        return None, None
    made_by = meta.get("versions", {}).get("fedclock")
    if config != to_yaml(cfg):
        return None, "its config differs"
    if made_by != __version__:
        return None, f"it was made by fedclock {made_by}"
    # runs recorded before meta.json had source_digest match on the version alone
    if meta.get("source_digest", source_digest()) != source_digest():
        return None, "it was made by other fedclock source (the code changed since)"
    if summary.get("status") not in accept:
        return None, f"it ended {summary.get('status')}"
    return summary, None


def reusable(
    run_dir: Path, cfg: ExperimentConfig, accept: tuple[str, ...] = ("completed",)
) -> dict[str, Any] | None:
    """The stored summary of a finished run with exactly this config, fedclock version and
    source (``meta.json``'s ``source_digest``), whose status is in ``accept``; else None."""
    return _finished(run_dir, cfg, accept)[0]


def stale_reason(
    run_dir: Path, cfg: ExperimentConfig, accept: tuple[str, ...] = ("completed",)
) -> str | None:
    """Why a finished run in ``run_dir`` is not reused for ``cfg`` (None: no run there, or
    it is reusable) — the console says it before re-running the cell."""
    return _finished(run_dir, cfg, accept)[1]


def run_cell(
    cfg: ExperimentConfig, run_dir: Path, progress: Callable[[Any], None] | None
) -> RunResult:
    """``run_experiment`` for one cell of a comparison or sweep, then a full garbage collection.

    A finished run leaves reference cycles (its models, tasks and contributions) that only
    Python's full collection frees, and those passes are rare: without this a command running
    many cells held every finished run's tensors (measured: about 200 MB more per MNIST run,
    16 GB after a few dozen).
    """
    result = run_experiment(cfg, run_dir=run_dir, progress=progress)
    gc.collect()
    return result


def aggregate_rows(summaries: Sequence[dict[str, Any]], keys: dict[str, Any]) -> dict[str, Any]:
    """One table row: identifying ``keys``, then <metric>_mean/_std over seeds, then n_seeds.

    std is the sample standard deviation (0 for one seed). A metric missing in
    any seed (e.g. time_to_target when a seed never reached it) has mean NaN.
    """
    row: dict[str, Any] = dict(keys)
    names = [
        k for k, v in summaries[0].items()
        if k not in _NOT_METRICS and (isinstance(v, int | float) or v is None) and not isinstance(v, bool)
    ]  # fmt: skip
    for k in names:
        vals = [s.get(k) for s in summaries]
        if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in vals):
            mean = std = math.nan
        else:
            arr = np.asarray(vals, dtype=float)
            mean = float(arr.mean())
            std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
        row[f"{k}_mean"] = mean
        row[f"{k}_std"] = std
    row["n_seeds"] = len(summaries)
    return row


def write_table(rows: Sequence[dict[str, Any]], out: Path, *, id_cols: Sequence[str]) -> None:
    """table.csv (every column) and table.md (headline metrics as mean ± std)."""
    out.mkdir(parents=True, exist_ok=True)
    cols = list(dict.fromkeys(k for r in rows for k in r))  # rows merged from earlier commands
    with (out / "table.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, restval="")
        w.writeheader()
        for r in rows:
            w.writerow(
                {k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            )
    headline = [
        ("final_test_accuracy", "final acc", 3),
        ("best_test_accuracy", "best acc", 3),
        ("final_test_loss", "final loss", 3),
        ("federated_loss_tail", "federated loss (last 10%)", 3),
        ("participation_loss_tail", "participation loss (last 10%)", 3),
        ("surrogate_loss_tail", "surrogate loss (last 10%)", 3),
        ("client_loss_std_tail", "client loss std (last 10%)", 3),
        ("mean_staleness", "mean staleness", 3),
        ("time_to_target", "time to target (s)", 4),
        ("virtual_time", "virtual time (s)", 4),
        ("aggregations", "aggregations", 4),
        ("updates_discarded", "discarded", 4),
        ("useful_work_ratio", "useful work", 3),
    ]
    present = [h for h in headline if f"{h[0]}_mean" in cols]
    lines = [
        "| " + " | ".join([*id_cols, *(h[1] for h in present), "seeds"]) + " |",
        "|" + "---|" * (len(id_cols) + len(present) + 1),
    ]
    for r in rows:
        cells = [str(r[c]) for c in id_cols]
        for key, _, digits in present:
            m, s = r.get(f"{key}_mean", math.nan), r.get(f"{key}_std", math.nan)
            cells.append("—" if math.isnan(m) else f"{m:.{digits}g} ± {s:.2g}")
        cells.append(str(r["n_seeds"]))
        lines.append("| " + " | ".join(cells) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")


def _cells(
    cfg: ExperimentConfig, out: Path, entry: str, lr: float | None, seeds: Sequence[int]
) -> list[tuple[Path, ExperimentConfig]]:
    """(run folder, config) of each seed of one (entry, lr) cell of a comparison."""
    base = out / "runs" / entry_dir(entry)
    if lr is not None:
        base = base / f"lr-{lr:g}"
    return [(base / f"seed-{seed}", cell_config(cfg, entry, seed, lr=lr)) for seed in seeds]


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
    remember_entries(out, strategies)  # now: if this command stops, its finished cells still merge
    lrs: list[float | None] = list(lr_grid) or [None]
    summaries: dict[tuple[str, float | None], list[dict[str, Any]]] = {}
    curves: dict[tuple[str, float | None], list[dict[str, np.ndarray]]] = {}
    accept = ("completed", "diverged") if lr_grid else ("completed",)
    error = None
    for entry in strategies:
        for lr in lrs:
            cell = (entry, lr)
            summaries[cell], curves[cell] = [], []
            for seed, (run_dir, ccfg) in zip(
                seeds, _cells(cfg, out, entry, lr, seeds), strict=True
            ):
                label = entry if lr is None else f"{entry} lr {lr:g}"
                summary = reusable(run_dir, ccfg, accept)
                if summary is None:
                    reason = stale_reason(run_dir, ccfg, accept)
                    if reason is not None:
                        on_rerun(label, seed, reason)
                    result = run_cell(ccfg, run_dir, progress_factory(f"{label} seed {seed}"))
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
        _write_lr_grid(grid_rows, out, cfg.name)
    groups = {entry: curves[cell] for entry, cell in chosen.items()}
    seeds_text = ", ".join(map(str, seeds))
    runs = [r for rs in groups.values() for r in rs if r]
    if runs:
        plot_groups(
            groups, out / "accuracy.png", title=f"{cfg.name}: test accuracy (seeds {seeds_text})"
        )
    if runs and all(LOSS_PANELS[0][0] in r for r in runs):
        plot_loss_panels(groups, out / "losses.png", title=f"{cfg.name} (seeds {seeds_text})")
    return rows, error


LOSS_PANELS = (
    ("federated_loss", "federated loss, eq. (2)"),
    ("participation_loss", "participation-weighted loss (authors' surrogate)"),
    ("surrogate_loss", "surrogate loss, eq. (10), own q"),
    ("client_loss_std", "std of the client losses"),
)


def plot_loss_panels(
    groups: dict[str, list[dict[str, np.ndarray]]], out: Path, *, title: str
) -> Path:
    """Fraboni et al.'s Fig. 2 panels vs virtual time (log scale): mean ± std over seeds."""
    import matplotlib.pyplot as plt

    from fedclock.metrics.plots import step_interp

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for (metric, label), ax in zip(LOSS_PANELS, axes.flat, strict=True):
        for i, (name, runs) in enumerate(groups.items()):
            runs = [r for r in runs if r]
            if not runs:
                continue
            end = min(r["virtual_time"][-1] for r in runs)
            grid = np.linspace(0.0, end, 600)
            ys = np.stack([step_interp(r["virtual_time"], r[metric], grid) for r in runs])
            mean, std = np.nanmean(ys, 0), np.nanstd(ys, 0)
            color = colour(i, len(groups))
            ax.plot(grid, mean, color=color, lw=1.4, label=f"{name} ({len(runs)} seeds)")
            if len(runs) > 1:
                ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.2, lw=0)
        ax.set_yscale("log")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    for ax in axes[1]:
        ax.set_xlabel("virtual time (s)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _write_lr_grid(rows: Sequence[dict[str, Any]], out: Path, title: str) -> None:
    """lr_grid.csv (every entry × learning rate) and lr_grid.png (selection loss vs lr)."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    with (out / "lr_grid.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow(
                {
                    k: ("" if isinstance(v, float) and not math.isfinite(v) else v)
                    for k, v in r.items()
                }
            )
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    labels: dict[str, list[tuple[float, float]]] = {}
    skip = {"lr", "selected_by", "selection_loss", "selected", "status", "n_seeds"}
    for r in rows:
        label = " ".join(
            f"{v}" if k == "strategy" else f"{k}={v}"
            for k, v in r.items()
            if k not in skip and v != ""
        )
        labels.setdefault(label, []).append((float(r["lr"]), float(r["selection_loss"])))
    for i, (label, pts) in enumerate(labels.items()):
        xs = [x for x, y in pts if math.isfinite(y)]
        ys = [y for x, y in pts if math.isfinite(y)]
        ax.plot(xs, ys, "o-", color=colour(i, len(labels)), label=label)
    ax.set_xscale("log")
    ax.set_xlabel("local learning rate η_l")
    ax.set_ylabel(f"final {rows[0]['selected_by'].replace('_', ' ')} (mean over seeds)")
    ax.set_title(f"{title}: learning-rate grid (diverged rates omitted)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "lr_grid.png", dpi=120)
    plt.close(fig)
