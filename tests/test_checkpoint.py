"""Checkpoints and exact resume (fedclock.sim.checkpoint): the codec, safe loading, and for
every strategy a run killed mid-way and resumed equals the uninterrupted run."""

from __future__ import annotations

import csv
import io
import json
from hashlib import sha256
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedclock.config import load_config
from fedclock.devices.cost import TaskCost, TaskTiming
from fedclock.errors import CheckpointError
from fedclock.experiment import run_experiment
from fedclock.models.shapes import FULL, Fragment, Suffix
from fedclock.sim.checkpoint import (
    _VALUE_TYPES,
    CHECKPOINT_FILE,
    FORMAT,
    MAGIC,
    capture,
    components,
    is_component,
    read,
    restore,
    write_checkpoint,
)
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan
from tests.conftest import load_script, tiny_raw

golden = load_script("golden")


class _Crash(BaseException):
    """Stands in for SIGKILL: nothing after it runs, nothing catches it."""


class _Holder:
    checkpoint_fields = ("a", "b", "shared")

    def __init__(self) -> None:
        self.a: Any = None
        self.b: Any = None
        self.shared: list[int] = []


def _task(tid: int, base: ModelVersion, shape: Any = FULL) -> Task:
    plan = TaskPlan(local_steps=2, batch_size=4, samples=8, shape=shape)
    return Task(tid, 1, 0, base, plan, TaskCost(1.0, 2, 3), TaskTiming(0.5, 1.0, 0.25), 2.0)


def _roundtrip(obj: object, tmp_path: Path) -> dict[str, Any]:
    write_checkpoint(tmp_path / "c.pt", {"format": FORMAT, "state": capture(obj)})
    return read(tmp_path / "c.pt")


def test_codec_keeps_shared_objects_shared_and_values_exact(tmp_path: Path) -> None:
    v = ModelVersion(3, {"w": torch.arange(4.0)}, {})
    t1, t2 = _task(7, v), _task(8, v, Fragment(1, (0.4, 0.6), "neurons"))
    c = Contribution(t1, {"w": torch.ones(4)}, {}, 10, 0.5, weight=0.25)
    src = _Holder()
    rng = np.random.default_rng(5)
    rng.random(3)  # a stream part-way through
    src.a = {
        "tasks": [t1, t2], "c": c, (1, 2): {3, 1}, "arr": np.arange(3, dtype=np.int64),
        "u64": np.array([2**63 + 5], dtype=np.uint64), "scalar": np.float64(0.1), "rng": rng,
        "big": 2**70, "nan": float("nan"), "suffix": Suffix(2),
    }  # fmt: skip
    src.b = v
    payload = _roundtrip(src, tmp_path)
    dst = _Holder()
    dst.shared = shared = [9]
    restore(dst, payload["state"])
    a = dst.a
    assert a["tasks"][0] is a["c"].task and a["tasks"][0].base is a["tasks"][1].base is dst.b
    assert a["tasks"][0].plan.shape is FULL  # the singleton, not an equal copy
    assert a["tasks"][1].plan.shape == Fragment(1, (0.4, 0.6), "neurons")
    assert a["tasks"][1].timing == TaskTiming(0.5, 1.0, 0.25) and a["c"].weight == 0.25
    assert torch.equal(dst.b.params["w"], torch.arange(4.0))
    assert a[(1, 2)] == {1, 3} and a["big"] == 2**70 and np.isnan(a["nan"])
    assert a["arr"].dtype == np.int64 and a["u64"][0] == 2**63 + 5
    assert type(a["scalar"]) is np.float64 and a["scalar"] == 0.1
    assert a["rng"].random(5).tolist() == rng.random(5).tolist()  # continues the stream
    assert dst.shared is shared and shared == []  # lists are filled in place


def test_codec_refuses_what_it_cannot_store() -> None:
    src = _Holder()
    src.a = object()
    with pytest.raises(CheckpointError, match="cannot be checkpointed"):
        capture(src)


def test_components_are_walked_once_each() -> None:
    outer, inner = _Holder(), _Holder()
    outer.a, outer.b = inner, inner  # shared: one path
    assert [p for p, _ in components(outer)] == ["", ".a"]


