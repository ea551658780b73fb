"""Cells of a comparison or sweep in parallel: local processes, or Ray tasks on a cluster.

A cell (one strategy × grid point × seed) is an independent run: it reads its config and
data, and writes only its own run folder. :class:`CellRunner` runs a list of them, ``jobs``
at a time, in worker processes (``backend="local"``, :mod:`concurrent.futures` with the
``spawn`` start method) or as Ray tasks (``backend="ray"``: a local Ray started with
``jobs`` CPUs, or the cluster at ``address``); ``compare`` / ``sweep`` then build their
tables from the run folders exactly as after a sequential run. A run's results do not depend
on where it ran: every random draw is keyed by the seed (``fedclock.rng``), not by a process.

With ``batch_runs`` N > 1 (run batching, :mod:`fedclock.runs.lockstep`) the unit of work is
a group of up to N cells advanced in lockstep in one process (in this process when ``jobs``
is 1, else one group per worker process or Ray task), cells that read the same data grouped
together. Locally without ``jobs``, as many groups run at once as there are cores (each
worker with one thread: measured on the SALF MLP grid, two single-threaded workers beat one
two-threaded process by 1.5×); a single group runs in this process.

A cell that raises (a worker killed, a node lost, an error) is tried once more (on its own);
if that fails too its error sentence is reported and the other cells go on. Each worker sets
torch's threads to its share of the cores (``executor.threads`` if the config sets it).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedclock.config import ExperimentConfig
from fedclock.errors import ConfigError, FedclockError, short
from fedclock.experiment import RunResult

BACKENDS = ("local", "ray")
MAX_JOBS = 4096  # --jobs and --batch-runs


@dataclass(frozen=True)
class Cell:
    label: str  # "fedavg seed 1", as the console names it
    cfg: ExperimentConfig
    run_dir: Path


@dataclass(frozen=True)
class CellFailure:
    """A cell that failed twice: its error in one sentence."""

    error: str


# on_event(kind, label, detail): "plan" (detail: the number of cells) | "groups" (run
# batching; detail: the lockstep groups' sizes) | "start" | "done" (detail: the RunResult) |
# "retry" | "failed" (detail: the error sentence)
OnEvent = Callable[[str, str, Any], None]


def run_one_cell(cfg: ExperimentConfig, run_dir: Path, threads: int) -> RunResult:
    """A cell in a worker: ``run_cell`` (goes on from a checkpoint if the cell has one) with
    ``threads`` torch threads; the history stays in the run folder (not sent back)."""
    import torch

    from fedclock.runs.cache import run_cell

    torch.set_num_threads(cfg.executor.threads or threads)
    result = run_cell(cfg, run_dir, None)
    return RunResult(run_dir=result.run_dir, summary=result.summary, history=[], error=result.error)


def run_cell_group(
    cells: Sequence[tuple[ExperimentConfig, Path]], threads: int | None
) -> list[RunResult | str]:
    """A group of cells in lockstep (in a worker, or in this process): each cell's result
    (history left in its run folder) or its error sentence."""
    import torch

    from fedclock.runs.lockstep import run_cells_together

    if threads is not None:
        torch.set_num_threads(cells[0][0].executor.threads or threads)
    out: list[RunResult | str] = []
    for r in run_cells_together(cells):
        if isinstance(r, RunResult):
            out.append(RunResult(run_dir=r.run_dir, summary=r.summary, history=[], error=r.error))
        else:
            out.append(_sentence(r))
    return out


def batch_workers(cells: int, batch_runs: int, jobs: int | None, backend: str, cpus: int) -> int:
    """How many lockstep groups run at once: ``jobs`` if given; on Ray all CPUs; locally, a
    group per core, no more workers than cells (1: the groups run one after another in this
    process). A group's Python work runs one thread at a time, so a core left without a
    group idles: 4 cells on 2 cores are 2 groups of 2, not one of 4."""
    if jobs is not None:
        return jobs
    if backend == "local":
        return max(1, min(cpus, cells))
    return cpus


#: how often a worker checks that the command that started it is still there
PARENT_POLL_S = 1.0


def _exit_with_parent(parent: int) -> None:
    """Ends this worker once its parent is gone (the command killed, e.g. by SIGTERM, which
    its workers do not receive): an orphan would go on computing a cell nobody collects.
    The cell's checkpoint stays, so the next command resumes or re-runs it."""
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent:
            os._exit(1)


