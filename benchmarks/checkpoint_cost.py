"""What a checkpoint costs: seconds per write, file size, and the overhead of a run.

Each workload is a ``fedclock`` config run twice through :func:`fedclock.experiment.
run_experiment`: without checkpoints, and with one every ``every`` server steps (a far denser
cadence than the default, one per 60 wall seconds, to time many writes). The write time is
measured around :meth:`fedclock.sim.checkpoint.Checkpointer.save` (state capture, torch.save,
fsync, rename); the run-time overhead at the default cadence is that time over 60 s.

- ``digits-fedbuff``: the default experiment's data and MLP, 24 clients, FedBuff (m = 4);
- ``digits-sync-deadline``: the same with synchronous rounds under a 3 s deadline;
- ``synthetic-fedbuff-1000``: 1,000 clients of synthetic data, MLP 64, FedBuff with 100
  training at once — many tasks in flight, each holding its base model version.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fedclock.config import load_config
from fedclock.experiment import run_experiment
from fedclock.sim import checkpoint

_DEMO = ["data.name=digits", "model.arch=mlp", "model.hidden=[64]", "executor.threads=2"]
WORKLOADS: dict[str, tuple[list[str], int]] = {
    "digits-fedbuff": (
        [*_DEMO, "strategy.name=fedbuff", "strategy.buffer_size=4", "budget.virtual_time=120"],
        5,
    ),
    "digits-sync-deadline": (
        [*_DEMO, "strategy.name=drop-stragglers", "strategy.t_max=3.0"],
        2,
    ),
    "synthetic-fedbuff-1000": (
        [
            "data.name=synthetic", "partition.num_clients=1000", "model.arch=mlp",
            "model.hidden=[64]", "strategy.name=fedbuff", "strategy.buffer_size=10",
            "strategy.concurrency=100", "budget.aggregations=300", "eval.every_aggregations=50",
            "executor.threads=2",
        ],
        20,
    ),
}  # fmt: skip


def _config(overrides: list[str], every: int | None) -> Any:
    """The default experiment (``demo``) with ``overrides``, checkpoints every ``every``."""
    from fedclock.presets import load_preset

    raw = load_preset("demo")
    raw.pop("compare", None)
    raw["strategy"] = {"name": "fedavg"}
    ck = [f"checkpoint.every_aggregations={every or 'null'}", "checkpoint.every_seconds=null"]
    return load_config(raw=raw, overrides=[*overrides, *ck])


def _one(name: str, quick: bool) -> dict[str, object]:
    overrides, every = WORKLOADS[name]
    if quick:
        overrides = [*overrides, "budget.virtual_time=20", "budget.aggregations=20"]
        every = min(every, 5)
    saves: list[float] = []
    sizes: list[int] = []
    real_save = checkpoint.Checkpointer.save

    def timed(self: checkpoint.Checkpointer, sim: Any) -> None:
        t0 = time.perf_counter()
        real_save(self, sim)
        saves.append(time.perf_counter() - t0)
        sizes.append(self.path.stat().st_size)

    with tempfile.TemporaryDirectory() as tmp:
        run_experiment(_config(overrides, None), run_dir=Path(tmp) / "warm-up")  # data, caches
        t0 = time.perf_counter()
        plain = run_experiment(_config(overrides, None), run_dir=Path(tmp) / "plain")
        wall_plain = time.perf_counter() - t0
        checkpoint.Checkpointer.save = timed  # type: ignore[method-assign]
        try:
            t0 = time.perf_counter()
            run_experiment(_config(overrides, every), run_dir=Path(tmp) / "ckpt")
            wall_ckpt = time.perf_counter() - t0
        finally:
            checkpoint.Checkpointer.save = real_save  # type: ignore[method-assign]
    write_s = statistics.median(saves) if saves else float("nan")
    return {
        "aggregations": plain.summary["aggregations"],
        "every_aggregations": every,
        "checkpoints": len(saves),
        "write_ms_median": round(1000 * write_s, 2),
        "write_ms_max": round(1000 * max(saves), 2) if saves else None,
        "size_mb_median": round(statistics.median(sizes) / 2**20, 3) if sizes else None,
        "size_mb_max": round(max(sizes) / 2**20, 3) if sizes else None,
        "run_s_without": round(wall_plain, 2),
        "run_s_with": round(wall_ckpt, 2),
        "overhead_at_60s_percent": round(100 * write_s / 60.0, 3),
    }


def run(*, quick: bool = False, repeats: int = 3) -> dict[str, object]:
    from benchmarks.common import machine

    return {
        "machine": machine(),
        "workloads": {name: _one(name, quick) for name in WORKLOADS},
    }


def rows(r: dict[str, object]) -> list[tuple[str, str]]:
    out = []
    workloads: dict[str, dict[str, Any]] = r["workloads"]  # type: ignore[assignment]
    for name, w in workloads.items():
        out.append(
            (
                name,
                f"{w['checkpoints']} writes, {w['write_ms_median']} ms (max {w['write_ms_max']}), "
                f"{w['size_mb_median']} MB (max {w['size_mb_max']}); "
                f"run {w['run_s_without']} s → {w['run_s_with']} s; "
                f"{w['overhead_at_60s_percent']} % at one per minute",
            )
        )
    return out
