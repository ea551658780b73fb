"""Datasets: digits, MNIST, CIFAR-10/100, Tiny Shakespeare and a seeded synthetic task.

:func:`load_dataset` returns a :class:`Dataset` with normalised float32 inputs
(channels first) — or int64 token ids for text — and int64 labels, split into
train and test sets. Splits and synthetic draws come from
:func:`fedclock.rng.stream`, so the same seed always gives the same data.

- ``digits``: the 1,797 8×8 images bundled with scikit-learn (``load_digits``);
  pixels are divided by 16, split (stratified) by ``test_fraction``, then
  standardised with the scalar mean and standard deviation of the train split.
- ``mnist``: the four standard IDX files (gzip or not) from ``data_dir`` or
  ``$FEDCLOCK_DATA`` (that folder, or its ``mnist/`` subfolder); pixels become
  ``(x/255 - 0.1307)/0.3081``; the official 10,000-image test set is used.
- ``cifar10`` / ``cifar100``: the python-version batches, see
  :mod:`fedclock.data.cifar`; the official test set is used.
- ``shakespeare``: next-character prediction on Tiny Shakespeare with one
  natural client per speaking role (``Dataset.groups``), see
  :mod:`fedclock.data.shakespeare` and :class:`TextSpec`.
- ``synthetic``: a Gaussian mixture, see :class:`SyntheticSpec` (flat features,
  or image-shaped samples with ``image_shape``); split (stratified) by
  ``test_fraction`` and standardised like ``digits``, generated in float32 straight
  into the returned tensors (no float64 or second copy of the samples).

``max_train`` keeps only the first ``max_train`` training samples and
``max_test`` the first ``max_test`` test samples (any dataset; Shakespeare keeps
evenly spaced ones instead, so every speaking role keeps its share).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from fedclock.data.cifar import load_cifar
from fedclock.data.dataset import Dataset, data_root
from fedclock.data.idx import IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, read_idx
from fedclock.data.shakespeare import TextSpec, load_shakespeare
from fedclock.errors import ConfigError, DataError
from fedclock.rng import stream, torch_generator

__all__ = [
    "DATASET_NAMES",
    "MNIST_FILES",
    "Dataset",
    "SyntheticSpec",
    "TextSpec",
    "load_dataset",
]

DATASET_NAMES = ("cifar10", "cifar100", "digits", "mnist", "shakespeare", "synthetic")
SEEDED_DATASETS = ("digits", "synthetic")
"""Datasets whose samples or train/test split :func:`load_dataset` draws from the seed."""

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081


@dataclass(frozen=True)
class SyntheticSpec:
    """A seeded Gaussian-mixture classification task.

    Each class ``k`` gets a mean ``mu_k`` with a uniformly random direction and
    norm ``separation``; a sample of class ``k`` is ``mu_k + N(0, I)``. Classes
    are balanced (sizes differ by at most one). Larger ``separation`` makes the
    task easier.

    With ``image_shape`` (e.g. ``(3, 32, 32)`` for CIFAR-shaped runs without
    CIFAR files) each sample is drawn in ``prod(image_shape)`` dimensions and
    reshaped to ``image_shape``, and ``num_features`` is not used. The mixture
    has no spatial structure; it only gives image models inputs of the right
    shape and a learnable task.
    """

    num_samples: int = 2000
    num_features: int = 20
    num_classes: int = 4
    separation: float = 2.0
    image_shape: tuple[int, ...] | None = None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """One sample's shape: ``image_shape``, or ``(num_features,)``."""
        return self.image_shape if self.image_shape is not None else (self.num_features,)

    def __post_init__(self) -> None:
        if self.image_shape is not None:
            shape = tuple(self.image_shape)
            if not shape or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape
            ):
                raise ConfigError(
                    f"data.synthetic.image_shape must be a non-empty list of positive integers, "
                    f"got {list(shape)}."
                )
            object.__setattr__(self, "image_shape", shape)
        if self.num_classes < 2:
            raise ConfigError(
                f"data.synthetic.num_classes must be at least 2, got {self.num_classes}."
            )
        if self.num_features < 1:
            raise ConfigError(
                f"data.synthetic.num_features must be at least 1, got {self.num_features}."
            )
        if self.num_samples < 2 * self.num_classes:
            raise ConfigError(
                f"data.synthetic.num_samples must be at least twice num_classes "
                f"({2 * self.num_classes}), got {self.num_samples}."
            )
        if not (self.separation >= 0 and np.isfinite(self.separation)):
            raise ConfigError(
                f"data.synthetic.separation must be a finite number ≥ 0, got {self.separation}."
            )


