"""Deployment on real devices (fedclock.deploy): the wire format and the checks every reply
passes, the device's budget rule, and whole deployments on devices that are threads of this
process (real time, real compute; no framework). Flower's processes: tests/test_deploy_flower.py.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedclock.cli import app
from fedclock.config import load_config
from fedclock.deploy.device import UPLOAD_SHARE, DeviceWorker
from fedclock.deploy.local import LocalDevices
from fedclock.deploy.run import deploy
from fedclock.deploy.wire import (
    Payload,
    RejectedReply,
    check_reply,
    decode_shape,
    decode_task,
    encode_reply,
    encode_shape,
    encode_task,
)
from fedclock.devices.cost import TaskCost, TaskTiming
from fedclock.models.shapes import FULL, Fragment, OrderedDropout, Suffix, Width
from fedclock.sim.types import Contribution, ModelVersion, Task, TaskPlan


def _task(shape: Any = FULL) -> Task:
    base = ModelVersion(
        3, {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.zeros(2)}
    )
    plan = TaskPlan(local_steps=2, batch_size=4, samples=8, shape=shape, lr_scale=0.5)
    task = Task(7, 1, 2, base, plan, TaskCost(10.0, 32, 32), TaskTiming(0, 0, 0), 0.0, repeat=1)
    task.down = {"c": {"w": torch.ones(2, 3)}}
    return task


def _reply(task: Task, **config: Any) -> Payload:
    c = Contribution(
        task=task, delta={n: torch.full_like(t, 0.5) for n, t in task.base.params.items()},
        buffers={}, num_samples=8, train_loss=0.25,
    )  # fmt: skip
    p = encode_reply(task, c, shape=task.plan.shape, compute_s=0.1, busy_s=0.2, speed=1e6)
    p.config.update(config)
    return p


def test_a_task_travels_whole() -> None:
    task = _task(Suffix(2))
    got, budget, cut, speed = decode_task(
        encode_task(task, budget_s=1.5, cut="suffix", seed=4, speed=2e6)
    )
    assert (budget, cut, speed) == (1.5, "suffix", 2e6)
    assert (got.task_id, got.client, got.k, got.repeat) == (7, 1, 2, 1)
    assert got.plan == task.plan and got.base.version == 3
    assert torch.equal(got.base.params["w"], task.base.params["w"])
    assert torch.equal(got.down["c"]["w"], torch.ones(2, 3))
    assert decode_task(encode_task(task, budget_s=None, cut="none", seed=4))[1] is None


@pytest.mark.parametrize(
    "shape",
    [FULL, Suffix(3), Width(0.25), Fragment(2, (0.5, 0.25, 1.0)),
     OrderedDropout(0.5, (0.25, 0.5, 1.0))],
)  # fmt: skip
def test_every_deployable_shape_travels(shape: Any) -> None:
    assert decode_shape(encode_shape(shape)) == shape


def test_a_good_reply_is_accepted() -> None:
    task = _task()
    r = check_reply(_reply(task), task)
    assert r.num_samples == 8 and r.train_loss == 0.25 and r.shape is FULL and r.speed == 1e6
    assert torch.equal(r.delta["w"], torch.full((2, 3), 0.5))


def _tampered(kind: str, task: Task) -> Payload:
    p = _reply(task)
    if kind == "other task":
        p.config["task_id"] = 8
    elif kind == "old version":
        p.config["version"] = 2
    elif kind == "missing tensor":
        del p.arrays["delta/b"]
    elif kind == "extra tensor":
        p.arrays["delta/evil"] = np.zeros(2, dtype=np.float32)
    elif kind == "wrong shape":
        p.arrays["delta/w"] = np.zeros((3, 2), dtype=np.float32)
    elif kind == "wrong dtype":
        p.arrays["delta/w"] = np.zeros((2, 3), dtype=np.float64)
    elif kind == "nan":
        p.arrays["delta/w"][0, 0] = np.nan
    elif kind == "inf loss":
        p.config["train_loss"] = float("inf")
    elif kind == "oversized":
        p.arrays["up/sq_grads/w"] = np.zeros((2, 3), dtype=np.float32)
        p.config["padding"] = "x" * 100_000
    elif kind == "statistic of nothing":
        p.arrays["up/sq_grads/evil"] = np.zeros(3, dtype=np.float32)
    elif kind == "unknown shape":
        p.config["shape"] = 'Anything:{"x":1}'
    elif kind == "no loss":
        del p.config["train_loss"]
    elif kind == "negative count":
        p.config["num_samples"] = -1
    return p


@pytest.mark.parametrize(
    "kind",
    ["other task", "old version", "missing tensor", "extra tensor", "wrong shape", "wrong dtype",
     "nan", "inf loss", "oversized", "statistic of nothing", "unknown shape", "no loss",
     "negative count"],
)  # fmt: skip
def test_a_malformed_reply_is_rejected_with_its_reason(kind: str) -> None:
    task = _task()
    with pytest.raises(RejectedReply):
        check_reply(_tampered(kind, task), task)


def test_a_device_may_cut_a_layer_suffix_only_deeper() -> None:
    task = _task(Suffix(2))
    deeper = _reply(task, shape='Suffix:{"depth":3}')
    assert check_reply(deeper, task, max_depth=3).shape == Suffix(3)
    for shape in (
        "Full",
        'Suffix:{"depth":4}',
        'Suffix:{"evil":1}',
        "Suffix:[1]",
    ):  # shallower than sent; past the last unit
        with pytest.raises(RejectedReply):
            check_reply(_reply(task, shape=shape), task, max_depth=3)
    with pytest.raises(RejectedReply):  # a full task's device may not send a width slice
        check_reply(_reply(_task(), shape='Width:{"rate":0.5}'), _task())


def _cfg(*sets: str) -> Any:
    return load_config(
        None, ["partition.num_clients=4", "eval.every_aggregations=1", *sets]
    )  # digits, an MLP


def test_a_device_picks_the_deepest_suffix_its_budget_allows() -> None:
    """Hand-computed: with a measured speed S and budget B, the depth is the smallest d whose
    FLOPs / S ≤ B·(1 − UPLOAD_SHARE); the last unit when none fits."""
    cfg = _cfg("strategy.name=salf", "salf.scenario=deadline", "strategy.t_max=1",
               "model.hidden=[64,64]")  # fmt: skip
    w = DeviceWorker(cfg, 0)
    task = _task()
    task.plan = TaskPlan(local_steps=1, batch_size=32, samples=32)
    assert w.layout is not None
    units = w.layout.units.count
    flops = [w.flops(FULL if d == 1 else Suffix(d), 32) for d in range(1, units + 1)]
    assert flops == sorted(flops, reverse=True) and units == 3
    w.speed = 1.0
    for d in range(1, units + 1):  # a budget that just fits depth d
        assert w._depth(task, flops[d - 1] / (1 - UPLOAD_SHARE) * (1 + 1e-9)) == d
    assert w._depth(task, flops[-1] / 2) == units  # nothing fits: the last unit


def _timeline(run_dir: Path) -> list[dict[str, str]]:
    lines = [
        x for x in (run_dir / "timeline.csv").read_text().splitlines() if not x.startswith("#")
    ]
    return [r for r in csv.DictReader(lines) if r["event"] == "task"]


def test_fedavg_deploys_on_local_devices(tmp_path: Path) -> None:
    cfg = _cfg("strategy.name=fedavg", "budget.virtual_time=3")
    res = deploy(cfg, tmp_path, LocalDevices(cfg, slow={3: 3.0}), engine_name="threads")
    s = res.summary
    assert res.error is None and s["status"] == "completed" and s["aggregations"] >= 2
    assert s["updates_rejected"] == 0 and s["max_staleness"] == 0
    assert s["final_test_accuracy"] > 0.5  # digits after a few rounds
    dep = s["deployment"]
    assert dep["engine"] == "threads" and set(dep["device_flops_per_s"]) == {"0", "1", "2", "3"}
    rows = _timeline(tmp_path)
    used = [r for r in rows if r["outcome"] == "used"]
    assert used and all(float(r["compute_s"]) > 0 for r in used)  # measured, not priced
    # every round waits for the slow device (a barrier): the rounds' times follow it
    assert json.loads((tmp_path / "summary.json").read_text())["deployment"]["engine"] == "threads"


def test_fedbuff_records_the_slow_devices_staleness(tmp_path: Path) -> None:
    cfg = _cfg("strategy.name=fedbuff", "strategy.buffer_size=2", "budget.virtual_time=3")
    res = deploy(cfg, tmp_path, LocalDevices(cfg, slow={3: 20.0}), engine_name="threads")
    assert res.error is None and res.summary["aggregations"] >= 3
    stale = [int(r["staleness"]) for r in _timeline(tmp_path)
             if r["client"] == "3" and r["outcome"] in ("used", "stale")]  # fmt: skip
    assert stale and max(stale) > 0


def _full_task_flops(cfg: Any, client: int) -> float:
    """The FLOPs of ``client``'s full task under ``cfg`` (what its device's speed divides)."""
    from fedclock.experiment import _build

    w = DeviceWorker(cfg, client)
    plan = _build(cfg, None).strategy.planner.nominal(client)[0]  # (its full task)
    return w.flops(FULL, plan.samples)


def test_salf_devices_cut_their_work_to_a_layer_suffix(tmp_path: Path) -> None:
    """A device emulating a speed at which its full task takes 1 s, under a 0.6 s deadline:
    on its first task (its speed unknown) it stops at the step boundary the budget allows;
    then it picks the layer suffix that fits at the speed it measured — partial, layer-wise
    updates used inside the deadline; the others train in full."""
    cfg = _cfg("strategy.name=salf", "salf.scenario=deadline", "strategy.t_max=0.6",
               "model.hidden=[64,64]", "budget.aggregations=5")  # fmt: skip
    speed = _full_task_flops(cfg, 3) / 1.0
    res = deploy(cfg, tmp_path, LocalDevices(cfg, speed={3: speed}), engine_name="threads")
    assert res.error is None and res.summary["status"] == "completed"
    rows = _timeline(tmp_path)
    slow = [r for r in rows if r["client"] == "3" and r["outcome"] == "used"]
    assert slow and all(float(r["t_end"]) - float(r["t_start"]) <= 0.6 + 1e-6 for r in slow)
    assert int(slow[0]["local_steps"]) < 12 and slow[0]["work"] == "full-model"
    assert any(r["work"].startswith("layer-suffix") for r in slow[1:])
    fast = [r for r in rows if r["client"] != "3" and r["outcome"] == "used"]
    assert fast and all(r["work"] == "full-model" for r in fast)


def test_a_device_that_sends_garbage_is_rejected_and_the_run_goes_on(tmp_path: Path) -> None:
    def tamper(client: int, p: Payload) -> Payload:
        if client == 2:
            name = next(k for k in p.arrays if k.startswith("delta/"))
            p.arrays[name] = np.full_like(p.arrays[name], np.nan)
        if client == 1:
            p.arrays["delta/evil"] = np.zeros(4, dtype=np.float32)
        return p

    cfg = _cfg("strategy.name=fedavg", "budget.virtual_time=2")
    res = deploy(cfg, tmp_path, LocalDevices(cfg, tamper=tamper), engine_name="threads")
    s = res.summary
    assert res.error is None and s["status"] == "completed" and s["aggregations"] >= 2
    assert s["updates_rejected"] >= 2 * s["aggregations"] - 2  # clients 1 and 2, every round
    rejected = {r["client"] for r in _timeline(tmp_path) if r["outcome"] == "rejected"}
    assert rejected == {"1", "2"}
    reasons = {x["client"]: x["reason"] for x in s["deployment"]["rejected"]}
    assert "non-finite" in reasons[2] and "unexpected" in reasons[1]


def test_a_failing_device_is_recorded_and_the_round_closes(tmp_path: Path) -> None:
    def tamper(client: int, p: Payload) -> Payload:
        if client == 0:
            raise RuntimeError("battery empty")
        return p

    cfg = _cfg("strategy.name=fedavg", "budget.virtual_time=1.5")
    res = deploy(cfg, tmp_path, LocalDevices(cfg, tamper=tamper), engine_name="threads")
    assert res.error is None and res.summary["aggregations"] >= 2
    assert all("battery empty" in x["reason"] for x in res.summary["deployment"]["rejected"])


def test_a_device_that_never_replies_is_given_up_at_the_round_timeout(tmp_path: Path) -> None:
    """FedAvg's barrier has no deadline: a device that hangs would stall every round. With a
    round timeout its task is given up (rejected with the reason, lost to the trigger) and
    the round closes with the others; without one, no round closes in the same time."""
    import threading

    release = threading.Event()

    def hang(client: int, p: Payload) -> Payload:
        if client == 0:
            release.wait(10.0)  # (a device that never answers, within the run)
        return p

    cfg = _cfg("strategy.name=fedavg", "budget.virtual_time=1.5")
    try:
        res = deploy(cfg, tmp_path / "timeout", LocalDevices(cfg, tamper=hang),
                     engine_name="threads", round_timeout_s=0.25)  # fmt: skip
        stalled = deploy(cfg, tmp_path / "stalled", LocalDevices(cfg, tamper=hang),
                         engine_name="threads")  # fmt: skip
    finally:
        release.set()
    s = res.summary
    assert res.error is None and s["status"] == "completed" and s["aggregations"] >= 2
    dep = s["deployment"]
    assert dep["round_timeout_s"] == 0.25 and dep["rejected"]
    assert {x["client"] for x in dep["rejected"]} == {0}
    assert all("round timeout of 0.25 s" in x["reason"] for x in dep["rejected"])
    rows = _timeline(tmp_path / "timeout")
    given_up = [r for r in rows if r["client"] == "0" and r["outcome"] == "rejected"]
    assert given_up and all(
        float(r["t_end"]) - float(r["t_start"]) == pytest.approx(0.25, abs=0.2) for r in given_up
    )
    assert stalled.summary["aggregations"] == 0 and stalled.summary["deployment"]["rejected"] == []


def test_the_deploy_command_writes_a_run_folder_and_report(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, [
        "deploy", "--engine", "threads", "--local", "3", "--slow", "2=3",
        "--set", "budget.virtual_time=1.5", "--out", str(tmp_path), "--json", "-q",
    ])  # fmt: skip
    assert res.exit_code == 0, res.stderr or res.stdout
    summary = json.loads(res.stdout)
    assert summary["num_clients"] == 3 and summary["deployment"]["engine"] == "threads"
    for name in ("config.yaml", "metrics.csv", "timeline.csv", "clients.csv", "report.html"):
        assert (tmp_path / name).is_file()


@pytest.mark.parametrize("bad", ["5=2", "1=0.5", "x=2", "1"])
def test_a_bad_slow_option_is_one_sentence(tmp_path: Path, bad: str) -> None:
    res = CliRunner().invoke(
        app,
        ["deploy", "--engine", "threads", "--local", "3", "--slow", bad, "--out", str(tmp_path)],
    )
    assert res.exit_code == 2 and "--slow" in res.stderr and "Traceback" not in res.stderr


def test_strategies_whose_trigger_cannot_lose_a_device_are_refused(tmp_path: Path) -> None:
    """PruneFL's rounds cannot lose a device (as on a fleet with availability)."""
    res = CliRunner().invoke(app, [
        "deploy", "--engine", "threads", "--local", "3", "--set", "strategy.name=prunefl",
        "--out", str(tmp_path),
    ])  # fmt: skip
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert "'prunefl' cannot be deployed yet" in res.stderr and "fails" in res.stderr


