"""scripts/salf_authors_loop.py, the independent cross-check of SALF reference mode."""

from __future__ import annotations

import importlib.util
import json

from tests.conftest import REPO, require_data


def _loop(capsys, *argv: str) -> dict:
    mnist = require_data("mnist")  # skip, or fail under CI=true, without the shared MNIST
    spec = importlib.util.spec_from_file_location(
        "salf_loop", REPO / "scripts" / "salf_authors_loop.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    base = ["--data-dir", str(mnist), "--users", "4", "--rounds", "2", "--seed", "5"]
    assert module.main([*base, *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_no_stragglers_is_vanilla_and_all_stragglers_never_move(capsys) -> None:
    vanilla = _loop(capsys, "--method", "vanilla")
    drop0 = _loop(capsys, "--method", "drop", "--ratio", "0")
    keys = ("val_best_test_accuracy", "final_test_accuracy")
    assert [vanilla[k] for k in keys] == [drop0[k] for k in keys]
    # every user a straggler: divide by U of global copies leaves the model where it
    # started, in every round, whether the set is fixed or re-drawn
    frozen = [_loop(capsys, "--method", "drop", "--ratio", "1", *r) for r in ((), ("--redraw",))]
    for run in frozen:
        assert run["final_test_accuracy"] == run["val_best_test_accuracy"]
    assert frozen[0]["final_test_accuracy"] == frozen[1]["final_test_accuracy"]
    assert frozen[0]["final_test_accuracy"] != vanilla["final_test_accuracy"]
