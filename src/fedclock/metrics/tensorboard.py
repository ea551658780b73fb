"""TensorBoard: every evaluation's metrics as scalars, one TensorBoard run per run folder.

``fedclock run / compare / sweep --tensorboard DIR`` calls :func:`enable`; every run of the
command then gets a :class:`TensorBoardWriter` (an observer, :mod:`fedclock.sim.observers`)
that writes the columns of each metrics.csv row as scalars into ``DIR/<cell>``: the run's
folder relative to the command's ``--out`` (``fedavg/seed-1`` for a comparison's cell,
``salf/strategy.t_max=1.5/seed-0`` for a sweep's; the run folder's name for ``run``).

Each scalar's step is the number of aggregations (server steps) at the evaluation and its
time stamp is the virtual time in seconds, so TensorBoard's "Step" axis shows server steps
and its "Relative" axis the virtual time. The setting travels to worker processes through the
environment variable :data:`ENV`; cells that were not run by this command (finished earlier
and reused, or run by Ray on another machine) get their scalars from their metrics.csv
afterwards (:func:`export_missing`), the same scalars. A resumed run writes its run's
scalars again from the start (the old event files are removed), so none is doubled.

It needs the ``tensorboard`` package (``pip install 'fedclock[tensorboard]'``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedclock.errors import ConfigError

ENV = "FEDCLOCK_TENSORBOARD"
EVENTS_GLOB = "events.out.tfevents.*"
_NOT_SCALARS = ("aggregation",)  # the step


def _summary_writer() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "--tensorboard needs the tensorboard package: pip install tensorboard (fedclock's "
            "tensorboard extra)."
        ) from None
    return SummaryWriter


def enable(root: Path, base: Path | None) -> None:
    """Give every run of this process and of its workers a TensorBoard run under ``root``:
    its folder's path relative to ``base`` (the command's output folder), or its folder's
    name when ``base`` is None or not above it. One sentence if tensorboard is missing."""
    _summary_writer()
    root.mkdir(parents=True, exist_ok=True)
    os.environ[ENV] = json.dumps(
        {"root": str(root.resolve()), "base": None if base is None else str(base.resolve())}
    )


def disable() -> None:
    os.environ.pop(ENV, None)


def _read_spec(spec: str) -> dict[str, Any]:
    """The setting :func:`enable` wrote into :data:`ENV`; one sentence if someone else did."""
    try:
        conf = json.loads(spec)
    except ValueError:
        conf = None
    ok = (
        isinstance(conf, dict)
        and isinstance(conf.get("root"), str)
        and conf["root"] != ""
        and (conf.get("base") is None or isinstance(conf["base"], str))
    )
    if not ok:
        raise ConfigError(
            f"${ENV} is fedclock's channel to its worker processes and holds a value it did not "
            f"write ({spec[:40]!r}): unset it, and use --tensorboard DIR instead."
        )
    return conf


def log_dir_for(run_dir: Path) -> Path | None:
    """The TensorBoard run of ``run_dir`` (None when :func:`enable` was not called)."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    conf = _read_spec(spec)
    root, run_dir = Path(conf["root"]), run_dir.resolve()
    rel: Path | None = None
    if conf["base"] is not None:
        try:
            rel = run_dir.relative_to(conf["base"])
        except ValueError:
            rel = None
    if rel is None or rel == Path("."):
        rel = Path(run_dir.name)
    elif rel.parts[0] == "runs" and len(rel.parts) > 1:  # compare / sweep: runs/<cell>/…
        rel = Path(*rel.parts[1:])
    return root / rel


def _scalars(row: Mapping[str, Any]) -> Iterable[tuple[str, float]]:
    for k, v in row.items():
        if k in _NOT_SCALARS or isinstance(v, str) or v is None:
            continue
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        yield k, x


class TensorBoardWriter:
    """The observer: the scalars of every evaluation row (after the metrics are in it).
    Not checkpoint state (as the progress display is not): a resumed run replays its history
    (:meth:`replay`), so a run may be resumed with or without ``--tensorboard``."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        for old in log_dir.glob(EVENTS_GLOB):  # a run written again (or resumed): afresh
            old.unlink()
        self._writer = _summary_writer()(log_dir=str(log_dir))

    def write_row(self, row: Mapping[str, Any]) -> None:
        step, t = int(row["aggregation"]), float(row["virtual_time"])
        for tag, x in _scalars(row):
            self._writer.add_scalar(tag, x, global_step=step, walltime=t)

    def replay(self, history: Iterable[Mapping[str, Any]]) -> None:
        """The rows a resumed run's checkpoint holds."""
        for row in history:
            self.write_row(row)

    def on_evaluation(self, sim: Any, row: dict[str, Any]) -> None:
        self.write_row(row)

    def close(self) -> None:
        self._writer.close()


def export(run_dir: Path, log_dir: Path) -> None:
    """Write a finished run's scalars from its metrics.csv (the observer's, afterwards)."""
    from fedclock.metrics.readers import read_metrics

    cols = read_metrics(run_dir)
    if "aggregation" not in cols:
        return
    writer = TensorBoardWriter(log_dir)
    try:
        n = len(cols["aggregation"])
        for i in range(n):
            # (a blank cell: a column that evaluation did not have)
            row = {k: float(v[i]) for k, v in cols.items() if not math.isnan(v[i])}
            if "aggregation" in row and "virtual_time" in row:
                writer.write_row(row)
    finally:
        writer.close()


def export_missing(run_dirs: Iterable[Path]) -> None:
    """:func:`export` each run whose TensorBoard run has no events yet (cells reused from an
    earlier command, or run elsewhere)."""
    for run_dir in run_dirs:
        log_dir = log_dir_for(run_dir)
        if log_dir is None or not (run_dir / "metrics.csv").is_file():
            continue
        if not any(log_dir.glob(EVENTS_GLOB)):
            export(run_dir, log_dir)
