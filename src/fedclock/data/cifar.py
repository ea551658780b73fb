"""CIFAR-10 and CIFAR-100 from the standard "python version" files a user supplies.

**Files.** From ``data_dir`` or ``$FEDCLOCK_DATA``, the first of these found:

- the extracted folder ``cifar-10-batches-py/`` (``data_batch_1`` … ``data_batch_5``,
  ``test_batch``) or ``cifar-100-python/`` (``train``, ``test``), inside the
  data folder, or the data folder itself;
- the archive ``cifar-10-python.tar.gz`` / ``cifar-100-python.tar.gz`` as
  distributed (read in memory, nothing is extracted to disk), or the archive
  path itself as ``data_dir``.

Each is looked for in the data folder, its ``cifar/`` and ``cifar10/`` /
``cifar100/`` subfolders, and its parent (so the shared data root works when
``$FEDCLOCK_DATA`` points at its ``mnist/`` folder).

**Format.** Each batch is a pickled dict with ``data``: uint8 ``(N, 3072)``,
one row per image, channel-major (1024 red, 1024 green, 1024 blue values, each
row-major 32×32), and ``labels`` (CIFAR-10) or ``fine_labels`` (CIFAR-100,
the 100 classes; ``coarse_labels`` is ignored). Keys may be ``bytes`` (as
Python 3 reads the original Python 2 pickles with ``encoding="bytes"``) or
``str``. Pickles are read with a restricted unpickler that only resolves the
numpy array constructors these files need, so a crafted file cannot run code.

**Normalisation.** ``x/255``, then per channel ``(x − mean)/std`` with the
CIFAR-10 statistics mean (0.4914, 0.4822, 0.4465), std (0.2023, 0.1994,
0.2010) — for CIFAR-100 too, as Fraboni et al.'s code does. Inputs are float32
``(3, 32, 32)``; the official 10,000-image test set is the test set.
"""

from __future__ import annotations

import io
import pickle
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedclock.data.dataset import Dataset, data_root
from fedclock.errors import DataError

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "CIFAR_LAYOUTS", "load_cifar"]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
_ROW = 3 * 32 * 32


@dataclass(frozen=True)
class _Layout:
    title: str
    folder: str
    archive: str
    train: tuple[str, ...]
    test: tuple[str, ...]
    label_key: str
    num_classes: int


CIFAR_LAYOUTS: dict[str, _Layout] = {
    "cifar10": _Layout(
        "CIFAR-10",
        "cifar-10-batches-py",
        "cifar-10-python.tar.gz",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        ("test_batch",),
        "labels",
        10,
    ),
    "cifar100": _Layout(
        "CIFAR-100",
        "cifar-100-python",
        "cifar-100-python.tar.gz",
        ("train",),
        ("test",),
        "fine_labels",
        100,
    ),
}

# The globals a CIFAR pickle may name: numpy's array reconstruction (numpy 1 and 2
# module paths) and, in pickles written by Python 3 with protocol < 3, bytes objects.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a CIFAR file never does")


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()).rstrip(".")
    return text or type(err).__name__


def _unpickle(raw: bytes, where: str) -> dict[str, Any]:
    try:
        obj = _RestrictedUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except Exception as err:  # any failure of a corrupt pickle is the user's file
        raise DataError(
            f"{where} is not a readable CIFAR python-version pickle ({_one_line(err)})."
        ) from None
    if not isinstance(obj, dict):
        raise DataError(
            f"{where} holds a pickled {type(obj).__name__}, expected a dict with 'data' and labels."
        )
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _arrays(batch: dict[str, Any], layout: _Layout, where: str) -> tuple[np.ndarray, np.ndarray]:
    for key in ("data", layout.label_key):
        if key not in batch:
            raise DataError(
                f"{where} has no '{key}' entry (it has {', '.join(sorted(batch)) or 'none'}); "
                f"expected a {layout.title} python-version batch."
            )
    try:
        data = np.asarray(batch["data"])
        labels = np.asarray(batch[layout.label_key])
    except Exception as err:
        raise DataError(f"{where} holds data that is not an array ({_one_line(err)}).") from None
    if data.ndim != 2 or data.shape[1] != _ROW:
        raise DataError(
            f"{where} holds data of shape {data.shape}, expected (N, {_ROW}) for 32×32 RGB images."
        )
    if data.dtype != np.uint8:
        if not np.issubdtype(data.dtype, np.integer) or (
            data.size and (int(data.min()) < 0 or int(data.max()) > 255)
        ):
            raise DataError(f"{where} holds data of type {data.dtype}, expected uint8 pixels.")
        data = data.astype(np.uint8)
    if labels.shape != (data.shape[0],) or not (
        np.issubdtype(labels.dtype, np.integer) or labels.size == 0
    ):
        raise DataError(
            f"{where} holds {data.shape[0]} images but labels of shape {labels.shape} and type "
            f"{labels.dtype}, expected {data.shape[0]} integers."
        )
    if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= layout.num_classes):
        bad = int(labels.max()) if int(labels.max()) >= layout.num_classes else int(labels.min())
        raise DataError(
            f"{where} holds label {bad}, expected classes 0 to {layout.num_classes - 1} "
            f"for {layout.title}."
        )
    return data, labels.astype(np.int64)


