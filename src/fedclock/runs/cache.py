"""The cache of finished runs: a cell whose run folder holds a finished run with the same
config, fedclock version and source is reused, so an interrupted comparison or sweep resumes
where it stopped; a finished run that cannot be reused is re-run, and
:func:`stale_reason` says why."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedclock.config import ExperimentConfig, to_yaml
from fedclock.errors import CheckpointError
from fedclock.experiment import RunResult, run_experiment


def _finished(
    run_dir: Path, cfg: ExperimentConfig, accept: tuple[str, ...]
) -> tuple[dict[str, Any] | None, str | None]:
    """(summary, None) if the run in ``run_dir`` can be reused for ``cfg``; (None, why not)
    if a run there cannot; (None, None) if there is no finished run."""
    from fedclock import __version__
    from fedclock.metrics.recorder import source_digest, verify_files

    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        meta = json.loads((run_dir / "meta.json").read_text())
        config = (run_dir / "config.yaml").read_text()
    except (OSError, ValueError):
        return None, None
    made_by = meta.get("versions", {}).get("fedclock")
    if config != to_yaml(cfg):
        return None, "its config differs"
    if made_by != __version__:
        return None, f"it was made by fedclock {made_by}"
    # runs recorded before meta.json had source_digest match on the version alone
    if meta.get("source_digest", source_digest()) != source_digest():
        return None, "it was made by other fedclock source (the code changed since)"
    if summary.get("status") not in accept:
        return None, f"it ended {summary.get('status')}"
    changed = verify_files(run_dir)
    if changed is not None:  # (edited, truncated or replaced after it finished)
        return None, changed
    # summary.json is written last, so its files are whole; a checkpoint beside it was
    # about to be removed when the process was killed (no run goes on from it)
    if summary.get("status") in ("completed", "diverged"):
        from fedclock.sim.checkpoint import CHECKPOINT_FILE

        (run_dir / CHECKPOINT_FILE).unlink(missing_ok=True)
    return summary, None


def reusable(
    run_dir: Path, cfg: ExperimentConfig, accept: tuple[str, ...] = ("completed",)
) -> dict[str, Any] | None:
    """The stored summary of a finished run with exactly this config, fedclock version and
    source (``meta.json``'s ``source_digest``), whose status is in ``accept``; else None."""
    return _finished(run_dir, cfg, accept)[0]


RESUMING = "it was interrupted: going on from its checkpoint"


def stale_reason(
    run_dir: Path, cfg: ExperimentConfig, accept: tuple[str, ...] = ("completed",)
) -> str | None:
    """Why a finished run in ``run_dir`` is not reused for ``cfg`` (None: no run there, or
    it is reusable) — the console says it before running the cell (again, or on from its
    checkpoint)."""
    if resumable(run_dir, cfg):
        return RESUMING
    return _finished(run_dir, cfg, accept)[1]


def resumable(run_dir: Path, cfg: ExperimentConfig) -> bool:
    """Whether ``run_dir`` holds an unfinished run of ``cfg`` with a checkpoint made by this
    fedclock source (then the cell goes on from it instead of starting again)."""
    from fedclock import __version__
    from fedclock.metrics.recorder import source_digest
    from fedclock.sim.checkpoint import CHECKPOINT_FILE

    if not (run_dir / CHECKPOINT_FILE).is_file():
        return False
    try:
        meta = json.loads((run_dir / "meta.json").read_text())
        config = (run_dir / "config.yaml").read_text()
    except (OSError, ValueError):
        return False
    return (
        config == to_yaml(cfg)
        and meta.get("versions", {}).get("fedclock") == __version__
        and meta.get("source_digest") == source_digest()
    )


def run_cell(
    cfg: ExperimentConfig,
    run_dir: Path,
    progress: Callable[[Any], None] | None,
    *,
    lockstep: tuple[Any, int] | None = None,
) -> RunResult:
    """``run_experiment`` for one cell of a comparison or sweep — on from its checkpoint when
    an interrupted run of it left one — then a full garbage collection.

    A finished run leaves reference cycles (its models, tasks and contributions) that only
    Python's full collection frees, and those passes are rare: without this a command running
    many cells held every finished run's tensors (measured: about 200 MB more per MNIST run,
    16 GB after a few dozen). ``lockstep``: see :func:`~fedclock.experiment.run_experiment`.
    """
    resume = resumable(run_dir, cfg)
    try:
        result = run_experiment(
            cfg, run_dir=run_dir, progress=progress, resume=resume, lockstep=lockstep
        )
    except CheckpointError:
        if not resume:
            raise
        # a damaged checkpoint (or metrics.csv shorter than it): the cell starts again
        result = run_experiment(cfg, run_dir=run_dir, progress=progress, lockstep=lockstep)
    gc.collect()
    return result
