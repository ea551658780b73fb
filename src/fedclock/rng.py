"""Deterministic random streams.

Every random draw in fedclock comes from a stream keyed by
``(seed, purpose, *ids)`` — e.g. ``("batches", client, version)`` — never from a
shared global RNG, so results do not depend on execution order, and two
strategies run with the same seed see the same device draws, client samples
and batch orders (common random numbers).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch


def _key(seed: int, purpose: str, ids: tuple[int, ...]) -> list[int]:
    if seed < 0:
        raise ValueError("seed must be non-negative")
    return [int(seed), zlib.crc32(purpose.encode()), *(int(i) for i in ids)]


def stream(seed: int, purpose: str, *ids: int) -> np.random.Generator:
    """A numpy Generator for ``(seed, purpose, *ids)``; the same key always gives the same stream."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(_key(seed, purpose, ids))))


def torch_seed(seed: int, purpose: str, *ids: int) -> int:
    """A 63-bit integer seed for torch generators, derived like :func:`stream`."""
    ss = np.random.SeedSequence(_key(seed, purpose, ids))
    return int(
        ss.generate_state(2, dtype=np.uint32).astype(np.uint64)
        @ np.array([1, 2**32], dtype=np.uint64)
    ) & (2**63 - 1)


def torch_generator(seed: int, purpose: str, *ids: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(torch_seed(seed, purpose, *ids))
    return g
