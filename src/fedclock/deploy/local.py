"""Devices on this machine: :class:`LocalDevices` (threads in this process, no framework) and
:func:`run_flower_local` (a Flower SuperLink and N SuperNodes as real processes).

Both run the run's clients as real devices in real time; a device may be slowed
(:class:`~fedclock.deploy.device.DeviceWorker`'s ``slow``). The threads are the quick way to
try a deployment and what the fast tests use; the Flower processes are a real deployment on
localhost (``--insecure``), shut down on success, error or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fedclock.deploy.device import DeviceWorker
from fedclock.deploy.wire import Payload
from fedclock.errors import ConfigError
from fedclock.outputs import check_no_links, write_atomic


class LocalDevices:
    """One device per client, each a thread of this process with its own executor.

    ``slow``: client → slowdown factor; ``speed``: client → the FLOP/s it emulates;
    ``tamper``: a test's hook that alters a reply before it is sent (a device the server
    must not trust)."""

    def __init__(
        self,
        cfg: Any,
        *,
        slow: dict[int, float] | None = None,
        speed: dict[int, float] | None = None,
        tamper: Callable[[int, Payload], Payload] | None = None,
    ) -> None:
        self.cfg = cfg
        self.slow = dict(slow or {})
        self.speed = dict(speed or {})
        self.tamper = tamper
        n = cfg.partition.num_clients
        # one thread per device, as each real device works on one task at a time: a device
        # that hangs holds up its own tasks only
        self._pools = {
            c: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"device-{c}") for c in range(n)
        }
        # each device holds its data before the run starts (as a real one would)
        self._workers = {
            c: DeviceWorker(cfg, c, slow=self.slow.get(c, 1.0), flops_per_s=self.speed.get(c))
            for c in range(n)
        }
        self._replies: queue.Queue[tuple[int, Payload | str]] = queue.Queue()

    def _worker(self, client: int) -> DeviceWorker:
        return self._workers[client]

    def _run(self, task_id: int, client: int, payload: Payload) -> None:
        try:
            reply = self._worker(client).handle(payload)
            if self.tamper is not None:
                reply = self.tamper(client, reply)
            self._replies.put((task_id, reply))
        except Exception as exc:  # a device's failure is the server's to record
            self._replies.put((task_id, f"{type(exc).__name__}: {exc}"))

    def send(self, task_id: int, client: int, payload: Payload) -> None:
        self._pools[client].submit(self._run, task_id, client, payload)

    def poll(self, timeout: float) -> list[tuple[int, Payload | str]]:
        out: list[tuple[int, Payload | str]] = []
        try:
            out.append(self._replies.get(timeout=max(timeout, 0.0)))
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self._replies.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------- Flower on localhost
def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


APP_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedclock-deploy"
version = "1.0.0"
description = "fedclock's strategies on Flower's Deployment Engine"
license = "MIT"

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedclock"

[tool.flwr.app.components]
serverapp = "fedclock_app:server_app"
clientapp = "fedclock_app:client_app"

[tool.flwr.app.config]
config = ""
out = ""
nodes = 0
wait = 120.0
round_timeout = 0.0
"""
APP_MODULE = '''"""fedclock's Flower app (written by `fedclock deploy`): the apps live in fedclock."""

from fedclock.deploy.flower import client_app, server_app

__all__ = ["client_app", "server_app"]
'''


