"""Build an experiment from its config and run it: the one place where the parts meet.

ExperimentConfig → Dataset → partition → model (layers, FLOPs) → population
→ strategy → Simulator(executor, evaluator) → run directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fedclock.config import ExperimentConfig, to_yaml
from fedclock.data import SyntheticSpec, TextSpec, load_dataset, partition
from fedclock.data.datasets import SEEDED_DATASETS
from fedclock.data.transforms import authors_normalization, holdout_split
from fedclock.devices import Population, build_population
from fedclock.devices.cost import TaskCost
from fedclock.devices.topology import also_trees, build_tree
from fedclock.errors import CheckpointError, ConfigError, DivergenceError
from fedclock.metrics.recorder import CLIENT_LOSS_COLUMNS, RunRecorder, source_digest, summarize
from fedclock.models import build_model, layer_view, param_bytes
from fedclock.models.early_exit import EarlyExitNet, MultiExitLoss
from fedclock.rng import torch_seed
from fedclock.sim.checkpoint import (
    CHECKPOINT_FILE,
    Checkpointer,
    restore,
    stop_on_sigint,
)
from fedclock.sim.checkpoint import read as read_checkpoint
from fedclock.sim.guard import FaultInjector, UpdateGuard
from fedclock.sim.simulator import Budget, Simulator
from fedclock.sim.types import ModelVersion
from fedclock.strategies import BuildInfo, Strategy, build_strategy, client_importance
from fedclock.train.evaluate import BestValidation, ClientLossEvaluator, Evaluator, ExitEvaluator
from fedclock.train.executor import ClientData, snapshot
from fedclock.train.factory import make_executor, resolve_device
from fedclock.train.local import CrossEntropy, LocalTraining

if TYPE_CHECKING:
    from fedclock.data.dataset import Dataset


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    history: list[dict[str, Any]]
    error: str | None = None  # one sentence when the run diverged or was interrupted


def default_run_dir(cfg: ExperimentConfig) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.output_dir) / f"{cfg.name}-{cfg.strategy.name}-{stamp}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


#: parameters of the largest model a run may build (4 GB a copy as float32; a run holds
#: several copies): a bigger one is a mistake in the model's sizes
MAX_PARAMETERS = 1_000_000_000


def check_model_size(new_model: Callable[[], torch.nn.Module], arch: str) -> None:
    """One sentence, before anything is allocated, when the model is too large to hold: it
    is built on the meta device (shapes only) and its parameters counted."""
    with torch.device("meta"):
        probe = new_model()
    n = sum(p.numel() for p in probe.parameters())
    if n > MAX_PARAMETERS:
        raise ConfigError(
            f"Model {arch} with these sizes has {n:.3g} parameters, more than the "
            f"{MAX_PARAMETERS:.0e} a run can hold; make its widths (model.hidden, "
            "model.channels, ...) smaller."
        )


def check_deadline(strategy: Strategy, population: Population, cfg: ExperimentConfig) -> None:
    """An impossible deadline fails before any compute: no client could ever deliver."""
    t_max = strategy.needs.deadline  # the deadline the strategy declares
    if t_max is None:
        return
    best = math.inf
    for client in range(len(population)):
        plan_cost: TaskCost = strategy.planner.nominal(client)[1]
        timing = population.nominal_timing(client, plan_cost)
        # with a random slowdown the compute can shrink, communication cannot
        floor = (
            timing.duration if population.slowdown_kind == "none" else timing.down_s + timing.up_s
        )
        best = min(best, floor)
    if t_max < best:
        what = (
            "one task (download, local training, upload)"
            if population.slowdown_kind == "none"
            else "its model download and upload alone"
        )
        raise ConfigError(
            f"strategy.t_max = {t_max:g} s is impossible: the fastest client needs at least "
            f"{best:.4g} virtual seconds for {what}, so no update could ever arrive."
        )


def _validation_schedule(
    evaluator: object, every: int | None
) -> Callable[[ModelVersion, int], None] | None:
    """Validate every ``every`` aggregations (``eval.val_every_aggregations``)."""
    if every is None or not isinstance(evaluator, BestValidation):
        return None

    def validate(version: ModelVersion, aggregations: int) -> None:
        if aggregations % every == 0:
            evaluator.validate(version)

    return validate


def client_table(
    sim: Simulator, strategy: Strategy, population: Population, importance: Any
) -> dict[str, Any]:
    """clients.csv columns: importance p_i, nominal update time τ_i, participations,
    total weight received and its normalised share q̃_i, and the last training loss."""
    n = len(population)
    tau = [population.nominal_timing(c, strategy.planner.nominal(c)[1]).duration for c in range(n)]
    received = sim.per_client(sim.counters.weight_received)
    total = float(received.sum())
    cols: dict[str, Any] = {
        "client": list(range(n)),
        "num_samples": [int(v) for v in sim.client_sizes],
        "importance": [float(v) for v in importance],
        "tau_nominal": tau,
        "participations": [int(v) for v in sim.per_client(sim.counters.participation)],
        "weight_received": [float(v) for v in received],
        "q_share": [float(v) / total if total > 0 else math.nan for v in received],
    }
    if sim.last_client_losses is not None:
        cols["final_train_loss"] = [float(v) for v in sim.last_client_losses]
    return cols


def _guard(cfg: ExperimentConfig) -> UpdateGuard | None:
    g = cfg.guard
    if not g.reject_nonfinite and g.max_update_norm is None:
        return None
    return UpdateGuard(reject_nonfinite=g.reject_nonfinite, max_norm=g.max_update_norm)


def _faults(cfg: ExperimentConfig, num_clients: int) -> FaultInjector | None:
    f = cfg.population.faults
    if f.fraction == 0:
        return None
    return FaultInjector(f.fraction, f.kind, f.scale, num_clients, cfg.seed)


def checkpoint_header(cfg: ExperimentConfig) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: fedclock's version and source, the config."""
    from fedclock import __version__

    return {
        "fedclock": __version__,
        "source_digest": source_digest(),
        "config_sha256": hashlib.sha256(to_yaml(cfg).encode()).hexdigest(),
    }


