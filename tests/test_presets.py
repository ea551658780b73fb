"""Every shipped preset runs as given, at a tiny budget, with each command it is made for:
``fedclock run``; ``fedclock compare`` when it names strategies to compare (with its seeds
and its learning-rate grid); ``fedclock sweep`` when it names a grid to sweep.

Presets on MNIST or Tiny Shakespeare use the shared data (skipped without it, failed under
CI=true; see tests/conftest.py). Slow: a few seconds per run, hundreds of runs in all.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fedclock.cli import app
from fedclock.presets import load_preset, preset_names
from fedclock.runs import parse_over
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


def _data_args(raw: dict[str, Any], cifar: Path) -> list[str]:
    name = raw["data"]["name"]
    if name in ("mnist", "shakespeare"):
        return ["--data-dir", str(require_data(name))]
    if name in ("cifar10", "cifar100"):
        return ["--data-dir", str(cifar)]
    return []


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
def test_every_preset_runs_as_shipped(tmp_path: Path, preset: str, fake_cifar: Path) -> None:
    raw = load_preset(preset)
    summary = _invoke(
        ["run", "--preset", preset, *_data_args(raw, fake_cifar), "--out", str(tmp_path)]
    )
    assert summary["status"] == "completed" and summary["aggregations"] == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset", [p for p in PRESETS if load_preset(p).get("compare", {}).get("strategies")]
)
def test_every_preset_compares_as_shipped(tmp_path: Path, preset: str, fake_cifar: Path) -> None:
    raw = load_preset(preset)
    result = _invoke(
        ["compare", "--preset", preset, *_data_args(raw, fake_cifar), "--out", str(tmp_path)]
    )
    compare = raw["compare"]
    assert len(result["rows"]) == len(compare["strategies"])
    assert all(r["n_seeds"] == len(compare.get("seeds") or [raw["seed"]]) for r in result["rows"])
    if compare.get("lr_grid"):  # compared over the shipped grid, by default
        assert all(r["lr"] in compare["lr_grid"] for r in result["rows"])
        assert (tmp_path / "lr_grid.csv").is_file()


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset", [p for p in PRESETS if load_preset(p).get("compare", {}).get("over")]
)
def test_every_preset_sweeps_as_shipped(tmp_path: Path, preset: str, fake_cifar: Path) -> None:
    raw = load_preset(preset)
    result = _invoke(
        ["sweep", "--preset", preset, *_data_args(raw, fake_cifar), "--out", str(tmp_path)]
    )
    path, values = parse_over(raw["compare"]["over"][0])
    cells = {(r["strategy"], r[path]) for r in result["rows"]}
    assert cells == {(s, v) for s in raw["compare"]["strategies"] for v in values}
