"""Cells of a comparison or sweep in parallel: local processes, or Ray tasks on a cluster.

A cell (one strategy × grid point × seed) is an independent run: it reads its config and
data, and writes only its own run folder. :class:`CellRunner` runs a list of them, ``jobs``
at a time, in worker processes (``backend="local"``, :mod:`concurrent.futures` with the
``spawn`` start method) or as Ray tasks (``backend="ray"``: a local Ray started with
``jobs`` CPUs, or the cluster at ``address``); ``compare`` / ``sweep`` then build their
tables from the run folders exactly as after a sequential run. A run's results do not depend
on where it ran: every random draw is keyed by the seed (``fedclock.rng``), not by a process.

A cell that raises (a worker killed, a node lost, an error) is tried once more; if that
fails too its error sentence is reported and the other cells go on. Each worker sets
torch's threads to its share of the cores (``executor.threads`` if the config sets it).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedclock.config import ExperimentConfig
from fedclock.errors import ConfigError, FedclockError
from fedclock.experiment import RunResult

BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class Cell:
    label: str  # "fedavg seed 1", as the console names it
    cfg: ExperimentConfig
    run_dir: Path


@dataclass(frozen=True)
class CellFailure:
    """A cell that failed twice: its error in one sentence."""

    error: str


# on_event(kind, label, detail): "plan" (detail: the number of cells) | "start" | "done"
# (detail: the RunResult) | "retry" | "failed" (detail: the error sentence)
OnEvent = Callable[[str, str, Any], None]


def run_one_cell(cfg: ExperimentConfig, run_dir: Path, threads: int) -> RunResult:
    """A cell in a worker: ``run_cell`` (goes on from a checkpoint if the cell has one) with
    ``threads`` torch threads; the history stays in the run folder (not sent back)."""
    import torch

    from fedclock.runs.cache import run_cell

    torch.set_num_threads(cfg.executor.threads or threads)
    result = run_cell(cfg, run_dir, None)
    return RunResult(run_dir=result.run_dir, summary=result.summary, history=[], error=result.error)


def _sentence(exc: BaseException) -> str:
    if isinstance(exc, FedclockError):
        return str(exc)
    text = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
    return f"{type(exc).__name__}{': ' + text if text else ''}".rstrip(".") + "."


class CellRunner:
    """Runs cells ``jobs`` at a time on ``backend`` (see the module doc)."""

    def __init__(
        self,
        backend: str = "local",
        jobs: int | None = None,
        *,
        address: str | None = None,
        on_event: OnEvent = lambda kind, label, detail: None,
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"Unknown backend '{backend}'; allowed: {', '.join(BACKENDS)}.")
        if jobs is not None and jobs < 1:
            raise ConfigError("--jobs must be at least 1.")
        if address is not None and backend != "ray":
            raise ConfigError("--address names a Ray cluster: give it with --backend ray.")
        self.backend, self.jobs, self.address, self.on_event = backend, jobs, address, on_event

    def run(self, cells: Sequence[Cell]) -> dict[Path, RunResult | CellFailure]:
        if not cells:
            return {}
        self.on_event("plan", "", len(cells))
        if self.backend == "ray":
            return self._run_ray(cells)
        return self._run_local(cells)

    # ------------------------------------------------------------------ local processes
    def _run_local(self, cells: Sequence[Cell]) -> dict[Path, RunResult | CellFailure]:
        jobs = min(self.jobs or os.cpu_count() or 1, len(cells))
        threads = max(1, (os.cpu_count() or 1) // jobs)
        out: dict[Path, RunResult | CellFailure] = {}
        tries = {c.run_dir: 0 for c in cells}
        todo = list(cells)
        ctx = multiprocessing.get_context("spawn")  # (fork would copy torch's thread pools)
        while todo:
            with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
                running: dict[cf.Future[RunResult], Cell] = {}
                for cell in todo:
                    tries[cell.run_dir] += 1
                    self.on_event("start", cell.label, None)
                    running[pool.submit(run_one_cell, cell.cfg, cell.run_dir, threads)] = cell
                todo = []  # (a killed worker breaks the pool: its cells start again in a new one)
                for future in cf.as_completed(running):
                    cell = running[future]
                    try:
                        out[cell.run_dir] = result = future.result()
                        self.on_event("done", cell.label, result)
                    except Exception as exc:
                        self._failed(cell, exc, tries, todo, out)
        return out

    def _failed(
        self,
        cell: Cell,
        exc: BaseException,
        tries: dict[Path, int],
        todo: list[Cell],
        out: dict[Path, RunResult | CellFailure],
    ) -> None:
        sentence = _sentence(exc)
        if tries[cell.run_dir] < 2:
            self.on_event("retry", cell.label, sentence)
            todo.append(cell)
        else:
            out[cell.run_dir] = CellFailure(f"{cell.label}: {sentence}")
            self.on_event("failed", cell.label, sentence)

    # ------------------------------------------------------------------ Ray
    def _run_ray(self, cells: Sequence[Cell]) -> dict[Path, RunResult | CellFailure]:
        try:
            import ray
        except ImportError:
            raise ConfigError(
                "--backend ray needs Ray: pip install 'fedclock[ray]' (or pip install ray)."
            ) from None
        started = not ray.is_initialized()
        if started:
            if self.address is not None:
                ray.init(address=self.address, log_to_driver=False)
            else:
                ray.init(
                    num_cpus=self.jobs or os.cpu_count(), include_dashboard=False,
                    log_to_driver=False, configure_logging=False,
                )  # fmt: skip
        try:
            remote = ray.remote(num_cpus=1, max_retries=0)(run_one_cell)
            out: dict[Path, RunResult | CellFailure] = {}
            tries = {c.run_dir: 0 for c in cells}
            todo = list(cells)
            while todo:
                refs = {}
                for cell in todo:
                    tries[cell.run_dir] += 1
                    self.on_event("start", cell.label, None)
                    refs[remote.remote(cell.cfg, cell.run_dir, 1)] = cell
                todo = []
                pending = list(refs)
                while pending:
                    done, pending = ray.wait(pending, num_returns=1)
                    cell = refs[done[0]]
                    try:
                        out[cell.run_dir] = result = ray.get(done[0])
                        self.on_event("done", cell.label, result)
                    except Exception as exc:
                        cause = getattr(exc, "cause", None) or exc
                        self._failed(cell, cause, tries, todo, out)
            return out
        finally:
            if started:
                ray.shutdown()
