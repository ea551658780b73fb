"""Fault injection: kill fedclock at an exact write of one of its files, continue, compare.

A command (`run`, `compare` or `sweep` of a small digits experiment, a checkpoint every
server step) runs once whole with a test-only hook (``fedclock.outputs.fault_hook``) that
lists every write it makes: each file's temporary copy written and synced
(``temporary``), renamed over the file (``renamed``), and each row appended to
metrics.csv (``appended``). Then, for each chosen position k, the same command runs in a
fresh folder and the process ends at its k-th write with ``os._exit(137)`` — as SIGKILL at
that moment would: no ``finally``, no flush — and the continuation runs (`run --resume`, or
the same `compare`/`sweep` again; a run killed before its config.yaml was written is
refused by `--resume` with a sentence that says to start it again, and started again). The
trial passes when every run folder's metrics.csv
(wall time aside), summary.json (``wall_s`` aside), clients.csv and timeline.csv equal the
uninterrupted command's, the folders hold the same file names, and no temporary file is
left.

    python scripts/fault_inject.py                      # every kind, docs/reliability.md
    python scripts/fault_inject.py --kinds run --positions 3   # a quick look
    python scripts/fault_inject.py --fault enospc       # a full disk at each kind of write
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# the process: the hook, then fedclock's CLI (argv[1]: the hook's spec as JSON)
BOOT = """
import json, os, sys
spec = json.loads(sys.argv[1])
from fedclock import outputs
count = [0]
def hook(path, stage):
    count[0] += 1
    if spec.get("log"):
        with open(spec["log"], "a") as fh:
            fh.write(f"{count[0]}\\t{os.path.relpath(path, spec['root'])}\\t{stage}\\n")
    if count[0] == spec.get("kill_at"):
        if spec.get("fault") == "enospc":  # the disk is full at this write
            import errno
            raise OSError(errno.ENOSPC, "No space left on device")
        os._exit(137)
outputs.fault_hook = hook
sys.argv = ["fedclock", *sys.argv[2:]]
from fedclock.cli import main
main()
"""

CONFIG = {
    "name": "faults",
    "seed": 3,
    "data": {"name": "digits"},
    "partition": {"scheme": "iid", "num_clients": 6},
    "model": {"arch": "mlp", "hidden": [16]},
    "population": {
        "scenario": "classes",
        "classes": [{"fraction": 0.5, "speed": 2.0e6}, {"fraction": 0.5, "speed": 5.0e5}],
    },
    "train": {"local_epochs": 1, "batch_size": 32, "lr": 0.1},
    "strategy": {"name": "fedavg"},
    "budget": {"aggregations": 4},
    "eval": {"every_aggregations": 1},
    "checkpoint": {"every_aggregations": 1},
    "executor": {"threads": 1},
}

COMMON = ["-q", "-j", "1", "--batch-runs", "1"]


def commands(kind: str, config: Path, out: Path) -> tuple[list[str], list[str]]:
    """(the command, its continuation after a kill)."""
    if kind == "run":
        return ["run", str(config), "-q", "--out", str(out)], ["run", "-q", "--resume", str(out)]
    if kind == "compare":
        cmd = ["compare", str(config), *COMMON, "--strategies", "fedavg,fedbuff:buffer_size=3",
               "--seeds", "1,2", "--out", str(out)]  # fmt: skip
        return cmd, cmd
    cmd = ["sweep", str(config), *COMMON, "--over", "train.lr=0.05,0.1", "--seeds", "1",
           "--out", str(out)]  # fmt: skip
    return cmd, cmd


def launch(
    args: list[str], root: Path, *, log: Path | None = None, kill_at: int | None = None,
    quiet: bool = False, fault: str = "kill", stderr: list[str] | None = None,
) -> int:  # fmt: skip
    spec = {"root": str(root), "log": str(log) if log else None, "kill_at": kill_at,
            "fault": fault}  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", BOOT, json.dumps(spec), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False,
    )  # fmt: skip
    text = proc.stderr.decode(errors="replace")
    if stderr is not None:
        stderr.append(text)
    if proc.returncode not in (0, 137) and not quiet:
        sys.stderr.write(text)
    return proc.returncode


def run_folders(out: Path) -> list[Path]:
    """The run folders of a command's output (``out`` itself for `run`)."""
    if (out / "meta.json").is_file() or (out / "metrics.csv").is_file():
        return [out]
    return sorted(p.parent for p in out.glob("runs/**/summary.json"))


def outputs_of(out: Path) -> dict[str, Any]:
    """What must equal an uninterrupted command's: each run folder's results and the
    names of the files in every folder."""
    got: dict[str, Any] = {}
    for run_dir in run_folders(out):
        rel = str(run_dir.relative_to(out))
        with (run_dir / "metrics.csv").open(newline="") as fh:
            rows = list(csv.reader(fh))
        keep = [i for i, h in enumerate(rows[0]) if h != "wall_time"]
        summary = json.loads((run_dir / "summary.json").read_text())
        summary.pop("wall_s", None)
        timeline = run_dir / "timeline.csv"
        got[rel] = (
            [[r[i] for i in keep] for r in rows],
            summary,
            (run_dir / "clients.csv").read_text(),
            timeline.read_text() if timeline.is_file() else None,
        )
    got["files"] = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    return got