def test_a_checkpoint_with_pickled_code_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> Any:
            return (Path.touch, (marker,))

    path = tmp_path / CHECKPOINT_FILE
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "x": Evil()}, buf)
    body = buf.getvalue()  # with a valid digest: the refusal comes from weights_only
    path.write_bytes(
        b"%s %d sha256:%s\n" % (MAGIC, FORMAT, sha256(body).hexdigest().encode()) + body
    )
    with pytest.raises(CheckpointError) as err:
        read(path)
    assert not marker.exists()
    assert str(err.value).count(".") >= 1 and "\n" not in str(err.value)
    path.write_bytes(buf.getvalue()[:100])  # truncated
    with pytest.raises(CheckpointError, match="damaged"):
        read(path)


@pytest.mark.parametrize("older", [1, 2])
def test_a_checkpoint_of_an_older_format_is_refused_in_one_sentence(
    tmp_path: Path, older: int
) -> None:
    """A whole, undamaged checkpoint written by an older fedclock (formats 1 and 2: before
    the client records' generic encoding) is refused from its header, before it is loaded,
    in one sentence naming the file, the format this version reads and how to go on."""
    path = tmp_path / CHECKPOINT_FILE
    buf = io.BytesIO()
    torch.save({"format": older, "state": {"round": torch.tensor(3)}}, buf)
    body = buf.getvalue()
    path.write_bytes(
        b"%s %d sha256:%s\n" % (MAGIC, older, sha256(body).hexdigest().encode()) + body
    )
    with pytest.raises(CheckpointError) as err:
        read(path)
    text = str(err.value)
    assert str(path) in text and f"another format than {FORMAT}" in text and "\n" not in text
    assert "without --resume to start over" in text
    assert FORMAT == 3 and older < FORMAT


# ------------------------------------------------------------------ every strategy, killed and resumed


# beyond the golden cases: the parts with state of their own that no golden case uses
EXTRA_CASES: dict[str, dict[str, Any]] = {
    "fedadam": {"strategy.server_optimizer": "adam", "strategy.server_lr": 0.01},
    "fedavgm": {"strategy.server_momentum": 0.9},
    "best-validation": {"eval.val_holdout": 300, "eval.val_every_aggregations": 1},
    "client-losses": {"strategy.name": "fedbuff", "strategy.buffer_size": 2, "eval.client_losses": True, "budget.aggregations": 10},
    "guarded-faults": {
        "strategy.name": "fedasync", "population.faults.fraction": 0.3,
        "guard.reject_nonfinite": True, "budget.aggregations": 10,
    },
    "serial-executor": {"strategy.name": "fedbuff", "strategy.buffer_size": 2, "executor.kind": "serial", "budget.aggregations": 10},
    # a client rule's per-client state (SCAFFOLD's c_i and c, FedDyn's ∇L_i and h)
    "scaffold": {"strategy.name": "scaffold", "strategy.client_fraction": 0.5},
    "feddyn": {"strategy.name": "feddyn", "strategy.client_fraction": 0.5, "strategy.feddyn_alpha": 0.1},
    # devices going offline (a trace's availability): lost tasks and wake-up timers
    "availability-fedavg": {"population.scenario": "trace", "population.trace": str(
        Path(__file__).parent / "data" / "trace-availability"), "budget.aggregations": 6},
    "availability-fedbuff": {"population.scenario": "trace", "population.trace": str(
        Path(__file__).parent / "data" / "trace-availability"), "strategy.name": "fedbuff",
        "strategy.buffer_size": 2, "budget.aggregations": 8},
    # speed-aware selection: Oort's utilities, pacer and exploration; TiFL's tiers (issue 45)
    "oort": {"strategy.client_fraction": 0.5, "selection.name": "oort",
             "selection.pacer_step": 1, "budget.aggregations": 6},
    "tifl": {"strategy.client_fraction": 0.5, "selection.name": "tifl", "selection.tiers": 2,
             "selection.interval": 1, "selection.credits": 4, "budget.aggregations": 6},
    "refl": {"strategy.name": "drop-stragglers", "strategy.t_max": 2.0,
             "strategy.client_fraction": 0.5, "selection.name": "refl", "budget.aggregations": 8},
    "oort-fedbuff": {"strategy.name": "fedbuff", "strategy.buffer_size": 2,
                     "strategy.concurrency": 3, "selection.name": "oort",
                     "budget.aggregations": 8},
    "availability-fedbuff-concurrency": {"population.scenario": "trace", "population.trace": str(
        Path(__file__).parent / "data" / "trace-availability"), "strategy.name": "fedbuff",
        "strategy.buffer_size": 2, "strategy.concurrency": 3, "budget.aggregations": 8},
    "oort-availability": {"population.scenario": "trace", "population.trace": str(
        Path(__file__).parent / "data" / "trace-availability"), "strategy.client_fraction": 0.5,
        "selection.name": "oort", "budget.aggregations": 6},
    # SALF over half its users a round, chosen by Oort: eq. 9's p_l over each round's users
    "salf-oort": {"strategy.name": "salf", "salf.scenario": "deadline", "strategy.t_max": 0.5,
                  "strategy.client_fraction": 0.5, "selection.name": "oort",
                  "budget.aggregations": 6},
    "fedfix-estimated": {
        "strategy.name": "fedfix", "strategy.delta_t": 0.3, "strategy.tau_source": "estimated",
        "budget.aggregations": 10,
    },
}  # fmt: skip
CASES = {**golden.CASES, **EXTRA_CASES}


