"""Evaluation of a global model version: on held-out data, and per client on training data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedclock.sim.types import ModelVersion


class Evaluator:
    """Test accuracy and mean cross-entropy of a model version (no copy of the snapshot)."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 2048,
                 device: torch.device | str = "cpu") -> None:  # fmt: skip
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.x = x.to(self.device)
        self.y = y.to(self.device)
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(self, version: ModelVersion) -> tuple[float, float]:
        self.model.eval()
        state = {**version.params, **version.buffers}
        correct = 0
        loss = 0.0
        n = len(self.y)
        for i in range(0, n, self.batch_size):
            xb, yb = self.x[i : i + self.batch_size], self.y[i : i + self.batch_size]
            logits = functional_call(self.model, state, (xb,))
            loss += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(1) == yb).sum())
        return correct / n, loss / n


class ClientLossEvaluator:
    """Each client's training loss L_i(θ) (mean cross-entropy over its own samples).

    One pass over the clients' training samples per call; the per-sample losses
    are summed per client. Fraboni et al.'s federated loss (eq. 2) and surrogate
    loss (eq. 10) are weighted sums of these (see
    :func:`fedclock.metrics.recorder.federated_metrics`).
    """

    def __init__(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        indices: Sequence[torch.Tensor],
        *,
        batch_size: int = 2048,
        device: torch.device | str = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device)
        rows = torch.cat([torch.as_tensor(i, dtype=torch.int64) for i in indices])
        owner = torch.repeat_interleave(
            torch.arange(len(indices)), torch.tensor([len(i) for i in indices])
        )
        self.x = x.to(self.device)  # held once (no copy on CPU); rows gathered per batch
        self.rows = rows.to(self.device)
        self.y = y[rows].to(self.device)
        self.owner = owner.to(self.device)
        self.sizes = torch.tensor([len(i) for i in indices], dtype=torch.float64)
        self.num_clients = len(indices)
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(self, version: ModelVersion) -> np.ndarray:
        self.model.eval()
        state = {**version.params, **version.buffers}
        total = torch.zeros(self.num_clients, dtype=torch.float64, device=self.device)
        for i in range(0, len(self.y), self.batch_size):
            sl = slice(i, i + self.batch_size)
            logits = functional_call(self.model, state, (self.x[self.rows[sl]],))
            loss = F.cross_entropy(logits, self.y[sl], reduction="none")
            total.index_add_(0, self.owner[sl], loss.to(torch.float64))
        return (total.cpu() / self.sizes.clamp(min=1)).numpy()


class BestValidation:
    """An evaluator that reports test (accuracy, loss) and tracks the test accuracy of the
    best-validation model (the authors' ``model.best.t7``, evaluated on the test set).

    Calling it evaluates test and validation; :meth:`validate` evaluates validation alone
    (for a validation schedule denser than the test curve's) and the test set only when
    validation improves, so the model chosen is the same as if both ran every time.
    """

    checkpoint_fields: ClassVar[tuple[str, ...]] = (
        "best_val",
        "best_val_test_accuracy",
        "last_val_accuracy",
        "validations",
        "_validated",
    )

    def __init__(self, test: object, val: object) -> None:
        self.test = test
        self.val = val
        self.best_val = -1.0
        self.best_val_test_accuracy = float("nan")
        self.last_val_accuracy = float("nan")
        self.validations = 0
        self._validated: int | None = None  # the version last validated

    def __call__(self, version: ModelVersion) -> tuple[float, float]:
        acc, loss = self.test(version)  # type: ignore[operator]
        self.validate(version, test_accuracy=acc)
        return acc, loss

    def validate(self, version: ModelVersion, test_accuracy: float | None = None) -> None:
        if self._validated == version.version:
            return
        self._validated = version.version
        self.validations += 1
        vacc, _ = self.val(version)  # type: ignore[operator]
        self.last_val_accuracy = float(vacc)
        if vacc > self.best_val:
            self.best_val = float(vacc)
            if test_accuracy is None:
                test_accuracy, _ = self.test(version)  # type: ignore[operator]
            self.best_val_test_accuracy = float(test_accuracy)