def test_a_deployment_exports_its_measured_fleet_and_the_simulator_replays_it(
    tmp_path: Path,
) -> None:
    """Closing the loop: `fedclock trace export` of a deployment writes the speeds its devices
    measured (the slowed one slower), and the same config runs in simulation on that trace."""
    runner = CliRunner()
    run = tmp_path / "deployed"
    res = runner.invoke(app, [
        "deploy", "--engine", "threads", "--local", "3", "--slow", "2=6",
        "--set", "budget.virtual_time=1.5", "--out", str(run), "-q",
    ])  # fmt: skip
    assert res.exit_code == 0, res.stderr or res.stdout
    res = runner.invoke(app, ["trace", "export", str(run), "--out", str(tmp_path / "trace")])
    assert res.exit_code == 0, res.stderr or res.stdout
    lines = [x for x in (tmp_path / "trace" / "devices.csv").read_text().splitlines()
             if not x.startswith("#")]  # fmt: skip
    rows = list(csv.DictReader(lines))
    measured = json.loads((run / "summary.json").read_text())["deployment"]["device_flops_per_s"]
    speeds = [float(r["flops_per_s"]) for r in rows]
    for c, v in measured.items():
        assert speeds[int(c)] == pytest.approx(v, rel=1e-6)
    assert speeds[2] < min(speeds[0], speeds[1])  # the slowed device measured itself slower
    res = runner.invoke(app, [
        "run", "--set", "partition.num_clients=3", "--set", "population.scenario=trace",
        "--set", f"population.trace={tmp_path / 'trace'}", "--set", "budget.aggregations=3",
        "--out", str(tmp_path / "simulated"), "--json", "-q",
    ])  # fmt: skip
    assert res.exit_code == 0, res.stderr or res.stdout
    assert json.loads(res.stdout)["aggregations"] == 3


