"""Device traces: fleets as they were measured (docs/traces.md).

fedclock's own format is two plain-text CSV files in one folder, each opening with ``#``
lines that name the format version, the units and, for a converted trace, where it came
from and the reference used:

- ``devices.csv`` — ``device_id, flops_per_s, up_bytes_per_s, down_bytes_per_s, model,
  source``: one device per row; an empty ``flops_per_s`` takes ``population.speed``, an
  empty bandwidth is free (as ``null`` in the config);
- ``availability.csv`` (optional) — ``device_id, start_s, end_s, period_s``: the device is
  online in [start_s, end_s) and, with ``period_s``, in every [start_s + k·period_s,
  end_s + k·period_s); a device without a row is always online, one with rows only then.

:func:`read_trace` checks every line (one sentence naming the file and the line);
:func:`write_trace` writes both files atomically. :class:`Availability` answers "online at
t?", "when does it next go offline?" and "when is it next online?" by bisection over each
device's sorted intervals (any order of queries; FedScale's forward-only cursor is not).
The importers convert FedScale's two pickles (:func:`from_fedscale`, read by a restricted
unpickler that builds only dicts, lists, strings and numbers) and FLASH's user-behaviour
JSON (:func:`from_flash`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from fedclock.errors import DataError

FORMAT = 1
DEVICES_FILE = "devices.csv"
AVAILABILITY_FILE = "availability.csv"
DEVICE_COLUMNS = (
    "device_id",
    "flops_per_s",
    "up_bytes_per_s",
    "down_bytes_per_s",
    "model",
    "source",
)
AVAILABILITY_COLUMNS = ("device_id", "start_s", "end_s", "period_s")

#: FedScale's speeds are one model's inference latency (ms per sample): MobileNet-V2 at
#: 224×224, about 300 M multiply-adds, 6.0e8 FLOPs per sample counting multiply and add —
#: the reference a conversion to FLOP/s states in its header (docs/traces.md)
FEDSCALE_REFERENCE_FLOPS = 6.0e8
#: FedScale's "communication" is in kbit/s of 1024 bits (its model sizes are bytes/1024·8)
FEDSCALE_KBIT_BYTES = 128.0
#: FLASH's time origin (models/timer.py: refer_time) and its time format
FLASH_FORMAT = "%Y-%m-%d %H:%M:%S"


# --------------------------------------------------------------------- the trace
@dataclass
class Trace:
    """A fleet: per device its id, FLOP/s (NaN: the population's ``speed``), bandwidths in
    bytes/s (inf: free), model and source, and its availability intervals (None: every
    device always online)."""

    device_id: list[str]
    flops_per_s: np.ndarray
    up_bytes_per_s: np.ndarray
    down_bytes_per_s: np.ndarray
    model: list[str]
    source: list[str]
    availability: Availability | None = None
    # header lines beyond the format's own (where the trace came from, the reference used)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.device_id)


@dataclass
class Availability:
    """Each device's online intervals, sorted: device d's are rows ``offsets[d]`` to
    ``offsets[d + 1]`` of ``start``/``end``; ``period[d]`` (inf: once) repeats them, every
    interval lying in [0, period). A device without intervals is always online."""

    offsets: np.ndarray  # (D + 1,) int64
    start: np.ndarray  # float64
    end: np.ndarray  # float64
    period: np.ndarray  # (D,) float64, inf: not periodic
    # a device listed in availability.csv (False: always online)
    listed: np.ndarray  # (D,) bool
    # (online_all's per-interval device, period and whether it repeats: built on first use)
    _rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(
        default=None, repr=False, compare=False
    )

    @classmethod
    def from_rows(
        cls, devices: int, rows: Iterable[tuple[int, float, float, float]]
    ) -> Availability:
        """From (device index, start, end, period) rows, any order; a periodic device's
        intervals are folded into [0, period) and merged where they overlap."""
        per: list[list[tuple[float, float]]] = [[] for _ in range(devices)]
        period = np.full(devices, math.inf)
        listed = np.zeros(devices, dtype=bool)
        for d, s, e, p in rows:
            listed[d] = True
            if math.isfinite(p):
                if math.isfinite(period[d]) and period[d] != p:
                    raise ValueError(f"device {d} has two periods ({period[d]:g} and {p:g})")
                period[d] = p
            per[d].append((s, e))
        offsets = np.zeros(devices + 1, dtype=np.int64)
        starts: list[float] = []
        ends: list[float] = []
        for d, ivs in enumerate(per):
            p = period[d]
            if math.isfinite(p):  # fold into [0, p): an interval over the wrap is two
                folded = []
                for s, e in ivs:
                    if e - s >= p:
                        folded.append((0.0, p))
                        continue
                    s0 = s % p
                    e0 = s0 + (e - s)
                    if e0 <= p:
                        folded.append((s0, e0))
                    else:
                        folded += [(s0, p), (0.0, e0 - p)]
                ivs = folded
            merged: list[tuple[float, float]] = []
            for s, e in sorted(ivs):
                if merged and s <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], e))
                elif e > s:
                    merged.append((s, e))
            starts += [s for s, _ in merged]
            ends += [e for _, e in merged]
            offsets[d + 1] = offsets[d] + len(merged)
        return cls(offsets, np.array(starts, dtype=np.float64),
                   np.array(ends, dtype=np.float64), period, listed)  # fmt: skip

    def take(self, devices: np.ndarray) -> Availability:
        """The availability of ``devices`` (indices, repeats allowed), in that order."""
        counts = self.offsets[devices + 1] - self.offsets[devices]
        offsets = np.zeros(len(devices) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        rows = (
            np.concatenate([np.arange(self.offsets[d], self.offsets[d + 1]) for d in devices])
            if len(devices) and counts.sum()
            else np.zeros(0, dtype=np.int64)
        )
        return Availability(offsets, self.start[rows], self.end[rows], self.period[devices],
                            self.listed[devices])  # fmt: skip

    def _local(self, d: int, t: float) -> tuple[float, float]:
        """(t folded into device d's period, the start of that period), Python floats."""
        p = float(self.period[d])
        t = float(t)
        if not math.isfinite(p):
            return t, 0.0
        base = math.floor(t / p) * p
        return t - base, base

    def online_all(self, t: float) -> np.ndarray:
        """Whether each device is online at time ``t`` (one numpy pass over the intervals,
        for selection among many devices); equal to :meth:`online` device by device."""
        n = len(self.period)
        out = ~self.listed
        if not len(self.start):
            return out
        rows = self._rows
        if rows is None:  # each interval's device and period, once (an inf period: 0)
            dev = np.repeat(np.arange(n), np.diff(self.offsets))
            p = self.period[dev]
            rows = self._rows = (dev, np.where(np.isfinite(p), p, 0.0), np.isfinite(p))
        dev, p, finite = rows
        t = float(t)
        with np.errstate(divide="ignore", invalid="ignore"):
            folded = t - np.floor(t / p) * p  # (as _local folds it)
        x = np.where(finite, folded, t)
        inside = (self.start <= x) & (x < self.end)
        hit = np.zeros(n, dtype=bool)
        hit[dev[inside]] = True
        return out | hit

    def online(self, d: int, t: float) -> bool:
        """Whether device ``d`` is online at time ``t``."""
        if not self.listed[d]:
            return True
        lo, hi = int(self.offsets[d]), int(self.offsets[d + 1])
        x, _ = self._local(d, t)
        i = lo + int(np.searchsorted(self.start[lo:hi], x, side="right")) - 1
        return i >= lo and x < self.end[i]

    def next_offline(self, d: int, t: float) -> float:
        """The first time ≥ ``t`` at which device ``d`` is offline (``t`` if it is offline
        at ``t``; inf if it never goes offline). :meth:`online` is False there, exactly: a
        periodic time folded back may round an ulp inside the interval, so the answer is
        moved up by ulps until it is not."""
        return _settle(self, d, float(self._next_offline(d, t)), want=False)

    def next_online(self, d: int, t: float) -> float:
        """The first time ≥ ``t`` at which device ``d`` is online (inf: never again);
        :meth:`online` is True there, exactly (as :meth:`next_offline`)."""
        return _settle(self, d, float(self._next_online(d, t)), want=True)

    def _next_offline(self, d: int, t: float) -> float:
        if not self.listed[d]:
            return math.inf
        lo, hi = int(self.offsets[d]), int(self.offsets[d + 1])
        x, base = self._local(d, t)
        i = lo + int(np.searchsorted(self.start[lo:hi], x, side="right")) - 1
        if i < lo or x >= self.end[i]:
            return t
        end = float(self.end[i])
        p = float(self.period[d])
        if math.isfinite(p) and end >= p and self.start[lo] <= 0.0:  # online over the wrap
            if hi - lo == 1:
                return math.inf  # [0, period): online all the time
            return base + p + float(self.end[lo])  # (the next period's first interval)
        return base + end

    def _next_online(self, d: int, t: float) -> float:
        if not self.listed[d] or self.online(d, t):
            return t
        lo, hi = int(self.offsets[d]), int(self.offsets[d + 1])
        if hi == lo:
            return math.inf
        x, base = self._local(d, t)
        j = lo + int(np.searchsorted(self.start[lo:hi], x, side="right"))
        if j < hi:
            return base + float(self.start[j])
        p = float(self.period[d])
        return base + p + float(self.start[lo]) if math.isfinite(p) else math.inf


class OnlineSet:
    """The devices online at a time that only moves forward (a run's clock): their flags,
    a Fenwick tree over them (how many are online; the k-th online device in index order,
    O(log D)) and a heap of each device's next change (:meth:`Availability.next_offline` /
    :meth:`~Availability.next_online`), so advancing costs O(changes · log D), not a pass
    over every device. Derived from the time alone: rebuilt at a resumed run's time, it
    holds what the uninterrupted run held."""

    def __init__(self, avail: Availability, t: float) -> None:
        import heapq

        self.avail, self.t = avail, float(t)
        on = avail.online_all(self.t)
        self.on = on.copy()
        n = len(on)
        self._size = n
        # Fenwick tree (1-based): node i sums the flags of (i − lowbit(i), i]
        idx = np.arange(1, n + 1)
        cs = np.concatenate([[0], np.cumsum(on, dtype=np.int64)])
        self._tree = [0, *(cs[idx] - cs[idx - (idx & -idx)]).tolist()]
        self._top = 1 << max(0, n.bit_length() - 1)
        # each listed device's next interval boundary after t, at most its next change (a
        # boundary where nothing changes, or one an ulp early, is checked when popped)
        heap: list[tuple[float, int]] = []
        rows = avail._rows
        if rows is not None and len(avail.start):
            dev, p, finite = rows
            with np.errstate(divide="ignore", invalid="ignore"):
                base = np.where(finite, np.floor(self.t / p) * p, 0.0)
            nxt = np.full(len(dev), np.inf)
            for b in (avail.start, avail.end):
                at = base + b
                at = np.where(at > self.t, at, np.where(finite, at + p, np.inf))
                nxt = np.minimum(nxt, at)
            counts = np.diff(avail.offsets)
            has = np.flatnonzero(counts > 0)
            first = np.minimum.reduceat(nxt, avail.offsets[has]) if len(has) else nxt[:0]
            keep = np.isfinite(first)
            heap = list(zip(first[keep].tolist(), has[keep].tolist(), strict=True))
            heapq.heapify(heap)
        self._heap = heap
        self.count = int(on.sum())

    def _add(self, i: int, delta: int) -> None:
        tree, n = self._tree, self._size
        i += 1
        while i <= n:
            tree[i] += delta
            i += i & -i

    def advance(self, t: float) -> None:
        """Apply every change at or before ``t`` (``t`` never earlier than the last)."""
        import heapq

        t = float(t)
        heap, avail = self._heap, self.avail
        while heap and heap[0][0] <= t:
            at, d = heapq.heappop(heap)
            now_on = avail.online(d, at)
            if now_on != self.on[d]:
                self.on[d] = now_on
                self._add(d, 1 if now_on else -1)
                self.count += 1 if now_on else -1
            nxt = avail.next_offline(d, at) if now_on else avail.next_online(d, at)
            if math.isfinite(nxt):
                heapq.heappush(heap, (nxt, d))
        self.t = max(self.t, t)

    def kth(self, k: int) -> int:
        """The k-th (0-based) online device in index order."""
        tree, pos, step, k = self._tree, 0, self._top, k + 1
        while step:
            nxt = pos + step
            if nxt <= self._size and tree[nxt] < k:
                pos = nxt
                k -= tree[nxt]
            step >>= 1
        return pos  # (1-based pos + 1 − 1)

    def next_change(self) -> float:
        """When the next device comes online or goes offline (inf: never)."""
        return self._heap[0][0] if self._heap else math.inf


def _settle(a: Availability, d: int, t: float, *, want: bool) -> float:
    """``t``, moved up by ulps until ``a.online(d, t)`` is ``want`` (a few at most)."""
    if not math.isfinite(t):
        return t
    for _ in range(64):
        if a.online(d, t) == want:
            return t
        t = math.nextafter(t, math.inf)
    raise AssertionError(f"availability of device {d} is inconsistent at {t!r}")


# --------------------------------------------------------------------- reading and writing
def _rows(path: Path, columns: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    """(line number, row) of a trace file; one sentence if it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{path} is not a trace file: it is not UTF-8 text.") from None
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise DataError(f"{path} could not be read ({reason}).") from None
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    if not lines or not lines[0].startswith(f"# fedclock-trace {FORMAT}"):
        raise DataError(
            f"{path} is not a fedclock trace of format {FORMAT} (its first line must be "
            f"'# fedclock-trace {FORMAT}: …')."
        )
    reader = csv.reader(lines[first:])
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header) != tuple(columns):
        raise DataError(
            f"{path} line {first + 1}: the header must be {','.join(columns)}, got "
            f"{','.join(header or [])[:120]!r}."
        )
    for k, row in enumerate(reader):
        line = first + 2 + k
        if not row:
            continue
        if len(row) != len(columns):
            raise DataError(f"{path} line {line}: {len(row)} fields, the header {len(columns)}.")
        yield line, dict(zip(columns, row, strict=True))


def _number(path: Path, line: int, name: str, text: str, *, empty: float) -> float:
    text = text.strip()
    if not text:
        return empty
    try:
        v = float(text)
    except ValueError:
        raise DataError(f"{path} line {line}: {name} {text[:30]!r} is not a number.") from None
    if not math.isfinite(v) or v < 0:
        raise DataError(f"{path} line {line}: {name} must be a finite number ≥ 0, got {text[:30]}.")
    return v


def read_trace(folder: Path) -> Trace:
    """The trace in ``folder`` (devices.csv and, if present, availability.csv)."""
    if not folder.is_dir():
        raise DataError(f"Trace folder {folder} does not exist (population.trace).")
    path = folder / DEVICES_FILE
    if not path.is_file():
        raise DataError(f"Trace folder {folder} has no {DEVICES_FILE}.")
    ids: list[str] = []
    flops: list[float] = []
    up: list[float] = []
    down: list[float] = []
    model: list[str] = []
    source: list[str] = []
    index: dict[str, int] = {}
    for line, r in _rows(path, DEVICE_COLUMNS):
        d = r["device_id"].strip()
        if not d:
            raise DataError(f"{path} line {line}: device_id is empty.")
        if d in index:
            raise DataError(f"{path} line {line}: device {d[:40]!r} is listed twice.")
        index[d] = len(ids)
        ids.append(d)
        f = _number(path, line, "flops_per_s", r["flops_per_s"], empty=math.nan)
        if f == 0:
            raise DataError(f"{path} line {line}: flops_per_s must be positive.")
        flops.append(f)
        for name, out in (("up_bytes_per_s", up), ("down_bytes_per_s", down)):
            v = _number(path, line, name, r[name], empty=math.inf)
            if v == 0:
                raise DataError(f"{path} line {line}: {name} must be positive (empty: free).")
            out.append(v)
        model.append(r["model"].strip())
        source.append(r["source"].strip())
    if not ids:
        raise DataError(f"{path} lists no device.")
    notes = _notes(path)
    avail = None
    apath = folder / AVAILABILITY_FILE
    if apath.is_file():
        rows = []
        for line, r in _rows(apath, AVAILABILITY_COLUMNS):
            at = index.get(r["device_id"].strip())
            if at is None:
                raise DataError(
                    f"{apath} line {line}: device {r['device_id'][:40]!r} is not in {DEVICES_FILE}."
                )
            s = _number(apath, line, "start_s", r["start_s"], empty=math.nan)
            e = _number(apath, line, "end_s", r["end_s"], empty=math.nan)
            p = _number(apath, line, "period_s", r["period_s"], empty=math.inf)
            if math.isnan(s) or math.isnan(e) or not e > s:
                raise DataError(f"{apath} line {line}: an interval needs start_s < end_s.")
            if p == 0 or (math.isfinite(p) and e - s > p):
                raise DataError(
                    f"{apath} line {line}: period_s must be positive and at least the interval."
                )
            rows.append((at, s, e, p))
        try:
            avail = Availability.from_rows(len(ids), rows)
        except ValueError as exc:
            raise DataError(f"{apath}: {exc}.") from None
        notes += _notes(apath)
    return Trace(ids, np.array(flops), np.array(up), np.array(down), model, source, avail,
                 notes)  # fmt: skip


def _notes(path: Path) -> list[str]:
    out = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.startswith("#"):
                break
            out.append(line[1:].strip())
    return out[2:]  # (the format line and the units line are the format's own)


def _fmt(v: float) -> str:
    return "" if not math.isfinite(v) else repr(float(v))


def write_trace(folder: Path, trace: Trace) -> None:
    """``folder/devices.csv`` and, with availability, ``folder/availability.csv``."""
    from fedclock.outputs import write_atomic

    folder.mkdir(parents=True, exist_ok=True)
    notes = "".join(f"# {n}\n" for n in trace.notes)
    buf = io.StringIO()
    buf.write(f"# fedclock-trace {FORMAT}: devices\n")
    buf.write("# units: flops_per_s in FLOP/s (empty: population.speed); up_bytes_per_s and "
              "down_bytes_per_s in bytes/s (empty: free)\n")  # fmt: skip
    buf.write(notes)
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(DEVICE_COLUMNS)
    for i, d in enumerate(trace.device_id):
        w.writerow([d, _fmt(trace.flops_per_s[i]), _fmt(trace.up_bytes_per_s[i]),
                    _fmt(trace.down_bytes_per_s[i]), trace.model[i], trace.source[i]])  # fmt: skip
    write_atomic(folder / DEVICES_FILE, buf.getvalue())
    a = trace.availability
    if a is None:
        return
    buf = io.StringIO()
    buf.write(f"# fedclock-trace {FORMAT}: availability\n")
    buf.write("# units: start_s, end_s and period_s in seconds of virtual time; online in "
              "[start_s, end_s) and, with period_s, every period_s after\n")  # fmt: skip
    buf.write(notes)
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(AVAILABILITY_COLUMNS)
    for k, dev in enumerate(trace.device_id):
        for i in range(int(a.offsets[k]), int(a.offsets[k + 1])):
            w.writerow([dev, repr(float(a.start[i])), repr(float(a.end[i])),
                        _fmt(float(a.period[k]))])  # fmt: skip
    write_atomic(folder / AVAILABILITY_FILE, buf.getvalue())


# --------------------------------------------------------------------- generated fleets
GENERATED = ("always", "bernoulli", "diurnal")


def generate_trace(
    devices: int,
    *,
    availability: str = "diurnal",
    seed: int = 0,
    slot_s: float = 3600.0,
    period_s: float = 86_400.0,
    online: float = 0.5,
    speed_median: float = 4.0e9,
    speed_sigma: float = 0.8,
    kbit_median: float = 5000.0,
    kbit_sigma: float = 1.0,
) -> Trace:
    """A synthetic fleet where no measured trace is at hand: speeds log-normal around
    ``speed_median`` FLOP/s (σ ``speed_sigma``; FedScale's are about 4e9 against the 6e8
    reference), links log-normal around ``kbit_median`` kbit/s (× 128 bytes/s, both ways),
    and availability in slots of ``slot_s`` over a ``period_s`` that repeats:

    - ``always``: every device always online (no availability.csv);
    - ``bernoulli``: each slot online with probability ``online``, independently;
    - ``diurnal``: each slot online with probability ``online``·(1 + 0.8·sin(2π(t/period +
      φ_d))), clipped to [0, 1], φ_d a device's uniform phase (time zones) — about
      ``online`` on average, mostly at one time of each device's day.

    Draws from ``numpy.random.default_rng(seed)`` in a fixed order."""
    if availability not in GENERATED:
        raise ValueError(f"unknown availability {availability!r}; allowed: {', '.join(GENERATED)}")
    if devices < 1 or not (0.0 < online <= 1.0) or not (0 < slot_s <= period_s):
        raise ValueError("need devices ≥ 1, 0 < online ≤ 1 and 0 < slot_s ≤ period_s")
    rng = np.random.default_rng(seed)
    flops = speed_median * rng.lognormal(0.0, speed_sigma, devices)
    bw = kbit_median * rng.lognormal(0.0, kbit_sigma, devices) * FEDSCALE_KBIT_BYTES
    avail = None
    if availability != "always":
        slots = max(1, round(period_s / slot_s))
        t = (np.arange(slots) + 0.5) / slots
        if availability == "bernoulli":
            p = np.full((devices, slots), online)
        else:
            phase = rng.uniform(0.0, 1.0, (devices, 1))
            p = np.clip(online * (1.0 + 0.8 * np.sin(2.0 * np.pi * (t[None, :] + phase))), 0.0, 1.0)
        on = rng.random((devices, slots)) < p
        rows = [
            (d, float(k * slot_s), float((k + 1) * slot_s), float(period_s))
            for d, k in zip(*np.nonzero(on), strict=True)
        ]
        avail = Availability.from_rows(devices, rows)
        # a device never online in its period would never train: online in its best slot
        never = np.flatnonzero(np.diff(avail.offsets) == 0)
        if len(never):
            best = np.argmax(p[never], axis=1)
            extra = [(int(d), float(k * slot_s), float((k + 1) * slot_s), float(period_s))
                     for d, k in zip(never, best, strict=True)]  # fmt: skip
            avail = Availability.from_rows(devices, rows + extra)
    notes = [
        f"source: generated (fedclock trace generate: {availability}, seed {seed}, "
        f"{devices} devices, slots of {slot_s:g} s over {period_s:g} s, online {online:g})",
        f"reference: speeds log-normal around {speed_median:g} FLOP/s (sigma {speed_sigma:g}); "
        f"links around {kbit_median:g} kbit/s x 128 bytes/s (sigma {kbit_sigma:g})",
    ]
    return Trace([f"g{i}" for i in range(devices)], flops, bw, bw.copy(), [""] * devices,
                 ["generated"] * devices, avail, notes)  # fmt: skip


# --------------------------------------------------------------------- importers
class _PlainUnpickler(pickle.Unpickler):
    """Builds only what pickle's own opcodes build (dicts, lists, tuples, strings, numbers):
    every class or function a pickle names is refused, so none is ever imported or called."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it names {module[:40]}.{name[:40]}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it refers to a persistent object")


_PLAIN = (dict, list, str, int, float)


def read_plain_pickle(path: Path) -> Any:
    """A pickle of dicts, lists, strings and numbers only; one sentence for anything else
    (nothing in it runs)."""
    try:
        with path.open("rb") as fh:
            data = _PlainUnpickler(fh).load()
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise DataError(f"{path} could not be read ({reason}).") from None
    except pickle.UnpicklingError as exc:
        raise DataError(
            f"{path} is refused: a trace pickle may hold only dicts, lists, strings and "
            f"numbers, and {exc}."
        ) from None
    except Exception as exc:  # (a damaged pickle: EOFError, ValueError, …)
        raise DataError(f"{path} is not a readable pickle ({type(exc).__name__}).") from None
    stack = [data]
    while stack:
        x = stack.pop()
        if isinstance(x, bool) or not isinstance(x, _PLAIN):
            raise DataError(
                f"{path} is refused: a trace pickle may hold only dicts, lists, strings and "
                f"numbers, and it holds a {type(x).__name__}."
            )
        if isinstance(x, dict):
            stack += list(x.keys()) + list(x.values())
        elif isinstance(x, list):
            stack += x
    return data


def from_fedscale(
    capacity: Path, behave: Path | None, reference_flops: float = FEDSCALE_REFERENCE_FLOPS
) -> Trace:
    """FedScale's ``client_device_capacity`` ({client_id: {'computation': ms per sample,
    'communication': kbit/s}}) and ``client_behave_trace`` ({client_id: {'active': [s],
    'inactive': [s], 'finish_time': s, 'model': str, …}}) as a trace: FLOP/s =
    ``reference_flops`` / (ms per sample / 1000) (FedScale trains at 3× the inference
    latency, as a model of that many inference FLOPs does in fedclock's cost model);
    bytes/s = kbit/s × 128, both ways; online in [active[i], inactive[i]] every finish_time
    (FedScale's is_active). A device without a behaviour trace is always online."""
    cap = read_plain_pickle(capacity)
    if not isinstance(cap, dict) or not cap:
        raise DataError(f"{capacity} is not FedScale's device capacity trace (a dict by client).")
    ids, flops, bw = [], [], []
    for key in sorted(cap, key=_sort_key):
        v = cap[key]
        if not (isinstance(v, dict) and _positive(v.get("computation"))
                and _positive(v.get("communication"))):  # fmt: skip
            raise DataError(
                f"{capacity}: client {str(key)[:40]} has no positive 'computation' (ms per "
                "sample) and 'communication' (kbit/s)."
            )
        ids.append(str(key))
        flops.append(reference_flops / (float(v["computation"]) / 1000.0))
        bw.append(float(v["communication"]) * FEDSCALE_KBIT_BYTES)
    index = {d: i for i, d in enumerate(ids)}
    models = [""] * len(ids)
    avail = None
    if behave is not None:
        trace = read_plain_pickle(behave)
        if not isinstance(trace, dict):
            raise DataError(
                f"{behave} is not FedScale's client behaviour trace (a dict by client)."
            )
        rows = []
        for key, v in trace.items():
            d = index.get(str(key))
            if d is None:
                continue  # (FedScale's behaviour trace covers fewer clients than its capacity)
            ok = (isinstance(v, dict) and isinstance(v.get("active"), list)
                  and isinstance(v.get("inactive"), list) and _positive(v.get("finish_time"))
                  and len(v["active"]) == len(v["inactive"]))  # fmt: skip
            if not ok:
                raise DataError(
                    f"{behave}: client {str(key)[:40]} has no 'active' and 'inactive' lists "
                    "of the same length and a positive 'finish_time'."
                )
            period = float(v["finish_time"])
            models[d] = str(v.get("model", ""))
            for s, e in zip(v["active"], v["inactive"], strict=True):
                if isinstance(s, int | float) and isinstance(e, int | float) and e > s:
                    rows.append((d, float(s), min(float(e), float(s) + period), period))
        avail = Availability.from_rows(len(ids), rows)
    notes = [
        f"source: FedScale client_device_capacity ({capacity.name})"
        + (f" and client_behave_trace ({behave.name})" if behave else ""),
        f"reference: flops_per_s = {reference_flops:g} FLOPs per sample ("
        + (
            "MobileNet-V2 inference, 224x224"
            if reference_flops == FEDSCALE_REFERENCE_FLOPS
            else "a model's inference, --reference-flops: its per-sample time is FedScale's"
        )
        + ") / FedScale's ms per sample; bytes/s = kbit/s x 128",
        "note: FedScale's speeds are one model's inference latency, the same ratio for every "
        "model (FedScale issue #6)",
    ]
    n = len(ids)
    return Trace(ids, np.array(flops), np.array(bw), np.array(bw), models, ["fedscale"] * n,
                 avail, notes)  # fmt: skip


def _sort_key(k: Any) -> tuple[int, Any]:
    return (0, k) if isinstance(k, int) else (1, str(k))


def _positive(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def from_flash(path: Path) -> Trace:
    """FLASH's user-behaviour JSON ({key: {'guid', 'model', 'messages'}}, each message
    ``YYYY-mm-dd HH:MM:SS<TAB>state``) as availability: a device is ready while locked,
    on Wi-Fi and charging (FLASH's rule, models/timer.py), its intervals measured from its
    first message and repeated every trace length (last − first message). FLASH gives no
    speeds: flops_per_s is left empty (``population.speed``), bandwidths free."""
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise DataError(f"{path} could not be read ({reason}).") from None
    except ValueError:
        raise DataError(f"{path} is not FLASH's user-behaviour JSON (not JSON).") from None
    users = data.values() if isinstance(data, dict) else data if isinstance(data, list) else None
    if users is None:
        raise DataError(f"{path} is not FLASH's user-behaviour JSON (a dict or list of users).")
    ids: list[str] = []
    models: list[str] = []
    rows: list[tuple[int, float, float, float]] = []
    for u in users:
        if not (isinstance(u, dict) and isinstance(u.get("guid"), str)
                and isinstance(u.get("messages"), str)):  # fmt: skip
            raise DataError(f"{path}: a user has no 'guid' and 'messages' strings.")
        ready, span = _flash_ready(path, u["guid"], u["messages"])
        if span <= 0:
            continue  # (FLASH drops such traces: trace_end = trace_start)
        d = len(ids)
        ids.append(u["guid"])
        models.append(str(u.get("model", "")))
        rows += [(d, s, e, span) for s, e in ready]
    if not ids:
        raise DataError(f"{path} holds no user with a usable trace.")
    n = len(ids)
    return Trace(
        ids, np.full(n, math.nan), np.full(n, math.inf), np.full(n, math.inf), models,
        ["flash"] * n, Availability.from_rows(n, rows),
        [f"source: FLASH user behaviour ({path.name}); ready = screen locked and Wi-Fi and "
         "charging; times from each device's first message, repeated every trace length"],
    )  # fmt: skip


def _flash_ready(path: Path, guid: str, messages: str) -> tuple[list[tuple[float, float]], float]:
    """A FLASH user's ready intervals (seconds from its first message) and trace length."""
    locked = wifi = charged = False
    t0: datetime | None = None
    last = 0.0
    start: float | None = None
    out = []
    for k, line in enumerate(messages.split("\n")):
        if not line.strip():
            continue
        try:
            stamp, state = (x.strip() for x in line.strip().split("\t"))
            at = datetime.strptime(stamp, FLASH_FORMAT)
        except ValueError:
            raise DataError(
                f"{path}: user {guid[:40]}'s message {k + 1} is not 'YYYY-mm-dd HH:MM:SS<TAB>state'."
            ) from None
        t0 = t0 or at
        t = (at - t0).total_seconds()
        last = t
        s = state.lower()
        if s == "battery_charged_on":
            charged = True
        elif s == "battery_charged_off":
            charged = False
        elif s == "wifi":
            wifi = True
        elif s in ("unknown", "2g", "3g", "4g", "5g"):
            wifi = False
        elif s == "screen_lock":
            locked = True
        elif s == "screen_unlock":
            locked = False
        ready = locked and wifi and charged
        if ready and start is None:
            start = t
        elif not ready and start is not None:
            if t > start:
                out.append((start, t))
            start = None
    return out, last
