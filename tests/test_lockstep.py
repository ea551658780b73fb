"""Run batching (fedclock.runs.lockstep, fedclock.train.joint): runs advanced together in one
process give the metrics and summaries of the same runs made alone; the joint executor call
gives each run's contributions; a failing run does not stop the others; Ctrl-C stops all."""

from __future__ import annotations

import csv
import json
import os
import platform
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

import fedclock.runs.lockstep as lockstep
from fedclock.cli import app
from fedclock.config import validate
from fedclock.experiment import run_experiment
from fedclock.models import build_model
from fedclock.runs.lockstep import (
    AUTO_MAX_RUNS,
    Lockstep,
    auto_batch_runs,
    batch_groups,
    run_cells_together,
)
from fedclock.runs.parallel import Cell, CellFailure, CellRunner, batch_workers
from fedclock.sim.types import ModelVersion, Task, TaskPlan
from fedclock.train.executor import ClientData, snapshot
from fedclock.train.joint import run_joint
from fedclock.train.local import LocalTraining
from fedclock.train.vectorized import VectorizedExecutor
from tests.conftest import tiny_raw

# one of each kind: synchronous, deadline, SALF (layer-suffix work), asynchronous, client rule
STRATEGIES: dict[str, dict[str, Any]] = {
    "fedavg": {"name": "fedavg"},
    "drop-stragglers": {"name": "drop-stragglers", "t_max": 0.6},
    "salf": {"name": "salf", "t_max": 0.6},
    "fedbuff": {"name": "fedbuff", "buffer_size": 3, "concurrency": 5},
    # a client rule: each task's down tensors stacked in blocks shared by two runs
    "scaffold": {"name": "scaffold", "client_fraction": 0.5},
}


def _cfg(strategy: dict[str, Any], seed: int) -> Any:
    raw = tiny_raw(strategy=strategy, seed=seed, budget={"aggregations": 5})
    if strategy["name"] == "salf":
        raw["salf"] = {"scenario": "deadline"}
    return validate(raw)


def _metrics(run_dir: Path) -> tuple[list[str], np.ndarray]:
    """metrics.csv without its wall-clock column, as float64."""
    with (run_dir / "metrics.csv").open(newline="") as fh:
        rows = list(csv.reader(fh))
    keep = [i for i, h in enumerate(rows[0]) if h != "wall_time"]
    header = [rows[0][i] for i in keep]
    return header, np.array([[float(r[i] or "nan") for i in keep] for r in rows[1:]])


def _summary(run_dir: Path) -> dict[str, Any]:
    s = json.loads((run_dir / "summary.json").read_text())
    s.pop("wall_s")
    return s


def _assert_same_run(alone: Path, together: Path) -> None:
    h1, m1 = _metrics(alone)
    h2, m2 = _metrics(together)
    assert h1 == h2 and m1.shape == m2.shape
    # float32 training: equal to float32 tolerance (bit-identical where the kernels are)
    np.testing.assert_allclose(m2, m1, rtol=1e-4, atol=1e-6, equal_nan=True)
    s1, s2 = _summary(alone), _summary(together)
    assert s1.keys() == s2.keys()
    for k, v in s1.items():
        if isinstance(v, float):
            assert s2[k] == pytest.approx(v, rel=1e-4, abs=1e-6, nan_ok=True), k
        else:
            assert s2[k] == v, k


def test_runs_advanced_together_match_each_run_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fedclock.train.evaluate as evaluate

    stacked: list[int] = []  # versions per joint evaluation call
    joint = evaluate.evaluate_joint

    def spy(requests: Any) -> Any:
        stacked.append(len(requests))
        return joint(requests)

    monkeypatch.setattr(evaluate, "evaluate_joint", spy)
    capped: list[bool] = []  # the group caps glibc's malloc arenas before its threads start
    cap = lockstep.limit_malloc_arenas
    monkeypatch.setattr(lockstep, "limit_malloc_arenas", lambda: capped.append(cap()))
    cells = [(_cfg(s, seed), tmp_path / "together" / f"{n}-{seed}")
             for n, s in STRATEGIES.items() for seed in (3, 4)]  # fmt: skip
    results = run_cells_together(cells)
    assert max(stacked) > 1  # the runs' versions were evaluated together
    assert capped == [platform.libc_ver()[0] == "glibc"]  # and results are as alone (below)
    for (cfg, run_dir), result in zip(cells, results, strict=True):
        assert not isinstance(result, BaseException), result
        assert result.summary["status"] == "completed"
        alone = tmp_path / "alone" / run_dir.name
        run_experiment(cfg, run_dir=alone)
        try:
            _assert_same_run(alone, run_dir)
        except AssertionError as e:
            raise AssertionError(f"{run_dir.name}: {e}") from None


