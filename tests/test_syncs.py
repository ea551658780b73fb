"""Host↔device synchronisations per round (issue 34's CPU-side check): on a GPU each call
that reads a device value on the host (``item``/``float``/``bool`` of a tensor, ``tolist``,
``numpy``, ``cpu``, ``nonzero`` …) stalls the host until the device catches up. Counted on
CPU by an instrumented fake — every such call made while the executor trains or an
evaluator measures — the count per round must not grow with the number of clients (it is
at most a few per block of tasks and one per evaluation)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from fedclock.config import load_config
from fedclock.experiment import run_experiment
from fedclock.train import evaluate
from fedclock.train.vectorized import VectorizedExecutor
from tests.conftest import tiny_raw
from tests.test_golden import golden  # scripts/golden.py: its cases' strategy settings

# aten ops whose result the host must wait for (the scalar read behind item/float/int/bool,
# and ops whose output size depends on the values)
_SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal"}
_SYNC_METHODS = ("tolist", "numpy", "cpu")


class _Syncs(TorchDispatchMode):
    def __init__(self, counter: Counter[str], inside: list[int]) -> None:
        super().__init__()
        self.counter, self.inside = counter, inside

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if self.inside[0] and name in _SYNC_OPS:
            self.counter[name] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def count_syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts the syncing calls made inside ``VectorizedExecutor.run`` and the evaluators."""
    counter: Counter[str] = Counter()
    inside = [0]

    def scoped(fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            inside[0] += 1
            try:
                return fn(*a, **k)
            finally:
                inside[0] -= 1

        return wrapper

    def counted(meth: str) -> Any:
        orig = getattr(torch.Tensor, meth)

        def wrapper(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            if inside[0]:
                counter[meth] += 1
            return orig(self, *a, **k)

        return wrapper

    monkeypatch.setattr(VectorizedExecutor, "run", scoped(VectorizedExecutor.run))
    monkeypatch.setattr(evaluate.Evaluator, "measure", scoped(evaluate.Evaluator.measure))
    monkeypatch.setattr(evaluate, "evaluate_joint", scoped(evaluate.evaluate_joint))
    monkeypatch.setattr(evaluate.ExitEvaluator, "_measure", scoped(evaluate.ExitEvaluator._measure))
    for meth in _SYNC_METHODS:
        monkeypatch.setattr(torch.Tensor, meth, counted(meth))
    with _Syncs(counter, inside):
        yield counter


def _syncs(case: str, clients: int, aggregations: int, monkeypatch, tmp_path: Path) -> int:
    raw = tiny_raw(executor={"threads": 1, "kind": "vectorized", "max_batch_clients": 256})
    overrides = {
        **golden.CASES[case], "partition.num_clients": clients, "budget.aggregations": aggregations,
        "eval.every_aggregations": 1,
    }  # fmt: skip
    cfg = load_config(raw=raw, overrides=[f"{k}={v}" for k, v in overrides.items()])
    with count_syncs(monkeypatch) as counter:
        run_experiment(cfg, run_dir=tmp_path / f"{case}-{clients}-{aggregations}")
    return sum(counter.values())


@pytest.mark.parametrize(
    ("case", "blocks"),
    [
        ("fedavg", 1),  # one block
        ("heterofl", 3),  # a block per width rate (3 here)
        ("salf-paper", 4),  # a block per depth (at most 4 here)
        ("fed-raa-sync", 4),  # a block per fragment (4)
    ],
)
def test_syncs_per_round_do_not_grow_with_the_clients(
    case: str, blocks: int, monkeypatch, tmp_path
) -> None:
    """At most 3 per block (the block's losses, read from the device; two reads of the
    host-side row indices, which a GPU does not wait for) and 1 per evaluation, whatever
    the number of clients."""
    per_round = 3 * blocks + 1
    per = {}
    for clients in (6, 30):
        few = _syncs(case, clients, 2, monkeypatch, tmp_path)
        many = _syncs(case, clients, 5, monkeypatch, tmp_path)
        per[clients] = (many - few) / 3
    assert per[6] <= per_round and per[30] <= per_round, per


def test_an_evaluation_syncs_once(monkeypatch) -> None:
    """Accuracy and loss summed on the device over the batches, read once."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 3))
    x, y = torch.randn(1000, 8), torch.randint(0, 3, (1000,))
    ev = evaluate.Evaluator(model, x, y, batch_size=64)  # 16 batches
    from fedclock.train.executor import snapshot

    with count_syncs(monkeypatch) as counter:
        acc, loss = ev(snapshot(model, 0))
    assert sum(counter.values()) == 1, counter
    with torch.no_grad():
        logits = model(x)
    assert acc == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    with torch.no_grad():
        want = sum(
            float(F.cross_entropy(logits[i : i + 64], y[i : i + 64], reduction="sum"))
            for i in range(0, 1000, 64)
        )
    assert loss == want / 1000  # the float64 sum in batch order, bit for bit


def test_an_exit_evaluation_syncs_a_fixed_number_of_times(monkeypatch) -> None:
    """CIS's per-exit evaluator fills its entropy and hit tables on the device and reads
    them once (5 counted calls: ``cpu`` and ``numpy`` of each table, the loss's scalar), whatever the number of test batches; the
    accuracies and the last exit's loss are those of a direct computation."""

    class TwoExits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 3), torch.nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.stack([self.a(x), self.b(x)], dim=1)  # (B, E, C)

    torch.manual_seed(0)
    model = TwoExits()
    x, y = torch.randn(1000, 8), torch.randint(0, 3, (1000,))
    from fedclock.train.executor import snapshot

    reads = []
    for batch in (500, 64):  # 2 and 16 batches
        ev = evaluate.ExitEvaluator(model, x, y, num_exits=2, batch_size=batch)
        with count_syncs(monkeypatch) as counter:
            m = ev.more(snapshot(model, 0))
        reads.append(sum(counter.values()))
    assert reads[0] == reads[1] <= 5, reads
    with torch.no_grad():
        logits = model(x).double()
    for e in range(2):
        assert m[f"exit{e + 1}_accuracy"] == pytest.approx(
            float((logits[:, e].argmax(-1) == y).double().mean()), abs=1e-12
        )