def check_resumable(payload: dict[str, Any], header: dict[str, Any], run_dir: Path) -> None:
    """One sentence when the checkpoint in ``run_dir`` was made by other code or config."""
    if payload.get("config_sha256") != header["config_sha256"]:
        raise CheckpointError(
            f"The checkpoint in {run_dir} was made for another config than this run's, so it "
            "cannot be resumed; run it again without --resume (or in another folder)."
        )
    if (payload.get("fedclock"), payload.get("source_digest")) != (
        header["fedclock"],
        header["source_digest"],
    ):
        raise CheckpointError(
            f"The checkpoint in {run_dir} was made by other fedclock source (version "
            f"{payload.get('fedclock')}), so resuming it would not give the same run; run it "
            "again without --resume."
        )


def _chain(
    progress: Callable[[Simulator], None] | None, checkpointer: Checkpointer
) -> Callable[[Simulator], None]:
    if progress is None:
        return checkpointer

    def on_event(sim: Simulator) -> None:
        progress(sim)
        checkpointer(sim)

    return on_event


def _run_and_record(
    sim: Simulator, cfg: ExperimentConfig, recorder: RunRecorder, run_dir: Path, wall0: float
) -> tuple[dict[str, Any], str | None]:
    """Run the simulator; (summary, one sentence if it diverged or was interrupted)."""
    status, error, stop = "completed", None, None
    try:
        stop = sim.run().value
    except DivergenceError as exc:
        status, error = "diverged", str(exc)
    except KeyboardInterrupt:
        status = "interrupted"
        error = f"Interrupted at virtual time {sim.now:.4g} s; the metrics so far are in {run_dir}"
        if (run_dir / CHECKPOINT_FILE).is_file():
            error += f", and `fedclock run --resume {run_dir}` continues it."
        else:
            error += " (no checkpoint was written yet: the run starts again from t = 0)."
    finally:
        recorder.close()
    summary = summarize(
        name=cfg.name, strategy=cfg.strategy.name, seed=cfg.seed, status=status, stop_reason=stop,
        history=sim.history, counters=sim.counters,
        wall_s=time.perf_counter() - min(wall0, sim.wall_start), virtual_time=sim.now,
        target_accuracy=cfg.eval.target_accuracy, num_clients=cfg.partition.num_clients,
        extra_columns=[c for c in recorder.columns if c.startswith(("exit", "cis_"))],
    )  # fmt: skip
    return summary, error