def _executor(seed: int, arch: str, data: tuple[torch.Tensor, torch.Tensor]) -> VectorizedExecutor:
    x, y = data
    model = build_model(arch, input_shape=tuple(x.shape[1:]), num_classes=10, seed=seed)
    rng = np.random.default_rng(seed)
    parts = np.array_split(rng.permutation(len(x)), 4)
    return VectorizedExecutor(
        model,
        ClientData.from_partition(x, y, parts),
        seed=seed,
        local=LocalTraining(lr=0.1, momentum=0.5),
    )


def _tasks(ex: VectorizedExecutor, base: ModelVersion, steps: list[int]) -> list[Task]:
    from fedclock.devices.cost import TaskCost, TaskTiming

    return [
        Task(i, i, 0, base, TaskPlan(local_steps=k, batch_size=8, samples=8 * k),
             TaskCost(1.0, 1, 1), TaskTiming(0.0, 1.0, 0.0), 0.0)
        for i, k in enumerate(steps)
    ]  # fmt: skip


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_joint_call_gives_each_run_its_own_contributions(arch: str) -> None:
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(200, 1, 12, 12, generator=g), torch.randint(0, 10, (200,), generator=g))
    a, b = _executor(1, arch, data), _executor(2, arch, data)
    assert a.joint_signature() == b.joint_signature()  # they share blocks
    base_a, base_b = snapshot(a.model, 0), snapshot(b.model, 0)
    calls = [(a, _tasks(a, base_a, [3, 3, 2, 1])), (b, _tasks(b, base_b, [3, 2, 2]))]
    joint = run_joint(calls)
    for (ex, tasks), got in zip(calls, joint, strict=True):
        want = ex.run(tasks)
        assert [c.task.task_id for c in got] == [c.task.task_id for c in want]
        for c1, c2 in zip(want, got, strict=True):
            assert c1.num_samples == c2.num_samples
            assert c1.train_loss == pytest.approx(c2.train_loss, rel=1e-5)
            for n in c1.delta:  # float32: tolerance of the dtype
                torch.testing.assert_close(c2.delta[n], c1.delta[n], rtol=1e-4, atol=1e-6)