def _executable(name: str) -> str:
    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent),
                                                     os.environ.get("PATH", "")]))  # fmt: skip
    if found is None:
        raise ConfigError(
            f"`{name}` is not installed: install Flower with `pip install 'fedclock[flower]'`."
        )
    return found


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started in the block are stopped when it ends (each in its own session: its
    children — a SuperNode's ClientApps, the SuperLink's ServerApp — go with it)."""
    procs: list[subprocess.Popen[bytes]] = []
    # a SIGTERM (or a closed terminal's SIGHUP) ends the block like Ctrl-C does, through
    # the cleanup below, instead of killing this process and leaving Flower's running
    saved: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            saved[sig] = signal.signal(sig, _exit_on_signal)
    try:
        yield procs
    finally:
        _stop(procs)
        for sig, handler in saved.items():  # (after the cleanup: a second signal waits)
            signal.signal(sig, handler)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop ``procs`` and every process below them: SIGTERM, then SIGKILL after 10 s."""
    # (a SuperNode starts each ClientApp in a session of its own: found by parentage)
    family = _descendants({p.pid for p in procs})
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for pid in family:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10.0
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    for pid in family:  # gone by now, or killed
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _descendants(roots: set[int]) -> list[int]:
    """Every process below ``roots`` (Linux's /proc; elsewhere none are found)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = entry.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[-1].split()
        if len(fields) > 1:
            parent[int(entry.parent.name)] = int(fields[1])
    found: list[int] = []
    frontier = set(roots)
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier and pid not in found}
        found.extend(sorted(frontier))
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


#: the hosts ``--insecure`` may name: this machine
LOCALHOST = ("localhost", "127.0.0.1", "::1")


def check_superlink_security(
    superlink: str | None, root_certificates: Path | None, insecure: bool
) -> None:
    """ConfigError unless the connection to ``superlink`` is TLS (``root_certificates``) or
    an explicitly ``insecure`` one to this machine: model updates never cross a network in
    plain text by default."""
    if superlink is None:
        if insecure:
            raise ConfigError(
                "--insecure goes with --superlink (a local fleet is on 127.0.0.1 already)."
            )
        return
    if root_certificates is not None:
        if insecure:
            raise ConfigError("--insecure and --root-certificates exclude each other: choose one.")
        if not root_certificates.is_file():
            raise ConfigError(f"--root-certificates {root_certificates} is not a file.")
        return
    host = superlink  # HOST, HOST:PORT or [IPv6]:PORT
    if host.startswith("[") and "]" in host:
        host = host[1 : host.index("]")]
    elif host.count(":") == 1:
        host = host.split(":")[0]
    local = host.lower() in LOCALHOST or host.startswith("127.")
    if not local:
        raise ConfigError(
            f"--superlink {superlink} is not this machine and no --root-certificates was given: "
            "give the SuperLink's CA certificate (an insecure connection is only for localhost)."
        )
    if not insecure:
        raise ConfigError(
            f"--superlink {superlink} without --root-certificates is an insecure connection: "
            "say so with --insecure (localhost only), or give the SuperLink's CA certificate."
        )


def _flower_home(
    run_dir: Path, address: str, *, root_certificates: Path | None = None
) -> tuple[Path, Path, dict[str, str]]:
    """The run's Flower folder (``RUN/flower``: the app, the SuperLink connection, the logs)
    and the environment its commands run in: (home, app folder, environment)."""
    home = run_dir.resolve() / "flower"  # (Flower needs an absolute FLWR_HOME)
    app = home / "app"
    check_no_links(run_dir.resolve(), app)
    app.mkdir(parents=True, exist_ok=True)
    write_atomic(app / "pyproject.toml", APP_PYPROJECT)
    write_atomic(app / "fedclock_app.py", APP_MODULE)
    security = "insecure = true\n"
    if root_certificates is not None:
        security = f'root-certificates = "{root_certificates.resolve()}"\n'
    write_atomic(
        home / "config.toml",
        f'[superlink]\ndefault = "fedclock"\n\n[superlink.fedclock]\naddress = "{address}"\n'
        + security,
    )
    check_no_links(home, home / "logs")
    (home / "logs").mkdir(exist_ok=True)
    # (a local SuperLink and SuperNodes start flwr-serverapp / flwr-clientapp from PATH: this
    # Python's scripts first, so that they import this fedclock)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_UPDATE_CHECK": "1", "PATH": path}
    return home, app, env


def _log_file(path: Path) -> Any:
    """``path`` opened for a process's output, never through a link (refused in one
    sentence)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if path.is_symlink():
            raise ConfigError(
                f"{path} is a symbolic link; fedclock writes only its own files, not through "
                "links: remove the link."
            ) from None
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    return os.fdopen(fd, "wb")


