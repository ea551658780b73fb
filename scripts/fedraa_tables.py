"""Print the per-seed figures behind docs/reproductions/fed-raa.md from compare folders.

    python scripts/fedraa_tables.py runs/t3 runs/t2 --ref fed-raa --at 100 300

For every strategy found under ``FOLDER/runs/<strategy>/seed-<s>/`` (later folders add
strategies, or override a strategy of the same name): the time to the target accuracy per
seed (``summary.json``'s ``time_to_target``), mean ± std, the paired ratio to ``--ref``
(seed by seed), the test accuracy at the ``--at`` virtual times (the last evaluation at or
before each), the final accuracy and the server steps. ``--label NAME=FOLDER`` names a
strategy of a folder differently (e.g. ``fed-raa@completed=runs/t3-completed``).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path


def _runs(folder: Path, rename: dict[Path, str]) -> dict[str, dict[int, Path]]:
    out: dict[str, dict[int, Path]] = {}
    for seed_dir in sorted(folder.glob("runs/*/seed-*")):
        if not (seed_dir / "summary.json").is_file():
            continue
        name = seed_dir.parent.name
        suffix = rename.get(folder)
        key = f"{name}{suffix}" if suffix else name
        out.setdefault(key, {})[int(seed_dir.name.split("-")[1])] = seed_dir
    return out


def _accuracy_at(run: Path, t: float) -> float:
    best = float("nan")
    with (run / "metrics.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            if float(row["virtual_time"]) <= t + 1e-9:
                best = float(row["test_accuracy"])
    return best


def _fmt(values: list[float], digits: int = 1) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--ref", default="fed-raa", help="strategy the ratios are paired against")
    ap.add_argument("--at", nargs="*", type=float, default=[100.0, 300.0])
    ap.add_argument("--suffix", action="append", default=[], metavar="FOLDER=SUFFIX",
                    help="append SUFFIX to the strategy names of FOLDER")  # fmt: skip
    args = ap.parse_args(argv)
    rename = {Path(k): v for k, v in (s.split("=", 1) for s in args.suffix)}
    runs: dict[str, dict[int, Path]] = {}
    for folder in args.folders:
        runs.update(_runs(folder, rename))
    if not runs:
        raise SystemExit("no finished runs under the folders given")
    ref = runs.get(args.ref, {})
    ttt = {
        name: {s: json.loads((p / "summary.json").read_text()).get("time_to_target")
               for s, p in seeds.items()}
        for name, seeds in runs.items()
    }  # fmt: skip
    head = ["strategy", "time to target (s)", "per seed", f"ratio to {args.ref} (paired)"]
    head += [f"acc. at {t:g} s (%)" for t in args.at] + ["final acc. (%)", "server steps"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, seeds in runs.items():
        order = sorted(seeds)
        times = [ttt[name][s] for s in order]
        reached = [t for t in times if t is not None]
        per = ", ".join("—" if t is None else f"{t:g}" for t in times)
        ratios = [
            ttt[name][s] / ttt[args.ref][s]
            for s in order
            if s in ref and ttt[name][s] is not None and ttt[args.ref][s]
        ]
        ratio = (
            f"{statistics.mean(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)})"
            if ratios else "—"
        )  # fmt: skip
        summaries = [json.loads((seeds[s] / "summary.json").read_text()) for s in order]
        accs = [_fmt([100 * _accuracy_at(seeds[s], t) for s in order], 2) for t in args.at]
        final = _fmt([100 * x["final_test_accuracy"] for x in summaries], 2)
        steps = _fmt([float(x["aggregations"]) for x in summaries], 0)
        row = [name, _fmt(reached) + ("" if len(reached) == len(times) else " (some never)"),
               per, ratio, *accs, final, steps]  # fmt: skip
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
