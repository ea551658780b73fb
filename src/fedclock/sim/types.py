"""Value types that flow between the simulator, the strategy and the executor."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from fedclock.devices.cost import TaskCost, TaskTiming
from fedclock.models.shapes import FULL, WorkShape

Params = dict[str, torch.Tensor]


@dataclass(frozen=True, eq=False)
class ModelVersion:
    """A global model snapshot, shared by reference by every task started on it.

    The tensors are never modified in place; an aggregation makes a new version.
    """

    version: int
    params: Params
    buffers: Params = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TaskPlan:
    """What a client computes (decided by the Planner).

    ``local_steps`` SGD steps of ``batch_size``; ``samples`` is the number of
    samples processed (the last batch of an epoch may be partial).
    """

    local_steps: int
    batch_size: int
    samples: int
    epochs: float | None = None
    # what the task trains: the full model, a layer suffix (SALF), a width slice (HeteroFL)
    shape: WorkShape = FULL
    # the task's learning rate is train.lr × lr_scale (a schedule over rounds, e.g. CIS's
    # cosine annealing); executors batch together only tasks of equal scale
    lr_scale: float = 1.0


@dataclass(eq=False, slots=True)
class Task:
    """A dispatched unit of client work, with its virtual timing known up front."""

    task_id: int
    client: int
    k: int  # the client's task counter (keys its slowdown draw)
    base: ModelVersion
    plan: TaskPlan
    cost: TaskCost
    timing: TaskTiming
    t_start: float
    execute: bool = True  # False: the strategy already knows it will be discarded
    cancelled: bool = False
    # index of this task among the client's tasks on the same base version (0 for the
    # first): with the client and the base version it keys the task's batch stream, so
    # no two tasks train on the same batches (see Simulator._repeat)
    repeat: int = 0
    # per-task tensors sent down with the model (Task.down), full parameter shapes keyed
    # first by what they are, then by parameter name: a strategy's ClientRule attaches them
    # when the task is dispatched (SCAFFOLD's c − c_i, FedDyn's linear term) and the local
    # objective's gradient terms read them (fedclock.train.local.GradientTerm)
    down: dict[str, Params] = field(default_factory=dict)

    @property
    def t_finish(self) -> float:
        return self.t_start + self.timing.duration


@dataclass(eq=False, slots=True)
class Contribution:
    """What a client sends back; aggregators only ever see contributions."""

    task: Task
    delta: Params  # local params − base params, per parameter tensor
    buffers: Params  # local buffers after training (e.g. BatchNorm statistics)
    num_samples: int  # client data size (FedAvg weight n_i)
    train_loss: float  # mean training loss over the local steps
    # the weight ω_i(n) the aggregator gave this update when it was committed
    # (Fraboni et al. eq. 5; FedAsync's α_t); None until aggregated or if the
    # aggregator does not report it
    weight: float | None = None
    # the part of each parameter the update covers (its work shape's Program.coverage):
    # True / False for a whole tensor, or a boolean mask; None: every element (full work).
    # Aggregators average an element over the contributions that cover it
    coverage: Mapping[str, torch.Tensor | bool] | None = None
    # statistics the local rule sends up besides Δ, keyed by what they are, then by
    # parameter name: a program's per-step statistics (train.local.STEP_STATISTICS, e.g.
    # PruneFL's "sq_grads") and the selection's ("selection", train.statistics)
    up: dict[str, Params] = field(default_factory=dict)

    def covers(self, name: str) -> torch.Tensor | bool:
        """Whether (or where) this update covers parameter ``name``."""
        return True if self.coverage is None else self.coverage[name]

    @property
    def client(self) -> int:
        return self.task.client

    @property
    def base_version(self) -> int:
        return self.task.base.version
