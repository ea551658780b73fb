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

import gzip
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


def _decompress(path: Path, raw: bytes) -> bytes:
    if not raw.startswith(_GZIP_MAGIC):
        raise DataError(
            f"{path} is not a valid gzip file (it does not start with the gzip magic bytes)."
        )
    try:
        return gzip.decompress(raw)
    except EOFError:
        reason = "the compressed stream ends early"
    except (OSError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        reason = str(err).strip().rstrip(".") or type(err).__name__
    reason = " ".join(reason.split())  # keep the message on one line
    raise DataError(f"{path} is not a valid gzip file ({reason}).")


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
        raw = _decompress(path, raw)

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
