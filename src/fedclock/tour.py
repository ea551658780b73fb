"""``fedclock tour`` (``make demo``): four short paired comparisons on digits, one per family
of methods, each with the conclusion its own numbers support, and one report linking them.

Every step is a shipped preset (``tour-salf``, ``tour-async``, ``tour-fedraa``,
``tour-cis``) run as ``fedclock compare --preset NAME`` would. A step's conclusion is
computed here from its cells' summaries, seed by seed (each seed gives every strategy the
same devices, data and draws): a claim is *supported* when the method is better in every
seed, *supported in k of n seeds* when it is better in most and on average, and *not
supported* otherwise — the sentence says which, whatever the numbers are.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedclock.errors import ConfigError
from fedclock.outputs import check_no_links, write_atomic


@dataclass(frozen=True)
class Claim:
    """``method`` does better than each of ``baselines`` on ``metric``."""

    method: str  # a strategy entry of the preset's compare.strategies
    baselines: tuple[str, ...]
    metric: str  # a summary.json key
    what: str  # the metric in words, for the sentence


@dataclass(frozen=True)
class Step:
    folder: str  # under the tour's folder
    preset: str
    title: str
    claims: tuple[Claim, ...]


STEPS = (
    Step(
        "salf",
        "tour-salf",
        "1. SALF vs drop-stragglers vs vanilla under stragglers",
        (Claim("salf", ("drop-stragglers", "vanilla"), "final_test_accuracy", "final accuracy"),),
    ),
    Step(
        "async",
        "tour-async",
        "2. FedBuff and asynchronous FedAvg vs synchronous FedAvg (Fraboni's F80 devices)",
        (
            Claim("fedbuff:buffer_size=5", ("fedavg",), "time_to_target", "time to target"),
            Claim("async-time-based", ("fedavg",), "time_to_target", "time to target"),
        ),
    ),
    Step(
        "fedraa",
        "tour-fedraa",
        "3. Fed-RAA vs FedAsync vs FedAvg on capability classes",
        (Claim("fed-raa", ("fedasync", "fedavg"), "time_to_target", "time to target"),),
    ),
    Step(
        "cis",
        "tour-cis",
        "4. CIS: serving-rate vs equal weighting of the exits (4-2-1 tree)",
        (Claim("cis-serving", ("cis-equal",), "cis_accuracy", "routed CIS accuracy"),),
    ),
)

_LOWER_IS_BETTER = {"time_to_target", "final_test_loss", "federated_loss_tail"}


def _value(summary: dict[str, Any], metric: str) -> float:
    v = summary.get(metric)
    if v is None and metric == "time_to_target":
        return math.inf  # never reached within the budget
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan


def _fmt(values: list[float], metric: str, target: float | None) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if metric == "time_to_target":
        if not finite:
            return "never reached"
        text = f"{sum(finite) / len(finite):.3g} s"
        missed = len(values) - len(finite)
        return text + (f" (never reached in {missed} of {len(values)} seeds)" if missed else "")
    return f"{sum(finite) / len(finite):.3f}" if finite else "—"


def verdict(mine: list[float], theirs: list[float], lower_is_better: bool) -> tuple[str, bool]:
    """(words, supported) for paired values of the method and a baseline, seed by seed."""
    n = len(mine)
    if n == 0:
        return "no seeds to compare", False
    better = sum((a < b) if lower_is_better else (a > b) for a, b in zip(mine, theirs, strict=True))
    diffs = [a - b for a, b in zip(mine, theirs, strict=True) if math.isfinite(a - b)]
    mean_favours = True
    if diffs:
        mean = sum(diffs) / len(diffs)
        mean_favours = mean < 0 if lower_is_better else mean > 0
    if better == n:
        return f"better in all {n} seeds", True
    if better == 0:
        return f"better in none of the {n} seeds", False
    if better * 2 > n and mean_favours:
        return f"better in {better} of {n} seeds", True
    return f"better in only {better} of {n} seeds", False


def conclusions(
    step: Step, summaries: dict[str, list[dict[str, Any]]], target: float | None
) -> list[tuple[str, bool]]:
    """(sentence, supported) for each of the step's claims."""
    parts: list[tuple[str, bool]] = []
    for claim in step.claims:
        lower = claim.metric in _LOWER_IS_BETTER
        mine_by_seed = {s["seed"]: s for s in summaries.get(claim.method, [])}
        mine_all = [_value(s, claim.metric) for s in mine_by_seed.values()]
        what = claim.what
        if claim.metric == "time_to_target" and target is not None:
            what = f"time to {target:.0%} accuracy"
        bits, failing = [], []
        for base in claim.baselines:
            theirs_by_seed = {s["seed"]: s for s in summaries.get(base, [])}
            seeds = sorted(set(mine_by_seed) & set(theirs_by_seed))
            mine = [_value(mine_by_seed[s], claim.metric) for s in seeds]
            theirs = [_value(theirs_by_seed[s], claim.metric) for s in seeds]
            words, ok = verdict(mine, theirs, lower)
            if not ok:
                failing.append(_name(base))
            bits.append(f"{_name(base)} {_fmt(theirs, claim.metric, target)} ({words})")
        me = _name(claim.method)
        how = "sooner" if lower else "higher"
        if failing:
            end = f"not supported: {me} does not get there {how} than {' or '.join(failing)} in most seeds"
            if not lower:
                end = f"not supported: {me} does not end {how} than {' or '.join(failing)} in most seeds"
        else:
            others = " and ".join(_name(b) for b in claim.baselines)
            end = (
                f"supported: {me} gets there {how} than {others}"
                if lower
                else f"supported: {me} ends {how} than {others}"
            )
        text = f"{me}: {what} {_fmt(mine_all, claim.metric, target)} vs {', '.join(bits)} → {end}"
        parts.append((text, not failing))
    return parts