def test_without_flower_the_flower_engine_says_how_to_install_it(tmp_path: Path) -> None:
    import shutil

    if shutil.which("flower-superlink") is not None:
        pytest.skip("Flower is installed here")
    res = CliRunner().invoke(app, ["deploy", "--local", "2", "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "fedclock[flower]" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--superlink", "10.0.0.5:9093"], "is not this machine"),
        (["--superlink", "fleet.example.org:9093", "--insecure"], "is not this machine"),
        (["--superlink", "127.0.0.1:9093"], "say so with --insecure"),
        (["--superlink", "[::1]:9093", "--root-certificates", "ca.crt"], "is not a file"),
        (["--insecure"], "goes with --superlink"),
        (["--engine", "threads", "--insecure"], "go with --engine flower"),
    ],
)
def test_an_insecure_connection_is_refused_unless_asked_for_on_localhost(
    tmp_path: Path, args: list[str], words: str
) -> None:
    """Model updates never cross a network in plain text by default: `--superlink` to another
    host needs its CA certificate; to this machine, TLS or an explicit --insecure. Refused
    in one sentence before anything starts (no run folder)."""
    from fedclock.deploy.local import check_superlink_security

    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["deploy", "--local", "2", "--out", str(run), *args])
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and words in lines[0], res.output
    assert not run.exists()
    for ok in ("127.0.0.1:9093", "localhost:9093", "[::1]:9093", "127.0.0.2"):
        check_superlink_security(ok, None, True)
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    check_superlink_security("fleet.example.org:9093", ca, False)
    check_superlink_security(None, None, False)