def load_dataset(
    name: str,
    *,
    seed: int,
    data_dir: str | Path | None = None,
    test_fraction: float = 0.2,
    synthetic: SyntheticSpec | None = None,
    max_train: int | None = None,
    max_test: int | None = None,
    text: TextSpec | None = None,
) -> Dataset:
    """Load dataset ``name`` (one of :data:`DATASET_NAMES`), deterministically per seed.

    ``test_fraction`` applies to ``digits`` and ``synthetic`` (stratified
    split) and to ``shakespeare`` (the last part of every role); MNIST and
    CIFAR come with their official test sets. ``synthetic`` is used by
    ``synthetic``, ``text`` by ``shakespeare``.

    Raises:
        ConfigError: unknown name or invalid ``test_fraction`` / ``max_train`` / ``max_test``.
        DataError: data files missing or malformed.
    """
    if name not in DATASET_NAMES:
        raise ConfigError(f"data.name {name!r} is unknown; allowed: {', '.join(DATASET_NAMES)}.")
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(
            f"data.test_fraction must be strictly between 0 and 1, got {test_fraction}."
        )
    for field_name, cap in (("max_train", max_train), ("max_test", max_test)):
        if cap is not None and cap < 1:
            raise ConfigError(f"data.{field_name} must be at least 1, got {cap}.")

    if name == "digits":
        ds = _load_digits(seed, test_fraction)
    elif name == "mnist":
        ds = _load_mnist(data_dir, max_train)
    elif name in ("cifar10", "cifar100"):
        ds = load_cifar(name, data_dir, max_train=max_train)
    elif name == "shakespeare":
        ds = load_shakespeare(
            data_dir, text=text, test_fraction=test_fraction, max_train=max_train,
            max_test=max_test,
        )  # fmt: skip
    else:
        ds = _load_synthetic(seed, test_fraction, synthetic or SyntheticSpec())

    if max_train is not None and max_train < ds.num_train:
        ds = replace(
            ds,
            x_train=ds.x_train[:max_train].clone(),
            y_train=ds.y_train[:max_train].clone(),
            groups=None if ds.groups is None else ds.groups[:max_train].copy(),
        )
    if max_test is not None and max_test < ds.num_test:
        ds = replace(
            ds,
            x_test=ds.x_test[:max_test].clone(),
            y_test=ds.y_test[:max_test].clone(),
            test_groups=None if ds.test_groups is None else ds.test_groups[:max_test].copy(),
        )
    return ds


# --------------------------------------------------------------------------- helpers


def _tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
    return xt, yt