class _Source:
    """Reads members of a CIFAR folder or archive as bytes."""

    def __init__(self, layout: _Layout, folder: Path | None, archive: Path | None) -> None:
        self.layout, self.folder, self.archive = layout, folder, archive
        self._tar: tarfile.TarFile | None = None

    def __enter__(self) -> _Source:
        if self.archive is not None:
            try:
                self._tar = tarfile.open(self.archive, "r:*")
            except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
                raise DataError(
                    f"{self.archive} is not a readable tar.gz archive ({_one_line(err)})."
                ) from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tar is not None:
            self._tar.close()

    def where(self, member: str) -> str:
        if self.folder is not None:
            return str(self.folder / member)
        return f"{self.archive}:{self.layout.folder}/{member}"

    def read(self, member: str) -> bytes:
        if self.folder is not None:
            path = self.folder / member
            if not path.is_file():
                raise DataError(
                    f"{self.layout.title} file not found: {path} (expected "
                    f"{', '.join(self.layout.train + self.layout.test)} in {self.folder})."
                )
            try:
                return path.read_bytes()
            except OSError as err:
                raise DataError(f"{path} could not be read ({_one_line(err)}).") from None
        assert self._tar is not None
        name = f"{self.layout.folder}/{member}"
        try:
            info = self._tar.getmember(name)
            fh = self._tar.extractfile(info)
            if fh is None:
                raise KeyError(name)
            return fh.read()
        except KeyError:
            raise DataError(
                f"{self.archive} has no member {name}; expected the {self.layout.title} "
                f"python-version archive ({self.layout.archive})."
            ) from None
        except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
            raise DataError(
                f"{self.archive} is not a readable tar.gz archive ({_one_line(err)})."
            ) from None


def _find(layout: _Layout, root: Path, name: str) -> tuple[Path | None, Path | None]:
    """(extracted folder, archive): exactly one is set; a DataError when neither is found."""
    if root.is_file():
        return None, root
    places = [root, root / "cifar", root / name, root.parent]
    for place in places:
        if (place / layout.folder).is_dir():
            return place / layout.folder, None
        if any((place / member).is_file() for member in layout.train + layout.test):
            return place, None
        if (place / layout.archive).is_file():
            return None, place / layout.archive
    raise DataError(
        f"{layout.title} not found: no {layout.folder}/ folder or {layout.archive} in {root}, "
        f"its cifar/ or {name}/ subfolder, or {root.parent} (set --data-dir or FEDCLOCK_DATA)."
    )


def _normalise(pixels: np.ndarray) -> torch.Tensor:
    x = pixels.reshape(-1, 3, 32, 32).astype(np.float32)
    x /= np.float32(255.0)
    x -= np.asarray(CIFAR10_MEAN, dtype=np.float32)[:, None, None]
    x /= np.asarray(CIFAR10_STD, dtype=np.float32)[:, None, None]
    return torch.from_numpy(x)


def load_cifar(name: str, data_dir: str | Path | None, *, max_train: int | None = None) -> Dataset:
    """CIFAR-10 (``name="cifar10"``) or CIFAR-100 (``"cifar100"``); see the module docstring.

    ``max_train`` keeps the first ``max_train`` training images (before
    normalisation, to save memory).

    Raises:
        DataError: files missing, unreadable, or not in the python-version format.
    """
    layout = CIFAR_LAYOUTS[name]
    root = data_root(
        data_dir, layout.title, f"{layout.folder}/ or {layout.archive} (the python version)"
    )
    folder, archive = _find(layout, root, name)
    splits: list[tuple[np.ndarray, np.ndarray]] = []
    with _Source(layout, folder, archive) as source:
        for members in (layout.train, layout.test):
            xs, ys = [], []
            for member in members:
                where = source.where(member)
                x, y = _arrays(_unpickle(source.read(member), where), layout, where)
                xs.append(x)
                ys.append(y)
            splits.append((np.concatenate(xs), np.concatenate(ys)))
    (x_tr, y_tr), (x_te, y_te) = splits
    if max_train is not None:
        x_tr, y_tr = x_tr[:max_train], y_tr[:max_train]
    return Dataset(
        name,
        x_train=_normalise(x_tr),
        y_train=torch.from_numpy(y_tr),
        x_test=_normalise(x_te),
        y_test=torch.from_numpy(y_te),
        num_classes=layout.num_classes,
        input_shape=(3, 32, 32),
    )
