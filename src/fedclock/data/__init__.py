"""Datasets and their partition among clients.

- :func:`load_dataset` — ``digits`` (scikit-learn), ``mnist`` (IDX files) or a
  seeded ``synthetic`` Gaussian mixture, as a :class:`Dataset` of tensors.
- :func:`partition` — split the train set among clients (``iid``,
  ``dirichlet``, ``shards``); :func:`label_histogram` summarises a split.
- :func:`read_idx` — the IDX file reader behind MNIST.
"""

from fedclock.data.datasets import Dataset, SyntheticSpec, load_dataset
from fedclock.data.idx import read_idx
from fedclock.data.partition import label_histogram, partition

__all__ = ["Dataset", "SyntheticSpec", "label_histogram", "load_dataset", "partition", "read_idx"]