def _split(
    x: np.ndarray, y: np.ndarray, seed: int, test_fraction: float, what: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stratified train/test split of ``(x, y)``: see :func:`_split_indices`."""
    tr, te = _split_indices(y, seed, test_fraction, what)
    return x[tr], x[te], y[tr], y[te]


def _split_indices(
    y: np.ndarray, seed: int, test_fraction: float, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified train/test split of the labels ``y``, drawn from ``stream(seed, "data-split")``:
    the train and the test samples' indices.

    The test set has ``ceil(test_fraction * N)`` samples (scikit-learn's rounding),
    shared among classes in proportion to their sizes (largest remainder), with
    every class in both sets. Both sets come back in random order.
    """
    n = len(y)
    n_test = int(np.ceil(test_fraction * n - 1e-9))
    classes, y_idx, counts = np.unique(y, return_inverse=True, return_counts=True)
    if n_test < len(classes) or n - n_test < len(classes) or counts.min() < 2:
        raise ConfigError(
            f"data.test_fraction {test_fraction} cannot split the {n} samples of "
            f"{what} so that every class appears in both train and test sets."
        )
    ideal = counts * n_test / n
    take = np.floor(ideal).astype(np.int64)
    order = np.argsort(-(ideal - take), kind="stable")
    take[order[: n_test - int(take.sum())]] += 1
    take = np.clip(take, 1, counts - 1)
    while int(take.sum()) > n_test:  # clipping can break the total: repair it
        k = int(np.argmax(np.where(take > 1, take - ideal, -np.inf)))
        take[k] -= 1
    while int(take.sum()) < n_test:
        k = int(np.argmax(np.where(take < counts - 1, ideal - take, -np.inf)))
        take[k] += 1

    rng = stream(seed, "data-split")
    test_parts, train_parts = [], []
    for k in range(len(classes)):
        members = rng.permutation(np.flatnonzero(y_idx == k))
        test_parts.append(members[: take[k]])
        train_parts.append(members[take[k] :])
    tr = rng.permutation(np.concatenate(train_parts))
    te = rng.permutation(np.concatenate(test_parts))
    return tr, te


def _standardise(x_tr: np.ndarray, x_te: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = float(x_tr.mean())
    std = float(x_tr.std()) or 1.0
    return (x_tr - mean) / std, (x_te - mean) / std


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits as ``(pixels 0..16, labels)``.

    Reads the CSV that ``sklearn.datasets.load_digits`` reads, straight from the
    installed package, which skips the seconds it takes to import scikit-learn
    and SciPy; falls back to ``load_digits`` if the file is not where expected.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.origin is not None:
        csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
        if csv.is_file():
            table = np.loadtxt(csv, delimiter=",")
            if table.shape == (1797, 65):
                return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)


def _load_digits(seed: int, test_fraction: float) -> Dataset:
    pixels, y = _digits_arrays()
    x = pixels / 16.0
    x_tr, x_te, y_tr, y_te = _split(x, y, seed, test_fraction, "digits")
    x_tr, x_te = _standardise(x_tr, x_te)
    shape = (1, 8, 8)
    xt_tr, yt_tr = _tensors(x_tr.reshape(-1, *shape), y_tr)
    xt_te, yt_te = _tensors(x_te.reshape(-1, *shape), y_te)
    return Dataset("digits", xt_tr, yt_tr, xt_te, yt_te, num_classes=10, input_shape=shape)


_ROWS = 2048  # rows per chunk of the synthetic generator's in-place passes


def _load_synthetic(seed: int, test_fraction: float, spec: SyntheticSpec) -> Dataset:
    """The Gaussian mixture, generated in float32 straight into its final tensors.

    The class means and labels come from ``stream(seed, "data-synthetic")`` and are split
    first; then each set's samples are drawn in that set's order (the train set's, then the
    test set's) by ``torch.randn`` from ``torch_generator(seed, "data-synthetic")``, one
    float32 tensor per set (samples are i.i.d. given their label, so this is the same
    distribution as drawing them all and splitting). The class means are added and the train
    split's scalar mean and standard deviation taken out in place, in chunks of rows, so no
    float64 or second copy of the samples is ever made.
    """
    rng = stream(seed, "data-synthetic")
    shape = spec.sample_shape
    n, d, c = spec.num_samples, math.prod(shape), spec.num_classes
    directions = rng.standard_normal((c, d))
    norms = np.linalg.norm(directions, axis=1, keepdims=True)
    means = (spec.separation * directions / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    y = rng.permutation(np.arange(n) % c).astype(np.int64)
    tr, te = _split_indices(y, seed, test_fraction, "the synthetic dataset")
    y_tr, y_te = y[tr], y[te]
    noise = torch_generator(seed, "data-synthetic")
    x_tr = _mixture_samples(noise, means, y_tr)
    x_te = _mixture_samples(noise, means, y_te)
    mean, std = _scalar_moments(x_tr.numpy())
    for x in (x_tr, x_te):
        x.sub_(mean).div_(std)
    return Dataset(
        "synthetic", x_tr.view(-1, *shape), torch.from_numpy(y_tr), x_te.view(-1, *shape),
        torch.from_numpy(y_te), num_classes=c, input_shape=shape,
    )  # fmt: skip


def _mixture_samples(gen: torch.Generator, means: np.ndarray, y: np.ndarray) -> torch.Tensor:
    """``means[y] + N(0, I)`` as one new float32 tensor, without a temporary of its size."""
    x = torch.randn(len(y), means.shape[1], generator=gen)
    rows, mu = x.numpy(), means
    for start in range(0, len(y), _ROWS):
        rows[start : start + _ROWS] += mu[y[start : start + _ROWS]]
    return x


def _scalar_moments(x: np.ndarray) -> tuple[float, float]:
    """Mean and standard deviation of all entries of ``x``, accumulated in float64 over chunks
    of rows (no temporary of ``x``'s size); a standard deviation of 0 is taken as 1."""
    mean = float(x.mean(dtype=np.float64))
    squares = 0.0
    buf = np.empty((min(len(x), _ROWS), *x.shape[1:]), dtype=np.float64)
    for start in range(0, len(x), _ROWS):
        dev = buf[: len(x[start : start + _ROWS])]
        dev[...] = x[start : start + _ROWS]
        dev -= mean
        squares += float(np.square(dev, out=dev).sum())
    std = math.sqrt(squares / x.size) if x.size else 0.0
    return mean, std or 1.0


def _mnist_dir(data_dir: str | Path | None) -> Path:
    """The folder holding the MNIST files: ``data_dir`` (or ``$FEDCLOCK_DATA``) or its ``mnist/``."""
    root = data_root(data_dir, "MNIST", "the four IDX files of MNIST")
    for candidate in (root, root / "mnist"):
        if any((candidate / f).is_file() or (candidate / f"{f}.gz").is_file() for f in MNIST_FILES):
            return candidate
    return root


def _mnist_file(folder: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    raise DataError(
        f"MNIST file not found: {folder / (stem + '.gz')} (expected the four IDX files of "
        f"MNIST in {folder}; set --data-dir or FEDCLOCK_DATA)."
    )


def _mnist_pair(folder: Path, images: str, labels: str) -> tuple[np.ndarray, np.ndarray]:
    img_path, lbl_path = _mnist_file(folder, images), _mnist_file(folder, labels)
    x = read_idx(img_path, expected_magic=IDX_IMAGES_MAGIC)
    y = read_idx(lbl_path, expected_magic=IDX_LABELS_MAGIC)
    if x.shape[1:] != (28, 28):
        raise DataError(
            f"{img_path} holds images of shape {tuple(x.shape[1:])}, expected 28×28 for MNIST."
        )
    if y.ndim != 1:
        raise DataError(f"{lbl_path} has {y.ndim} dimensions, expected 1 for MNIST labels.")
    if x.shape[0] != y.shape[0]:
        raise DataError(
            f"{img_path} holds {x.shape[0]} images but {lbl_path} holds {y.shape[0]} labels."
        )
    if y.size and int(y.max()) > 9:
        raise DataError(f"{lbl_path} holds label {int(y.max())}, expected digits 0 to 9.")
    return x, y


def _mnist_normalise(pixels: np.ndarray) -> np.ndarray:
    """``(x/255 - 0.1307)/0.3081`` in float32, in place on one new array (fast for 47M pixels)."""
    x = pixels.astype(np.float32)
    x /= np.float32(255.0)
    x -= np.float32(MNIST_MEAN)
    x /= np.float32(MNIST_STD)
    return x


def _load_mnist(data_dir: str | Path | None, max_train: int | None) -> Dataset:
    folder = _mnist_dir(data_dir)
    for stem in MNIST_FILES:  # report a missing file before reading any of them
        _mnist_file(folder, stem)
    x_tr, y_tr = _mnist_pair(folder, MNIST_FILES[0], MNIST_FILES[1])
    x_te, y_te = _mnist_pair(folder, MNIST_FILES[2], MNIST_FILES[3])
    if max_train is not None:
        x_tr, y_tr = x_tr[:max_train], y_tr[:max_train]
    shape = (1, 28, 28)
    xt_tr, yt_tr = _tensors(_mnist_normalise(x_tr).reshape(-1, *shape), y_tr)
    xt_te, yt_te = _tensors(_mnist_normalise(x_te).reshape(-1, *shape), y_te)
    return Dataset("mnist", xt_tr, yt_tr, xt_te, yt_te, num_classes=10, input_shape=shape)