def _case_config(case: str, every: int = 1) -> Any:
    raw = tiny_raw(executor={"threads": 1})
    overrides = [f"{k}={v}" for k, v in CASES[case].items()]
    return load_config(raw=raw, overrides=[*overrides, f"checkpoint.every_aggregations={every}"])


# metrics.csv without wall_time, summary.json without wall_s, clients.csv (the crash script's)
_outputs = load_script("crash_resume").outputs


def _crash_at(event: int) -> Any:
    seen = [0]

    def progress(sim: Any) -> None:
        seen[0] += 1
        if seen[0] == event:
            raise _Crash

    return progress


def _count_events(cfg: Any, run_dir: Path) -> int:
    seen = [0]

    def progress(sim: Any) -> None:
        seen[0] += 1

    run_experiment(cfg, run_dir=run_dir, progress=progress)
    return seen[0]


@pytest.mark.parametrize("case", list(CASES))
def test_a_killed_run_resumes_to_the_uninterrupted_result(case: str, tmp_path: Path) -> None:
    cfg = _case_config(case)
    events = _count_events(cfg, tmp_path / "whole")
    want = _outputs(tmp_path / "whole")
    assert not (tmp_path / "whole" / CHECKPOINT_FILE).exists()  # a finished run keeps none
    run_dir = tmp_path / "killed"
    # killed twice, resumed after each (a resumed process counts its events from 1)
    for at in (events // 2, events // 4):
        with pytest.raises(_Crash):
            run_experiment(cfg, run_dir=run_dir, progress=_crash_at(at), resume=True)
        assert (run_dir / CHECKPOINT_FILE).exists(), f"no checkpoint by event {at} of {events}"
    run_experiment(cfg, run_dir=run_dir, resume=True)
    assert _outputs(run_dir) == want
    assert not (run_dir / CHECKPOINT_FILE).exists()
    # (the first call found no checkpoint: it started the run)
    assert len(json.loads((run_dir / "meta.json").read_text())["resumed"]) == 2


# which fedclock classes a run holds that are neither state nor value nor built from the config
_STATIC = {
    "Population", "Layout", "Units", "Program", "Scale", "ClientData", "Context", "Evaluator",
    "ClientLossEvaluator", "UpdateGuard", "FaultInjector", "Needs", "LocalTraining", "Staleness",
    "BuildInfo", "Counters", "Work", "Budget", "Classifier", "CrossEntropy",
    "EarlyExitNet", "ExitInfo", "ExitLoss", "MultiExitLoss", "Tree", "RunRecorder", "Progress",
    "Checkpointer", "Split",
    "Neurons",  # (a work shape: Layout keeps recent transient ones' keys)
    "Availability",  # (a trace's online intervals: data, read from the trace)
    "OnlineSet",  # (who is online now: derived from the time, rebuilt after a resume)
    "Linear", "Proximal", "WeightDecay",  # (gradient terms: values of the local objective)
}  # fmt: skip


def _fedclock_objects(root: object) -> set[type]:
    """Types of the fedclock objects reachable from ``root`` through attributes and containers
    (not into components' own attributes' values that are plain data)."""
    found: set[type] = set()
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif type(obj).__module__.startswith("fedclock.") and hasattr(obj, "__dict__"):
            found.add(type(obj))
            stack.extend(vars(obj).values())
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_every_part_of_a_run_declares_its_state(case: str, tmp_path: Path) -> None:
    """A class holding run state must say so (``checkpoint_fields``), or a resume would
    silently start it afresh: every fedclock object a running simulator reaches is a
    component, a stored value or a known static part."""
    got: list[Any] = []

    def progress(sim: Any) -> None:
        if not got:
            got.append(sim)
            raise _Crash

    with pytest.raises(_Crash):
        run_experiment(_case_config(case), run_dir=tmp_path, progress=progress)
    types = _fedclock_objects(got[0])
    undeclared = {
        t.__name__
        for t in types
        if not hasattr(t, "checkpoint_fields")
        and not hasattr(t, "checkpoint_state")
        and t.__name__ not in _STATIC
        and _VALUE_TYPES.get(t.__name__) is not t  # a stored value (e.g. PruneFL's Mask)
        and t not in {ModelVersion, Task, Contribution}
    }
    assert not undeclared
    assert all(is_component(c) for _, c in components(got[0]))


def test_resume_refuses_a_checkpoint_of_another_config_or_source(tmp_path: Path) -> None:
    cfg = _case_config("fedbuff")
    with pytest.raises(_Crash):
        run_experiment(cfg, run_dir=tmp_path, progress=_crash_at(12))
    other = load_config(raw=tiny_raw(executor={"threads": 1}), overrides=["seed=9"])
    with pytest.raises(CheckpointError, match="another config"):
        run_experiment(other, run_dir=tmp_path, resume=True)
    payload = read(tmp_path / CHECKPOINT_FILE)
    payload["source_digest"] = "sha256:0"
    write_checkpoint(tmp_path / CHECKPOINT_FILE, payload)
    with pytest.raises(CheckpointError, match="other fedclock source"):
        run_experiment(cfg, run_dir=tmp_path, resume=True)


def test_a_flipped_bit_anywhere_in_a_checkpoint_is_refused(tmp_path: Path) -> None:
    """The digest written with a checkpoint covers every byte: one bit flipped at any of a
    spread of positions (header, digest, zip headers, tensor data, the end) is refused in one
    sentence naming the file and offering to start over; the untouched file loads."""
    cfg = _case_config("fedbuff")
    with pytest.raises(_Crash):
        run_experiment(cfg, run_dir=tmp_path, progress=_crash_at(12))
    path = tmp_path / CHECKPOINT_FILE
    good = path.read_bytes()
    read(path)
    rng = np.random.default_rng(0)
    spots = {0, 5, 20, 30, 60, len(good) // 2, len(good) - 1}
    spots |= set(rng.integers(0, len(good), 40).tolist())
    for at in sorted(spots):
        bad = bytearray(good)
        bad[at] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(bad))
        with pytest.raises(CheckpointError) as err:
            read(path)
        msg = str(err.value)
        assert str(path) in msg and "start over" in msg and "\n" not in msg, (at, msg)
    path.write_bytes(good)
    # through the command line: one sentence, exit 2, nothing changed
    from typer.testing import CliRunner

    from fedclock.cli import app

    bad = bytearray(good)
    bad[len(good) * 3 // 4] ^= 0x10
    path.write_bytes(bytes(bad))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    res = CliRunner().invoke(app, ["run", "--resume", str(tmp_path)])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "damaged" in lines[0], res.output
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_resume_needs_the_rows_its_checkpoint_covers(tmp_path: Path) -> None:
    cfg = _case_config("fedavg")
    with pytest.raises(_Crash):
        run_experiment(cfg, run_dir=tmp_path, progress=_crash_at(20))
    (tmp_path / "metrics.csv").write_text("virtual_time\n")
    with pytest.raises(CheckpointError, match="cannot be resumed"):
        run_experiment(cfg, run_dir=tmp_path, resume=True)


# ------------------------------------------------------------------ the command line


def _table(out: Path) -> list[dict[str, str]]:
    with (out / "table.csv").open(newline="") as fh:
        return [{k: v for k, v in r.items() if "wall" not in k} for r in csv.DictReader(fh)]


def test_compare_goes_on_from_the_checkpoint_of_an_interrupted_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    import fedclock.runs.cache as cache
    from fedclock.cli import app

    raw = tiny_raw(executor={"threads": 1}, budget={"aggregations": 8})
    raw["checkpoint"] = {"every_aggregations": 1}
    raw["strategy"] = {"name": "fedavg", "buffer_size": 2}
    (tmp_path / "exp.yaml").write_text(json.dumps(raw))
    # one run at a time: the crash below stands for the process being killed (a run of a
    # lockstep group that raises is a failed cell instead, retried on its own)
    args = ["compare", str(tmp_path / "exp.yaml"), "--strategies", "fedavg,fedbuff",
            "--batch-runs", "1"]  # fmt: skip
    runner = CliRunner()
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "whole"), "-q"])
    assert res.exit_code == 0, res.output

    real = cache.run_experiment

    def killed_in_fedbuff(cfg: Any, **kw: Any) -> Any:
        if cfg.strategy.name == "fedbuff":
            kw["progress"] = _crash_at(15)
        return real(cfg, **kw)

    monkeypatch.setattr(cache, "run_experiment", killed_in_fedbuff)
    with pytest.raises(_Crash):
        runner.invoke(app, [*args, "--out", str(tmp_path / "killed"), "-q"])
    cell = tmp_path / "killed" / "runs" / "fedbuff" / "seed-3"
    assert (cell / CHECKPOINT_FILE).exists()
    monkeypatch.setattr(cache, "run_experiment", real)
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "killed")])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "going on with fedbuff seed 3 from its checkpoint (interrupted)" in text
    assert "reused finished run fedavg seed 3" in res.output
    assert "resumed" in json.loads((cell / "meta.json").read_text())
    assert _table(tmp_path / "killed") == _table(tmp_path / "whole")