def test_the_flower_folder_is_written_whole_and_never_through_links(tmp_path: Path) -> None:
    """RUN/flower's app and connection files are written atomically; a link in its place
    (or as its logs folder, or as a log file) is refused and its target left alone."""
    from fedclock.deploy.local import _flower_home, _log_file
    from fedclock.errors import ConfigError

    run = tmp_path / "run"
    home, app_dir, env = _flower_home(run, "127.0.0.1:9093")
    assert (home / "config.toml").read_text().endswith("insecure = true\n")
    assert (app_dir / "fedclock_app.py").is_file() and env["FLWR_HOME"] == str(home)
    assert not [p for p in home.rglob(".*.tmp")]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine\n")
    (home / "logs").rmdir()
    (home / "logs").symlink_to(mine, target_is_directory=True)
    with pytest.raises(ConfigError, match="logs is a symbolic link"):
        _flower_home(run, "127.0.0.1:9093")
    (home / "logs").unlink()
    (home / "logs").mkdir()
    (home / "logs" / "superlink.log").symlink_to(mine / "keep.txt")
    with pytest.raises(ConfigError, match=r"superlink\.log is a symbolic link"):
        _log_file(home / "logs" / "superlink.log")
    assert [p.name for p in mine.iterdir()] == ["keep.txt"]
    assert (mine / "keep.txt").read_text() == "mine\n"