def _load_data(cfg: ExperimentConfig) -> Dataset:
    """The run's dataset, normalised as configured (before any validation hold-out)."""
    data_dir = cfg.data.data_dir or os.environ.get("FEDCLOCK_DATA")
    ds = load_dataset(
        cfg.data.name,
        seed=cfg.seed,
        data_dir=data_dir,
        test_fraction=cfg.data.test_fraction,
        synthetic=SyntheticSpec(**cfg.data.synthetic.model_dump()),
        max_train=cfg.data.max_train,
        max_test=cfg.data.max_test,
        text=TextSpec(**cfg.data.text.model_dump()),
    )
    if cfg.data.normalize == "authors":  # SALF's code normalises MNIST with mean 0.5, std 0.5
        ds = authors_normalization(ds)
    return ds


def _prepare_data(
    cfg: ExperimentConfig, ds: Dataset | None = None
) -> tuple[Dataset, tuple[torch.Tensor, torch.Tensor] | None]:
    """The run's dataset (``ds``, else loaded) and its validation hold-out, if any."""
    if ds is None:
        ds = _load_data(cfg)
    val_xy = None
    if cfg.eval.val_holdout:  # e.g. SALF reference mode: a validation split out of the training set
        xt, yt, xv, yv = holdout_split(ds.x_train, ds.y_train, cfg.eval.val_holdout, cfg.seed)
        ds = dataclasses.replace(ds, x_train=xt, y_train=yt, groups=None)
        val_xy = (xv, yv)
    return ds, val_xy


def data_key(cfg: ExperimentConfig) -> Hashable:
    """Runs with equal keys read the same training and test tensors."""
    return (cfg.data.model_dump_json(), cfg.seed, cfg.eval.val_holdout)


class DataReuse:
    """The loaded data of this process's last run, handed to its next run when that one reads
    the same (equal data section and data folder; equal seed for the datasets drawn from
    it, :data:`~fedclock.data.datasets.SEEDED_DATASETS`). Off by default; ``compare`` and
    ``sweep`` turn it on (:func:`reusing_data`, and for good in their worker processes), so a
    worker running cell after cell loads and normalises a dataset once (MNIST: about 1.2 s a
    run; a sweep's seeds alternate, so a per-seed key would never hit). Runs never write into
    their data, so a reused copy gives the same results. A data file changed while one
    command runs is not seen by its later cells."""

    def __init__(self) -> None:
        self.enabled = False
        self._last: tuple[Any, Any] | None = None
        self._lock = threading.Lock()

    def get(
        self, cfg: ExperimentConfig
    ) -> tuple[Dataset, tuple[torch.Tensor, torch.Tensor] | None]:
        """:func:`_prepare_data` of ``cfg``, from the last loaded copy when it is the same data
        (the seed counts only for datasets drawn from it; the hold-out is split per run)."""
        seeded = cfg.data.name in SEEDED_DATASETS
        key = (cfg.data.model_dump_json(), os.environ.get("FEDCLOCK_DATA"),
               cfg.seed if seeded else None)  # fmt: skip
        with self._lock:
            last = self._last if self.enabled else None
        if last is not None and last[0] == key:
            return _prepare_data(cfg, last[1])
        ds = _load_data(cfg)
        with self._lock:
            self._last = (key, ds) if self.enabled else None
        return _prepare_data(cfg, ds)


DATA_REUSE = DataReuse()


def reuse_data(enabled: bool = True) -> None:
    """Let this process's runs reuse the data of the run before (see :class:`DataReuse`)."""
    DATA_REUSE.enabled = enabled
    if not enabled:
        DATA_REUSE._last = None


@contextlib.contextmanager
def reusing_data() -> Iterator[None]:
    """:func:`reuse_data` while the block runs, then as before (dropping the copy if off)."""
    before = DATA_REUSE.enabled
    reuse_data()
    try:
        yield
    finally:
        reuse_data(before)


