"""Evaluation of a global model version on held-out data."""

from __future__ import annotations

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
