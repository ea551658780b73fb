"""Deterministic random streams.

Every random draw in fedclock comes from a stream keyed by
``(seed, purpose, *ids)`` — e.g. ``("batches", client, version)`` — never from a
shared global RNG, so results do not depend on execution order, and two
strategies run with the same seed see the same device draws, client samples
and batch orders (common random numbers).
"""

from __future__ import annotations

import functools
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


_M64 = (1 << 64) - 1


def splitmix64(z: int) -> int:
    """The SplitMix64 output function of ``z`` + the golden-ratio increment (64-bit)."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def splitmix64_at(seed: int, position: int) -> int:
    """Output number ``position`` (0-based) of the SplitMix64 stream seeded by ``seed``."""
    return splitmix64((seed + position * 0x9E3779B97F4A7C15) & _M64)


_GAMMA = np.uint64(0x9E3779B97F4A7C15)


_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31))


def _mix64_(z: np.ndarray) -> np.ndarray:
    """SplitMix64's mixing steps on the ``uint64`` array ``z`` in place (one scratch array for
    the shifts: a large temporary per shift costs more than the arithmetic). Array arithmetic
    wraps mod 2⁶⁴ without a warning (only NumPy's scalar arithmetic checks for overflow)."""
    t = np.empty_like(z)
    np.right_shift(z, _SHIFTS[0], out=t)
    z ^= t
    z *= _MUL1
    np.right_shift(z, _SHIFTS[1], out=t)
    z ^= t
    z *= _MUL2
    np.right_shift(z, _SHIFTS[2], out=t)
    z ^= t
    return z


def splitmix64_array(z: np.ndarray) -> np.ndarray:
    """:func:`splitmix64` element-wise over a ``uint64`` array (arithmetic wraps mod 2⁶⁴)."""
    with np.errstate(over="ignore"):
        return _mix64_(z + _GAMMA)  # (a new array: the mixing works in place on it)


def splitmix64_grid(keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Output ``positions[j]`` of the stream seeded by ``keys[i]``, as a (keys, positions)
    ``uint64`` array: :func:`splitmix64_at` over the grid, with one temporary."""
    step = (positions.astype(np.uint64) + np.uint64(1)) * _GAMMA  # z + γ of each position
    return _mix64_(np.add(keys.astype(np.uint64)[:, None], step[None, :]))


def counter_key(seed: int, purpose: str, *ids: int) -> int:
    """A 64-bit key for ``(seed, purpose, *ids)``; extend it with :func:`splitmix64` per id."""
    key = 0
    for part in _key(seed, purpose, ids):
        key = splitmix64(key ^ part)
    return key


@functools.lru_cache(maxsize=256)
def _purpose_key(seed: int, purpose: str) -> np.uint64:
    return np.uint64(counter_key(seed, purpose))


def counter_keys(seed: int, purpose: str, *ids: np.ndarray) -> np.ndarray:
    """:func:`counter_key` element-wise over arrays of ids (one ``uint64`` key per element)."""
    arrays = [np.asarray(i).astype(np.uint64) for i in ids]
    shape = np.broadcast(*arrays).shape if arrays else ()
    out = np.full(shape, _purpose_key(seed, purpose), dtype=np.uint64)
    for a in arrays:
        out = splitmix64_array(out ^ a)
    return out


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
