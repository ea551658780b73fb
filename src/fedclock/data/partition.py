"""Split a training set among clients: iid, Dirichlet label skew, McMahan's shards, or natural.

:func:`partition` returns one sorted int64 array of train-set indices per client.
The arrays are disjoint, and every random draw comes from
``stream(seed, "partition", ...)`` so a seed always gives the same split. Client
sizes are drawn from their own stream, so for a given seed, ``num_clients`` and
``sizes`` every scheme gives clients the same number of samples.

Client sizes (``sizes``):

- ``equal``: ``floor(N / num_clients)`` each; the remainder ``N mod num_clients``
  is spread one sample each over the first clients, so all N samples are used.
- ``lognormal``: sizes proportional to ``lognormal(0, size_sigma)`` draws, with a
  floor of ``min_samples`` (clients below it are raised to it and the rest share
  what is left in proportion), rounded by largest remainder so they sum to N.

Schemes (``scheme``):

- ``iid``: shuffle the indices, then cut them into the client sizes.
- ``dirichlet``: per-client Dirichlet label proportions, as in Fraboni et al.
  (also how "MNIST-shard = Dir 0.1" is meant). Each client ``c`` draws
  ``q_c ~ Dir(alpha * 1)`` over the classes (small ``alpha``: a few classes
  dominate; large ``alpha``: close to uniform), then fills its quota by drawing
  samples class by class according to ``q_c``, without replacement, from
  shuffled per-class pools. When a class pool runs out, ``q_c`` is renormalised
  over the classes that still have samples. Clients are served in a random order
  so that pool exhaustion does not favour low client ids. Every client gets
  exactly its quota and the clients' indices are disjoint.
- ``shards``: McMahan et al.'s pathological non-iid split. Indices are sorted
  by label (randomly within a class), cut into ``num_clients * shards_per_client``
  contiguous shards of (nearly) equal size, and each client gets
  ``shards_per_client`` random shards, so it sees about ``shards_per_client``
  classes. Only ``sizes="equal"`` is allowed.
- ``natural``: the clients the data come from, given as a group id per sample
  (``Dataset.groups``; for Shakespeare, the speaking role). The
  ``num_clients`` largest groups (most training samples first, ties to the
  smaller id) become clients 0, 1, …, each with all of its group's samples;
  samples of the other groups are not used, and groups smaller than
  ``min_samples`` are never chosen. Sizes are the groups' own, so ``sizes``
  must be ``equal`` (the default, ignored here); no random draw is made.
"""

from __future__ import annotations

import numpy as np

from fedclock.errors import ConfigError
from fedclock.rng import stream

__all__ = ["SCHEMES", "SIZES", "client_sizes", "label_histogram", "natural_clients", "partition"]

SCHEMES = ("iid", "dirichlet", "shards", "natural")
SIZES = ("equal", "lognormal", "tree")

# Stream ids under purpose "partition".
_SIZES_STREAM = 0
_ASSIGN_STREAM = 1


