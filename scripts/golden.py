"""Golden outputs: one small run per strategy, its metrics recorded, to check a refactoring.

``python scripts/golden.py record`` runs every case below (digits, a few aggregations, one
torch thread) and writes ``tests/golden/<case>.csv`` — the run's ``metrics.csv`` without
the wall-time column. ``python scripts/golden.py check`` re-runs them and compares
**bit for bit** (the strict check for a restructuring that must not change results on
the machine that recorded them); ``tests/test_golden.py`` compares the same runs with
float tolerances, so it passes on any CPU of this class.

Every strategy of ``fedclock strategies`` has at least one case; the SALF family has one
per scenario and mode.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"

_SALF = {"salf.scenario": "ratio", "population.straggler_ratio": 0.5}
_SALF_DEADLINE = {"salf.scenario": "deadline", "strategy.t_max": 0.5}
_ASYNC = {"budget.aggregations": 10}
_CIS = {
    "partition.num_clients": 7,
    "partition.sizes": "tree",
    "model.arch": "ee_cnn",
    "model.channels": "[4, 4, 8]",
    "cis.tree": "4-2-1",
    "cis.serving": "80-15-5",
}

# case name → overrides of tiny_raw() (tests/conftest.py): 6 digits clients, MLP [16]
CASES: dict[str, dict[str, Any]] = {
    "fedavg": {"strategy.name": "fedavg"},
    "fedavg-fraction": {"strategy.name": "fedavg", "strategy.client_fraction": 0.5},
    "fedprox": {"strategy.name": "fedprox", "strategy.mu": 0.1},
    "fednova": {"strategy.name": "fednova", "partition.sizes": "lognormal"},
    "scaffold": {"strategy.name": "scaffold", "strategy.client_fraction": 0.5},
    "fedrolex": {"strategy.name": "fedrolex", "partition.sizes": "lognormal"},
    "fjord": {"strategy.name": "fjord", "partition.sizes": "lognormal"},
    "feddyn": {"strategy.name": "feddyn", "strategy.feddyn_alpha": 0.1},
    "ram-fed": {"strategy.name": "ram-fed", "partition.sizes": "lognormal"},
    "ram-fed-static-coverage": {
        "strategy.name": "ram-fed",
        "strategy.extraction": "static",
        "strategy.aggregation": "coverage",
        "strategy.client_fraction": 0.5,
    },
    "prunefl": {
        "strategy.name": "prunefl",
        "strategy.reconfig_interval": 2,
        "strategy.initial_interval": 2,
        "strategy.initial_max_rounds": 10,
        "budget.aggregations": 6,
    },
    "splitfed": {"strategy.name": "splitfed", "population.server_speed": 4.0e6},
    "drop-stragglers-deadline": {"strategy.name": "drop-stragglers", "strategy.t_max": 0.5},
    "async-identical": {"strategy.name": "async-identical", **_ASYNC},
    "async-time-based": {"strategy.name": "async-time-based", **_ASYNC},
    "fedfix": {"strategy.name": "fedfix", "strategy.delta_t": 0.3, **_ASYNC},
    "fedbuff": {"strategy.name": "fedbuff", "strategy.buffer_size": 2, **_ASYNC},
    "fedbuff-concurrency": {
        "strategy.name": "fedbuff",
        "strategy.buffer_size": 3,
        "strategy.concurrency": 3,
        **_ASYNC,
    },
    "fedasync": {"strategy.name": "fedasync", **_ASYNC},
    "fed-raa": {"strategy.name": "fed-raa", **_ASYNC},
    "fed-raa-reference": {"strategy.name": "fed-raa", "strategy.mode": "reference", **_ASYNC},
    "fed-raa-random": {"strategy.name": "fed-raa-random", **_ASYNC},
    "fed-raa-mp": {"strategy.name": "fed-raa-mp", **_ASYNC},
    "fed-raa-sync": {"strategy.name": "fed-raa-sync", "budget.aggregations": 3},
    "vanilla": {"strategy.name": "vanilla", **_SALF},
    "salf-paper": {"strategy.name": "salf", **_SALF},
    "salf-reference": {
        "strategy.name": "salf",
        "salf.mode": "reference",
        **_SALF,
        "train.momentum": 0.5,
    },
    "salf-deadline": {"strategy.name": "salf", **_SALF_DEADLINE},
    "drop-stragglers-salf-paper": {"strategy.name": "drop-stragglers", **_SALF},
    "drop-stragglers-salf-reference": {
        "strategy.name": "drop-stragglers",
        "salf.mode": "reference",
        **_SALF,
    },
    "drop-stragglers-salf-deadline": {"strategy.name": "drop-stragglers", **_SALF_DEADLINE},
    "heterofl": {"strategy.name": "heterofl", **_SALF},
    "heterofl-deadline": {"strategy.name": "heterofl", **_SALF_DEADLINE},
    "asyncfl-paper": {"strategy.name": "asyncfl", **_SALF},
    "asyncfl-reference": {"strategy.name": "asyncfl", "salf.mode": "reference", **_SALF},
    "cis-serving": {"strategy.name": "cis-serving", **_CIS},
    "cis-equal-code-p": {
        "strategy.name": "cis-equal",
        "strategy.epsilon": 0.2,
        "strategy.p_rule": "code",
        "strategy.lr_schedule": "constant",
        **_CIS,
    },
    "cis-flops-epsilon": {"strategy.name": "cis-flops", "strategy.epsilon": 0.2, **_CIS},
    "cis-balanced-reference": {
        "strategy.name": "cis-balanced",
        "strategy.mode": "reference",
        "strategy.epsilon": 0.2,
        "train.momentum": 0.5,
        **_CIS,
    },
}

DROP = ("wall_time",)


def config_for(case: str) -> Any:
    sys.path.insert(0, str(REPO))
    from fedclock.config import load_config
    from tests.conftest import tiny_raw

    raw = tiny_raw(executor={"threads": 1})
    return load_config(raw=raw, overrides=[f"{k}={v}" for k, v in CASES[case].items()])


def run_case(case: str, workdir: Path) -> list[list[str]]:
    """The case's metrics.csv rows (header first) without the wall-time column."""
    from fedclock.experiment import run_experiment

    res = run_experiment(config_for(case), run_dir=workdir / case)
    if res.summary["status"] != "completed":
        raise RuntimeError(f"golden case {case} did not complete: {res.error}")
    with (res.run_dir / "metrics.csv").open(newline="") as fh:
        rows = list(csv.reader(fh))
    keep = [i for i, h in enumerate(rows[0]) if h not in DROP]
    return [[r[i] for i in keep] for r in rows]


def read_golden(case: str) -> list[list[str]]:
    with (GOLDEN / f"{case}.csv").open(newline="") as fh:
        return list(csv.reader(fh))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["record", "check"])
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    cases = args.cases or list(CASES)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            rows = run_case(case, Path(tmp))
            if args.action == "record":
                with (GOLDEN / f"{case}.csv").open("w", newline="") as fh:
                    csv.writer(fh, lineterminator="\n").writerows(rows)
                print(f"recorded {case}: {len(rows) - 1} rows")
            else:
                same = rows == read_golden(case)
                bad += not same
                print(f"{'same     ' if same else 'DIFFERENT'} {case}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
