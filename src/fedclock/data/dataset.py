"""The in-memory :class:`Dataset` every loader returns, and where loaders look for files."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedclock.errors import DataError

__all__ = ["DATA_ENV", "Dataset", "data_root", "even_subset"]

DATA_ENV = "FEDCLOCK_DATA"


@dataclass(frozen=True, eq=False)
class Dataset:
    """A classification dataset held in memory as tensors.

    ``x_*`` have shape ``(N, *input_shape)``: float32 and normalised for
    real-valued inputs (images, features), or int64 token ids for text
    (:attr:`input_dtype` tells which). ``y_*`` are int64 of shape ``(N,)`` with
    values in ``[0, num_classes)``.

    ``groups`` (optional) gives each *training* sample the id of the natural
    client it comes from — for Shakespeare, its speaking role — as an int64
    array of length ``num_train`` indexing ``group_names``; ``test_groups`` does
    the same for the test set. ``partition(scheme="natural")`` uses them.
    """

    name: str
    x_train: torch.Tensor = field(repr=False)
    y_train: torch.Tensor = field(repr=False)
    x_test: torch.Tensor = field(repr=False)
    y_test: torch.Tensor = field(repr=False)
    num_classes: int
    input_shape: tuple[int, ...]
    groups: np.ndarray | None = field(default=None, repr=False)
    test_groups: np.ndarray | None = field(default=None, repr=False)
    group_names: tuple[str, ...] = field(default=(), repr=False)

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.y_test.shape[0])

    @property
    def input_dtype(self) -> torch.dtype:
        """``torch.float32`` for real-valued inputs, ``torch.int64`` for token ids."""
        return self.x_train.dtype


def data_root(data_dir: str | Path | None, what: str, files: str) -> Path:
    """``data_dir``, else ``$FEDCLOCK_DATA``, as a path; a one-sentence DataError when neither is set.

    ``what`` names the dataset and ``files`` what the folder should hold, for the message.
    """
    if data_dir is None:
        env = os.environ.get(DATA_ENV)
        if not env:
            raise DataError(
                f"{what} needs a data directory: set --data-dir or {DATA_ENV} to the folder "
                f"holding {files}."
            )
        data_dir = env
    return Path(data_dir).expanduser()


def even_subset(n: int, keep: int | None) -> np.ndarray:
    """``keep`` evenly spaced indices of ``range(n)`` (all of them when ``keep`` is None or ≥ n).

    Index ``floor(i·n/keep)`` for ``i < keep``: strictly increasing, so a set
    stored group by group keeps every group's share (to within one sample).
    """
    if keep is None or keep >= n:
        return np.arange(n, dtype=np.int64)
    return (np.arange(keep, dtype=np.int64) * n) // keep
