"""Tiny Shakespeare as next-character prediction, one natural client per speaking role.

The task follows LEAF's Shakespeare and Fraboni et al.'s code: a sample is a
window of ``seq_len`` (80) characters, the label is the character that follows
it, and a client is one speaking role of the plays.

**File.** ``tinyshakespeare.txt`` (Karpathy's char-rnn ``input.txt``, 1,115,394
bytes) from ``data_dir`` or ``$FEDCLOCK_DATA``: that folder itself, its
``shakespeare/`` subfolder, or — when the folder is a sibling such as the
shared data root's ``mnist/`` — ``../shakespeare``. ``data_dir`` may also be
the file itself. It must be UTF-8 text.

**Vocabulary.** The authors' code indexes a character by its position in
Python's :data:`string.printable` (digits, ASCII letters, punctuation, then
``' \\t\\n\\r\\x0b\\x0c'``): 100 symbols, so ``num_classes = 100`` and the
embedding has 100 rows, even though Tiny Shakespeare uses only 65 of them.
A character outside that set (none in Tiny Shakespeare) is read as a space.

**Roles.** The text is a sequence of speeches separated by blank lines. A line
ending with ``:`` that follows a blank line (or opens the file) starts a speech
by the role it names (``ROMEO:`` → ``ROMEO``); the lines up to the next role
line are that speech (blank lines inside are skipped, lines before the first
role line are ignored). A role's text is all its speeches in order, each line
followed by ``\\n``. Roles are identified by name only: Tiny Shakespeare
concatenates plays without marking where one ends, so e.g. ``First Citizen``
of different plays is one role. Tiny Shakespeare has 299 roles that speak at
least one line (1,027,852 characters of speech in all).

**Samples.** In each role's text, windows start every ``stride`` characters:
``x = text[s : s+seq_len]`` (int64 token ids), ``y = text[s+seq_len]``, for
``s = 0, stride, 2·stride, …`` while ``s + seq_len < len(text)``. Windows never
cross from one role to another. The stride bounds the size of the data set
(stride 1 is LEAF's every-position sampling): Tiny Shakespeare gives about
1.03 M / ``stride`` windows, so the default stride 20 gives ≈ 40 k training and
≈ 10 k test samples.

**Dropped roles.** A role with fewer than ``min_samples`` windows is dropped
(its text is not used at all); the default 10 keeps 219 of the 299 roles at
stride 20. Kept roles are numbered in order of first appearance: that number
is each sample's group (``Dataset.groups``), and ``Dataset.group_names`` gives
the role names.

**Test split.** The last ``test_fraction`` (default 20 %) of each role's windows,
rounded half up and at least one window, never all of them, form the test
set; the rest are training samples. The split is by position, not random, so
held-out windows are later text; the first ⌈seq_len/stride⌉ test windows of a
role share input characters with its last training windows (LEAF's random
per-sample split overlaps far more).

Samples are stored role after role, in text order. ``max_train`` /
``max_test`` keep evenly spaced samples (see
:func:`~fedclock.data.dataset.even_subset`), so every role keeps its share.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from fedclock.data.dataset import Dataset, data_root, even_subset
from fedclock.errors import ConfigError, DataError

__all__ = [
    "SHAKESPEARE_FILE",
    "VOCAB",
    "TextSpec",
    "encode",
    "find_shakespeare_file",
    "load_shakespeare",
    "parse_roles",
    "role_windows",
]

SHAKESPEARE_FILE = "tinyshakespeare.txt"
VOCAB = string.printable
"""The 100 symbols of the vocabulary; a character's token id is its position here."""

_INDEX = np.full(128, VOCAB.index(" "), dtype=np.int64)
for _i, _c in enumerate(VOCAB):
    _INDEX[ord(_c)] = _i


@dataclass(frozen=True)
class TextSpec:
    """How text becomes samples: window length, stride between windows, smallest role kept."""

    seq_len: int = 80
    stride: int = 20
    min_samples: int = 10

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ConfigError(f"data.text.seq_len must be at least 1, got {self.seq_len}.")
        if self.stride < 1:
            raise ConfigError(f"data.text.stride must be at least 1, got {self.stride}.")
        if self.min_samples < 2:
            raise ConfigError(
                f"data.text.min_samples must be at least 2 (one training and one test "
                f"window), got {self.min_samples}."
            )


