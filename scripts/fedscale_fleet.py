"""A synthetic fleet written in FedScale's exact trace layout (two pickles), for runs that
want FedScale's format where its real files are not at hand (their terms: research use
only; docs/traces.md says where to get them).

    python scripts/fedscale_fleet.py --clients 200 --seed 0 --out traces/fleet-pickles
    fedclock trace import fedscale traces/fleet-pickles/client_device_capacity \\
        traces/fleet-pickles/client_behave_trace --reference-flops 3.2e5 --out traces/fleet

``client_device_capacity``: {client id: {'computation': ms per sample, 'communication':
kbit/s}}; ``client_behave_trace``: {client id: {'duration', 'inactive', 'finish_time',
'active', 'model'}} — online in [active[i], inactive[i]) and again every ``finish_time``
seconds, as FedScale's ``is_active`` reads it. Client ids start at 1, as FedScale's.

The distributions are ours, not FedScale's data: per-sample latency log-normal around
``--ms`` (σ 0.8), links log-normal around ``--kbit`` (σ 1.0), and for each client a day
(``--period``) of alternating offline gaps and online sessions, exponential with means
``--offline`` and ``--online`` seconds (a random start in the cycle); ``--always`` of the
clients (FedScale's behaviour trace covers fewer clients than its capacity trace) get no
behaviour entry: always online.
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

import numpy as np

MODELS = ("SM-G950F", "Pixel 3", "SM-A505F", "Redmi Note 8", "iPhone X", "SM-J730G")


def fleet(
    clients: int,
    seed: int,
    *,
    ms: float,
    kbit: float,
    online: float,
    offline: float,
    period: float,
    always: float,
) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, object]]]:
    """The two dictionaries FedScale pickles (capacity, behaviour)."""
    rng = np.random.default_rng(seed)
    comp = ms * rng.lognormal(0.0, 0.8, clients)
    comm = kbit * rng.lognormal(0.0, 1.0, clients)
    capacity = {
        i + 1: {"computation": round(float(comp[i]), 3), "communication": round(float(comm[i]), 1)}
        for i in range(clients)
    }
    behave: dict[int, dict[str, object]] = {}
    for i in range(clients):
        if rng.random() < always:
            continue
        active: list[float] = []
        inactive: list[float] = []
        t = float(rng.uniform(0.0, offline))  # where in its cycle the day starts
        while t < period:
            end = min(period, t + float(rng.exponential(online)))
            if end - t >= 1.0:
                active.append(round(t, 1))
                inactive.append(round(end, 1))
            t = end + float(rng.exponential(offline))
        if not active:  # every device is online some time of its day
            active, inactive = [0.0], [round(online, 1)]
        behave[i + 1] = {
            "duration": period,
            "inactive": inactive,
            "finish_time": period,
            "active": active,
            "model": MODELS[int(rng.integers(len(MODELS)))],
        }
    return capacity, behave


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ms", type=float, default=100.0, help="median latency, ms per sample")
    ap.add_argument("--kbit", type=float, default=5000.0, help="median link rate, kbit/s")
    ap.add_argument("--online", type=float, default=2400.0, help="mean online session, s")
    ap.add_argument("--offline", type=float, default=1800.0, help="mean offline gap, s")
    ap.add_argument("--period", type=float, default=86400.0, help="the cycle, s (a day)")
    ap.add_argument("--always", type=float, default=0.1, help="share always online")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    capacity, behave = fleet(
        a.clients, a.seed, ms=a.ms, kbit=a.kbit, online=a.online, offline=a.offline,
        period=a.period, always=a.always,
    )  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "client_device_capacity").write_bytes(pickle.dumps(capacity))
    (a.out / "client_behave_trace").write_bytes(pickle.dumps(behave))
    print(f"{len(capacity)} clients ({len(behave)} with a behaviour trace) in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
