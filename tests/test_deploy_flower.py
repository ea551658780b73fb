"""A real local deployment on Flower (flwr ≥ 1.21): a SuperLink and 4 SuperNodes as
processes, one slowed, running fedavg, fedbuff and salf from `fedclock deploy`; every run
finishes, its report renders, and no process is left behind.

flwr is an optional extra (``fedclock[flower]``) whose pins clash with the dev environment's,
so CI runs these tests in a second environment (.ci/run: .venv-flower, ``pytest -m flower``);
elsewhere they skip with that reason. Each run takes about a minute (Flower starts a fresh
ClientApp process for every message).
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

flwr = pytest.importorskip("flwr", reason="flwr is not installed (pip install 'fedclock[flower]')")

from fedclock.cli import app  # noqa: E402

pytestmark = pytest.mark.flower


def _tasks(run_dir: Path) -> list[dict[str, str]]:
    lines = [
        x for x in (run_dir / "timeline.csv").read_text().splitlines() if not x.startswith("#")
    ]
    return [r for r in csv.DictReader(lines) if r["event"] == "task"]


def _flower_processes() -> list[str]:
    """Flower's processes still running, read from /proc (not `ps`, whose lines a COLUMNS
    variable in the environment cuts short). A zombie has exited: reaping it is the job of
    the container's init, which some containers lack."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except (OSError, IndexError):
            continue
        if ("flower-super" in args or "flwr-" in args) and state != "Z":
            found.append(args)
    return found


def _speed(sets: list[str], seconds: float) -> str:
    """``--device-speed`` for device 3 at which its full task under ``sets`` takes
    ``seconds`` (SALF: 30 s against a 25-s deadline, so it cannot train in full but a layer
    suffix fits; FedBuff: 15 s, slower than the others' whole round trips)."""
    from fedclock.config import load_config
    from tests.test_deploy import _full_task_flops

    cfg = load_config(None, ["partition.num_clients=4", *sets])
    return f"3={_full_task_flops(cfg, 3) / seconds}"


SALF = ["strategy.name=salf", "salf.scenario=deadline", "strategy.t_max=25",
        "model.hidden=[64,64]"]  # fmt: skip


@pytest.mark.parametrize(
    ("strategy", "sets", "slow"),
    [
        ("fedavg", [], ["--slow", "3=4"]),
        ("fedbuff", ["strategy.buffer_size=2"], ["--device-speed", "15"]),
        ("salf", [*SALF[1:], "budget.virtual_time=105"], ["--device-speed", "30"]),
    ],
)  # fmt: skip
def test_a_local_flower_deployment(
    tmp_path: Path, strategy: str, sets: list[str], slow: list[str]
) -> None:
    if slow[0] == "--device-speed":
        slow = [slow[0], _speed([f"strategy.name={strategy}", *sets], float(slow[1]))]
    args = ["deploy", "--local", "4", *slow, "--timeout", "300", "--out", str(tmp_path),
            "--json", "-q", "--set", f"strategy.name={strategy}", "--set", "budget.virtual_time=40"]  # fmt: skip
    for s in sets:
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.stderr or res.stdout
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["aggregations"] >= 1
    assert summary["deployment"]["engine"] == "flower"
    assert (tmp_path / "report.html").stat().st_size > 10_000
    rows = _tasks(tmp_path)
    slow_rows = [r for r in rows if r["client"] == "3"]
    if strategy == "fedbuff":  # the slow device's updates come in stale
        assert any(r["staleness"] not in ("", "0") for r in slow_rows)
    if strategy == "salf":  # the slow device's partial work is used, inside the deadline:
        used = [r for r in slow_rows if r["outcome"] == "used"]
        # on its first task (its speed unknown) fewer steps of the full model; once it has
        # measured its speed, the layer suffix that fits its 25-s budget
        assert used and all(float(r["t_end"]) - float(r["t_start"]) <= 25 + 1e-6 for r in used)
        assert any(r["work"].startswith("layer-suffix") for r in used), slow_rows
        assert all(r["work"].startswith("layer-suffix") or int(r["local_steps"]) < 12
                   for r in used), slow_rows  # fmt: skip
        fast = [r for r in rows if r["client"] != "3" and r["outcome"] == "used"]
        assert fast and all(r["work"] == "full-model" for r in fast)
    assert _flower_processes() == []


def test_a_run_submitted_to_a_running_superlink(tmp_path: Path) -> None:
    """`fedclock deploy --superlink`: a SuperLink and SuperNodes started by hand (as on other
    hosts, each naming its client), the run submitted to them."""
    import os
    import subprocess as sp
    import sys

    from fedclock.deploy.local import _executable, _free_ports, _processes, _wait_port

    link, *ports = _free_ports(3)
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "fleet"), "FLWR_DISABLE_UPDATE_CHECK": "1",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}  # fmt: skip
    with _processes() as procs:
        procs.append(sp.Popen([_executable("flower-superlink"), "--insecure", "--host",
                               "127.0.0.1", "--port", str(link)], env=env, stdout=sp.DEVNULL,
                              stderr=sp.DEVNULL, start_new_session=True))  # fmt: skip
        _wait_port(link, procs[0], tmp_path / "none.log")
        for i, port in enumerate(ports):
            procs.append(sp.Popen([_executable("flower-supernode"), "--insecure", "--superlink",
                                   f"127.0.0.1:{link}", "--port", str(port), "--node-config",
                                   f"partition-id={i}"], env=env, stdout=sp.DEVNULL,
                                  stderr=sp.DEVNULL, start_new_session=True))  # fmt: skip
        res = CliRunner().invoke(app, [
            "deploy", "--superlink", f"127.0.0.1:{link}", "--insecure", "--local", "2",
            "--timeout", "300",
            "--set", "budget.virtual_time=20", "--out", str(tmp_path / "run"), "--json", "-q",
        ])  # fmt: skip
    assert res.exit_code == 0, res.stderr or res.stdout
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["num_clients"] == 2 and summary["deployment"]["engine"] == "flower"
    assert summary["aggregations"] >= 1
    assert _flower_processes() == []


def test_a_stopped_deployment_leaves_no_process_behind(tmp_path: Path) -> None:
    """SIGTERM (as Ctrl-C) while the fleet runs: the SuperLink, the SuperNodes and their
    apps are all stopped before `fedclock deploy` exits."""
    import signal
    import sys
    import time

    run, err = tmp_path / "run", tmp_path / "stderr.txt"
    with err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedclock", "deploy", "--local", "2", "--out", str(run), "-q",
             "--set", "budget.virtual_time=120"],
            stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip

    def why() -> str:
        logs = sorted((run / "flower" / "logs").glob("*.log"))
        return err.read_text() + "".join(f"\n{x.name}: {x.read_text()[-800:]}" for x in logs)

    # (the run submitted and its apps started: a ServerApp and the two SuperNodes running)
    deadline = time.monotonic() + 120
    while not any("flwr-serverapp" in x for x in _flower_processes()):
        assert proc.poll() is None and time.monotonic() < deadline, why()
        time.sleep(0.5)
    assert len([x for x in _flower_processes() if "flower-supernode" in x]) == 2, why()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM, why()
    assert _flower_processes() == []