def partition(
    labels: np.ndarray,
    num_clients: int,
    *,
    scheme: str,
    seed: int,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    sizes: str = "equal",
    size_sigma: float = 1.0,
    min_samples: int = 1,
    groups: np.ndarray | None = None,
    shares: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Split ``range(len(labels))`` among ``num_clients`` clients; see the module docstring.

    ``groups`` (one non-negative integer per sample) is needed by, and only
    used by, ``scheme="natural"``. ``shares`` (one per client, summing to 1) gives the
    client sizes of ``sizes="tree"`` (a collaborative inference system's data split).

    Returns:
        One sorted int64 index array per client, disjoint, each of at least
        ``min_samples`` entries.

    Raises:
        ConfigError: an unknown scheme or sizes, or settings the data cannot satisfy.
    """
    y = np.asarray(labels)
    if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or y.size == 0):
        raise ValueError("labels must be a 1-D array of integers")
    if y.size and int(y.min()) < 0:
        raise ValueError("labels must be non-negative")
    n = int(y.size)

    if scheme not in SCHEMES:
        raise ConfigError(f"partition.scheme {scheme!r} is unknown; allowed: {', '.join(SCHEMES)}.")
    if sizes not in SIZES:
        raise ConfigError(f"partition.sizes {sizes!r} is unknown; allowed: {', '.join(SIZES)}.")
    if num_clients < 1:
        raise ConfigError(f"partition.num_clients must be at least 1, got {num_clients}.")
    if min_samples < 1:
        raise ConfigError(f"partition.min_samples must be at least 1, got {min_samples}.")
    if num_clients * min_samples > n:
        raise ConfigError(
            f"partition.num_clients {num_clients} needs at least "
            f"{num_clients * min_samples} training samples ({min_samples} per client) "
            f"but the training set has {n}."
        )
    if not (alpha > 0 and np.isfinite(alpha)):
        raise ConfigError(f"partition.alpha must be a finite number > 0, got {alpha}.")
    if not (size_sigma >= 0 and np.isfinite(size_sigma)):
        raise ConfigError(f"partition.size_sigma must be a finite number ≥ 0, got {size_sigma}.")

    if scheme == "natural":
        return _natural(groups, n, num_clients, sizes, min_samples)
    rng = stream(seed, "partition", _ASSIGN_STREAM)
    if scheme == "shards":
        return _shards(y, num_clients, shards_per_client, sizes, min_samples, rng)

    if sizes == "tree":
        if shares is None or len(shares) != num_clients:
            raise ConfigError("partition.sizes tree needs one data share per node (cis.tree).")
        quota = shared_sizes(n, np.asarray(shares, dtype=float), min_samples)
    else:
        quota = client_sizes(
            n, num_clients, sizes=sizes, size_sigma=size_sigma, min_samples=min_samples, seed=seed
        )
    if scheme == "iid":
        bounds = np.cumsum(quota)[:-1]
        parts = np.split(rng.permutation(n), bounds)
    else:
        parts = _dirichlet(y, quota, alpha, rng)
    return [np.sort(p).astype(np.int64, copy=False) for p in parts]


def natural_clients(groups: np.ndarray, num_clients: int, *, min_samples: int = 1) -> np.ndarray:
    """Ids of the ``num_clients`` largest groups, largest first (ties: smaller id first).

    Raises:
        ConfigError: fewer than ``num_clients`` groups have ``min_samples`` samples.
    """
    counts = np.bincount(np.asarray(groups, dtype=np.int64))
    order = np.lexsort((np.arange(len(counts)), -counts))
    eligible = order[counts[order] >= min_samples]
    if len(eligible) < num_clients:
        raise ConfigError(
            f"partition.num_clients {num_clients} exceeds the {len(eligible)} natural clients "
            f"(e.g. speaking roles) with at least {min_samples} training samples; lower "
            f"partition.num_clients or use partition.scheme 'iid'."
        )
    return eligible[:num_clients].astype(np.int64)


def _natural(
    groups: np.ndarray | None, n: int, num_clients: int, sizes: str, min_samples: int
) -> list[np.ndarray]:
    if groups is None:
        raise ConfigError(
            "partition.scheme 'natural' needs a dataset whose samples come from natural clients "
            "(data.name 'shakespeare'); this one has none, so use 'iid', 'dirichlet' or 'shards'."
        )
    g = np.asarray(groups)
    if g.shape != (n,) or not (np.issubdtype(g.dtype, np.integer) or g.size == 0):
        raise ValueError(f"groups must be a 1-D integer array of length {n}")
    if g.size and int(g.min()) < 0:
        raise ValueError("groups must be non-negative")
    if sizes != "equal":
        raise ConfigError(
            f"partition.sizes must be 'equal' with partition.scheme 'natural' (clients keep "
            f"their natural sizes), got {sizes!r}."
        )
    chosen = natural_clients(g, num_clients, min_samples=min_samples)
    return [np.flatnonzero(g == c).astype(np.int64, copy=False) for c in chosen]


def shared_sizes(n: int, shares: np.ndarray, min_samples: int = 1) -> np.ndarray:
    """Sample counts ∝ ``shares`` summing to ``n``: floors, then the largest remainders
    (ties to the lower client id), each at least ``min_samples``."""
    want = shares / shares.sum() * n
    out = np.maximum(np.floor(want).astype(np.int64), min_samples)
    rest = n - int(out.sum())
    if rest > 0:
        order = np.argsort(-(want - np.floor(want)), kind="stable")
        out[order[:rest]] += 1
    while int(out.sum()) > n:
        out[int(np.argmax(out))] -= 1
    return out


def client_sizes(
    n: int,
    num_clients: int,
    *,
    sizes: str = "equal",
    size_sigma: float = 1.0,
    min_samples: int = 1,
    seed: int = 0,
) -> np.ndarray:
    """Per-client sample counts (int64, summing to ``n``) as described in the module docstring.

    Assumes ``num_clients * min_samples <= n`` (checked by :func:`partition`).
    """
    if sizes == "equal":
        base, rem = divmod(n, num_clients)
        return base + (np.arange(num_clients) < rem).astype(np.int64)
    if sizes != "lognormal":
        raise ConfigError(f"partition.sizes {sizes!r} is unknown; allowed: {', '.join(SIZES)}.")

    w = stream(seed, "partition", _SIZES_STREAM).lognormal(0.0, size_sigma, num_clients)
    floored = np.zeros(num_clients, dtype=bool)
    share = np.zeros(num_clients)
    for _ in range(num_clients + 1):  # water-filling: each pass floors >= 1 client or stops
        free = n - min_samples * int(floored.sum())
        share = np.where(floored, float(min_samples), w * free / w[~floored].sum())
        low = ~floored & (share < min_samples)
        if not low.any():
            break
        floored |= low
    out = np.floor(share).astype(np.int64)
    out = np.maximum(out, min_samples)
    rest = n - int(out.sum())
    if rest > 0:  # largest remainders first; ties broken by client id
        order = np.argsort(-(share - np.floor(share)), kind="stable")
        out[order[:rest]] += 1
    while int(out.sum()) > n:  # only float round-off can get here; trim the largest clients
        out[int(np.argmax(out))] -= 1
    return out


def _dirichlet(
    y: np.ndarray, quota: np.ndarray, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    classes, y_idx = np.unique(y, return_inverse=True)
    num_classes = len(classes)
    pools = [rng.permutation(np.flatnonzero(y_idx == k)) for k in range(num_classes)]
    avail = np.array([len(p) for p in pools], dtype=np.int64)
    taken = np.zeros(num_classes, dtype=np.int64)  # next unused position in each pool
    parts: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(quota)

    for c in rng.permutation(len(quota)):
        q = rng.dirichlet(np.full(num_classes, alpha))
        counts = np.zeros(num_classes, dtype=np.int64)
        need = int(quota[c])
        while need > 0:
            left = avail - counts
            p = np.where(left > 0, q, 0.0)
            if p.sum() <= 0 or not np.isfinite(p.sum()):
                # q put (numerically) all its mass on exhausted classes: fall back to
                # drawing in proportion to what is left.
                p = left.astype(np.float64)
            draw = rng.multinomial(need, p / p.sum())
            got = np.minimum(draw, left)
            counts += got
            need -= int(got.sum())
        chunks = [pools[k][taken[k] : taken[k] + counts[k]] for k in np.flatnonzero(counts)]
        taken += counts
        avail -= counts
        parts[c] = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)
    return parts


def _shards(
    y: np.ndarray,
    num_clients: int,
    shards_per_client: int,
    sizes: str,
    min_samples: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    n = len(y)
    if sizes != "equal":
        raise ConfigError(
            f"partition.sizes must be 'equal' with partition.scheme 'shards', got {sizes!r}."
        )
    if shards_per_client < 1:
        raise ConfigError(
            f"partition.shards_per_client must be at least 1, got {shards_per_client}."
        )
    num_shards = num_clients * shards_per_client
    smallest = shards_per_client * (n // num_shards)
    if smallest < max(min_samples, 1):
        raise ConfigError(
            f"partition.shards_per_client {shards_per_client} with {num_clients} clients "
            f"cuts the {n} training samples into shards too small to give every client "
            f"{min_samples} samples."
        )
    perm = rng.permutation(n)
    order = perm[np.argsort(y[perm], kind="stable")]  # by label, random within a label
    shards = np.array_split(order, num_shards)
    assignment = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [
        np.sort(np.concatenate([shards[s] for s in row])).astype(np.int64, copy=False)
        for row in assignment
    ]


def label_histogram(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Counts of each class per client: an int64 array of shape ``(len(parts), num_classes)``."""
    y = np.asarray(labels)
    if y.size and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    hist = np.zeros((len(parts), num_classes), dtype=np.int64)
    for i, p in enumerate(parts):
        hist[i] = np.bincount(y[np.asarray(p, dtype=np.int64)], minlength=num_classes)
    return hist