def _flwr_run(
    config_path: Path, run_dir: Path, nodes: int, *, app: Path, env: dict[str, str],
    timeout: float, procs: list[subprocess.Popen[bytes]], round_timeout: float | None = None,
) -> int:  # fmt: skip
    """`flwr run` of fedclock's app on the connection ``env`` names; its exit status."""
    logs = Path(env["FLWR_HOME"]) / "logs"
    run_config = (
        f"config='{config_path.resolve()}' out='{run_dir.resolve()}' nodes={nodes} wait={timeout}"
        f" round_timeout={float(round_timeout or 0.0)}"
    )
    cmd = [_executable("flwr"), "run", str(app), "fedclock", "--run-config", run_config,
           "--stream"]  # fmt: skip
    with _log_file(logs / "flwr-run.log") as out:
        run = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
        procs.append(run)
        try:
            return run.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ConfigError(
                f"The Flower deployment did not finish in {timeout:g} s; its logs are in {logs}."
            ) from None


def run_flower_local(
    config_path: Path, run_dir: Path, nodes: int, *, slow: dict[int, float], timeout: float,
    speed: dict[int, float] | None = None, round_timeout: float | None = None,
) -> int:  # fmt: skip
    """A SuperLink and ``nodes`` SuperNodes on localhost, then `flwr run` of fedclock's app on
    them (the run's config ``config_path``, its folder ``run_dir``); everything is stopped
    at the end. The exit status of `flwr run`."""
    link, *node_ports = _free_ports(1 + nodes)
    home, app, env = _flower_home(run_dir, f"127.0.0.1:{link}")
    logs = home / "logs"

    def start(cmd: list[str], name: str, procs: list[subprocess.Popen[bytes]]) -> None:
        out = _log_file(logs / f"{name}.log")
        procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True))  # fmt: skip

    with _processes() as procs:
        start([_executable("flower-superlink"), "--insecure", "--isolation", "subprocess",
               "--host", "127.0.0.1", "--port", str(link)], "superlink", procs)  # fmt: skip
        _wait_port(link, procs[0], logs / "superlink.log")
        for i, port in enumerate(node_ports):
            node_config = f"partition-id={i} slow={slow.get(i, 1.0)}"
            if speed and i in speed:
                node_config += f" flops-per-s={speed[i]}"
            start([_executable("flower-supernode"), "--insecure", "--superlink",
                   f"127.0.0.1:{link}", "--host", "127.0.0.1", "--port", str(port),
                   "--node-config", node_config], f"supernode-{i}", procs)  # fmt: skip
        return _flwr_run(config_path, run_dir, nodes, app=app, env=env, timeout=timeout,
                         procs=procs, round_timeout=round_timeout)  # fmt: skip


def run_flower_remote(
    config_path: Path, run_dir: Path, nodes: int, *, superlink: str,
    root_certificates: Path | None, timeout: float, round_timeout: float | None = None,
) -> int:  # fmt: skip
    """`flwr run` of fedclock's app on a running SuperLink (``superlink``: its address; TLS
    with ``root_certificates``, else insecure) whose ``nodes`` SuperNodes each name their
    client (``--node-config partition-id=I``). Run it on the SuperLink's machine: the server
    app reads ``config_path`` and writes ``run_dir`` there. The exit status of `flwr run`."""
    _, app, env = _flower_home(run_dir, superlink, root_certificates=root_certificates)
    with _processes() as procs:
        return _flwr_run(config_path, run_dir, nodes, app=app, env=env, timeout=timeout,
                         procs=procs, round_timeout=round_timeout)  # fmt: skip


def last_error(log_file: Path) -> str | None:
    """The last exception line of a Flower log (e.g. the ServerApp's), if any."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        text = line.strip()
        head = text.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return text[:300]
    return None


def _wait_port(port: int, proc: subprocess.Popen[bytes], log_file: Path) -> None:
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConfigError(f"The Flower SuperLink did not start; see {log_file}.")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise ConfigError(f"The Flower SuperLink did not open port {port} in 60 s; see {log_file}.")
