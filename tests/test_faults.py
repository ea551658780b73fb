"""The fault-injection suite (scripts/fault_inject.py, docs/reliability.md): a process killed
at an exact write of one of fedclock's files — as SIGKILL at that moment would — then
continued (`run --resume`, or the same `compare`/`sweep` again), ends with the files of an
uninterrupted command; nothing temporary is left."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from tests.conftest import load_script

faults = load_script("fault_inject")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(faults.CONFIG))
    return path


def _at(writes: list[tuple[int, str, str]], name: str, stage: str, nth: int = 0) -> int:
    return [n for n, path, st in writes if Path(path).name == name and st == stage][nth]


def test_a_run_killed_at_each_kind_of_write_is_resumed_to_the_uninterrupted_files(
    tmp_path: Path, config: Path
) -> None:
    """The writes a run makes, in order, and kills at the first config write (refused by
    --resume in one sentence, then started again), between summary.json's temporary copy
    and its rename, and in the report's write (after the run finished)."""
    writes, want = faults.positions("run", tmp_path, config)
    names = [(Path(p).name, st) for _, p, st in writes]
    assert names[:4] == [("config.yaml", "temporary"), ("config.yaml", "renamed"),
                         ("meta.json", "temporary"), ("meta.json", "renamed")]  # fmt: skip
    # summary.json is the last file of the run itself, then the report
    assert names[-4:] == [("summary.json", "temporary"), ("summary.json", "renamed"),
                          ("report.html", "temporary"), ("report.html", "renamed")]  # fmt: skip
    for at in (
        1,
        _at(writes, "summary.json", "temporary"),
        _at(writes, "report.html", "temporary"),
    ):
        assert faults.trial("run", tmp_path, config, at, want) is None, at


def test_a_full_disk_at_a_write_is_one_sentence_and_the_run_goes_on(
    tmp_path: Path, config: Path
) -> None:
    """ENOSPC at a metrics.csv row and at clients.csv's temporary copy: exit status 2, one
    sentence naming the file; `run --resume` then ends with the uninterrupted files."""
    writes, want = faults.positions("run", tmp_path, config)
    for at in (_at(writes, "metrics.csv", "appended", 2), _at(writes, "clients.csv", "temporary")):
        assert faults.trial("run", tmp_path, config, at, want, "enospc", writes) is None, at


def test_choose_takes_every_kind_of_write_first() -> None:
    writes = [(1, "a", "temporary"), (2, "a", "renamed"), (3, "b", "appended"),
              (4, "b", "appended"), (5, "b", "appended")]  # fmt: skip
    got = faults.choose(writes, 3, random.Random(0))
    assert len(got) == 3 and {1, 2} <= set(got) and len(set(got) & {3, 4, 5}) == 1


@pytest.mark.slow
def test_kills_at_24_positions_across_run_compare_and_sweep() -> None:
    """The acceptance figure of docs/reliability.md: 8 positions per command (every kind of
    write first), each trial equal to the uninterrupted command."""
    assert faults.main(["--positions", "8"]) == 0


@pytest.mark.slow
def test_a_full_disk_at_each_kind_of_write() -> None:
    """ENOSPC at 6 writes per command (every kind first): one sentence naming the file (a
    note for the report), and the continuation ends with the uninterrupted files."""
    assert faults.main(["--positions", "6", "--fault", "enospc"]) == 0
