"""Datasets and their partition among clients.

- :func:`load_dataset` — ``digits`` (scikit-learn), ``mnist`` (IDX files),
  ``cifar10`` / ``cifar100`` (python-version batches), ``shakespeare`` (Tiny
  Shakespeare, next character, one natural client per speaking role) or a
  seeded ``synthetic`` Gaussian mixture, as a :class:`Dataset` of tensors.
- :func:`partition` — split the train set among clients (``iid``,
  ``dirichlet``, ``shards``, ``natural``); :func:`label_histogram` summarises a split.
- :func:`read_idx` — the IDX file reader behind MNIST.
"""

from fedclock.data.dataset import Dataset
from fedclock.data.datasets import DATASET_NAMES, SyntheticSpec, load_dataset
from fedclock.data.idx import read_idx
from fedclock.data.partition import label_histogram, natural_clients, partition
from fedclock.data.shakespeare import VOCAB, TextSpec

__all__ = [
    "DATASET_NAMES",
    "VOCAB",
    "Dataset",
    "SyntheticSpec",
    "TextSpec",
    "label_histogram",
    "load_dataset",
    "natural_clients",
    "partition",
    "read_idx",
]