def encode(text: str) -> np.ndarray:
    """Token ids (int64) of ``text``: positions in :data:`VOCAB`; unknown characters → space."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    out = np.full(codes.shape, _INDEX[ord(" ")], dtype=np.int64)
    ascii_ = codes < 128
    out[ascii_] = _INDEX[codes[ascii_]]
    return out


def parse_roles(text: str) -> dict[str, str]:
    """Each speaking role's text (its speeches' lines, each ending in ``\\n``), in order of first appearance.

    See the module docstring for what starts a speech.
    """
    roles: dict[str, list[str]] = {}
    current: list[str] | None = None
    after_blank = True
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            after_blank = True
            continue
        if after_blank and line.endswith(":") and line[:-1].strip():
            current = roles.setdefault(line[:-1].strip(), [])
        elif current is not None:
            current.append(raw + "\n")
        after_blank = False
    return {name: "".join(lines) for name, lines in roles.items() if lines}


def role_windows(codes: np.ndarray, seq_len: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows ``codes[s:s+seq_len]`` and next tokens ``codes[s+seq_len]`` for ``s = 0, stride, …``."""
    starts = np.arange(0, max(0, len(codes) - seq_len), stride, dtype=np.int64)
    if starts.size == 0:
        return np.empty((0, seq_len), dtype=np.int64), np.empty(0, dtype=np.int64)
    x = sliding_window_view(codes, seq_len)[starts]
    return x, codes[starts + seq_len]


def find_shakespeare_file(data_dir: str | Path | None) -> Path:
    """Where ``tinyshakespeare.txt`` is (see the module docstring); a DataError when nowhere."""
    root = data_root(data_dir, "Tiny Shakespeare", f"{SHAKESPEARE_FILE}")
    if root.is_file():
        return root
    candidates = [root / SHAKESPEARE_FILE, root / "shakespeare" / SHAKESPEARE_FILE]
    candidates.append(root.parent / "shakespeare" / SHAKESPEARE_FILE)
    for path in candidates:
        if path.is_file():
            return path
    raise DataError(
        f"Tiny Shakespeare not found: no {SHAKESPEARE_FILE} in {root}, {root / 'shakespeare'} "
        f"or {root.parent / 'shakespeare'} (set --data-dir or FEDCLOCK_DATA to its folder)."
    )


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as err:
        reason = " ".join((err.strerror or str(err)).split())
        raise DataError(f"{path} could not be read ({reason}).") from None
    if not raw.strip():
        raise DataError(f"{path} is empty; expected the text of Tiny Shakespeare.")
    if b"\x00" in raw:
        raise DataError(f"{path} is not a text file (it holds NUL bytes).")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path} is not a UTF-8 text file (invalid byte at position {err.start})."
        ) from None


def _split_point(n: int, test_fraction: float) -> int:
    """Training windows of a role with ``n ≥ 2`` windows: the rest (≥ 1, < n) are test windows."""
    n_test = int(np.floor(test_fraction * n + 0.5))
    return n - min(max(n_test, 1), n - 1)


def load_shakespeare(
    data_dir: str | Path | None,
    *,
    text: TextSpec | None = None,
    test_fraction: float = 0.2,
    max_train: int | None = None,
    max_test: int | None = None,
) -> Dataset:
    """Tiny Shakespeare as described in the module docstring.

    Raises:
        DataError: the file is missing, empty, not text, holds no speeches, or
            no role has ``text.min_samples`` windows.
    """
    spec = text or TextSpec()
    path = find_shakespeare_file(data_dir)
    roles = parse_roles(_read_text(path))
    if not roles:
        raise DataError(
            f"{path} holds no speeches: expected blocks that start with a role line such as "
            f"'ROMEO:' after a blank line."
        )
    names: list[str] = []
    parts: dict[str, list[np.ndarray]] = {"xtr": [], "ytr": [], "xte": [], "yte": []}
    groups_tr: list[np.ndarray] = []
    groups_te: list[np.ndarray] = []
    for name, role_text in roles.items():
        x, y = role_windows(encode(role_text), spec.seq_len, spec.stride)
        n = len(y)
        if n < spec.min_samples:
            continue
        cut = _split_point(n, test_fraction)
        gid = len(names)
        names.append(name)
        parts["xtr"].append(x[:cut])
        parts["ytr"].append(y[:cut])
        parts["xte"].append(x[cut:])
        parts["yte"].append(y[cut:])
        groups_tr.append(np.full(cut, gid, dtype=np.int64))
        groups_te.append(np.full(n - cut, gid, dtype=np.int64))
    if not names:
        raise DataError(
            f"{path} has no speaking role with at least {spec.min_samples} windows of "
            f"{spec.seq_len}+1 characters at stride {spec.stride}; lower data.text.min_samples, "
            f"data.text.seq_len or data.text.stride."
        )
    g_tr, g_te = np.concatenate(groups_tr), np.concatenate(groups_te)
    keep_tr, keep_te = even_subset(len(g_tr), max_train), even_subset(len(g_te), max_test)

    def stack(key: str, keep: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(np.concatenate(parts[key])[keep]))

    return Dataset(
        "shakespeare",
        x_train=stack("xtr", keep_tr),
        y_train=stack("ytr", keep_tr),
        x_test=stack("xte", keep_te),
        y_test=stack("yte", keep_te),
        num_classes=len(VOCAB),
        input_shape=(spec.seq_len,),
        groups=g_tr[keep_tr],
        test_groups=g_te[keep_te],
        group_names=tuple(names),
    )
