"""Device traces (docs/traces.md): fedclock's format, FedScale's and FLASH's importers, the
availability intervals, and populations built from a trace."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fedclock.cli import app
from fedclock.config import ConfigError, load_config
from fedclock.devices.population import build_population, trace_assignment
from fedclock.devices.trace import (
    Availability,
    Trace,
    from_fedscale,
    from_flash,
    read_plain_pickle,
    read_trace,
    write_trace,
)
from fedclock.errors import DataError
from fedclock.experiment import run_experiment
from tests.conftest import tiny_raw

runner = CliRunner()


# ------------------------------------------------------------------ FedScale's pickles
def _fedscale(tmp: Path) -> tuple[Path, Path]:
    """Three clients in FedScale's layout: capacity {id: {'computation': ms/sample,
    'communication': kbit/s}}, behaviour {id: {'duration', 'inactive', 'finish_time',
    'active', 'model'}} for two of them."""
    cap = {1: {"computation": 162.0, "communication": 5648.0},
           2: {"computation": 50.0, "communication": 1000.0},
           3: {"computation": 500.0, "communication": 20000.0}}  # fmt: skip
    behave = {
        1: {"duration": 1000, "inactive": [300, 900], "finish_time": 1000, "active": [100, 600],
            "model": "SM-G950F"},
        3: {"duration": 500, "inactive": [450], "finish_time": 500, "active": [400],
            "model": "Pixel 3"},
    }  # fmt: skip
    a, b = tmp / "client_device_capacity", tmp / "client_behave_trace"
    a.write_bytes(pickle.dumps(cap))
    b.write_bytes(pickle.dumps(behave))
    return a, b


def test_fedscale_import_is_the_hand_computed_conversion(tmp_path: Path) -> None:
    """FLOP/s = 6e8 / (ms/1000): 162 ms → 3.7037e9, 50 ms → 1.2e10, 500 ms → 1.2e9; bytes/s
    = kbit/s × 128; client 1 online in [100, 300) and [600, 900) every 1000 s, client 2
    always, client 3 in [400, 450) every 500 s; models from the behaviour trace."""
    cap, behave = _fedscale(tmp_path)
    t = from_fedscale(cap, behave)
    assert t.device_id == ["1", "2", "3"]
    np.testing.assert_allclose(t.flops_per_s, [6e8 / 0.162, 6e8 / 0.05, 6e8 / 0.5], rtol=1e-15)
    np.testing.assert_array_equal(t.up_bytes_per_s, [5648.0 * 128, 1000.0 * 128, 20000.0 * 128])
    np.testing.assert_array_equal(t.down_bytes_per_s, t.up_bytes_per_s)
    assert t.model == ["SM-G950F", "", "Pixel 3"]
    a = t.availability
    assert a is not None
    assert [a.online(0, x) for x in (99, 100, 299.9, 300, 650, 1150, 1950)] == [
        False, True, True, False, True, True, False]  # fmt: skip
    assert all(a.online(1, x) for x in (0, 1e6))
    assert a.online(2, 420) and a.online(2, 920) and not a.online(2, 460)
    # written and read back: the same trace, the reference in the header
    write_trace(tmp_path / "tr", t)
    back = read_trace(tmp_path / "tr")
    np.testing.assert_array_equal(back.flops_per_s, t.flops_per_s)
    assert back.device_id == t.device_id and back.model == t.model
    assert back.availability is not None
    np.testing.assert_array_equal(back.availability.start, a.start)
    np.testing.assert_array_equal(back.availability.period, a.period)
    head = (tmp_path / "tr" / "devices.csv").read_text().splitlines()[:5]
    assert head[0].startswith("# fedclock-trace 1") and any("6e+08 FLOPs" in h for h in head)


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("payload", ["evil", "tuple", "bytes", "bool"])
def test_a_pickle_with_anything_but_plain_data_is_refused_and_runs_nothing(
    tmp_path: Path, payload: str
) -> None:
    marker = tmp_path / "ran"
    value = {
        "evil": {1: {"computation": _Evil(marker), "communication": 1.0}},
        "tuple": {1: (1.0, 2.0)},
        "bytes": {1: b"x"},
        "bool": {1: {"computation": True, "communication": 1.0}},
    }[payload]
    path = tmp_path / "p"
    path.write_bytes(pickle.dumps(value))
    with pytest.raises(DataError, match="refused: a trace pickle may hold only"):
        read_plain_pickle(path)
    assert not marker.exists()
    res = runner.invoke(
        app, ["trace", "import", "fedscale", str(path), "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 2 and "refused" in res.output and not marker.exists()
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ FLASH's state traces
def test_flash_ready_is_locked_and_wifi_and_charging(tmp_path: Path) -> None:
    """Ready from 00:10 (the last of lock, Wi-Fi and charging) to 00:30 (unlock), again from
    01:00 to 01:20 (charger off); the trace spans 01:40 = 6000 s, its period."""
    msgs = "\n".join([
        "2020-01-02 00:00:00\tscreen_lock", "2020-01-02 00:05:00\twifi",
        "2020-01-02 00:10:00\tbattery_charged_on", "2020-01-02 00:30:00\tscreen_unlock",
        "2020-01-02 01:00:00\tscreen_lock", "2020-01-02 01:20:00\tbattery_charged_off",
        "2020-01-02 01:40:00\t80%",
    ])  # fmt: skip
    path = tmp_path / "ubt.json"
    path.write_text(
        '{"0": {"guid": "u0", "model": "Redmi Note 8", "messages": '
        + repr(msgs).replace("'", '"')
        + "}}"
    )
    t = from_flash(path)
    a = t.availability
    assert t.device_id == ["u0"] and math.isnan(t.flops_per_s[0]) and a is not None
    assert list(zip(a.start, a.end, strict=True)) == [(600.0, 1800.0), (3600.0, 4800.0)]
    assert a.period[0] == 6000.0
    assert a.online(0, 6600.0) and not a.online(0, 6000.0 + 1800.0)


# ------------------------------------------------------------------ availability queries
def test_queries_by_hand() -> None:
    """Device 0: [10, 20) and [50, 60), once; device 1: [80, 100) ∪ [0, 30) every 100 (an
    interval over the wrap); device 2: never listed (always online)."""
    a = Availability.from_rows(3, [(0, 50, 60, math.inf), (0, 10, 20, math.inf),
                                   (1, 80, 130, 100.0)])  # fmt: skip
    assert a.next_offline(0, 15) == 20 and a.next_offline(0, 25) == 25
    assert a.next_online(0, 25) == 50 and a.next_online(0, 70) == math.inf
    assert a.online(1, 90) and a.online(1, 110) and not a.online(1, 140)
    assert a.next_offline(1, 90) == 130  # (online over the wrap into the next period)
    assert a.next_online(1, 140) == 180
    assert a.next_offline(2, 5) == math.inf and a.next_online(2, 5) == 5
    always = Availability.from_rows(1, [(0, 0, 100, 100.0)])
    assert always.next_offline(0, 1234.5) == math.inf


@st.composite
def _intervals(draw):  # type: ignore[no-untyped-def]
    period = draw(st.sampled_from([math.inf, 50.0, 100.0]))
    n = draw(st.integers(1, 5))
    rows = []
    for _ in range(n):
        s = draw(st.floats(0, 90, allow_nan=False))
        length = draw(st.floats(0.5, 40 if math.isfinite(period) else 60, allow_nan=False))
        rows.append((0, s, s + min(length, period if math.isfinite(period) else length), period))
    return rows


@settings(max_examples=150, deadline=None)
@given(rows=_intervals(), t=st.floats(0, 400, allow_nan=False))
def test_next_offline_and_next_online_agree_with_online(rows, t: float) -> None:  # type: ignore[no-untyped-def]
    """Between t and next_offline(t) the device is online (sampled); at next_online(t) it
    is online; both are ≥ t; brute force over a fine grid agrees."""
    a = Availability.from_rows(1, rows)
    off, on = a.next_offline(0, t), a.next_online(0, t)
    assert off >= t and on >= t
    if math.isfinite(on):
        assert a.online(0, on)
        for k in range(1, 20):  # offline just before it came online (unless on == t)
            x = t + (on - t) * k / 20
            if x < on:
                assert not a.online(0, x)
    end = min(off, t + 500)
    for k in range(20):
        x = t + (end - t) * k / 20
        if x < off:
            assert a.online(0, x)
    if math.isfinite(off):
        assert not a.online(0, off)


# ------------------------------------------------------------------ damaged traces
@pytest.mark.parametrize(
    ("devices", "words"),
    [
        ("device_id,flops\n", "not a fedclock trace"),
        ("# fedclock-trace 1: devices\n# u\ndevice_id,flops_per_s\n", "line 3: the header"),
        ("# fedclock-trace 1: devices\n# u\ndevice_id,flops_per_s,up_bytes_per_s,"
         "down_bytes_per_s,model,source\na,x,1,1,,\n", "line 4: flops_per_s 'x' is not a number"),
        ("# fedclock-trace 1: devices\n# u\ndevice_id,flops_per_s,up_bytes_per_s,"
         "down_bytes_per_s,model,source\na,1,1,1,,\na,1,1,1,,\n", "line 5: device 'a' is listed twice"),
        ("# fedclock-trace 1: devices\n# u\ndevice_id,flops_per_s,up_bytes_per_s,"
         "down_bytes_per_s,model,source\na,-1,1,1,,\n", "finite number ≥ 0"),
    ],
)  # fmt: skip
def test_a_damaged_trace_is_one_sentence_naming_the_file_and_line(
    tmp_path: Path, devices: str, words: str
) -> None:
    (tmp_path / "devices.csv").write_text(devices)
    with pytest.raises(DataError, match=words):
        read_trace(tmp_path)


# ------------------------------------------------------------------ populations from a trace
def _small_trace(folder: Path) -> Trace:
    n = 4
    t = Trace(
        [f"d{i}" for i in range(n)], np.array([1e6, math.nan, 4e6, 8e6]),
        np.array([1e5, 2e5, math.inf, 4e5]), np.array([1e5, 2e5, math.inf, 4e5]),
        ["", "", "", ""], ["test"] * n,
        Availability.from_rows(n, [(0, 0.0, 5.0, 10.0)]),
    )  # fmt: skip
    write_trace(folder, t)
    return t


def test_clients_get_devices_by_permutation_or_round_robin(tmp_path: Path) -> None:
    """Round-robin: client i → device i mod 4 (FedScale's); permutation: a seeded shuffle,
    the same for the same seed; a device without FLOP/s runs at population.speed."""
    _small_trace(tmp_path / "tr")
    assert trace_assignment(4, 6, 0, "round_robin").tolist() == [0, 1, 2, 3, 0, 1]
    perm = trace_assignment(4, 6, 5, "permutation")
    assert sorted(perm[:4].tolist()) == [0, 1, 2, 3] and perm[4:].tolist() == perm[:2].tolist()
    assert perm.tolist() == trace_assignment(4, 6, 5, "permutation").tolist()
    cfg = load_config(raw=tiny_raw(population={
        "scenario": "trace", "trace": str(tmp_path / "tr"), "assign": "round_robin",
        "speed": 3e6}))  # fmt: skip
    pop = build_population(cfg.population, 6, cfg.seed)
    assert pop.speed.tolist() == [1e6, 3e6, 4e6, 8e6, 1e6, 3e6]
    assert pop.device_ids == ["d0", "d1", "d2", "d3", "d0", "d1"]
    assert pop.availability is not None and not pop.availability.online(4, 7.0)
    assert pop.availability.online(5, 7.0)  # (d1 has no interval: always online)


def test_a_run_on_a_trace_and_its_export(tmp_path: Path) -> None:
    """A run's population comes from the trace; `trace export` writes the run's population
    (one device per client) and a run on the exported trace has the same devices."""
    _small_trace(tmp_path / "tr")
    raw = tiny_raw(population={"scenario": "trace", "trace": str(tmp_path / "tr")},
                   budget={"aggregations": 2})  # fmt: skip
    res = run_experiment(load_config(raw=raw), run_dir=tmp_path / "run")
    assert res.summary["status"] == "completed"
    out = runner.invoke(
        app, ["trace", "export", str(tmp_path / "run"), "--out", str(tmp_path / "ex")]
    )
    assert out.exit_code == 0, out.output
    back = read_trace(tmp_path / "ex")
    pop = build_population(load_config(raw=raw).population, 6, 3)
    np.testing.assert_array_equal(back.flops_per_s, pop.speed)
    np.testing.assert_array_equal(back.up_bytes_per_s, pop.up_bandwidth)
    # the exported trace, round-robin: client i gets device client-i
    raw2 = tiny_raw(population={"scenario": "trace", "trace": str(tmp_path / "ex"),
                                "assign": "round_robin"})  # fmt: skip
    pop2 = build_population(load_config(raw=raw2).population, 6, 3)
    np.testing.assert_array_equal(pop2.speed, pop.speed)


def test_trace_and_scenario_go_together(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"population\.trace"):
        load_config(raw=tiny_raw(population={"scenario": "trace"}))
    with pytest.raises(ConfigError, match=r"population\.trace"):
        load_config(raw=tiny_raw(population={"trace": str(tmp_path)}))
    raw = tiny_raw(population={"scenario": "trace", "trace": str(tmp_path / "none")})
    with pytest.raises(DataError, match="does not exist"):
        run_experiment(load_config(raw=raw), run_dir=tmp_path / "r")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    res = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "r2"), "-q"])
    assert res.exit_code == 2 and "does not exist" in res.output


@settings(max_examples=100, deadline=None)
@given(rows=_intervals(), t=st.floats(0, 400, allow_nan=False))
def test_online_all_equals_online_device_by_device(rows, t: float) -> None:  # type: ignore[no-untyped-def]
    more = [(1, s, e, p) for _, s, e, p in rows[:2]]
    a = Availability.from_rows(3, [*rows, *more])
    assert a.online_all(t).tolist() == [a.online(d, t) for d in range(3)]


@pytest.mark.parametrize("kind", ["bernoulli", "diurnal"])
def test_generated_fleets_are_seeded_and_online_about_the_share_asked(
    tmp_path: Path, kind: str
) -> None:
    """2,000 devices, hourly slots over a day, online 0.3: the share of device-hours online
    is 0.3 within sampling error (and the correction for devices never online, which
    adds at most one slot each); the same seed writes the same files; every device is
    online at some time."""
    from fedclock.devices.trace import generate_trace

    t = generate_trace(2000, availability=kind, seed=4, online=0.3)
    a = t.availability
    assert a is not None and (np.diff(a.offsets) > 0).all()
    share = float((a.end - a.start).sum()) / (2000 * 86_400.0)
    assert abs(share - 0.3) < 0.02, share
    write_trace(tmp_path / "a", t)
    write_trace(tmp_path / "b", generate_trace(2000, availability=kind, seed=4, online=0.3))
    for name in ("devices.csv", "availability.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_trace_generate_then_a_run_on_it(tmp_path: Path) -> None:
    res = runner.invoke(app, ["trace", "generate", "--devices", "12", "--availability",
                              "always", "--out", str(tmp_path / "g")])  # fmt: skip
    assert res.exit_code == 0 and not (tmp_path / "g" / "availability.csv").exists()
    res = runner.invoke(app, ["trace", "generate", "--devices", "12", "--slot", "0.5",
                              "--period", "4", "--out", str(tmp_path / "d")])  # fmt: skip
    assert res.exit_code == 0, res.output
    raw = tiny_raw(population={"scenario": "trace", "trace": str(tmp_path / "d")},
                   budget={"aggregations": 3})  # fmt: skip
    out = run_experiment(load_config(raw=raw), run_dir=tmp_path / "run")
    assert out.summary["status"] == "completed" and out.summary["aggregations"] == 3
    bad = runner.invoke(app, ["trace", "generate", "--online", "0", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "online" in bad.output


@settings(max_examples=60, deadline=None)
@given(
    rows=_intervals(), times=st.lists(st.floats(0, 400, allow_nan=False), min_size=1, max_size=8)
)
def test_the_online_set_follows_online_all_as_time_moves_forward(rows, times) -> None:  # type: ignore[no-untyped-def]
    """Advanced through increasing times, the online set's count and its k-th devices are
    online_all's, and a set built afresh at a time (a resumed run) equals the advanced one."""
    from fedclock.devices.trace import OnlineSet

    more = [(2, s + 3.0, e + 3.0, p) for _, s, e, p in rows[:3]]
    a = Availability.from_rows(4, [*rows, *more])
    times = sorted(times)
    live = OnlineSet(a, times[0])
    for t in times:
        live.advance(t)
        want = np.flatnonzero(a.online_all(t)).tolist()
        assert live.count == len(want)
        assert [live.kth(k) for k in range(live.count)] == want
        fresh = OnlineSet(a, t)
        assert fresh.count == live.count and fresh.on.tolist() == live.on.tolist()
