"""The run directory: resolved config, versions, metrics.csv (flushed row by row), summary.json.

metrics.csv is written as the run goes, so an interrupted or diverged run keeps
every evaluation it made; summary.json records how the run ended (``status``).
With client losses on (``eval.client_losses``) metrics.csv gains the columns of
:data:`CLIENT_LOSS_COLUMNS` and the run directory a ``clients.csv`` (one row per
client: importance, participations, weight received, final training loss).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import math
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from fedclock import outputs
from fedclock.outputs import write_atomic

METRIC_COLUMNS = (
    "virtual_time",
    "wall_time",
    "aggregation",
    "updates_received",
    "updates_used",
    "updates_discarded",
    "updates_rejected",
    "test_accuracy",
    "test_loss",
    "bytes_up",
    "bytes_down",
    "compute_s_spent",
    "compute_s_wasted",
)

# extra metrics.csv columns when every client's training loss is evaluated
CLIENT_LOSS_COLUMNS = (
    "federated_loss",
    "surrogate_loss",
    "participation_loss",
    "client_loss_std",
)


def federated_metrics(
    losses: np.ndarray,
    p: np.ndarray,
    *,
    weight_received: np.ndarray,
    participations: np.ndarray,
) -> dict[str, float]:
    """Losses of the global model over the clients' training data (Fraboni et al. §5).

    - ``federated_loss``: Σ p_i L_i  (eq. 2), p the client importance;
    - ``surrogate_loss``: Σ q̃_i L_i  (eq. 10) with q̃_i = q_i / Σ_j q_j and q_i
      the total aggregation weight client i actually received so far (∝ the mean
      ω_i(n) over the server steps); before any aggregation q̃ = p;
    - ``participation_loss``: Σ r_i L_i with r_i ∝ client i's participation count
      (the authors' code plots this as the surrogate for asynchronous FedAvg and
      FedBuff, the same weights for every strategy of a comparison);
    - ``client_loss_std``: the p-weighted standard deviation of the L_i
      around the federated loss.
    """
    loss = np.asarray(losses, dtype=np.float64)
    w = np.asarray(p, dtype=np.float64)
    w = w / w.sum()

    def normalised(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        total = x.sum()
        return x / total if total > 0 else w

    federated = float(w @ loss)
    return {
        "federated_loss": federated,
        "surrogate_loss": float(normalised(weight_received) @ loss),
        "participation_loss": float(normalised(participations) @ loss),
        "client_loss_std": float(np.sqrt(max(float(w @ (loss - federated) ** 2), 0.0))),
    }


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    from fedclock import __version__

    out["fedclock"] = __version__  # the source's version, even in a stale editable install
    for pkg in ("torch", "numpy", "scikit-learn", "pydantic", "typer", "matplotlib"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# files that never change a run's metrics: the command line, the grids of many runs
# (fedclock.runs: cells, cache, tables), plots (presets only produce configs, and a run's
# config is compared on its own)
_NOT_COMPUTE = (
    "cli.py",
    "__main__.py",
    "runs/__init__.py",
    "runs/grid.py",
    "runs/cache.py",
    "runs/lr.py",
    "runs/tables.py",
    "runs/compare.py",
    "runs/sweep.py",
    "runs/parallel.py",
    "metrics/plots.py",
    "metrics/readers.py",
    "report/__init__.py",
    "tour.py",
)


@functools.cache
def source_digest() -> str:
    """sha256 of the fedclock source that computes a run (each .py file with its path).

    Stored in meta.json: ``compare``/``sweep`` reuse a finished run only when it was made by
    the same source, so an edit inside a version is never mixed with runs made before it.
    The CLI, table, plot, report and tour modules are left out (:data:`_NOT_COMPUTE`).
    """
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if rel not in _NOT_COMPUTE:
            h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


STATUSES = ("completed", "diverged", "interrupted")
#: summary.json fields every reader relies on, and their types
_SUMMARY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str, "strategy": str, "seed": int, "status": str,
}  # fmt: skip


#: the files of a finished run whose size and digest meta.json records (RunRecorder.seal)
SEALED_FILES = ("config.yaml", "metrics.csv", "clients.csv", "timeline.csv")


def _file_digest(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def verify_files(run_dir: Path) -> str | None:
    """Why a finished run's files are not those it finished with (one clause naming the
    file), or None when they are — or when its meta.json records none (runs made before)."""
    try:
        meta = json.loads((run_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return "its meta.json cannot be read"
    files = meta.get("files") if isinstance(meta, dict) else None
    if files is None:
        return None
    if not isinstance(files, dict):
        return "its meta.json is damaged"
    for name, want in files.items():
        path = run_dir / name
        if path.is_symlink() or not path.is_file():
            return f"its {name} is missing"
        try:
            got = _file_digest(path)
        except OSError:
            return f"its {name} cannot be read"
        if got != want:
            return f"its {name} changed since it finished"
    return None


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir/summary.json`` (None if there is none); one sentence if it is damaged."""
    from fedclock.errors import DataError

    path = run_dir / "summary.json"
    if not (path.exists() or path.is_symlink()):
        return None
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise DataError(f"{path} could not be read ({reason}).") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} is damaged: it is not JSON (line {exc.lineno}).") from None
    except ValueError:  # (UnicodeDecodeError is one)
        raise DataError(f"{path} is damaged: it is not JSON.") from None
    if not isinstance(data, dict):
        raise DataError(f"{path} is damaged: it holds no JSON object.")
    for key, kind in _SUMMARY_FIELDS.items():
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise DataError(f"{path} is damaged: its field '{key}' is missing or of another type.")
    if data["status"] not in STATUSES:
        raise DataError(f"{path} is damaged: its status is not one of {', '.join(STATUSES)}.")
    return data