def _worker_init(parent: int) -> None:
    """A worker process's cells reuse the data of its cell before (see ``DataReuse``), and
    it ends with the command that started it (``parent``: that command's PID, passed in, so
    a command killed while the worker was still starting is noticed too)."""
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    from fedclock import logs
    from fedclock.experiment import reuse_data

    logs.show()  # the command's -v ($FEDCLOCK_LOG_LEVEL, inherited)

    reuse_data()


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
        batch_runs: int = 1,
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigError(
                f"Unknown backend '{short(backend)}'; allowed: {', '.join(BACKENDS)}."
            )
        if jobs is not None and not 1 <= jobs <= MAX_JOBS:
            raise ConfigError(f"--jobs must be from 1 to {MAX_JOBS}.")
        if address is not None and backend != "ray":
            raise ConfigError("--address names a Ray cluster: give it with --backend ray.")
        if not 1 <= batch_runs <= MAX_JOBS:
            raise ConfigError(f"--batch-runs must be from 1 to {MAX_JOBS}.")
        self.backend, self.jobs, self.address, self.on_event = backend, jobs, address, on_event
        self.batch_runs = batch_runs

    def run(self, cells: Sequence[Cell]) -> dict[Path, RunResult | CellFailure]:
        if not cells:
            return {}
        self.on_event("plan", "", len(cells))
        tries = {c.run_dir: 0 for c in cells}
        if self.batch_runs > 1:
            out, todo = self._run_batched(cells, tries)
            if not todo:
                return out
            cells = todo  # the failed ones, once more on their own
        else:
            out = {}
        if self.backend == "local" and (self.jobs or 1) == 1 and self.batch_runs > 1:
            return {**out, **self._run_inline(cells, tries)}
        if self.backend == "ray":
            return {**out, **self._run_ray(cells, tries)}
        return {**out, **self._run_local(cells, tries)}

    # ------------------------------------------------------------------ run batching
    def _run_batched(
        self, cells: Sequence[Cell], tries: dict[Path, int]
    ) -> tuple[dict[Path, RunResult | CellFailure], list[Cell]]:
        """Every cell once, in lockstep groups; (results, the cells that failed)."""
        from fedclock.runs.lockstep import batch_groups, data_key

        # every worker gets a group: at most ⌈cells / workers⌉ runs in one
        cpus = os.cpu_count() or 1
        workers = batch_workers(len(cells), self.batch_runs, self.jobs, self.backend, cpus)
        size = max(1, min(self.batch_runs, -(-len(cells) // workers)))
        groups = batch_groups(cells, size, lambda c: data_key(c.cfg), workers)
        self.on_event("groups", "", [len(g) for g in groups])
        out: dict[Path, RunResult | CellFailure] = {}
        todo: list[Cell] = []

        def collect(group: list[Cell], results: Sequence[RunResult | str]) -> None:
            for cell, r in zip(group, results, strict=True):
                if isinstance(r, RunResult):
                    out[cell.run_dir] = r
                    self.on_event("done", cell.label, r)
                else:
                    self._failed(cell, _GroupError(r), tries, todo, out)

        def start(group: list[Cell]) -> None:
            for cell in group:
                tries[cell.run_dir] += 1
                self.on_event("start", cell.label, None)

        pairs = [[(c.cfg, c.run_dir) for c in g] for g in groups]
        if self.backend == "local" and workers == 1:  # group after group, here
            for group, cells_of in zip(groups, pairs, strict=True):
                start(group)
                collect(group, run_cell_group(cells_of, None))
            return out, todo
        for group in groups:  # every group submitted at once
            start(group)
        if self.backend == "local":
            jobs = min(workers, len(groups))
            threads = max(1, cpus // jobs)
            ctx = multiprocessing.get_context("spawn")
            with cf.ProcessPoolExecutor(
                max_workers=jobs,
                mp_context=ctx,
                initializer=_worker_init,
                initargs=(os.getpid(),),
            ) as pool:
                futures = {
                    pool.submit(run_cell_group, cells_of, threads): group
                    for group, cells_of in zip(groups, pairs, strict=True)
                }
                for future in cf.as_completed(futures):
                    group = futures[future]
                    try:
                        collect(group, future.result())
                    except Exception as exc:  # the worker died: the group's cells again
                        collect(group, [_sentence(exc)] * len(group))
        else:
            ray = self._ray()
            try:
                remote = ray.remote(num_cpus=1, max_retries=0)(run_cell_group)
                refs = {
                    remote.remote(cells_of, 1): group
                    for group, cells_of in zip(groups, pairs, strict=True)
                }
                pending = list(refs)
                while pending:
                    done, pending = ray.wait(pending, num_returns=1)
                    group = refs[done[0]]
                    try:
                        collect(group, ray.get(done[0]))
                    except Exception as exc:  # any failure of a Ray task (RayTaskError,
                        # a lost worker) is its cells' result: the other groups go on
                        cause = getattr(exc, "cause", None) or exc
                        collect(group, [_sentence(cause)] * len(group))
            finally:
                self._ray_done()
        return out, todo

    def _run_inline(
        self, cells: Sequence[Cell], tries: dict[Path, int]
    ) -> dict[Path, RunResult | CellFailure]:
        """Cells one after another in this process (a failed batched cell's second try)."""
        out: dict[Path, RunResult | CellFailure] = {}
        todo = list(cells)
        while todo:
            cell = todo.pop(0)
            tries[cell.run_dir] += 1
            self.on_event("start", cell.label, None)
            result = run_cell_group([(cell.cfg, cell.run_dir)], None)[0]
            if isinstance(result, RunResult):
                out[cell.run_dir] = result
                self.on_event("done", cell.label, result)
            else:
                self._failed(cell, _GroupError(result), tries, todo, out)
        return out

    # ------------------------------------------------------------------ local processes
    def _run_local(
        self, cells: Sequence[Cell], tries: dict[Path, int]
    ) -> dict[Path, RunResult | CellFailure]:
        jobs = min(self.jobs or os.cpu_count() or 1, len(cells))
        threads = max(1, (os.cpu_count() or 1) // jobs)
        out: dict[Path, RunResult | CellFailure] = {}
        todo = list(cells)
        ctx = multiprocessing.get_context("spawn")  # (fork would copy torch's thread pools)
        while todo:
            with cf.ProcessPoolExecutor(
                max_workers=jobs,
                mp_context=ctx,
                initializer=_worker_init,
                initargs=(os.getpid(),),
            ) as pool:
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
                    except Exception as exc:  # the cell's error or a dead worker
                        # (BrokenProcessPool): _failed retries or reports it, others go on
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
    def _ray(self) -> Any:
        """Ray, started (locally with ``jobs`` CPUs, or on ``address``) unless it runs."""
        try:
            import ray
        except ImportError:
            raise ConfigError(
                "--backend ray needs Ray: pip install 'fedclock[ray]' (or pip install ray)."
            ) from None
        self._started = not ray.is_initialized()
        if self._started:
            if self.address is not None:
                ray.init(address=self.address, log_to_driver=False)
            else:
                ray.init(
                    num_cpus=self.jobs or os.cpu_count(), include_dashboard=False,
                    log_to_driver=False, configure_logging=False,
                )  # fmt: skip
        return ray

    def _ray_done(self) -> None:
        if getattr(self, "_started", False):
            import ray

            ray.shutdown()
            self._started = False

    def _run_ray(
        self, cells: Sequence[Cell], tries: dict[Path, int]
    ) -> dict[Path, RunResult | CellFailure]:
        ray = self._ray()
        try:
            remote = ray.remote(num_cpus=1, max_retries=0)(run_one_cell)
            out: dict[Path, RunResult | CellFailure] = {}
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
                    except Exception as exc:  # as above, from a Ray task
                        cause = getattr(exc, "cause", None) or exc
                        self._failed(cell, cause, tries, todo, out)
            return out
        finally:
            self._ray_done()


class _GroupError(FedclockError):
    """A cell's error sentence, as a batched group reported it."""