def _name(entry: str) -> str:
    return entry.split(":")[0]


def read_summaries(
    out: Path, entries: list[str], seeds: list[int]
) -> dict[str, list[dict[str, Any]]]:
    """Each entry's finished summaries under ``out/runs`` (a comparison's layout)."""
    from fedclock.metrics.recorder import read_summary
    from fedclock.runs.grid import entry_dir

    found: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        got = []
        for seed in seeds:
            s = read_summary(out / "runs" / entry_dir(e) / f"seed-{seed}")
            if s is not None and s.get("status") == "completed":
                got.append(s)
        found[e] = got
    return found


def check_tour_folder(out: Path, *, steps: bool = True) -> None:
    """Before any compute: ``out`` may take the tour's ``tour.json`` and ``report.html``
    (absent, or fedclock's) and, with ``steps``, each step's comparison files; ConfigError
    naming the first that is not."""
    from fedclock.outputs import check_writable
    from fedclock.report import REPORT_FILE, TOUR_FILE

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder for the tour.")
    path = out / TOUR_FILE
    if os.path.lexists(path):
        try:
            old = json.loads(path.read_bytes())
        except (OSError, ValueError):
            old = None
        if path.is_symlink() or not (isinstance(old, dict) and isinstance(old.get("steps"), list)):
            raise ConfigError(
                f"{path} is a file fedclock did not make; it never writes over those, so "
                "move it away or give another --out."
            )
    check_writable([out / REPORT_FILE])
    if steps:
        from fedclock.runs.grid import check_grid_folder

        for step in STEPS:  # each step's comparison folder: its tables, plots, report
            check_no_links(out, out / step.folder)
            check_grid_folder(out / step.folder, [])


def write_tour_record(out: Path, steps: list[dict[str, Any]], wall_s: float) -> Path:
    """``out/tour.json``: the steps (folder, preset, title, conclusion) the report lists;
    only over a tour record fedclock wrote."""
    from fedclock.report import TOUR_FILE

    check_tour_folder(out, steps=False)
    path = out / TOUR_FILE
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"steps": steps, "wall_s": wall_s}, indent=1) + "\n")
    return path