class RunRecorder:
    """Writes a run folder. ``resume_rows``: continue the run folder's metrics.csv after its
    first ``resume_rows`` rows (those a checkpoint covers; later ones are dropped, the resumed
    run writes them again)."""

    def __init__(
        self, run_dir: Path, *, extra_columns: Sequence[str] = (), resume_rows: int | None = None
    ) -> None:
        self.run_dir = run_dir
        self.columns = (*METRIC_COLUMNS, *extra_columns)
        run_dir.mkdir(parents=True, exist_ok=True)
        outputs.clean_temporaries(run_dir)  # (left by a process killed while writing)
        stale_files = ["summary.json", "clients.csv", "timeline.csv"]
        if resume_rows is None:
            stale_files.append("metrics.csv")
        for stale in stale_files:
            (run_dir / stale).unlink(missing_ok=True)
        path = run_dir / "metrics.csv"
        if resume_rows is not None:
            self._truncate(path, resume_rows)
            self._fh = path.open("a", newline="")
            self._writer = csv.DictWriter(self._fh, fieldnames=list(self.columns))
            return
        self._fh = path.open("w", newline="")
        self._writer = csv.DictWriter(self._fh, fieldnames=list(self.columns))
        self._writer.writeheader()
        self._fh.flush()

    def _truncate(self, path: Path, rows: int) -> None:
        from fedclock.errors import CheckpointError

        try:
            lines = path.read_bytes().splitlines(keepends=True)
        except OSError:
            lines = []
        header = ",".join(self.columns).encode()
        if not lines or lines[0].rstrip(b"\r\n") != header or len(lines) < rows + 1:
            raise CheckpointError(
                f"{path} does not hold the {rows} rows its checkpoint covers, so the run "
                "cannot be resumed; run it again without --resume."
            )
        kept = lines[: rows + 1]
        if not kept[-1].endswith(b"\n"):
            raise CheckpointError(f"{path} ends in a partial row, so the run cannot be resumed.")
        write_atomic(path, b"".join(kept))

    def write_config(self, config_yaml: str, seed: int, argv: Sequence[str] | None = None) -> None:
        write_atomic(self.run_dir / "config.yaml", config_yaml)
        meta = {
            "seed": seed,
            "versions": versions(),
            "source_digest": source_digest(),
            "argv": list(argv if argv is not None else sys.argv),
        }
        write_atomic(self.run_dir / "meta.json", json.dumps(meta, indent=2) + "\n")

    def note_resume(self, argv: Sequence[str] | None = None) -> None:
        """meta.json lists each resume's command line (the run's own fields stay)."""
        path = self.run_dir / "meta.json"
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError):
            meta = {}
        if not isinstance(meta, dict) or not isinstance(meta.get("resumed", []), list):
            meta = {}
        meta.setdefault("resumed", []).append(list(argv if argv is not None else sys.argv))
        write_atomic(path, json.dumps(meta, indent=2) + "\n")

    def record(self, row: dict[str, Any]) -> None:
        try:
            self._writer.writerow({k: _fmt(row[k]) for k in self.columns})
            self._fh.flush()
            if outputs.fault_hook is not None:
                outputs.fault_hook(self.run_dir / "metrics.csv", "appended")
        except OSError as exc:  # a full disk: name the file (the rows before stay)
            raise OSError(exc.errno, exc.strerror, str(self.run_dir / "metrics.csv")) from None

    def on_evaluation(self, sim: Any, row: dict[str, Any]) -> None:
        """As an observer: writes every evaluation row."""
        self.record(row)

    def seal(self) -> None:
        """meta.json records each result file's size and SHA-256 (``files``), just before
        summary.json: a finished run is reused only while its files still match
        (:func:`verify_files`)."""
        path = self.run_dir / "meta.json"
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError):
            meta = {}
        if not isinstance(meta, dict):
            meta = {}
        if not self._fh.closed:
            self._fh.flush()
        meta["files"] = {
            name: _file_digest(self.run_dir / name)
            for name in SEALED_FILES
            if (self.run_dir / name).is_file()
        }
        write_atomic(path, json.dumps(meta, indent=2) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        # whole or absent: a kill never leaves half a summary
        write_atomic(self.run_dir / "summary.json", json.dumps(json_safe(summary), indent=2) + "\n")

    def write_clients(self, columns: dict[str, Sequence[Any]]) -> None:
        """clients.csv: one row per client, one column per entry of ``columns``."""
        names = list(columns)
        buf = io.StringIO(newline="")
        w = csv.writer(buf)
        w.writerow(names)
        for row in zip(*(columns[k] for k in names), strict=True):
            w.writerow([_fmt(float(v)) if isinstance(v, np.floating) else _fmt(v) for v in row])
        write_atomic(self.run_dir / "clients.csv", buf.getvalue())  # whole or absent

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def json_safe(obj: Any) -> Any:
    """NaN/inf become null so summary.json is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return repr(v)  # shortest round-trip text: identical runs give identical files
    return v


def time_to_target(history: Sequence[dict[str, Any]], target: float | None) -> float | None:
    """First virtual time at which the test accuracy reached ``target`` (None if never)."""
    if target is None:
        return None
    for row in history:
        if row["test_accuracy"] >= target:
            return float(row["virtual_time"])
    return None


TAIL_FRACTION = 0.1


def tail_mean(history: Sequence[dict[str, Any]], key: str) -> float:
    """Mean of ``key`` over the evaluations in the last 10% of the run's virtual time.

    Single evaluations of an asynchronous run are noisy (the model moves with
    every client's step); this is the steadier "final" value (Fraboni et al.
    average their Fig. 3 losses over the last 5% of the server steps).
    """
    if not history:
        return math.nan
    end = float(history[-1]["virtual_time"])
    start = end - TAIL_FRACTION * end
    vals = [float(r[key]) for r in history if float(r["virtual_time"]) >= start and key in r]
    return float(np.mean(vals)) if vals else math.nan


def summarize(
    *,
    name: str,
    strategy: str,
    seed: int,
    status: str,
    stop_reason: str | None,
    history: Sequence[dict[str, Any]],
    counters: Any,
    wall_s: float,
    virtual_time: float,
    target_accuracy: float | None,
    num_clients: int,
    extra_columns: Sequence[str] = (),
    availability: bool = False,
) -> dict[str, Any]:
    """summary.json: the headline numbers of one run; each of ``extra_columns`` (evaluator
    metrics such as ``cis_accuracy``) at the last evaluation; ``updates_lost`` on a fleet
    with ``availability`` (0 included, so seeds and strategies compare) or where any was."""
    accs = [r["test_accuracy"] for r in history]
    last = history[-1] if history else None
    spent = float(counters.compute_s_spent)
    wasted = float(counters.compute_s_wasted)
    part = counters.participation
    stale: dict[int, int] = dict(sorted(getattr(counters, "staleness", {}).items()))
    n_stale = sum(stale.values())
    client_losses: dict[str, float] = {}
    if history and CLIENT_LOSS_COLUMNS[0] in history[0]:
        for k in CLIENT_LOSS_COLUMNS:
            client_losses[k] = last[k] if last and k in last else math.nan
        for k in CLIENT_LOSS_COLUMNS:
            client_losses[f"{k}_tail"] = tail_mean(history, k)
    return {
        "name": name,
        "strategy": strategy,
        "seed": seed,
        "status": status,
        "stop_reason": stop_reason,
        "final_test_accuracy": last["test_accuracy"] if last else math.nan,
        "best_test_accuracy": max(accs) if accs else math.nan,
        "final_test_loss": last["test_loss"] if last else math.nan,
        **{k: (last[k] if last and k in last else math.nan) for k in extra_columns},
        **client_losses,
        "virtual_time": virtual_time,
        "aggregations": int(counters.aggregations),
        "updates_received": int(counters.updates_received),
        "updates_used": int(counters.updates_used),
        "updates_discarded": int(counters.updates_discarded),
        "updates_rejected": int(counters.updates_rejected),
        # lost when a device went offline (only with a trace's availability)
        **(
            {"updates_lost": int(counters.updates_lost)}
            if availability or counters.updates_lost
            else {}
        ),
        "mean_staleness": sum(k * v for k, v in stale.items()) / n_stale if n_stale else math.nan,
        "max_staleness": max(stale) if stale else math.nan,
        "staleness_histogram": {str(k): v for k, v in stale.items()},
        "compute_s_spent": spent,
        "compute_s_wasted": wasted,
        "useful_work_ratio": (spent - wasted) / spent if spent > 0 else math.nan,
        "bytes_up": float(counters.bytes_up),
        "bytes_down": float(counters.bytes_down),
        "clients_participated": len(part),
        "num_clients": num_clients,
        "target_accuracy": target_accuracy,
        "time_to_target": time_to_target(history, target_accuracy),
        "wall_s": wall_s,
    }
