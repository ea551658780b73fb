"""CIS reproduction tables from sweep folders: every cell's CIS and per-exit accuracy, per
seed and as mean ± sample std, and paired differences between cells seed by seed.

``python scripts/cis_tables.py runs/cis-t1 [DIR ...] [--diff A B ...] [--metric cis_accuracy]``

A cell is ``<folder name>:<strategy>/<grid cell>`` (e.g. ``cis-t1:cis-serving/cis.serving=
80-15-5``), read from ``DIR/runs/<strategy>/<cell>/seed-<s>/summary.json`` (finished runs
only); a cell whose runs lack ``--metric`` is left out. ``--diff A B`` prints A − B per
seed (points, × 100) for the seeds both have; A and B may be given without the folder when
only one folder holds such a cell, and ``CELL#metric`` compares another metric of it (e.g.
``cis-equal/cis.serving=80-15-5#cis_accuracy_5-15-80``, cis.also_serving's column). Percentages
with one decimal, as the reproduction page reports them (docs/reproductions/cis.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

EXITS = ("exit1_accuracy", "exit2_accuracy", "exit3_accuracy")


def cells(folders: list[Path]) -> dict[str, dict[int, dict]]:
    """label → seed → summary.json of every finished run under the sweep folders."""
    out: dict[str, dict[int, dict]] = {}
    for folder in folders:
        for path in sorted(folder.glob("runs/*/*/seed-*/summary.json")):
            summary = json.loads(path.read_text())
            if summary.get("status") != "completed":
                continue
            seed = int(path.parent.name.removeprefix("seed-"))
            strategy, cell = path.parent.parent.parent.name, path.parent.parent.name
            label = f"{folder.name}:{strategy}/{cell}"
            out.setdefault(label, {})[seed] = summary
    return out


def _pm(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.fmean(values):.1f} ± {100 * sd:.1f}"


def _find(table: dict[str, dict[int, dict]], name: str) -> str:
    hits = [k for k in table if k == name or k.split(":", 1)[1] == name]
    if len(hits) != 1:
        raise SystemExit(f"--diff {name}: {len(hits)} cells match; give the folder too.")
    return hits[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--metric", default="cis_accuracy")
    ap.add_argument("--diff", nargs=2, action="append", default=[], metavar=("A", "B"))
    args = ap.parse_args(argv)
    table = cells(args.folders)
    print(f"| cell | seeds | {args.metric} % (mean ± sd) | per seed | exits 1 / 2 / 3 % (mean) |")
    print("|---|---|---|---|---|")
    for label, runs in table.items():
        seeds = [s for s in sorted(runs) if args.metric in runs[s]]
        if not seeds:
            continue
        vals = [runs[s][args.metric] for s in seeds]
        per = " / ".join(f"{100 * v:.1f}" for v in vals)
        ex = " / ".join(f"{100 * statistics.fmean(runs[s][e] for s in seeds):.1f}" for e in EXITS)
        names = ",".join(str(s) for s in seeds)
        print(f"| {label} | {names} | {_pm(vals)} | {per} | {ex} |")
    for a, b in args.diff:
        (a, _, ma), (b, _, mb) = a.partition("#"), b.partition("#")
        ma, mb = ma or args.metric, mb or args.metric
        ka, kb = _find(table, a), _find(table, b)
        both = sorted(set(table[ka]) & set(table[kb]))
        d = [100 * (table[ka][s][ma] - table[kb][s][mb]) for s in both]
        name_a = ka if ma == args.metric else f"{ka}#{ma}"
        name_b = kb if mb == args.metric else f"{kb}#{mb}"
        print(f"{name_a} − {name_b} (seeds {','.join(map(str, both))}): "
              + " / ".join(f"{x:+.1f}" for x in d))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