def positions(
    kind: str, work: Path, config: Path
) -> tuple[list[tuple[int, str, str]], dict[str, Any]]:
    """Every write of the uninterrupted command (number, file, stage) and its outputs."""
    out, log = work / f"{kind}-whole", work / f"{kind}.log"
    cmd, _ = commands(kind, config, out)
    if launch(cmd, out, log=log) != 0:
        raise SystemExit(f"the uninterrupted {kind} failed")
    writes = []
    for line in log.read_text().splitlines():
        n, path, stage = line.split("\t")
        writes.append((int(n), path, stage))
    return writes, outputs_of(out)


def choose(writes: list[tuple[int, str, str]], count: int, rng: random.Random) -> list[int]:
    """``count`` positions: one of every kind of write (file name and stage) first, then
    others at random."""
    kinds: dict[tuple[str, str], list[int]] = {}
    for n, path, stage in writes:
        kinds.setdefault((Path(path).name, stage), []).append(n)
    first = sorted(rng.choice(ns) for ns in kinds.values())
    rest = [n for n, _, _ in writes if n not in first]
    rng.shuffle(rest)
    return (
        sorted((first + rest)[:count])
        if count < len(first)
        else sorted(first + rest[: count - len(first)])
    )


def trial(
    kind: str, work: Path, config: Path, at: int, want: dict[str, Any], fault: str = "kill",
    writes: list[tuple[int, str, str]] | None = None,
) -> str | None:  # fmt: skip
    """Kill the command at write ``at`` (``fault="enospc"``: the disk is full at that write),
    continue it; None when the outputs match, else why."""
    out = work / f"{kind}-{fault}-{at}"
    cmd, cont = commands(kind, config, out)
    err: list[str] = []
    rc = launch(cmd, out, kill_at=at, fault=fault, quiet=fault != "kill", stderr=err)
    if fault == "kill" and rc != 137:
        return f"the command ended with {rc} before write {at}"
    if fault == "enospc":
        name = Path(writes[at - 1][1]).name if writes else ""
        lines = [x for x in err[0].splitlines() if x.strip()]
        if name == "report.html" or name.endswith(".png"):  # after the results: a note (-q: none)
            if rc != 0:
                return f"a full disk at {name} ended with {rc}: {lines}"
        elif rc != 2 or len(lines) != 1 or name not in lines[0] or "no space" not in lines[0]:
            return f"a full disk at {name} is not one sentence naming it (status {rc}): {lines}"
    if kind == "run" and not (out / "config.yaml").is_file():
        cont = cmd  # (stopped before its config was written: `--resume` says to start again)
        if launch(["run", "-q", "--resume", str(out)], out, quiet=True) == 0:
            return "--resume of a run stopped before its config did not refuse"
    if launch(cont, out) != 0:
        return "the continuation failed"
    left = [str(p) for p in out.rglob(".*.tmp")]
    if left:
        return f"temporary files left: {left}"
    got = outputs_of(out)
    if got != want:
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        return f"outputs differ from the uninterrupted command's: {diff}"
    shutil.rmtree(out)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="run,compare,sweep")
    ap.add_argument("--positions", type=int, default=8, help="kill positions per kind")
    ap.add_argument("--seed", type=int, default=0, help="which positions are drawn")
    ap.add_argument(
        "--fault", choices=("kill", "enospc"), default="kill",
        help="kill the process at the write, or make the disk full there (writes before a "
        "rename or an append only)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    import yaml

    rng = random.Random(args.seed)
    failed = total = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = work / "config.yaml"
        config.write_text(yaml.safe_dump(CONFIG))
        for kind in args.kinds.split(","):
            t0 = time.perf_counter()
            writes, want = positions(kind, work, config)
            # (a full disk fails a write before its rename, or an append)
            pool = writes if args.fault == "kill" else [w for w in writes if w[2] != "renamed"]
            chosen = choose(pool, args.positions, rng)
            for at in chosen:
                _, path, stage = writes[at - 1]
                why = trial(kind, work, config, at, want, args.fault, writes)
                total += 1
                failed += why is not None
                print(f"{'ok  ' if why is None else 'FAIL'} {kind:8} write {at:3}/{len(writes)} "
                      f"{stage:9} {path}{'' if why is None else ': ' + why}")  # fmt: skip
            print(f"# {kind}: {len(writes)} writes, {len(chosen)} killed, "
                  f"{time.perf_counter() - t0:.0f} s")  # fmt: skip
    print(f"# {total - failed} of {total} trials passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
