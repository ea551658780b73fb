"""Devices that come and go (a trace's availability, docs/traces.md): only online devices
are selected or started, a task whose device goes offline is lost then (outcome
``offline``, its compute wasted), a barrier round does not wait for it, and an asynchronous
client starts again when its device is back.

The fleet is tests/data/trace-availability (made with fedclock.devices.trace.write_trace):
d0 online in [0, 1) every 3 s, d1 in [0, 2) every 4 s, d2 in [1, 5) every 6 s, d3 from 0.5
to 100 s once, d4 and d5 always; round-robin, so client i has device d_i."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedclock.config import ConfigError, load_config
from fedclock.experiment import _build, run_experiment
from fedclock.metrics.timeline import read_timeline
from fedclock.sim.simulator import Budget, Simulator
from tests.conftest import tiny_raw

TRACE = Path(__file__).parent / "data" / "trace-availability"


def _raw(**sections: Any) -> dict[str, Any]:
    return tiny_raw(population={"scenario": "trace", "trace": str(TRACE),
                                "assign": "round_robin"}, **sections)  # fmt: skip


class _Watch:
    def __init__(self) -> None:
        self.dispatched: list[Any] = []
        self.lost: list[tuple[float, Any]] = []
        self.arrived: list[tuple[float, Any]] = []

    def on_dispatch(self, sim: Any, task: Any) -> None:
        self.dispatched.append(task)

    def on_lost(self, sim: Any, task: Any) -> None:
        self.lost.append((sim.now, task))

    def on_arrival(self, sim: Any, c: Any) -> None:
        self.arrived.append((sim.now, c.task))


def _simulate(raw: dict[str, Any], aggregations: int) -> tuple[Simulator, _Watch]:
    cfg = load_config(raw=raw)
    parts = _build(cfg, None)
    watch = _Watch()
    sim = Simulator(strategy=parts.strategy, executor=parts.executor, population=parts.population,
                    initial=parts.initial, seed=cfg.seed, budget=Budget(aggregations=aggregations),
                    observers=[watch])  # fmt: skip
    sim.run()
    return sim, watch


def test_barrier_rounds_select_online_devices_and_do_not_wait_for_lost_ones() -> None:
    """Every task starts on an online device; a task outlasting its device's interval is
    lost exactly when the interval ends, and is never an arrival; the rounds go on."""
    sim, w = _simulate(_raw(budget={"aggregations": 5}), 5)
    pop = sim.population
    assert pop.availability is not None
    for t in w.dispatched:
        assert pop.availability.online(t.client, t.t_start), (t.client, t.t_start)
    assert w.lost, "the fleet loses some tasks"
    for at, t in w.lost:
        off = pop.availability.next_offline(t.client, t.t_start)
        assert at == off < t.t_finish
    arrived = {t.task_id for _, t in w.arrived}
    assert not arrived & {t.task_id for _, t in w.lost}
    assert sim.counters.aggregations == 5
    assert sim.counters.updates_lost == len(w.lost)
    # d3 is offline before 0.5 s: not in the first round
    first = [t.client for t in w.dispatched if t.t_start == 0.0]
    assert 3 not in first and {4, 5} <= set(first)


def test_an_asynchronous_client_starts_again_when_its_device_is_back() -> None:
    """FedBuff (every client working): a client whose task was lost starts its next task at
    the moment its device is online again."""
    sim, w = _simulate(_raw(strategy={"name": "fedbuff", "buffer_size": 2}), 12)
    assert w.lost
    avail = sim.population.availability
    assert avail is not None
    checked = 0
    for at, t in w.lost:
        back = avail.next_online(t.client, at)
        later = [d for d in w.dispatched if d.client == t.client and d.t_start >= at]
        if later and back <= sim.now:
            assert later[0].t_start == back
            checked += 1
    assert checked, "no lost client came back within the run: the check ran on nothing"


def test_lost_tasks_show_as_offline_in_the_timeline_and_the_summary(tmp_path: Path) -> None:
    res = run_experiment(load_config(raw=_raw(budget={"aggregations": 5})), run_dir=tmp_path)
    tl = read_timeline(tmp_path / "timeline.csv")
    offline = [i for i, o in enumerate(tl.tasks["outcome"]) if o == "offline"]
    assert offline and res.summary["updates_lost"] == len(offline)
    assert tl.counts()["offline"] == len(offline)
    from fedclock.report import build_report

    page = build_report(tmp_path)
    assert "lost when its device went offline" in page
    wasted = res.summary["compute_s_wasted"]
    assert wasted > 0


@pytest.mark.parametrize(
    ("strategy", "words"),
    [({"name": "prunefl"}, "does not handle devices that go offline")],
)
def test_strategies_that_do_not_handle_offline_devices_say_so(
    tmp_path: Path, strategy: dict[str, Any], words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        run_experiment(load_config(raw=_raw(strategy=strategy)), run_dir=tmp_path)


@pytest.mark.parametrize("selection", ["random", "oort", "refl"])
def test_a_concurrency_gives_its_slots_to_online_devices(selection: str) -> None:
    """FedBuff with 3 of 6 clients training at once on the fleet: every task starts on an
    online device, never more than 3 run at once, a lost task frees its slot for an online
    client, and the run goes on (uniformly drawn, or Oort's or REFL's pick)."""
    raw = _raw(strategy={"name": "fedbuff", "buffer_size": 2, "concurrency": 3},
               selection={"name": selection})  # fmt: skip
    sim, w = _simulate(raw, 10)
    avail = sim.population.availability
    assert avail is not None and sim.counters.aggregations == 10
    for t in w.dispatched:
        assert avail.online(t.client, t.t_start), (t.client, t.t_start)
    ends = {t.task_id: t.t_finish for t in w.dispatched}
    for at, t in w.lost:
        ends[t.task_id] = at
    events = sorted([(e, -1) for e in ends.values()] + [(t.t_start, 1) for t in w.dispatched])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak <= 3
    assert w.lost, "the fleet loses some tasks"


def test_the_chrome_trace_has_complete_events_and_the_offline_ends(tmp_path: Path) -> None:
    """`fedclock report --chrome-trace` writes timeline.json in the Trace Event Format: every
    X event has ph, pid, tid, ts and dur (µs, ≥ 0); a lost task's last phase ends when its
    device went offline, its outcome in the args; server steps are instant events."""
    import json

    from typer.testing import CliRunner

    from fedclock.cli import app

    run_experiment(load_config(raw=_raw(budget={"aggregations": 5})), run_dir=tmp_path)
    res = CliRunner().invoke(app, ["report", str(tmp_path), "--chrome-trace"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "timeline.json").read_text())
    events = doc["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert xs and all({"pid", "tid", "ts", "dur", "name"} <= set(e) and e["dur"] >= 0 for e in xs)
    tl = read_timeline(tmp_path / "timeline.csv")
    for i, outcome in enumerate(tl.tasks["outcome"]):
        if outcome != "offline":
            continue
        mine = [e for e in xs if e["args"]["task_id"] == int(tl.tasks["task_id"][i])]
        end = max(e["ts"] + e["dur"] for e in mine)
        assert end == pytest.approx(tl.tasks["t_end"][i] * 1e6, rel=1e-9)
        assert all(e["args"]["outcome"] == "offline" for e in mine)
    steps = [e for e in events if e["ph"] == "i"]
    assert len(steps) == 5 and all(e["pid"] == 0 for e in steps)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {f"client {c}" for c in set(tl.tasks["client"].tolist())}
