"""Reader for the IDX format of MNIST (plain or gzip-compressed).

An IDX file starts with a 4-byte magic number ``0x0000TTNN`` — two zero bytes,
a data-type code ``TT`` and the number of dimensions ``NN`` — followed by ``NN``
big-endian int32 dimension sizes and the data itself, big-endian, in C order.
MNIST labels have magic 2049 (``0x0801``: unsigned bytes, 1 dimension) and
MNIST images 2051 (``0x0803``: unsigned bytes, 3 dimensions).

Every problem with a file — missing, unreadable, not gzip, wrong magic,
truncated — is raised as a one-sentence :class:`~fedclock.errors.DataError`
that names the file.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from fedclock.errors import DataError

__all__ = ["IDX_IMAGES_MAGIC", "IDX_LABELS_MAGIC", "read_idx"]

IDX_LABELS_MAGIC = 2049
IDX_IMAGES_MAGIC = 2051

_GZIP_MAGIC = b"\x1f\x8b"

# IDX data-type codes -> big-endian numpy dtypes.
_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _kind(magic: int) -> str:
    if magic == IDX_IMAGES_MAGIC:
        return "an IDX image file"
    if magic == IDX_LABELS_MAGIC:
        return "an IDX label file"
    return f"an IDX file of magic number {magic}"


#: the most data an IDX file may announce (MNIST's largest file holds 47 MB)
MAX_IDX_BYTES = 4 << 30


def _decompress(path: Path, raw: bytes) -> bytes:
    """The IDX bytes in gzip ``raw``: its header is inflated first, and a file whose header
    announces more than MAX_IDX_BYTES is refused before the rest is inflated; at most one
    byte past the announced size is inflated (so that trailing bytes are still seen)."""
    if not raw.startswith(_GZIP_MAGIC):
        raise DataError(
            f"{path} is not a valid gzip file (it does not start with the gzip magic bytes)."
        )
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = b""

    def upto(n: int) -> bool:
        """Inflate until ``out`` holds ``n`` bytes or the stream ends; whether it holds them."""
        nonlocal out
        data = raw if not out and not inflate.unconsumed_tail else inflate.unconsumed_tail
        while len(out) < n and data:
            out += inflate.decompress(data, n - len(out))
            data = inflate.unconsumed_tail
        return len(out) >= n

    want = 4
    try:
        if upto(4) and upto(want := 4 + 4 * out[3]):
            size = _DTYPES[out[2]].itemsize if out[2] in _DTYPES else 1
            for i in range(4, want, 4):
                size *= int.from_bytes(out[i : i + 4], "big")
            if size > MAX_IDX_BYTES:
                raise DataError(
                    f"{path} announces {size:.3g} bytes of data in its IDX header, more than "
                    f"the {MAX_IDX_BYTES >> 30} GiB an IDX file may hold; it is damaged."
                )
            upto(want := want + size + 1)
    except zlib.error as err:
        reason = " ".join((str(err).strip().rstrip(".") or type(err).__name__).split())
        raise DataError(f"{path} is not a valid gzip file ({reason}).") from None
    if len(out) < want and not inflate.eof:
        raise DataError(f"{path} is not a valid gzip file (the compressed stream ends early).")
    return out


def read_idx(path: Path, *, expected_magic: int | None = None) -> np.ndarray:
    """Read an IDX file into a native-endian numpy array of the shape its header announces.

    The file is decompressed first when its name ends in ``.gz`` or its content
    starts with the gzip magic bytes. ``expected_magic`` (e.g. 2051 for images,
    2049 for labels) makes any other magic number an error.

    Raises:
        DataError: the file is missing or unreadable, not valid gzip, not IDX,
            has an unexpected magic number, or is truncated or has trailing bytes.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"IDX file not found: {path}.")
    try:
        raw = path.read_bytes()
    except OSError as err:
        reason = " ".join((err.strerror or str(err)).split())
        raise DataError(f"{path} could not be read ({reason}).") from None

    if path.suffix == ".gz" or raw.startswith(_GZIP_MAGIC):
        raw = _decompress(path, raw)  # (a header announcing absurd sizes: refused first)

    if len(raw) < 4:
        raise DataError(
            f"{path} is truncated: an IDX header needs at least 4 bytes "
            f"but only {len(raw)} are present."
        )
    magic = int.from_bytes(raw[:4], "big")
    type_code, ndim = raw[2], raw[3]
    if expected_magic is not None and magic != expected_magic:
        raise DataError(
            f"{path} is not {_kind(expected_magic)}: magic number {magic}, "
            f"expected {expected_magic}."
        )
    if raw[0] != 0 or raw[1] != 0 or type_code not in _DTYPES:
        raise DataError(
            f"{path} is not an IDX file: magic number {magic} does not name a known IDX data type."
        )

    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DataError(
            f"{path} is truncated: its IDX header needs {header_len} bytes "
            f"but only {len(raw)} are present."
        )
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    if any(d < 0 for d in dims):
        raise DataError(f"{path} is not a valid IDX file: its header announces dimensions {dims}.")
    dtype = _DTYPES[type_code]
    count = 1
    for d in dims:
        count *= d
    need = count * dtype.itemsize
    have = len(raw) - header_len
    if have < need:
        raise DataError(
            f"{path} is truncated: header announces {need} bytes of data "
            f"but only {have} are present."
        )
    if have > need:
        raise DataError(
            f"{path} is not a valid IDX file: header announces {need} bytes of data "
            f"but {have} are present."
        )

    data = np.frombuffer(raw, dtype=dtype, count=count, offset=header_len).reshape(dims)
    # A native-endian, writable copy (frombuffer over bytes is read-only).
    return data.astype(dtype.newbyteorder("="), copy=True)
