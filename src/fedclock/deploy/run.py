"""One deployment run: the experiment's strategy on real devices, into the usual run folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedclock.config import ExperimentConfig
from fedclock.deploy.driver import RealTimeDriver, Transport
from fedclock.experiment import RunResult, run_experiment
from fedclock.models.shapes import Suffix

#: what summary.json's ``deployment`` holds beside the usual keys
DEPLOYMENT_KEY = "deployment"


def deployable(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` as a deployment runs it: no checkpoints (a deployment is not resumed: its
    devices' state is theirs) and the serial executor (the server trains nothing)."""
    return cfg.model_copy(
        update={
            "checkpoint": cfg.checkpoint.model_copy(
                update={"every_aggregations": None, "every_seconds": None}
            ),
            "executor": cfg.executor.model_copy(update={"kind": "serial"}),
        }
    )


def deploy(
    cfg: ExperimentConfig,
    run_dir: Path,
    transport: Transport,
    *,
    engine_name: str,
    argv: list[str] | None = None,
    progress: Any = None,
    round_timeout_s: float | None = None,
) -> RunResult:
    """Run ``cfg``'s strategy on the devices behind ``transport`` in real time: a deadline
    (the trigger's t_max) travels to each device as its budget; SALF's devices may cut their
    work to a layer suffix to meet it. ``round_timeout_s``: a task without a reply that long
    after its dispatch is given up as lost (:class:`RealTimeDriver`)."""
    holder: dict[str, RealTimeDriver] = {}

    def engine(**kwargs: Any) -> RealTimeDriver:
        strategy = kwargs["strategy"]
        t_max = getattr(strategy.trigger, "t_max", None)
        cut = "suffix" if Suffix in strategy.needs.shapes else "none"
        driver = RealTimeDriver(
            transport=transport, budget_s=t_max, cut=cut, round_timeout_s=round_timeout_s,
            on_finish=lambda d: strategy.summary.update({DEPLOYMENT_KEY: report(d, engine_name)}),
            **kwargs,
        )  # fmt: skip
        holder["driver"] = driver
        return driver

    return run_experiment(
        deployable(cfg), run_dir=run_dir, argv=argv, engine=engine, progress=progress
    )


def report(driver: RealTimeDriver, engine_name: str) -> dict[str, Any]:
    """What a deployment adds to summary.json: the engine, each device's measured speed and
    link (its last task's: FLOPs ÷ its compute time; bytes ÷ the time between dispatch and
    reply the device was not busy), the replies rejected (and why) and those that came after
    their task was closed. ``fedclock trace export`` writes the measured fleet as a trace."""
    return {
        "engine": engine_name,
        "clock": "wall",
        "round_timeout_s": driver.round_timeout_s,
        "device_flops_per_s": {str(c): s for c, s in sorted(driver.speeds.items())},
        "device_link_bytes_per_s": {str(c): b for c, b in sorted(driver.links.items())},
        "rejected": [{"task_id": t, "client": c, "reason": why} for t, c, why in driver.rejections],
        "late_replies": driver.late_replies,
    }
