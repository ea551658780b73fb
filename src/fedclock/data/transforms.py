"""Changes to a loaded :class:`~fedclock.data.Dataset` that a config asks for.

- :func:`authors_normalization` — ``data.normalize: authors``: MNIST re-normalised as in
  the SALF authors' code;
- :func:`holdout_split` — ``eval.val_holdout``: a seeded validation split out of the
  training set (the evaluation side is :class:`fedclock.train.evaluate.BestValidation`).
"""

from __future__ import annotations

import dataclasses

import torch

from fedclock.data.dataset import Dataset
from fedclock.errors import ConfigError
from fedclock.rng import torch_generator


def holdout_split(
    x: torch.Tensor, y: torch.Tensor, n_val: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_val, y_val): a seeded random ``n_val`` samples held out for validation."""
    if n_val >= len(y):
        raise ConfigError(
            f"eval.val_holdout = {n_val} leaves no training data ({len(y)} training samples)."
        )
    g = torch_generator(seed, "val_holdout")
    perm = torch.randperm(len(y), generator=g)
    val, train = perm[:n_val], perm[n_val:]
    return x[train], y[train], x[val], y[val]


def authors_normalization(ds: Dataset) -> Dataset:
    """MNIST re-normalised as in the SALF code: (x − 0.5)/0.5 instead of (x − 0.1307)/0.3081."""
    if ds.name != "mnist":
        raise ConfigError(
            f"data.normalize 'authors' applies to data.name 'mnist' only (got '{ds.name}')."
        )

    def remap(x: torch.Tensor) -> torch.Tensor:
        return ((x * 0.3081 + 0.1307) - 0.5) / 0.5

    return dataclasses.replace(ds, x_train=remap(ds.x_train), x_test=remap(ds.x_test))
