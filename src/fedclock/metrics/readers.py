"""Reading a run's metrics.csv and a comparison's or sweep's table.csv, and stepping a
metric onto a time grid — without plotting libraries, so the report and TensorBoard export
read runs without importing matplotlib."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def _read_csv(
    path: Path, what: str, lines: list[int] | None = None, header: list[str] | None = None
) -> list[dict[str, str]]:
    """The rows of a CSV file as text (``lines``, if given, gets each row's line number;
    ``header`` the column names); one sentence naming the file, and the line, if it is not a
    CSV table."""
    from fedclock.errors import DataError

    at: list[int] = [] if lines is None else lines
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            rows = []
            for r in reader:
                rows.append(r)
                at.append(reader.line_num)
            if header is not None:
                header.extend(reader.fieldnames or ())
    except UnicodeDecodeError:
        raise DataError(f"{path} is not {what}: it is not UTF-8 text.") from None
    except csv.Error as exc:
        raise DataError(f"{path} is not {what} ({str(exc)[:60]}).") from None
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise DataError(f"{path} could not be read ({reason}).") from None
    for i, r in enumerate(rows):
        if None in r or None in r.values():
            named = [k for k in r if k is not None]
            fields = sum(r[k] is not None for k in named) + len(r.get(None) or [])
            raise DataError(
                f"{path} is not {what}: line {at[i]} has {fields} fields, its header {len(named)}."
            )
    return rows


#: the columns every metrics.csv has, finite in every row (the x axes of every curve)
AXES = ("virtual_time", "aggregation")


def read_metrics(run_dir: Path) -> dict[str, np.ndarray]:
    """A run's metrics.csv as one array per column ({} for a header alone: a run killed
    before its first evaluation). One sentence naming the file if it is empty, lacks a
    column of :data:`AXES`, or holds a value that is not a number (or a non-finite axis)."""
    from fedclock.errors import DataError

    path = run_dir / "metrics.csv"
    lines: list[int] = []
    header: list[str] = []
    rows = _read_csv(path, "a run's metrics table", lines, header)
    if not header:
        raise DataError(f"{path} is not a run's metrics table: it is empty (no header line).")
    for col in AXES:
        if col not in header:
            raise DataError(f"{path} is not a run's metrics table: it has no column '{col}'.")
    if not rows:
        return {}
    try:
        out = {k: np.array([float(r[k] or "nan") for r in rows]) for k in rows[0]}
    except ValueError:
        for i, r in enumerate(rows):  # (the first value that is not a number, for the sentence)
            for k, v in r.items():
                try:
                    float(v or "nan")
                except ValueError:
                    raise DataError(
                        f"{path} is not a run's metrics table: line {lines[i]} holds "
                        f"{v[:20]!r} in column {k[:40]!r}, which is not a number."
                    ) from None
        raise
    for col in AXES:
        bad = np.flatnonzero(~np.isfinite(out[col]))
        if bad.size:
            raise DataError(
                f"{path} is not a run's metrics table: line {lines[int(bad[0])]} holds "
                f"{rows[int(bad[0])][col][:20]!r} in column '{col}', which is not a finite number."
            )
    return out


def step_interp(t: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The value in force at each grid time: the latest evaluation at or before it."""
    idx = np.searchsorted(t, grid, side="right") - 1
    out = y[np.clip(idx, 0, len(y) - 1)].astype(float)
    out[idx < 0] = np.nan
    out[grid > t[-1]] = np.nan
    return out


def read_table(out_dir: Path) -> list[dict[str, str]]:
    """The rows of ``OUT/table.csv`` (a comparison's or a sweep's table), as text."""
    return _read_csv(out_dir / "table.csv", "a comparison's or sweep's table")
