"""Reading a run's metrics.csv and a comparison's or sweep's table.csv, and stepping a
metric onto a time grid — without plotting libraries, so the report and TensorBoard export
read runs without importing matplotlib."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def _read_csv(path: Path, what: str, lines: list[int] | None = None) -> list[dict[str, str]]:
    """The rows of a CSV file as text (``lines``, if given, gets each row's line number);
    one sentence naming the file, and the line, if it is not a CSV table."""
    from fedclock.errors import DataError

    at: list[int] = [] if lines is None else lines
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            rows = []
            for r in reader:
                rows.append(r)
                at.append(reader.line_num)
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


def read_metrics(run_dir: Path) -> dict[str, np.ndarray]:
    from fedclock.errors import DataError

    path = run_dir / "metrics.csv"
    lines: list[int] = []
    rows = _read_csv(path, "a run's metrics table", lines)
    if not rows:
        return {}
    try:
        return {k: np.array([float(r[k] or "nan") for r in rows]) for k in rows[0]}
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
