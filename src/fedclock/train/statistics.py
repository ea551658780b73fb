"""Statistics a client sends up besides its update (``Contribution.up``): what speed-aware
selection reads — Oort's statistical utility |B_i|·√(Σ_{k∈B_i} Loss(k)² / |B_i|) (Lai et al.,
OSDI'21, §4.2) and TiFL's per-tier accuracy (Chai et al., HPDC'20, §4.3).

B_i is the set of samples of the task's first local epoch (FedScale's client measures its
utility over the first epoch's batches); each sample's loss is the loss of the model the
client received (``task.base``) on it — the usefulness of the client's data to the global
model, measured on the client before it trains (FedScale averages the batch losses as they
are trained: the first batch's are these, later ones come after some local steps). One
extra forward pass over one epoch of the client's data, only for strategies that select
by it (:attr:`fedclock.train.local.Needs.statistics`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn
from torch.func import functional_call

from fedclock.sim.types import Contribution, Task
from fedclock.train.executor import ClientData, batch_keys, batch_positions
from fedclock.train.local import CrossEntropy, Loss

#: the key of the selection statistics in ``Contribution.up``: one float64 vector
#: ``{"values": [Σ loss², Σ loss, samples predicted right, |B_i|]}`` (:data:`STAT_NAMES`)
SELECTION_STATS = "selection"
STAT_NAMES = ("loss_sq_sum", "loss_sum", "correct", "samples")


def first_epoch_rows(seed: int, tasks: Sequence[Task], data: ClientData) -> list[torch.Tensor]:
    """Each task's first-epoch samples (rows of the training set): all of the client's when
    the task trains at least one epoch, else the rows of its first steps' batches (its
    batch order, :func:`~fedclock.train.executor.batch_positions`; one call per task size)."""
    out: list[torch.Tensor | None] = [None] * len(tasks)
    partial: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for i, t in enumerate(tasks):
        idx = data.indices[t.client]
        n, b = len(idx), t.plan.batch_size
        if t.plan.local_steps >= -(-n // b):
            out[i] = idx
        else:
            partial[(n, t.plan.local_steps, b)].append(i)
    for (n, steps, b), which in partial.items():
        pos = batch_positions(batch_keys(seed, [tasks[i] for i in which]), n, steps, b)
        for j, i in enumerate(which):
            out[i] = data.indices[tasks[i].client][torch.from_numpy(pos[j])]
    return [r for r in out if r is not None]


@torch.no_grad()
def per_sample(
    model: nn.Module, state: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, loss: Loss
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's loss (float64) and whether it is predicted right, under the model with
    ``state`` (parameters and buffers; BatchNorm in evaluation mode)."""
    was = model.training
    model.eval()
    try:
        out = functional_call(model, state, (x,))
    finally:
        model.train(was)
    if isinstance(out, list | tuple):  # (an early-exit network: its last exit)
        out = out[-1]
    return loss.per_sample(out, y).double(), (out.argmax(-1) == y)


def segment_statistics(
    losses: torch.Tensor, right: torch.Tensor, lengths: Sequence[int]
) -> torch.Tensor:
    """One row per segment of ``lengths`` consecutive samples: Σ loss², Σ loss, the samples
    predicted right and their count (float64, :data:`STAT_NAMES`)."""
    seg = torch.repeat_interleave(
        torch.arange(len(lengths), device=losses.device),
        torch.as_tensor(list(lengths), device=losses.device),
    )
    cols = torch.stack([losses * losses, losses, right.double(), torch.ones_like(losses)], 1)
    return torch.zeros(len(lengths), 4, dtype=torch.float64, device=losses.device).index_add_(
        0, seg, cols
    )


def statistics_of(contribution: Contribution) -> dict[str, float] | None:
    """The selection statistics a contribution carries (None: it carries none)."""
    got = contribution.up.get(SELECTION_STATS)
    if got is None:
        return None
    return dict(zip(STAT_NAMES, got["values"].tolist(), strict=True))


def utility(stats: dict[str, float]) -> float:
    """Oort's statistical utility |B_i|·√(Σ Loss(k)² / |B_i|) = √(|B_i|·Σ Loss(k)²)."""
    n = stats["samples"]
    return math.sqrt(n * stats["loss_sq_sum"]) if n > 0 else 0.0


class StatisticsExecutor:
    """An executor that adds the selection statistics to each contribution of ``inner``
    (any executor: the statistics are the client's, computed where it trains). Tasks on
    one base version share one forward pass."""

    checkpoint_fields: ClassVar[tuple[str, ...]] = ()  # (the inner executor's, walked into)

    def __init__(
        self,
        inner: Any,
        model: nn.Module,
        data: ClientData,
        *,
        seed: int,
        loss: Loss | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.inner = inner
        self.model = model
        self.data = data
        self.seed = seed
        self.loss = loss or CrossEntropy()
        self.device = torch.device(device)
        self._rows = data.x.reshape(len(data.x), -1)  # (a view: one row per sample)

    def __getattr__(self, name: str) -> Any:  # everything else is the inner executor's
        return getattr(self.inner, name)

    def run(self, tasks: Sequence[Task]) -> list[Contribution]:
        contributions: list[Contribution] = self.inner.run(tasks)
        by_base: dict[int, list[Contribution]] = defaultdict(list)
        for c in contributions:
            by_base[id(c.task.base)].append(c)
        for group in by_base.values():
            base = group[0].task.base
            rows = first_epoch_rows(self.seed, [c.task for c in group], self.data)
            flat = torch.cat(rows)
            x = self._rows.index_select(0, flat).view(len(flat), *self.data.x.shape[1:])
            x, y = x.to(self.device), self.data.y.index_select(0, flat).to(self.device)
            losses, right = per_sample(self.model, {**base.params, **base.buffers}, x, y,
                                       self.loss)  # fmt: skip
            table = segment_statistics(losses, right, [len(r) for r in rows])
            for c, row in zip(group, table.unbind(0), strict=True):
                c.up[SELECTION_STATS] = {"values": row}
        return contributions
