"""Golden outputs (scripts/golden.py): every strategy's small run still gives its recorded
metrics. Counts and the virtual clock must match exactly; accuracy and loss within what
float32 training on another CPU of this class can move (``scripts/golden.py check`` is the
bit-for-bit check on the recording machine)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("golden", REPO / "scripts" / "golden.py")
assert _spec is not None and _spec.loader is not None
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)

EXACT = {"aggregation", "updates_received", "updates_used", "updates_discarded"}
CLOCK = {"virtual_time", "bytes_up", "bytes_down", "compute_s_spent", "compute_s_wasted"}


def test_every_strategy_has_a_golden_case() -> None:
    from fedclock.strategies import STRATEGIES

    named = {golden.config_for(case).strategy.name for case in golden.CASES}
    assert named == set(STRATEGIES)
    assert {p.stem for p in golden.GOLDEN.glob("*.csv")} == set(golden.CASES)


@pytest.mark.parametrize("case", list(golden.CASES))
def test_golden_metrics(case: str, tmp_path: Path) -> None:
    want = golden.read_golden(case)
    got = golden.run_case(case, tmp_path)
    assert got[0] == want[0] and len(got) == len(want)
    header = want[0]
    test_size = 360  # digits test split (20 %): one sample is 1/360 of accuracy
    for row_got, row_want in zip(got[1:], want[1:], strict=True):
        for name, g, w in zip(header, row_got, row_want, strict=True):
            if name in EXACT:
                assert g == w, (name, row_want)
            elif name in CLOCK:  # the cost model is float64 arithmetic in a fixed order
                assert math.isclose(float(g), float(w), rel_tol=1e-12, abs_tol=1e-12), name
            elif name == "test_accuracy":  # float32 round-off may flip a near-tie sample
                assert abs(float(g) - float(w)) <= 3 / test_size + 1e-12, (name, row_want)
            else:  # losses: float32 training, a few steps deep
                assert math.isclose(float(g), float(w), rel_tol=1e-3, abs_tol=1e-6), name
