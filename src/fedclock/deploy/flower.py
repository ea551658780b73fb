"""fedclock on Flower's Deployment Engine (flwr ≥ 1.21, Message API): a ServerApp that runs
the strategy with :class:`~fedclock.deploy.driver.RealTimeDriver` over a
:class:`FlowerTransport`, and a ClientApp that is a
:class:`~fedclock.deploy.device.DeviceWorker`. Only this module imports flwr.

Each SuperNode is one client: its node config names it (``partition-id``; ``slow`` and
``flops-per-s``: the local deployment's emulated slowdown or speed). The server learns which node holds which client with
a first ``query`` message to every node, then keeps tasks in flight by push/pull: it pushes a
task's message when the trigger dispatches it and pulls replies as they come, so
asynchronous and buffered strategies keep C messages in flight and synchronous ones close a
round by their deadline — no framework round timeout is involved.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedclock.deploy.wire import Payload

log = logging.getLogger(__name__)

server_app = ServerApp()
client_app = ClientApp()


def to_record(p: Payload) -> RecordDict:
    from flwr.app import Array

    arrays = ArrayRecord({k: Array(np.ascontiguousarray(a)) for k, a in p.arrays.items()})
    return RecordDict({"arrays": arrays, "config": ConfigRecord(dict(p.config))})


def from_record(rd: RecordDict) -> Payload:
    arrays = rd.array_records.get("arrays")
    config = rd.config_records.get("config")
    return Payload(
        arrays={} if arrays is None else {k: a.numpy() for k, a in arrays.items()},
        config={} if config is None else dict(config),
    )


class FlowerTransport:
    """Messages through a Flower Grid: one node per client (``nodes``: client → node id)."""

    def __init__(self, grid: Grid, nodes: dict[int, int], config_text: str) -> None:
        self.grid, self.nodes, self.config_text = grid, nodes, config_text
        self._pending: dict[str, int] = {}  # message id → task id

    def send(self, task_id: int, client: int, payload: Payload) -> None:
        payload.config["run_config"] = self.config_text  # (a device builds its data from it)
        msg = Message(to_record(payload), dst_node_id=self.nodes[client], message_type="train")
        [mid] = list(self.grid.push_messages([msg]))
        self._pending[mid] = task_id

    def poll(self, timeout: float) -> list[tuple[int, Payload | str]]:
        end = time.monotonic() + timeout
        while True:
            out: list[tuple[int, Payload | str]] = []
            if self._pending:
                for m in self.grid.pull_messages(list(self._pending)):
                    tid = self._pending.pop(m.metadata.reply_to_message_id, None)
                    if tid is None:
                        continue
                    if m.has_error():
                        out.append((tid, f"{m.error.reason} (code {m.error.code})"))
                    else:
                        try:
                            out.append((tid, from_record(m.content)))
                        except Exception as exc:  # an unreadable reply: rejected, with why
                            out.append((tid, f"an unreadable reply ({exc})"))
            if out or time.monotonic() >= end:
                return out
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def close(self) -> None:
        self._pending.clear()


def _node_clients(grid: Grid, expected: int, wait: float) -> dict[int, int]:
    """client → node id, from each node's answer to a ``query`` (its partition-id)."""
    deadline = time.monotonic() + wait
    while len(list(grid.get_node_ids())) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {expected} SuperNodes connected in {wait:g} s")
        time.sleep(0.2)
    nodes = list(grid.get_node_ids())
    msgs = [Message(RecordDict({"config": ConfigRecord({"ask": "client"})}), dst_node_id=n,
                    message_type="query") for n in nodes]  # fmt: skip
    mapping: dict[int, int] = {}
    for reply in grid.send_and_receive(msgs, timeout=wait):
        if reply.has_error():
            raise RuntimeError(f"a SuperNode failed to say which client it is: {reply.error}")
        client = int(reply.content.config_records["config"]["client"])
        if client in mapping:
            raise RuntimeError(f"two SuperNodes hold client {client} (partition-id)")
        mapping[client] = reply.metadata.src_node_id
    if sorted(mapping) != list(range(expected)):
        raise RuntimeError(f"the SuperNodes hold clients {sorted(mapping)}, not 0..{expected - 1}")
    return mapping


@server_app.main()
def _server(grid: Grid, context: Context) -> None:
    from fedclock.config import load_config, to_yaml
    from fedclock.deploy.run import deploy

    rc = context.run_config
    cfg = load_config(Path(str(rc["config"])))
    nodes = _node_clients(grid, int(rc["nodes"]), float(rc["wait"]))
    transport = FlowerTransport(grid, nodes, to_yaml(cfg))
    limit = float(rc.get("round_timeout", 0.0))  # (0: none)
    result = deploy(cfg, Path(str(rc["out"])), transport, engine_name="flower",
                    round_timeout_s=limit if limit > 0 else None)  # fmt: skip
    if result.error:
        raise RuntimeError(result.error)


_WORKERS: dict[tuple[str, int], Any] = {}  # (config, client) → its DeviceWorker, per process


@client_app.query()
def _query(msg: Message, context: Context) -> Message:
    client = int(context.node_config.get("partition-id", -1))
    return Message(RecordDict({"config": ConfigRecord({"client": client})}), reply_to=msg)


@client_app.train()
def _train(msg: Message, context: Context) -> Message:
    import yaml

    from fedclock.config import load_config
    from fedclock.deploy.device import DeviceWorker

    t0 = time.monotonic()
    payload = from_record(msg.content)
    text = str(payload.config.pop("run_config"))
    client = int(context.node_config.get("partition-id", -1))
    worker = _WORKERS.get((text, client))
    if worker is None:
        slow = float(context.node_config.get("slow", 1.0))
        speed = context.node_config.get("flops-per-s")
        worker = _WORKERS[(text, client)] = DeviceWorker(
            load_config(raw=yaml.safe_load(text)), client, slow=slow,
            flops_per_s=None if speed is None else float(speed),
        )  # fmt: skip
    reply = worker.handle(payload, setup_s=time.monotonic() - t0)
    return Message(to_record(reply), reply_to=msg)
