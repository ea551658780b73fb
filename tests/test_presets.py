"""Every shipped preset runs as given, at a tiny budget, with each command it is made for:
``fedclock run``; ``fedclock compare`` when it names strategies to compare (with its seeds
and its learning-rate grid); ``fedclock sweep`` when it names a grid to sweep.

Presets on MNIST or Tiny Shakespeare use the shared data (skipped without it, failed under
CI=true; see tests/conftest.py). A comparison or sweep runs with its first shipped seed only,
a sweep at its swept field's two ends: what a preset can get wrong at run time shows there,
seeds are paired the same way for every preset (tests/test_cli.py, tests/test_outputs.py),
and every cell's config is validated without running (the fast test at the end). Slow: a
few seconds per run, about 220 runs in all.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fedclock.cli import app
from fedclock.config import load_config
from fedclock.presets import load_preset, preset_names
from fedclock.runs import parse_over, parse_strategy
from fedclock.runs.grid import cell_config, with_value
from tests.conftest import require_data

runner = CliRunner()
PRESETS = preset_names()
# the smallest budget that still aggregates: one server step (a preset's virtual-time
# budget stays, whichever comes first ends the run)
TINY = ["--set", "budget.aggregations=1"]


@pytest.fixture(autouse=True)
def _free_runs() -> Iterator[None]:
    """A run left in this process's reference cycles is freed before the next test (`fedclock
    run` does not collect: its process ends)."""
    yield
    gc.collect()


@pytest.fixture(scope="module")
def fake_cifar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small CIFAR-10 and CIFAR-100 folders in the official layout (the presets for them run
    when the real files are given; here they run as shipped on these)."""
    from tests.test_text_cifar import write_fake_cifar10, write_fake_cifar100

    root = tmp_path_factory.mktemp("cifar")
    write_fake_cifar10(root, per_batch=20)
    write_fake_cifar100(root, n=60)
    return root


@pytest.fixture(scope="module")
def fleet_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trace a trace-driven preset names (traces/fleet, gitignored), made by the two
    commands its doc page gives: scripts/fedscale_fleet.py, then `fedclock trace import`."""
    root = tmp_path_factory.mktemp("fleet")
    script = Path(__file__).resolve().parents[1] / "scripts" / "fedscale_fleet.py"
    made = subprocess.run(
        [sys.executable, str(script), "--clients", "200", "--seed", "0", "--out", str(root)],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    res = runner.invoke(
        app,
        [
            "trace",
            "import",
            "fedscale",
            str(root / "client_device_capacity"),
            str(root / "client_behave_trace"),
            "--reference-flops",
            "3.2e5",
            "--out",
            str(root / "trace"),
        ],
    )
    assert res.exit_code == 0, res.stderr or res.stdout
    return root / "trace"


def _data_args(raw: dict[str, Any], cifar: Path, trace: Path) -> list[str]:
    """The data a preset reads (shared MNIST/Shakespeare, fake CIFAR) and, when it runs on a
    device trace, the trace built by the fixture above in place of its relative folder."""
    name = raw["data"]["name"]
    args: list[str] = []
    if name in ("mnist", "shakespeare"):
        args = ["--data-dir", str(require_data(name))]
    elif name in ("cifar10", "cifar100"):
        args = ["--data-dir", str(cifar)]
    if raw.get("population", {}).get("trace"):
        args += ["--set", f"population.trace={trace}"]
    return args


def _first_seed(raw: dict[str, Any]) -> list[str]:
    """The preset's first comparison seed (else its seed), as ``--seeds``."""
    seeds = raw.get("compare", {}).get("seeds") or [raw["seed"]]
    return ["--seeds", str(seeds[0])]


def _setup_bound(raw: dict[str, Any]) -> list[str]:
    """Work before the first server step that one aggregation does not bound: PruneFL's
    initial pruning runs until its density settles, up to 1,000 rounds at one client — on
    the fake CIFAR files (random labels) it never settles, 10 minutes a cell. Three rounds."""
    entries = raw.get("compare", {}).get("strategies", [])
    if any(parse_strategy(e)[0] == "prunefl" for e in entries):
        return ["--set", "strategy.initial_max_rounds=3"]
    return []


def _grid_args(raw: dict[str, Any], cifar: Path, trace: Path) -> list[str]:
    """A comparison's or sweep's arguments: its data, its first seed, the set-up bound."""
    return [*_data_args(raw, cifar, trace), *_first_seed(raw), *_setup_bound(raw)]


def _invoke(args: list[str]) -> dict[str, Any]:
    res = runner.invoke(app, [*args, *TINY, "--json", "-q"])
    assert res.exit_code == 0, res.stderr or res.stdout
    assert res.stderr == ""
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def test_the_presets_command_lists_every_preset() -> None:
    res = runner.invoke(app, ["presets"])
    assert res.exit_code == 0
    assert len(PRESETS) >= 13 and all(name in res.stdout for name in PRESETS)


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_as_shipped(
    tmp_path: Path, preset: str, fake_cifar: Path, fleet_trace: Path
) -> None:
    raw = load_preset(preset)
    summary = _invoke(
        [
            "run",
            "--preset",
            preset,
            *_data_args(raw, fake_cifar, fleet_trace),
            "--out",
            str(tmp_path),
        ]
    )
    assert summary["status"] == "completed" and summary["aggregations"] == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset", [p for p in PRESETS if load_preset(p).get("compare", {}).get("strategies")]
)
def test_every_preset_compares_as_shipped(
    tmp_path: Path, preset: str, fake_cifar: Path, fleet_trace: Path
) -> None:
    raw = load_preset(preset)
    result = _invoke(
        [
            "compare",
            "--preset",
            preset,
            *_grid_args(raw, fake_cifar, fleet_trace),
            "--out",
            str(tmp_path),
        ]
    )
    compare = raw["compare"]
    assert len(result["rows"]) == len(compare["strategies"])
    assert all(r["n_seeds"] == 1 for r in result["rows"])
    if compare.get("lr_grid"):  # compared over the shipped grid, by default
        assert all(r["lr"] in compare["lr_grid"] for r in result["rows"])
        assert (tmp_path / "lr_grid.csv").is_file()


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset", [p for p in PRESETS if load_preset(p).get("compare", {}).get("over")]
)
def test_every_preset_sweeps_as_shipped(
    tmp_path: Path, preset: str, fake_cifar: Path, fleet_trace: Path
) -> None:
    """At the swept field's two ends (the smallest deadline, the most stragglers …), every
    strategy; each value in between is validated by the fast test below."""
    raw = load_preset(preset)
    path, values = parse_over(raw["compare"]["over"][0])
    ends = [values[0], values[-1]]
    texts = raw["compare"]["over"][0].partition("=")[2].split(",")  # as the preset writes them
    over = ["--over", f"{path}={texts[0]},{texts[-1]}"]
    result = _invoke(
        [
            "sweep",
            "--preset",
            preset,
            *_grid_args(raw, fake_cifar, fleet_trace),
            *over,
            "--out",
            str(tmp_path),
        ]
    )
    cells = {(r["strategy"], r[path]) for r in result["rows"]}
    assert cells == {(s, v) for s in raw["compare"]["strategies"] for v in ends}


@pytest.mark.parametrize("preset", [p for p in PRESETS if load_preset(p).get("compare")])
def test_every_cell_of_every_preset_validates(preset: str) -> None:
    """Each cell a preset's comparison or sweep would run — every strategy × seed × grid
    learning rate × swept value — is a config the cell accepts (fast: nothing runs)."""
    raw = load_preset(preset)
    cfg = load_config(raw=raw)
    compare = raw["compare"]
    bases = [cfg]
    if compare.get("over"):
        path, values = parse_over(compare["over"][0])
        bases = [with_value(cfg, path, v) for v in values]
    seeds = compare.get("seeds") or [raw["seed"]]
    lrs = compare.get("lr_grid") or [None]
    for base in bases:
        for entry in compare.get("strategies") or [raw["strategy"]["name"]]:
            for seed in seeds:
                for lr in lrs:
                    cell = cell_config(base, entry, seed, lr=lr)  # raises if refused
                    assert cell.strategy.name == parse_strategy(entry)[0]
                    assert cell.seed == seed and (lr is None or cell.train.lr == lr)
