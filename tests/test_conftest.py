"""The test suite's own rule for shared data: skip with a reason, or fail under CI=true."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tests.conftest as conftest
from tests.conftest import REPO, require_data


@pytest.fixture
def no_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Neither $FEDCLOCK_DATA (an empty folder) nor the shared roots hold any data."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("FEDCLOCK_DATA", str(empty))
    monkeypatch.setattr(conftest, "SHARED_ROOTS", [tmp_path / "shared"])
    return empty


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_missing_data_skips_with_a_sentence_naming_where_it_looked(
    no_data: Path, monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception) as skipped:
        require_data("mnist")
    msg = str(skipped.value)
    assert msg.startswith("MNIST not found: ") and msg.endswith("; set FEDCLOCK_DATA.")
    assert str(no_data) in msg and str(no_data.parent / "shared" / "mnist") in msg
    assert "train-images-idx3-ubyte" in msg and "\n" not in msg


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_missing_data_fails_under_ci(
    no_data: Path, monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception) as failed:
        require_data("shakespeare")
    msg = str(failed.value)
    assert msg.startswith("CI=true and this test needs shared data: Tiny Shakespeare not found")
    assert str(no_data) in msg and "tinyshakespeare.txt" in msg and "\n" not in msg


def test_data_is_found_through_fedclock_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$FEDCLOCK_DATA may name the mnist folder (as .ci/run sets it): Shakespeare is its sibling."""
    mnist, text = tmp_path / "data" / "mnist", tmp_path / "data" / "shakespeare"
    mnist.mkdir(parents=True)
    text.mkdir()
    for f in conftest.DATA_FILES["mnist"]:
        (mnist / f"{f}.gz").write_bytes(b"")
    (text / "tinyshakespeare.txt").write_text("")
    monkeypatch.setenv("FEDCLOCK_DATA", str(mnist))
    monkeypatch.setattr(conftest, "SHARED_ROOTS", [])
    monkeypatch.setenv("CI", "true")
    assert require_data("mnist") == mnist
    assert require_data("shakespeare") == text
    (mnist / "t10k-labels-idx1-ubyte.gz").unlink()  # one file missing: not MNIST
    with pytest.raises(pytest.fail.Exception):
        require_data("mnist")


def test_the_summary_says_how_many_skipped_and_why(tmp_path: Path) -> None:
    """pytest with the project's options (pyproject's addopts) ends with each skip reason."""
    test = tmp_path / "test_skips.py"
    test.write_text(
        "import pytest\n"
        "def test_needs_data():\n"
        "    pytest.skip('MNIST not found: none of /nowhere holds it; set FEDCLOCK_DATA.')\n"
        "def test_other():\n"
        "    pass\n"
    )
    cmd = [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"),
           "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(test)]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 1 skipped" in run.stdout
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("SKIPPED [1] ")]
    assert line.endswith(
        "test_skips.py:3: MNIST not found: none of /nowhere holds it; set FEDCLOCK_DATA."
    )