def run_experiment(
    cfg: ExperimentConfig,
    *,
    run_dir: Path | None = None,
    progress: Callable[[Simulator], None] | None = None,
    argv: list[str] | None = None,
    resume: bool = False,
    lockstep: tuple[Any, int] | None = None,
) -> RunResult:
    """Run one experiment; always leaves a complete run directory, even on divergence or Ctrl-C.

    ``resume``: continue the run in ``run_dir`` from its checkpoint (from the start if it has
    none); the result is the one an uninterrupted run gives, wall-clock columns aside.
    """
    # run batching: the group's runs are built one at a time (torch's flop counter and
    # initialisation are process-wide), then run together
    setup = contextlib.nullcontext() if lockstep is None else lockstep[0].setup_lock
    with setup:
        wall0 = time.perf_counter()
        if cfg.executor.threads is not None:
            torch.set_num_threads(cfg.executor.threads)
        if lockstep is None:
            ds, val_xy = DATA_REUSE.get(cfg)
        else:  # run batching: the group's runs that read the same data share one copy
            ds, val_xy = lockstep[0].data(cfg, lambda: DATA_REUSE.get(cfg))
        p = cfg.partition
        tree = build_tree(cfg.cis)  # a collaborative inference system's devices, if any
        parts = partition(
            ds.y_train.numpy(), p.num_clients, scheme=p.scheme, seed=cfg.seed, alpha=p.alpha,
            shards_per_client=p.shards_per_client, sizes=p.sizes, size_sigma=p.size_sigma,
            min_samples=p.min_samples, groups=ds.groups,
            shares=None if tree is None else tree.data_shares(cfg.cis.split),
        )  # fmt: skip
        m = cfg.model

        def new_model() -> torch.nn.Module:
            return build_model(
                m.arch, input_shape=ds.input_shape, num_classes=ds.num_classes, hidden=m.hidden,
                channels=m.channels, kernel_size=m.kernel_size, fc_hidden=m.fc_hidden,
                padding=m.padding, embed_dim=m.embed_dim, lstm_hidden=m.lstm_hidden,
                lstm_layers=m.lstm_layers, vgg_width=m.vgg_width, exits=m.exits,
                input_dtype=ds.input_dtype,
                seed=torch_seed(cfg.seed, "init") % (2**31),
            )  # fmt: skip

        check_model_size(new_model, m.arch)
        model = new_model()
        layers = layer_view(model, ds.input_shape)
        data = ClientData.from_partition(ds.x_train, ds.y_train, parts)
        sizes = data.sizes()
        population = build_population(cfg.population, p.num_clients, cfg.seed)
        info = BuildInfo(
            client_sizes=sizes,
            layer_fwd_flops=tuple(layer.fwd_flops for layer in layers),
            layer_bwd_flops=tuple(layer.bwd_flops for layer in layers),
            model_bytes=param_bytes(model),
            model=model,
            layers=tuple(layers),
            population=population,
            train=(ds.x_train, ds.y_train),
        )
        strategy = build_strategy(cfg, info)
        check_deadline(strategy, population, cfg)

        device = resolve_device(cfg.executor.device)
        model.to(device)  # before the snapshot: every model version lives on the executor's device
        initial = snapshot(model, 0)
        t = cfg.train
        executor = make_executor(
            strategy.needs, model, data, seed=cfg.seed,
            local=LocalTraining(
                lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay,
                # an early-exit network's full-model task trains every exit
                loss=MultiExitLoss() if isinstance(model, EarlyExitNet) else CrossEntropy(),
            ),
            kind=cfg.executor.kind, device=cfg.executor.device,
            max_batch_clients=cfg.executor.max_batch_clients, workers=cfg.executor.workers,
        )  # fmt: skip
        evaluator: Any
        more: ExitEvaluator | None = None  # per-exit and routed CIS accuracy columns
        if isinstance(model, EarlyExitNet):
            evaluator = more = ExitEvaluator(
                new_model(), ds.x_test, ds.y_test, num_exits=model.num_exits, tree=tree,
                also=also_trees(cfg.cis, tree),
                batch_size=cfg.eval.batch_size, device=device,
            )  # fmt: skip
        else:
            evaluator = Evaluator(
                new_model(), ds.x_test, ds.y_test, batch_size=cfg.eval.batch_size, device=device
            )
        if val_xy is not None:
            evaluator = BestValidation(
                evaluator,
                Evaluator(new_model(), *val_xy, batch_size=cfg.eval.batch_size, device=device),
            )

        if lockstep is not None:  # run batching: evaluated with the group's other versions
            for ev in (
                evaluator,
                getattr(evaluator, "test", None),
                getattr(evaluator, "val", None),
            ):
                if isinstance(ev, Evaluator):
                    ev.submit = lockstep[0].evaluation(lockstep[1])
        client_eval = None
        if cfg.eval.client_losses:
            client_eval = ClientLossEvaluator(
                new_model(), ds.x_train, ds.y_train, data.indices,
                batch_size=cfg.eval.batch_size, device=device,
            )  # fmt: skip
        importance = client_importance(sizes.tolist(), cfg.strategy.weights)

        run_dir = run_dir or default_run_dir(cfg)
        header = checkpoint_header(cfg)
        ck_path = run_dir / CHECKPOINT_FILE
        if run_dir.is_dir():  # left by a process killed while writing a checkpoint
            for tmp in run_dir.glob(".checkpoint-*.tmp"):
                tmp.unlink(missing_ok=True)
        resumed = None
        if resume and ck_path.is_file():
            resumed = read_checkpoint(ck_path, map_location=device)
            check_resumable(resumed, header, run_dir)
        else:  # a checkpoint of an earlier run in this folder must never be resumed into this one
            ck_path.unlink(missing_ok=True)
        extra = (*(more.columns if more is not None else ()),
                 *(CLIENT_LOSS_COLUMNS if client_eval is not None else ()))  # fmt: skip
        recorder = RunRecorder(
            run_dir,
            extra_columns=extra,
            resume_rows=None if resumed is None else resumed["rows"],
        )
        if resumed is None:
            recorder.write_config(to_yaml(cfg), cfg.seed, argv)
        else:
            recorder.note_resume(argv)
        b = cfg.budget
        sim = Simulator(
            strategy=strategy,
            executor=executor,
            population=population,
            initial=initial,
            client_sizes=sizes,
            seed=cfg.seed,
            budget=Budget(
                virtual_time=b.virtual_time, aggregations=b.aggregations, updates=b.updates
            ),
            evaluate=evaluator,
            on_record=recorder.record,
            on_progress=progress,
            eval_every_aggregations=cfg.eval.every_aggregations,
            eval_every_virtual_seconds=cfg.eval.every_virtual_seconds,
            divergence_factor=cfg.eval.divergence_factor,
            evaluate_clients=client_eval,
            evaluate_more=more.more if more is not None else None,
            importance=importance,
            on_aggregate=_validation_schedule(evaluator, cfg.eval.val_every_aggregations),
            guard=_guard(cfg),
            faults=_faults(cfg, p.num_clients),
            execute=None if lockstep is None else lockstep[0].execute(lockstep[1], executor),
        )
        if resumed is not None:
            restore(sim, resumed["state"])
        ck = cfg.checkpoint
        checkpointer = None
        if ck.every_aggregations is not None or ck.every_seconds is not None:
            checkpointer = Checkpointer(
                ck_path,
                header,
                every_aggregations=ck.every_aggregations,
                every_seconds=ck.every_seconds,
            )
            sim.on_progress = _chain(progress, checkpointer)
    if lockstep is not None:
        if checkpointer is not None:
            lockstep[0].on_interrupt(lockstep[1], checkpointer.interrupt)
        lockstep[0].built(lockstep[1])
    # Ctrl-C stops the loop at the next event (after a checkpoint); once the loop is over it
    # is ignored until the run folder is complete
    with stop_on_sigint(checkpointer):
        try:
            summary, error = _run_and_record(sim, cfg, recorder, run_dir, wall0)
            summary.update(strategy.summary)  # e.g. cis-balanced's measured σ
        finally:
            close = getattr(executor, "close", None)  # (Ray actors)
            if close is not None:
                close()
        if val_xy is not None:  # test accuracy of the best-validation checkpoint (SALF Table II)
            summary["val_best_test_accuracy"] = evaluator.best_val_test_accuracy
            summary["best_val_accuracy"] = evaluator.best_val
            summary["validations"] = evaluator.validations
        recorder.write_summary(summary)
        recorder.write_clients(client_table(sim, strategy, population, importance))
        if summary["status"] != "interrupted":  # finished or diverged: nothing to resume
            (run_dir / CHECKPOINT_FILE).unlink(missing_ok=True)
    return RunResult(run_dir=run_dir, summary=summary, history=sim.history, error=error)
