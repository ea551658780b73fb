"""Build an experiment from its config and run it: the one place where the parts meet.

ExperimentConfig → Dataset → partition → model (layers, FLOPs) → population
→ strategy → executor → Simulator(observers: evaluation, recorder, checkpoints) → run
directory.
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
from fedclock.metrics.recorder import (
    CLIENT_LOSS_COLUMNS,
    METRIC_COLUMNS,
    RunRecorder,
    source_digest,
    summarize,
)
from fedclock.metrics.tensorboard import TensorBoardWriter, log_dir_for
from fedclock.metrics.timeline import TimelineRecorder
from fedclock.models import build_model, layer_view, param_bytes
from fedclock.rng import torch_seed
from fedclock.sim.checkpoint import (
    CHECKPOINT_FILE,
    Checkpointer,
    restore,
    stop_on_sigint,
)
from fedclock.sim.checkpoint import read as read_checkpoint
from fedclock.sim.guard import FaultInjector, UpdateGuard
from fedclock.sim.observers import DivergenceCheck, EvaluationSchedule, Metrics, Progress
from fedclock.sim.simulator import Budget, Simulator
from fedclock.sim.types import ModelVersion
from fedclock.strategies import BuildInfo, Strategy, build_strategy, client_importance
from fedclock.train.evaluate import (
    BestValidation,
    ClientLossEvaluator,
    Evaluator,
    test_evaluator,
)
from fedclock.train.executor import ClientData, snapshot
from fedclock.train.factory import make_executor, resolve_device
from fedclock.train.local import LocalTraining, model_loss

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


def client_table(
    sim: Simulator,
    strategy: Strategy,
    population: Population,
    importance: Any,
    sizes: Any,
    losses: Any = None,
) -> dict[str, Any]:
    """clients.csv columns: importance p_i, nominal update time τ_i, participations,
    total weight received and its normalised share q̃_i, and the last training loss."""
    n = len(population)
    tau = [population.nominal_timing(c, strategy.planner.nominal(c)[1]).duration for c in range(n)]
    received = sim.per_client(sim.counters.weight_received)
    total = float(received.sum())
    cols: dict[str, Any] = {
        "client": list(range(n)),
        "num_samples": [int(v) for v in sizes],
        "importance": [float(v) for v in importance],
        "tau_nominal": tau,
        "participations": [int(v) for v in sim.per_client(sim.counters.participation)],
        "weight_received": [float(v) for v in received],
        "q_share": [float(v) / total if total > 0 else math.nan for v in received],
    }
    if losses is not None:
        cols["final_train_loss"] = [float(v) for v in losses]
    return cols


def _guard(cfg: ExperimentConfig) -> UpdateGuard | None:
    """The update guard (``guard``) with the fault injector (``population.faults``)."""
    g, f = cfg.guard, cfg.population.faults
    faults = None
    if f.fraction != 0:
        faults = FaultInjector(f.fraction, f.kind, f.scale, cfg.partition.num_clients, cfg.seed)
    if not g.reject_nonfinite and g.max_update_norm is None and faults is None:
        return None
    return UpdateGuard(reject_nonfinite=g.reject_nonfinite, max_norm=g.max_update_norm,
                       faults=faults)  # fmt: skip


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
        # the evaluators' own columns (CIS's exit accuracies), the client losses aside
        extra_columns=[c for c in recorder.columns[len(METRIC_COLUMNS):]
                       if c not in CLIENT_LOSS_COLUMNS],
        availability=sim.population_has_availability,
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


@dataclass
class _Parts:
    """What one run is built from (``_build``)."""

    strategy: Strategy
    population: Population
    executor: Any
    initial: ModelVersion
    sizes: Any  # each client's sample count
    importance: Any  # the client importance p_i
    device: torch.device
    metrics: list[Any]  # the observers that measure (test metrics, validation, client losses)
    columns: tuple[str, ...]  # their metrics.csv columns beyond METRIC_COLUMNS
    validation: BestValidation | None
    client_losses: ClientLossEvaluator | None
    full_flops: float = 0.0  # a full task's FLOPs per sample (forward and backward)


def _build(cfg: ExperimentConfig, lockstep: tuple[Any, int] | None) -> _Parts:
    """Data, partition, model, population, strategy, executor and evaluators of ``cfg``."""
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
    new_model = _model_factory(cfg, ds)
    check_model_size(new_model, cfg.model.arch)
    model = new_model()
    layers = layer_view(model, ds.input_shape)
    data = ClientData.from_partition(ds.x_train, ds.y_train, parts)
    sizes = data.sizes()
    population = build_population(cfg.population, p.num_clients, cfg.seed)
    info = BuildInfo(
        client_sizes=sizes, layer_fwd_flops=tuple(layer.fwd_flops for layer in layers),
        layer_bwd_flops=tuple(layer.bwd_flops for layer in layers),
        model_bytes=param_bytes(model), model=model, layers=tuple(layers),
        population=population, train=(ds.x_train, ds.y_train), client_indices=data.indices,
    )  # fmt: skip
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
            loss=model_loss(model),
        ),
        kind=cfg.executor.kind, device=cfg.executor.device,
        max_batch_clients=cfg.executor.max_batch_clients, workers=cfg.executor.workers,
        momentum_store=strategy.client_state.momentum,
    )  # fmt: skip
    importance = client_importance(sizes.tolist(), cfg.strategy.weights)
    built = _Parts(strategy, population, executor, initial, sizes, importance, device,
                   *_evaluators(cfg, ds, val_xy, new_model, data, tree, device, importance,
                                lockstep))  # fmt: skip
    built.full_flops = sum(info.layer_fwd_flops) + sum(info.layer_bwd_flops)
    return built


def device_parts(cfg: ExperimentConfig) -> tuple[Any, Any, Callable[[Any, int], float]]:
    """A real device's part of ``cfg`` (fedclock.deploy.device): the serial executor that
    trains its tasks (the same data, partition, model and local rule as the simulation),
    the model's layout as work shapes see it (None for full-model strategies), and a task's
    FLOPs by (work shape, samples)."""
    cfg = cfg.model_copy(
        update={"executor": cfg.executor.model_copy(update={"kind": "serial", "device": "cpu"})}
    )
    parts = _build(cfg, None)
    layout = parts.strategy.needs.layout
    per_sample = parts.full_flops

    def flops(shape: Any, samples: int) -> float:
        if layout is None:
            return per_sample * samples
        return float(shape.cost(layout, samples).flops)

    return parts.executor, layout, flops


def _model_factory(cfg: ExperimentConfig, ds: Dataset) -> Callable[[], torch.nn.Module]:
    m = cfg.model

    def new_model() -> torch.nn.Module:
        return build_model(
            m.arch, input_shape=ds.input_shape, num_classes=ds.num_classes, hidden=m.hidden,
            channels=m.channels, kernel_size=m.kernel_size, fc_hidden=m.fc_hidden,
            padding=m.padding, embed_dim=m.embed_dim, lstm_hidden=m.lstm_hidden,
            lstm_layers=m.lstm_layers, vgg_width=m.vgg_width, exits=m.exits,
            input_dtype=ds.input_dtype, seed=torch_seed(cfg.seed, "init") % (2**31),
        )  # fmt: skip

    return new_model


def _evaluators(
    cfg: ExperimentConfig, ds: Dataset, val_xy: Any, new_model: Callable[[], torch.nn.Module],
    data: ClientData, tree: Any, device: torch.device, importance: Any,
    lockstep: tuple[Any, int] | None,
) -> tuple[list[Any], tuple[str, ...], BestValidation | None, ClientLossEvaluator | None]:  # fmt: skip
    """The measuring observers: test metrics (an early-exit network's per-exit and routed CIS
    accuracy too), the best-validation tracker (``eval.val_holdout``) and the client losses
    (``eval.client_losses``), with their extra metrics.csv columns."""
    bs = cfg.eval.batch_size
    # run batching: evaluated with the group's other versions
    submit = None if lockstep is None else lockstep[0].evaluation(lockstep[1])
    test: Any
    test, exits = test_evaluator(new_model(), ds.x_test, ds.y_test, tree=tree,
                                 also=also_trees(cfg.cis, tree), batch_size=bs, device=device,
                                 submit=submit)  # fmt: skip
    validation = None
    if val_xy is not None:
        val = Evaluator(new_model(), *val_xy, batch_size=bs, device=device, submit=submit)
        test = validation = BestValidation(test, val, every=cfg.eval.val_every_aggregations)
    observers: list[Any] = [Metrics(test, exits.more if exits is not None else None)]
    columns = exits.columns if exits is not None else ()
    if validation is not None:
        observers.append(validation)  # (on_aggregation: the denser validation schedule)
    client_losses = None
    if cfg.eval.client_losses:
        client_losses = ClientLossEvaluator(
            new_model(), ds.x_train, ds.y_train, data.indices, batch_size=bs, device=device,
            importance=importance,
        )  # fmt: skip
        observers.append(client_losses)
        columns = (*columns, *CLIENT_LOSS_COLUMNS)
    return observers, tuple(columns), validation, client_losses


def run_experiment(
    cfg: ExperimentConfig,
    *,
    run_dir: Path | None = None,
    progress: Callable[[Simulator], None] | None = None,
    argv: list[str] | None = None,
    resume: bool = False,
    lockstep: tuple[Any, int] | None = None,
    engine: Callable[..., Simulator] | None = None,
) -> RunResult:
    """Run one experiment; always leaves a complete run directory, even on divergence or Ctrl-C.

    ``resume``: continue the run in ``run_dir`` from its checkpoint (from the start if it has
    none); the result is the one an uninterrupted run gives, wall-clock columns aside.
    ``engine``: what runs the strategy instead of the :class:`Simulator` (it takes the
    simulator's arguments): a deployment's real-time driver (fedclock.deploy.driver).
    """
    # run batching: the group's runs are built one at a time (torch's flop counter and
    # initialisation are process-wide), then run together
    setup = contextlib.nullcontext() if lockstep is None else lockstep[0].setup_lock
    with setup:
        wall0 = time.perf_counter()
        if cfg.executor.threads is not None:
            torch.set_num_threads(cfg.executor.threads)
        parts = _build(cfg, lockstep)
        run_dir = run_dir or default_run_dir(cfg)
        header = checkpoint_header(cfg)
        resumed = _checkpoint_to_resume(run_dir, header, resume, parts.device)
        recorder = RunRecorder(run_dir, extra_columns=parts.columns,
                               resume_rows=None if resumed is None else resumed["rows"])  # fmt: skip
        if resumed is None:
            recorder.write_config(to_yaml(cfg), cfg.seed, argv)
        else:
            recorder.note_resume(argv)
        checkpointer = _checkpointer(cfg, run_dir / CHECKPOINT_FILE, header)
        timeline = TimelineRecorder()
        tb_dir = log_dir_for(run_dir)
        tensorboard = None if tb_dir is None else TensorBoardWriter(tb_dir)
        guard = _guard(cfg)
        b, ev = cfg.budget, cfg.eval
        sim = (engine or Simulator)(
            strategy=parts.strategy, executor=parts.executor, population=parts.population,
            initial=parts.initial, seed=cfg.seed,
            budget=Budget(virtual_time=b.virtual_time, aggregations=b.aggregations,
                          updates=b.updates),
            observers=[
                EvaluationSchedule(ev.every_aggregations, ev.every_virtual_seconds),
                *parts.metrics, recorder, timeline,
                *([] if tensorboard is None else [tensorboard]),
                DivergenceCheck(ev.divergence_factor, guarded=guard is not None and guard.checks),
                *([] if progress is None else [Progress(progress)]),
                *([] if checkpointer is None else [checkpointer]),
            ],
            guard=guard,
            execute=None if lockstep is None else lockstep[0].execute(lockstep[1], parts.executor),
        )  # fmt: skip
        if resumed is not None:
            restore(sim, resumed["state"])
            if tensorboard is not None:
                tensorboard.replay(sim.history)
    if lockstep is not None:
        if checkpointer is not None:
            lockstep[0].on_interrupt(lockstep[1], checkpointer.interrupt)
        lockstep[0].built(lockstep[1])
    try:
        summary, error = _run(sim, cfg, recorder, run_dir, wall0, checkpointer, parts, timeline)
    finally:
        if tensorboard is not None:
            tensorboard.close()
    return RunResult(run_dir=run_dir, summary=summary, history=sim.history, error=error)


def _run(
    sim: Simulator, cfg: ExperimentConfig, recorder: RunRecorder, run_dir: Path, wall0: float,
    checkpointer: Checkpointer | None, parts: _Parts, timeline: TimelineRecorder,
) -> tuple[dict[str, Any], str | None]:  # fmt: skip
    """Run ``sim`` and complete the run folder: summary.json, clients.csv, timeline.csv."""
    # Ctrl-C stops the loop at the next event (after a checkpoint); once the loop is over it
    # is ignored until the run folder is complete
    with stop_on_sigint(checkpointer):
        try:
            summary, error = _run_and_record(sim, cfg, recorder, run_dir, wall0)
            summary.update(parts.strategy.summary)  # e.g. cis-balanced's measured σ
        finally:
            close = getattr(parts.executor, "close", None)  # (Ray actors)
            if close is not None:
                close()
        v = parts.validation
        if v is not None:  # test accuracy of the best-validation checkpoint (SALF Table II)
            summary["val_best_test_accuracy"] = v.best_val_test_accuracy
            summary["best_val_accuracy"] = v.best_val
            summary["validations"] = v.validations
        losses = None if parts.client_losses is None else parts.client_losses.last
        # summary.json last: a run is complete (and reused as such) only once every file it
        # promises is whole, so a kill before it leaves a run that --resume finishes
        timeline.write(run_dir, sim.now, sim.tasks_dispatched, sim.counters.aggregations)
        recorder.write_clients(client_table(
            sim, parts.strategy, parts.population, parts.importance, parts.sizes, losses
        ))  # fmt: skip
        recorder.seal()
        recorder.write_summary(summary)
        if summary["status"] != "interrupted":  # finished or diverged: nothing to resume
            (run_dir / CHECKPOINT_FILE).unlink(missing_ok=True)
    return summary, error


def _checkpoint_to_resume(
    run_dir: Path, header: dict[str, Any], resume: bool, device: torch.device
) -> dict[str, Any] | None:
    """The checkpoint in ``run_dir`` to continue (``resume``), checked against ``header``;
    otherwise any old one is removed, so that it is never resumed into this run."""
    ck_path = run_dir / CHECKPOINT_FILE
    if resume and ck_path.is_file():
        resumed: dict[str, Any] = read_checkpoint(ck_path, map_location=device)
        check_resumable(resumed, header, run_dir)
        return resumed
    ck_path.unlink(missing_ok=True)
    return None


def _checkpointer(cfg: ExperimentConfig, path: Path, header: dict[str, Any]) -> Checkpointer | None:
    ck = cfg.checkpoint
    if ck.every_aggregations is None and ck.every_seconds is None:
        return None
    return Checkpointer(path, header, every_aggregations=ck.every_aggregations,
                        every_seconds=ck.every_seconds)  # fmt: skip
