"""CIS accuracy and accuracy per exit against rounds, from the metrics.csv of sweep runs.

``python scripts/cis_curves.py runs/cis-t1-15r [DIR ...] [--every 1]``

For every run ``DIR/runs/<strategy>/<cell>/seed-<s>/metrics.csv`` one table: round, CIS
accuracy, exits 1 / 2 / 3 (%, one decimal, as docs/reproductions/cis.md reports them);
``--every N`` keeps every N-th evaluated round and the last. Then, for runs of two
strategies in the same cell and seed, the first evaluated round at which one leads the other
for good (``--pair A B``: the strategies' folder names, e.g. cis-serving cis-equal).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

COLS = ("cis_accuracy", "exit1_accuracy", "exit2_accuracy", "exit3_accuracy")


def curves(folders: list[Path]) -> dict[tuple[str, str, int], list[dict[str, float]]]:
    """(strategy, cell, seed) → the evaluated rows (round and COLS) of its metrics.csv."""
    out: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for folder in folders:
        for path in sorted(folder.glob("runs/*/*/seed-*/metrics.csv")):
            seed = int(path.parent.name.removeprefix("seed-"))
            key = (path.parent.parent.parent.name, path.parent.parent.name, seed)
            rows = []
            with path.open() as f:
                for r in csv.DictReader(f):
                    if not r.get("cis_accuracy"):
                        continue
                    rows.append({"round": float(r["aggregation"])}
                                | {c: float(r[c]) for c in COLS})  # fmt: skip
            if rows:
                out[key] = rows
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--pair", nargs=2, metavar=("A", "B"))
    args = ap.parse_args(argv)
    table = curves(args.folders)
    for (strategy, cell, seed), rows in table.items():
        print(f"\n{strategy} {cell} seed {seed}")
        print("| round | CIS % | exit 1 % | exit 2 % | exit 3 % |")
        print("|---|---|---|---|---|")
        for i, r in enumerate(rows):
            if int(r["round"]) % args.every and i != len(rows) - 1:
                continue
            vals = " | ".join(f"{100 * r[c]:.1f}" for c in COLS)
            print(f"| {int(r['round'])} | {vals} |")
    if args.pair:
        a, b = args.pair
        for (strategy, cell, seed), rows in table.items():
            if strategy != a or (b, cell, seed) not in table:
                continue
            other = {int(r["round"]): r["cis_accuracy"] for r in table[(b, cell, seed)]}
            d = [(int(r["round"]), r["cis_accuracy"] - other[int(r["round"])])
                 for r in rows if int(r["round"]) in other]  # fmt: skip
            print(f"\n{a} − {b}, {cell}, seed {seed}, CIS points by round: "
                  + " / ".join(f"{t}: {100 * x:+.1f}" for t, x in d))  # fmt: skip
            ahead = [t for i, (t, _) in enumerate(d) if all(x > 0 for _, x in d[i:])]
            print(f"  {a} ahead for good from round: {ahead[0] if ahead else 'never'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