def test_run_resume_from_the_command_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fedclock.cli import app

    runner = CliRunner()
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "--resume", str(out), "--preset", "demo"])
    assert res.exit_code == 2 and "give no CONFIG, --preset" in res.stderr
    res = runner.invoke(app, ["run", "--resume", str(out)])
    assert res.exit_code == 2 and "no fedclock run there" in res.stderr
    with pytest.raises(_Crash):
        run_experiment(_case_config("fedasync"), run_dir=out, progress=_crash_at(6))
    res = runner.invoke(app, ["run", "--resume", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    res = runner.invoke(app, ["run", "--resume", str(out)])
    assert res.exit_code == 0 and "holds a finished run (completed): nothing to resume" in " ".join(
        res.output.split()
    )


def test_crash_script_two_trials(tmp_path: Path) -> None:
    """scripts/crash_resume.py as docs/reliability.md runs it with 20 trials: one SIGKILL (and
    maybe a second one during the resume) and one SIGINT trial, both identical."""
    crash = load_script("crash_resume")
    assert crash.main(["--trials", "2", "--strategies", "fedbuff", "--sigint-every", "2"]) == 0


def test_a_full_disk_while_checkpointing_is_one_sentence_and_keeps_the_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from typer.testing import CliRunner

    import fedclock.sim.checkpoint as ck
    from fedclock.cli import app

    def full(obj: Any, fh: Any) -> None:
        fh.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck.torch, "save", full)
    raw = tiny_raw(checkpoint={"every_aggregations": 2})
    (tmp_path / "exp.yaml").write_text(json.dumps(raw))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(tmp_path / "exp.yaml"), "--out", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    want = (
        f"error: Could not write the checkpoint {out / CHECKPOINT_FILE}: no space left on device."
    )
    assert [line for line in res.stderr.splitlines() if line.strip()] == [want]
    assert len((out / "metrics.csv").read_text().splitlines()) == 1 + 3  # t = 0 and 2 steps
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "meta.json", "metrics.csv"]