class _Counting:
    """An executor of another kind: run_joint runs its batch on its own."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def run(self, tasks: list[Any]) -> list[Any]:
        self.calls.append(len(tasks))
        return list(tasks)


def test_lockstep_trains_when_every_unfinished_run_waits_and_interrupt_stops_them() -> None:
    group = Lockstep(3)
    ex = [_Counting() for _ in range(3)]
    got: dict[int, Any] = {}

    def submit(k: int) -> None:
        try:
            got[k] = group.execute(k, ex[k])([k] * (k + 1))
        except KeyboardInterrupt:
            got[k] = "interrupted"

    t0, t1 = threading.Thread(target=submit, args=(0,)), threading.Thread(target=submit, args=(1,))
    t0.start(), t1.start()
    t0.join(0.3)
    assert t0.is_alive() and not got  # run 2 has neither submitted nor finished
    group.leave(2)  # run 2 finished: the two waiting batches are trained
    t0.join(), t1.join()
    assert got == {0: [0], 1: [1, 1]} and ex[0].calls == [1] and ex[1].calls == [2]
    t0 = threading.Thread(target=submit, args=(0,))
    t0.start()
    t0.join(0.3)
    assert t0.is_alive()  # waits for run 1
    group.interrupt()
    t0.join()
    assert got[0] == "interrupted"


def test_a_failing_run_leaves_the_others_and_the_runner_retries_it_once(tmp_path: Path) -> None:
    good = _cfg(STRATEGIES["fedavg"], 3)
    # MNIST files that are not there: the run fails while it builds itself
    bad = validate(tiny_raw(data={"name": "mnist", "data_dir": str(tmp_path / "no-mnist")}))
    events: list[tuple[str, str]] = []
    runner = CellRunner(batch_runs=4, on_event=lambda kind, label, d: events.append((kind, label)))
    cells = [Cell("good", good, tmp_path / "good"), Cell("bad", bad, tmp_path / "bad")]
    out = runner.run(cells)
    assert out[tmp_path / "good"].summary["status"] == "completed"  # type: ignore[union-attr]
    failure = out[tmp_path / "bad"]
    assert isinstance(failure, CellFailure) and failure.error.startswith("bad: ")
    assert "no-mnist" in failure.error
    assert ("retry", "bad") in events and ("failed", "bad") in events


def test_the_runner_reports_the_lockstep_groups_sizes(tmp_path: Path) -> None:
    cells = [Cell(f"c{s}", _cfg(STRATEGIES["fedavg"], s), tmp_path / f"c{s}") for s in range(5)]
    sizes: list[list[int]] = []
    runner = CellRunner(
        jobs=1, batch_runs=3,
        on_event=lambda kind, label, d: sizes.append(d) if kind == "groups" else None,
    )  # fmt: skip
    out = runner.run(cells)
    assert len(out) == 5
    assert sizes == [[3, 2]]  # 5 runs in groups of at most 3, as even as can be


def test_auto_batch_runs_and_groups() -> None:
    mlp = validate(tiny_raw())
    assert auto_batch_runs(mlp) == AUTO_MAX_RUNS
    cnn = validate(tiny_raw(model={"arch": "cnn", "channels": [4, 8], "fc_hidden": 16}))
    assert auto_batch_runs(cnn) == 1  # convolutions: float tolerance only, so on request
    serial = validate(tiny_raw(executor={"kind": "serial"}))
    assert auto_batch_runs(serial) == 1
    groups = batch_groups(["a1", "b1", "a2", "b2", "a3"], 2, key=lambda s: s[0])
    assert groups == [["a1", "a2"], ["a3", "b1"], ["b2"]]  # same data together
    sizes = [len(g) for g in batch_groups(list(range(51)), 8, key=lambda c: 0, workers=2)]
    assert sizes == [7, 7, 7, 6, 6, 6, 6, 6]  # 2 workers busy to the end (not 8 × 6 + 3)
    assert [len(g) for g in batch_groups(list(range(17)), 8, key=lambda c: 0)] == [6, 6, 5]
    assert [len(g) for g in batch_groups(list(range(4)), 8, key=lambda c: 0, workers=2)] == [4]
    assert batch_groups([], 8, key=lambda c: 0) == []


def test_batched_groups_run_one_per_core_by_default() -> None:
    assert batch_workers(51, 8, None, "local", 2) == 2  # 7 groups, 2 at a time
    assert batch_workers(4, 8, None, "local", 2) == 2  # 2 groups of 2: both cores busy
    assert batch_workers(1, 8, None, "local", 2) == 1  # one cell: in this process
    assert batch_workers(17, 8, None, "local", 16) == 16  # no more workers than cells
    assert batch_workers(51, 8, 1, "local", 2) == 1  # --jobs 1: one group after another
    assert batch_workers(51, 8, 3, "local", 2) == 3
    assert batch_workers(51, 8, None, "ray", 4) == 4


def test_cli_compare_batched_and_alone_write_the_same_table(tmp_path: Path) -> None:
    raw = tiny_raw(strategy={"name": "fedavg", "t_max": 0.6}, budget={"aggregations": 4})
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    runner = CliRunner()
    args = ["compare", str(path), "--strategies", "fedavg,drop-stragglers", "--seeds", "1,2"]
    res = runner.invoke(app, [*args, "--batch-runs", "1", "--out", str(tmp_path / "a"), "-q"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "b")])  # MLP: batched by default
    assert res.exit_code == 0, res.output
    # 4 cells in a group per core (2 groups of 2 on 2 cores): the bar gives their size
    size = -(-4 // min(4, os.cpu_count() or 1))
    assert f"cells ({size} in lockstep, a group per core)" in res.output
    assert "done 4" in res.output
    for run in ("fedavg/seed-1", "fedavg/seed-2", "drop-stragglers/seed-1"):
        _assert_same_run(tmp_path / "a" / "runs" / run, tmp_path / "b" / "runs" / run)
    bad = runner.invoke(app, [*args, "--batch-runs", "0", "--out", str(tmp_path / "c")])
    assert bad.exit_code != 0 and "--batch-runs must be from 1 to 4096" in bad.output


def test_interrupt_asks_a_checkpointed_run_to_stop_and_keeps_training_its_batch() -> None:
    group = Lockstep(2)
    stops: list[int] = []
    group.on_interrupt(0, lambda: stops.append(0))  # run 0 has a checkpointer
    ex, got = _Counting(), {}
    t = threading.Thread(target=lambda: got.setdefault(0, group.execute(0, ex)([7])))
    t.start()
    t.join(0.3)
    group.interrupt()
    assert stops == [0]
    t.join(0.3)
    assert t.is_alive()  # its batch still waits for run 1, then trains: it stops at its
    group.leave(1)  # next event after writing its checkpoint (Checkpointer.interrupt)
    t.join()
    assert got == {0: [7]}
    with pytest.raises(KeyboardInterrupt):  # a run without a checkpointer stops at once
        group.execute(1, ex)([1])