def test_a_failed_flower_run_names_the_server_apps_error(tmp_path: Path) -> None:
    from fedclock.deploy.local import last_error

    log = tmp_path / "flwr-run.log"
    log.write_text("INFO: started\nTraceback (most recent call last):\n  File x\n"
                   "RuntimeError: fewer than 4 SuperNodes connected in 120 s\nExit Code: 201\n")  # fmt: skip
    assert last_error(log) == "RuntimeError: fewer than 4 SuperNodes connected in 120 s"
    assert last_error(tmp_path / "missing.log") is None


def test_a_barrier_deployment_trains_the_same_models_as_its_simulation(tmp_path: Path) -> None:
    """The devices train with the simulator's executor on its batch streams: FedAvg's rounds
    deployed on threads and simulated (serial executor) end each step at the same model."""
    from fedclock.experiment import run_experiment

    sets = ["strategy.name=fedavg", "budget.aggregations=3", "executor.kind=serial"]
    cfg = _cfg(*sets)
    deployed = deploy(cfg, tmp_path / "d", LocalDevices(cfg, slow={1: 3.0}), engine_name="threads")
    simulated = run_experiment(cfg, run_dir=tmp_path / "s")
    acc = [[r["test_accuracy"] for r in res.history if r["aggregation"] > 0]
           for res in (deployed, simulated)]  # fmt: skip
    loss = [[r["test_loss"] for r in res.history if r["aggregation"] > 0]
            for res in (deployed, simulated)]  # fmt: skip
    assert deployed.summary["aggregations"] == 3 and acc[0] and acc[0] == acc[1]
    assert loss[0] == pytest.approx(loss[1], rel=1e-5)


def test_a_strategy_whose_work_cannot_travel_is_refused_in_one_sentence(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, [
        "deploy", "--engine", "threads", "--local", "3", "--set", "strategy.name=splitfed",
        "--out", str(tmp_path),
    ])  # fmt: skip
    assert res.exit_code == 2 and "cannot be deployed yet" in res.stderr
    assert "Split" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "sets",
    [["strategy.name=scaffold", "strategy.client_fraction=0.5"],  # Task.down travels
     ["strategy.name=fedavg", "strategy.client_fraction=0.5", "selection.name=oort"],  # up
     ["strategy.name=fed-raa"]],  # fragments
)  # fmt: skip
def test_what_a_method_sends_down_and_up_travels(tmp_path: Path, sets: list[str]) -> None:
    cfg = _cfg(*sets, "budget.aggregations=4")
    res = deploy(cfg, tmp_path, LocalDevices(cfg), engine_name="threads")
    assert res.error is None and res.summary["aggregations"] == 4
    assert res.summary["updates_rejected"] == 0, res.summary["deployment"]["rejected"][:1]
