"""The ``fedclock`` command: run, compare, sweep, plot, report, tour, presets."""

from __future__ import annotations

import errno
import gc
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedclock.errors import FedclockError, short

if TYPE_CHECKING:
    from fedclock.config import ExperimentConfig

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Federated learning on slow, busy and unreliable devices, simulated on a virtual clock.",
)

ConfigArg = Annotated[
    Path | None, typer.Argument(help="Experiment config (YAML).", show_default=False)
]
PresetOpt = Annotated[
    str | None, typer.Option("--preset", "-p", help="A shipped preset (see `fedclock presets`).")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a field: key.path=value (repeatable)."),
]
DataDirOpt = Annotated[
    Path | None, typer.Option("--data-dir", help="Folder with dataset files (else $FEDCLOCK_DATA).")
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the result as one JSON object on stdout.")
]
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        help="Where the cells run: 'local' (this machine; --jobs N processes at once) or "
        "'ray' (a Ray cluster: --address, or a local Ray with --jobs CPUs).",
    ),
]
JobsOpt = Annotated[
    int | None,
    typer.Option(
        "--jobs",
        "-j",
        help="Cells (with --batch-runs: groups) at once. Default: 1 locally, a group per core "
        "with run batching, all CPUs on Ray.",
    ),
]
BatchRunsOpt = Annotated[
    int | None,
    typer.Option(
        "--batch-runs",
        help="Cells advanced together in one process, their clients trained in shared vmap "
        "blocks (results as alone). Default: 8 for MLP/logreg models on the vectorized "
        "executor (bit-identical there), else 1; give N to batch other models too.",
    ),
]
TensorBoardOpt = Annotated[
    Path | None,
    typer.Option(
        "--tensorboard",
        metavar="DIR",
        help="Also write every evaluation's metrics as TensorBoard scalars under DIR, one "
        "TensorBoard run per run folder (needs the tensorboard package).",
    ),
]
AddressOpt = Annotated[
    str | None, typer.Option("--address", help="The Ray cluster to use, e.g. ray://head:10001.")
]
QuietOpt = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        help="Print nothing but errors (and the --json object): no progress bar, notes or table.",
    ),
]
StrategiesOpt = Annotated[  # compare and sweep
    str | None,
    typer.Option(help="Comma-separated strategies (default: the config's compare.strategies)."),
]
SeedsOpt = Annotated[
    str | None,
    typer.Option(help="Comma-separated seeds (default: compare.seeds, else the config's seed)."),
]


@app.callback()
def _main(
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            help="Show fedclock's log messages on stderr (also in compare/sweep workers): -v "
            "what a run decides on its own (PruneFL's initial pruning, Fed-RAA's delay bound, "
            "executor fallbacks), -vv debug detail. Same as $FEDCLOCK_LOG_LEVEL=INFO/DEBUG.",
        ),
    ] = 0,
) -> None:
    from fedclock import logs

    with _user_errors():
        logs.show("DEBUG" if verbose > 1 else "INFO" if verbose else None)


def _console(json_mode: bool, quiet: bool) -> Console:
    """Where progress, notes and tables go: stderr when stdout carries JSON; nowhere with -q
    (errors are printed by another console)."""
    return Console(stderr=json_mode, quiet=quiet)


@contextmanager
def _user_errors() -> Iterator[None]:
    try:
        yield
    except FedclockError as exc:  # (escaped: a sentence may hold brackets, fedclock[flower])
        Console(stderr=True).print(
            f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(2) from None
    except OSError as exc:  # an unwritable or full disk, a folder where a file should be, ...
        if exc.filename is None and _stdout_failed(exc):
            _stdout_closed(exc)
        what = exc.strerror or exc.__class__.__name__
        where = f"{exc.filename}: " if exc.filename else ""
        msg = f"Could not use {where}{what[0].lower()}{what[1:]}"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # what was written stays
            msg += "; free some space (or raise the file-size limit) and run the command again"
            msg += " (`fedclock run --resume DIR` goes on with a run)"
        elif exc.errno == errno.EIO:  # the device failed: what was written may not be
            msg += "; the device reported a hardware or network error: check it, then run the "
            msg += "command again (`fedclock run --resume DIR` goes on with a run)"
        msg += "."
        Console(stderr=True).print(
            f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(2) from None
    except KeyboardInterrupt:  # outside a run's loop (which stops cleanly on its own)
        Console(stderr=True).print("[bold red]error:[/] Interrupted (Ctrl-C).", highlight=False)
        raise typer.Exit(130) from None


def _header_only(path: Path) -> bool:
    """Whether ``path`` is a metrics.csv fedclock had just begun: its header line alone."""
    from fedclock.metrics.recorder import METRIC_COLUMNS

    try:
        if path.is_symlink() or path.stat().st_size > 4096:
            return False
        lines = path.read_bytes().splitlines()
    except OSError:
        return False
    return len(lines) == 1 and lines[0].startswith(",".join(METRIC_COLUMNS).encode())


def _fresh_run_dir(out: Path | None, cfg: Any) -> None:
    """``run --out``: a new or empty folder, or one holding a run of this very config (made
    again, the same numbers): no other file already there is ever overwritten."""
    from fedclock.config import to_yaml
    from fedclock.errors import ConfigError
    from fedclock.outputs import RUN_FILES, is_temporary

    if out is None:
        base = Path(cfg.output_dir)
        if base.exists() and not base.is_dir():
            raise ConfigError(f"output_dir {base} is a file; give a folder for the runs.")
        return
    if not (out.exists() or out.is_symlink()):
        return
    if out.is_symlink():
        raise ConfigError(
            f"--out {out} is a symbolic link; fedclock writes a run only into a folder, not "
            "through links: give the folder it leads to."
        )
    if not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder for the run.")
    # (a checkpoint being written when the process was killed leaves a temporary file)
    names = {p.name for p in out.iterdir() if not is_temporary(p.name)}
    if not names or (names == {"metrics.csv"} and _header_only(out / "metrics.csv")):
        return  # (empty, or a run killed before it wrote its config: started again)
    try:
        same = (out / "config.yaml").read_bytes() == to_yaml(cfg).encode()
    except OSError:
        same = False
    regular = all((out / n).is_file() and not (out / n).is_symlink() for n in names)
    if not (same and regular and names <= RUN_FILES):
        raise ConfigError(
            f"Run folder {out} already exists and holds other files than a run of this "
            "config; fedclock writes a run only into a new or empty folder (or over a run of "
            "the same config), so give another --out."
        )


def _resume_config(run_dir: Path) -> Any:
    """The config of the run in ``run_dir`` to resume (None if that run has finished)."""
    from fedclock.config import load_config, read_yaml
    from fedclock.errors import ConfigError
    from fedclock.metrics.recorder import read_summary
    from fedclock.sim.checkpoint import CHECKPOINT_FILE

    if not (run_dir / "config.yaml").is_file():
        from fedclock.outputs import is_temporary

        # (the recorder makes metrics.csv, then config.yaml: a kill between leaves no config)
        kept = (
            {p.name for p in run_dir.iterdir() if not is_temporary(p.name)}
            if run_dir.is_dir()
            else None
        )
        if kept is not None and kept <= {"metrics.csv"}:
            raise ConfigError(
                f"--resume {run_dir}: the run was stopped before it wrote its config, so "
                "nothing of it is kept; run the command that started it again."
            )
        raise ConfigError(f"--resume {run_dir}: no fedclock run there (it has no config.yaml).")
    if not (run_dir / CHECKPOINT_FILE).is_file():
        # (with a checkpoint the summary is rewritten: a kill may have cut it short)
        summary = read_summary(run_dir)  # a damaged one: one sentence, nothing touched
        if summary is not None and summary["status"] in ("completed", "diverged"):
            return None
    return load_config(raw=read_yaml(run_dir / "config.yaml"))


def _load(
    config: Path | None,
    preset: str | None,
    overrides: list[str] | None,
    data_dir: Path | None,
    *,
    grid: bool = False,
    console: Console | None = None,
):
    from fedclock.config import load_config, read_yaml
    from fedclock.errors import ConfigError
    from fedclock.presets import load_preset

    if config is not None and preset is not None:
        raise ConfigError("Give either a CONFIG file or --preset, not both.")
    raw: dict[str, Any] = load_preset(preset) if preset else (read_yaml(config) if config else {})
    extra = list(overrides or [])
    if data_dir is not None:
        if data_dir.exists() and not data_dir.is_dir():
            raise ConfigError(
                f"--data-dir {data_dir} is a file; give the folder that holds the data."
            )
        extra.append(f"data.data_dir={data_dir}")
    cfg = load_config(raw=raw, overrides=extra, grid=grid)  # grid: a comparison's base
    note = _shrunk_schedule(raw, cfg)
    if note is not None and console is not None:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    return cfg


def _shrunk_schedule(raw: dict[str, Any], cfg: Any) -> str | None:
    """One sentence when ``budget.aggregations`` is below the preset's (or config file's)
    and a schedule of the strategy spans the budget (CIS: the cosine learning rate, the
    FLOPS ramp), so it is compressed rather than cut."""
    given = (raw.get("budget") or {}).get("aggregations")
    rounds = cfg.budget.aggregations
    if not isinstance(given, int) or rounds is None or rounds >= given:
        return None
    what = []
    if getattr(cfg.strategy, "lr_schedule", None) == "cosine":
        what.append(f"the cosine learning rate reaches strategy.lr_min at round {rounds}")
    ramp = getattr(cfg.strategy, "flops_ramp", True)  # (cis-flops; default true)
    if ramp and "cis-flops" in {cfg.strategy.name, *cfg.compare.strategies}:
        what.append(f"cis-flops's ramp ends at round {rounds}")
    if not what:
        return None
    return (
        f"budget.aggregations={rounds} is shorter than the {given} the config was made for: "
        f"{' and '.join(what)} (the schedules shrink with the budget)."
    )


class _Bar:
    """A rich progress bar over the run's budget, refreshed at most 10 times a second."""

    def __init__(self, progress: Progress, cfg: Any, label: str) -> None:
        b = cfg.budget
        if b.virtual_time is not None:
            self.total, self.unit = b.virtual_time, "time"
        elif b.aggregations is not None:
            self.total, self.unit = float(b.aggregations), "aggregations"
        else:
            self.total, self.unit = float(b.updates), "updates"
        self.progress = progress
        self.task = progress.add_task(label, total=self.total, status="")
        self._last = 0.0

    def __call__(self, sim: Any) -> None:
        now = time.perf_counter()
        if now - self._last < 0.1 and sim.stop_reason is None:
            return
        self._last = now
        ctr = sim.counters
        done = {"time": sim.now, "aggregations": ctr.aggregations, "updates": ctr.updates_used}[
            self.unit
        ]
        last = sim.history[-1] if sim.history else {}
        key, name = headline_column(last)
        value = last.get(key, float("nan"))
        shown = f"{value:.4g}" if name == "loss" else f"{value:.3f}"
        self.progress.update(
            self.task,
            completed=min(done, self.total),
            status=f"t={sim.now:,.1f}s  agg={ctr.aggregations}  {name}={shown}",
        )


def headline_column(row: dict[str, Any]) -> tuple[str, str]:
    """The metrics.csv column a run's progress bar shows and its short name: the curve of
    the run's headline metric (:func:`fedclock.runs.tables.lead`)."""
    from fedclock.runs.tables import lead

    m = lead(row, curves=True)
    assert m.curve is not None
    return m.curve, m.short


def _progress(console: Console, quiet: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
        transient=False,
    )


#: headline metrics `fedclock run`'s table shows as "—" when the run has none
_ALWAYS_SHOWN = ("final_test_accuracy", "best_test_accuracy", "final_test_loss", "time_to_target")
#: what `fedclock run`'s table shows after the headline metrics
_RUN_ACCOUNTING = (
    "updates_used", "updates_rejected", "compute_s_spent", "compute_s_wasted", "cis_sigma",
    "cis_lambda_tilde", "wall_s",
)  # fmt: skip


def _summary_table(summary: dict[str, Any], run_dir: Path) -> Table:
    t = Table(
        title=f"{summary['name']} · {summary['strategy']} · seed {summary['seed']} · {summary['status']}"
    )
    t.add_column("metric")
    t.add_column("value", justify="right")
    from fedclock.runs.tables import HEADLINE

    def show(key: str, v: Any) -> None:
        if isinstance(v, list):  # (CIS's σ and Λ̃: one value per exit)
            t.add_row(key, " / ".join(f"{x:.3g}" for x in v))
        else:
            t.add_row(key, "—" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)))

    # the headline metrics the run has, in their order, then its accounting
    for m in HEADLINE:
        if m.key in summary or m.key in _ALWAYS_SHOWN:
            show(m.key, summary.get(m.key))
    for key in _RUN_ACCOUNTING:
        if key in summary or key == "wall_s":
            show(key, summary.get(key))
    t.caption = f"run directory: {run_dir}"
    return t


def _import_run_experiment() -> Callable[..., Any]:
    """``fedclock.experiment.run_experiment``, imported with the cyclic garbage collector paused.

    The import (torch, pydantic, the strategies) creates some 300,000 long-lived objects and
    almost no garbage, yet the collector's passes over them cost ≈ 0.1–0.3 s of a process's
    start-up. They are frozen out of its later passes too (``gc.freeze``); the simulator
    freezes everything alive when its loop starts anyway, and unfreezes all after the loop.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        from fedclock.experiment import run_experiment
    finally:
        if enabled:
            gc.enable()
    gc.freeze()
    return run_experiment


@app.command()
def run(
    config: ConfigArg = None,
    preset: PresetOpt = None,
    set_: SetOpt = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Run directory (default runs/<name>-<strategy>-<time>)."),
    ] = None,
    data_dir: DataDirOpt = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            help="Continue the interrupted run in this folder from its checkpoint (its own "
            "config; the result equals an uninterrupted run's).",
        ),
    ] = None,
    tensorboard: TensorBoardOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Run one experiment and write its run directory (or go on with an interrupted one)."""
    run_experiment = _import_run_experiment()

    console = _console(json_out, quiet)
    with _user_errors():
        if resume is not None:
            if config is not None or preset is not None or set_ or data_dir or out:
                from fedclock.errors import ConfigError

                raise ConfigError(
                    "--resume continues a run with the config in its folder: give no CONFIG, "
                    "--preset, --set, --data-dir or --out with it."
                )
            cfg = _resume_config(resume)
            out = resume
            if cfg is None:  # the run had finished
                from fedclock.metrics.recorder import read_summary
                from fedclock.outputs import clean_temporaries
                from fedclock.report import REPORT_FILE

                summary = read_summary(resume)
                assert summary is not None
                clean_temporaries(resume)  # (a kill while its report was written)
                console.print(_summary_table(summary, resume))
                console.print(
                    f"{resume} holds a finished run ({summary['status']}): nothing to resume."
                )
                if not (resume / REPORT_FILE).exists():
                    _write_report(console, resume)
                return
        else:
            cfg = _load(config, preset, set_, data_dir, console=console)
            _fresh_run_dir(out, cfg)
        with _tensorboard(tensorboard, None), _progress(console, quiet) as progress:
            result = run_experiment(
                cfg,
                run_dir=out,
                progress=_Bar(progress, cfg, cfg.strategy.name),
                argv=sys.argv,
                resume=resume is not None,
            )
    console.print(_summary_table(result.summary, result.run_dir))
    _write_report(console, result.run_dir)
    if json_out:
        from fedclock.metrics.recorder import json_safe

        typer.echo(json.dumps({**json_safe(result.summary), "run_dir": str(result.run_dir)}))
    if result.error:
        Console(stderr=True).print(
            f"[bold red]error:[/] {escape(result.error)}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(130 if result.summary["status"] == "interrupted" else 3)


def _slow_nodes(
    items: list[str] | None, nodes: int, *, what: str = "--slow",
    unit: str = "FACTOR ≥ 1 (how many times slower that device runs)", low: float = 1.0,
) -> dict[int, float]:  # fmt: skip
    """``--slow CLIENT=FACTOR`` (or ``--device-speed CLIENT=FLOPS``) as {client: value}
    (each a device of the local fleet)."""
    from fedclock.errors import ConfigError

    out: dict[int, float] = {}
    for item in items or []:
        left, sep, right = item.partition("=")
        try:
            client, value = int(left), float(right)
        except ValueError:
            client, value = -1, 0.0
        if not sep or not 0 <= client < nodes or not low <= value < math.inf:
            name = unit.split(" ", 1)[0]
            raise ConfigError(
                f"{what} {item!r}: give CLIENT={name} with CLIENT in 0..{nodes - 1} and {unit}."
            )
        out[client] = value
    return out


@app.command()
# (over 80 lines: its typer options are its signature; the body checks them and hands over)
def deploy(
    config: ConfigArg = None,
    preset: PresetOpt = None,
    set_: SetOpt = None,
    local: Annotated[
        int,
        typer.Option(
            "--local",
            help="Devices to start on this machine, one per client (sets partition.num_clients).",
            min=1,
        ),
    ] = 4,
    slow: Annotated[
        list[str] | None,
        typer.Option(
            "--slow",
            help="CLIENT=FACTOR: that device runs FACTOR times slower (repeatable).",
        ),
    ] = None,
    device_speed: Annotated[
        list[str] | None,
        typer.Option(
            "--device-speed",
            help="CLIENT=FLOPS: that device computes at FLOPS FLOP/s (each local step takes "
            "its FLOPs' time; repeatable).",
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="flower: a Flower SuperLink and one SuperNode per device, real processes "
            "(pip install 'fedclock[flower]'); threads: the devices as threads of this process.",
        ),
    ] = "flower",
    timeout: Annotated[
        float, typer.Option("--timeout", help="Give up after this many seconds (flower).")
    ] = 600.0,
    round_timeout: Annotated[
        float | None,
        typer.Option(
            "--round-timeout",
            help="Give up a task with no reply this many seconds after it was sent (counted "
            "rejected; its round closes without it). Default: wait, or the strategy's deadline.",
        ),
    ] = None,
    superlink: Annotated[
        str | None,
        typer.Option(
            "--superlink",
            help="HOST:PORT of a running Flower SuperLink whose --local N SuperNodes each name "
            "their client (partition-id): submit the run there instead of starting a local "
            "fleet (run this on the SuperLink's machine; docs/deploy.md).",
        ),
    ] = None,
    root_certificates: Annotated[
        Path | None,
        typer.Option(
            "--root-certificates",
            help="With --superlink: the CA certificate of its TLS.",
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="With --superlink on this machine (localhost only): connect without TLS.",
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Run directory (default runs/<name>-<strategy>-<time>)."),
    ] = None,
    data_dir: DataDirOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Run a strategy on real devices in real time (docs/deploy.md): the same strategy
    objects as the simulator, a deadline sent to each device as its time budget, every reply
    checked; the usual run folder, with measured times."""
    from fedclock.errors import ConfigError

    console = _console(json_out, quiet)
    with _user_errors():
        if engine not in ("flower", "threads"):
            raise ConfigError(f"--engine {engine!r}: choose flower or threads.")
        if engine == "threads" and (superlink, root_certificates, insecure) != (None, None, False):
            raise ConfigError(
                "--superlink, --root-certificates and --insecure go with --engine flower."
            )
        if engine == "flower":
            from fedclock.deploy.local import check_superlink_security

            check_superlink_security(superlink, root_certificates, insecure)
        if round_timeout is not None and not 0 < round_timeout < math.inf:
            raise ConfigError(
                f"--round-timeout must be a positive number of seconds, got {round_timeout:g}."
            )
        sets = [*(set_ or []), f"partition.num_clients={local}"]
        cfg = _load(config, preset, sets, data_dir, console=console)
        _fresh_run_dir(out, cfg)
        slowed = _slow_nodes(slow, local)
        speeds = _slow_nodes(device_speed, local, what="--device-speed", unit="FLOPS > 0",
                             low=1e-300)  # fmt: skip
        from fedclock.experiment import default_run_dir

        run_dir = out or default_run_dir(cfg)
        if engine == "threads":
            from fedclock.deploy.local import LocalDevices
            from fedclock.deploy.run import deploy as deploy_run

            with _progress(console, quiet) as progress:
                result = deploy_run(
                    cfg, run_dir, LocalDevices(cfg, slow=slowed, speed=speeds),
                    engine_name="threads", round_timeout_s=round_timeout,
                    argv=sys.argv, progress=_Bar(progress, cfg, cfg.strategy.name),
                )  # fmt: skip
            summary, error = result.summary, result.error
        else:
            from fedclock.config import to_yaml
            from fedclock.deploy.local import last_error, run_flower_local, run_flower_remote
            from fedclock.metrics.recorder import read_summary
            from fedclock.outputs import write_atomic

            run_dir.mkdir(parents=True, exist_ok=True)
            config_path = run_dir / "deploy-config.yaml"
            write_atomic(config_path, to_yaml(cfg))
            if superlink is not None:
                if slowed or speeds:
                    raise ConfigError(
                        "--slow and --device-speed emulate local devices: not with --superlink."
                    )
                console.print(f"submitting the run to the Flower SuperLink at {superlink} …")
                code = run_flower_remote(
                    config_path, run_dir, local, superlink=superlink,
                    root_certificates=root_certificates, timeout=timeout,
                    round_timeout=round_timeout,
                )  # fmt: skip
            else:
                console.print(f"starting a Flower SuperLink and {local} SuperNodes on 127.0.0.1 …")
                code = run_flower_local(config_path, run_dir, local, slow=slowed, speed=speeds,
                                        timeout=timeout, round_timeout=round_timeout)  # fmt: skip
            got = read_summary(run_dir)
            if code != 0 or got is None:
                logs = run_dir / "flower" / "logs"
                why = last_error(logs / "flwr-run.log")
                raise ConfigError(
                    f"The Flower deployment failed (flwr run exited {code}"
                    + (f"; the server app said: {why}" if why else "")
                    + f"); its logs are in {logs}."
                )
            summary, error = got, None
    console.print(_summary_table(summary, run_dir))
    _write_report(console, run_dir)
    if json_out:
        from fedclock.metrics.recorder import json_safe

        typer.echo(json.dumps({**json_safe(summary), "run_dir": str(run_dir)}))
    if error:
        Console(stderr=True).print(
            f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(130 if summary["status"] == "interrupted" else 3)


def _csv_list(text: str | None, cast: Callable[[str], Any]) -> list[Any]:
    if not text:
        return []
    return [cast(x.strip()) for x in text.split(",") if x.strip()]


def _note_reuse(progress: Progress, strategy: str, seed: int, result: Any) -> None:
    if result is None:
        progress.console.print(f"reused finished run {strategy} seed {seed}")


def _note_rerun(progress: Progress, cell: str, seed: int, why: str) -> None:
    from fedclock.runs.cache import RESUMING

    if why == RESUMING:
        progress.console.print(
            f"going on with {cell} seed {seed} from its checkpoint (interrupted)"
        )
    else:
        progress.console.print(f"re-running {cell} seed {seed}: {why}")


def _note_merged(progress: Progress, out: Path, entry: str) -> None:
    progress.console.print(
        f"the table also lists {entry}: runs finished in {out} by another command"
    )


def _strategy_entries(text: str | None, cfg: Any, default: list[str]) -> list[str]:
    """--strategies (else the config's compare.strategies, else ``default``), each entry's
    strategy checked against the registry."""
    from fedclock.errors import ConfigError
    from fedclock.strategies import STRATEGIES

    names = _csv_list(text, str)
    if text is not None and not names:
        raise ConfigError(f"--strategies names no strategy ('{short(text)}'); give one or more.")
    names = names or list(cfg.compare.strategies) or default
    for n in names:
        if n.split(":")[0] not in STRATEGIES:
            raise ConfigError(
                f"Unknown strategy '{short(n)}' in --strategies; allowed: {', '.join(sorted(STRATEGIES))}."
            )
    return names


def _seed_list(text: str | None, cfg: Any) -> list[int]:
    """--seeds, else the config's compare.seeds, else its seed."""
    from fedclock.errors import ConfigError

    try:
        seeds = _csv_list(text, int)
    except ValueError:
        raise ConfigError(
            f"--seeds must be comma-separated integers, got '{short(text)}'."
        ) from None
    if text is not None and not seeds:  # '' or ',,,': a typo, not "the preset's seeds"
        raise ConfigError(f"--seeds names no seed ('{short(text)}'); give one or more integers.")
    return seeds or list(cfg.compare.seeds) or [cfg.seed]


def _lr_rates(lr_grid: str | None, no_lr_grid: bool, cfg: Any, console: Console) -> list[float]:
    """The learning rates of --lr-grid / --no-lr-grid, else of the config's compare.lr_grid."""
    from fedclock.errors import ConfigError

    if no_lr_grid and lr_grid is not None:
        raise ConfigError("Give --lr-grid or --no-lr-grid, not both.")
    rates: list[float]
    if no_lr_grid:
        rates = []
    elif lr_grid is None:  # the config's grid, as a preset ships it
        rates = list(cfg.compare.lr_grid)
        if rates:
            console.print(
                f"learning-rate grid from compare.lr_grid: {', '.join(f'{r:g}' for r in rates)}"
                " (each strategy at its best rate; --no-lr-grid runs train.lr only)",
                highlight=False,
            )
    elif lr_grid.strip() == "preset":
        rates = list(cfg.compare.lr_grid)
        if not rates:
            raise ConfigError("--lr-grid preset needs compare.lr_grid in the config.")
    else:
        try:
            rates = _csv_list(lr_grid, float)
        except ValueError:
            raise ConfigError(
                f"--lr-grid must be comma-separated numbers, got '{short(lr_grid)}'."
            ) from None
        if any(not r > 0 for r in rates):
            raise ConfigError(f"--lr-grid rates must all be > 0, got '{short(lr_grid)}'.")
    return rates


@contextmanager
def _tensorboard(root: Path | None, out_dir: Path | None) -> Iterator[None]:
    """--tensorboard: every run of this command (and of its workers) writes its scalars
    (fedclock.metrics.tensorboard); one sentence if the package is missing."""
    if root is None:
        yield
        return
    from fedclock.metrics.tensorboard import disable, enable

    enable(root, out_dir)
    try:
        yield
    finally:
        disable()


def _tensorboard_missing(root: Path | None, out_dir: Path) -> None:
    """--tensorboard after a comparison or sweep: the scalars of the cells this command did
    not run (reused from an earlier one, or run by Ray elsewhere), from their metrics.csv."""
    if root is not None:
        from fedclock.metrics.tensorboard import export_missing

        export_missing(p.parent for p in sorted((out_dir / "runs").rglob("metrics.csv")))


def _out_dir(out: Path | None, cfg: Any, command: str) -> Path:
    """--out, else ``<output_dir>/<command>-<name>``."""
    return out or Path(cfg.output_dir) / f"{command}-{cfg.name}"


def _grid_notes(
    progress: Progress, cfg: Any, out_dir: Path, runner: Any, total: int | None
) -> dict[str, Any]:
    """The callbacks of ``run_compare`` / ``run_sweep``: a progress bar per cell, and a note
    for each reused, re-run and merged cell. Cells run one after another (no ``runner``)
    also get a bar over them all (``total`` cells, if known: cells done, running, failed
    and the time left); a runner has its own (:func:`_runner`)."""
    grid = _GridBar(progress, total) if runner is None else None

    def bar(label: str) -> _Bar:
        if grid is not None:
            grid.start()
        return _Bar(progress, cfg, label)

    def result(s: str, seed: int, r: Any) -> None:
        _note_reuse(progress, s, seed, r)
        if grid is not None:
            grid.result(r)

    return {
        "progress_factory": bar,
        "on_result": result,
        "on_merged": lambda e: _note_merged(progress, out_dir, e),
        "on_rerun": lambda c, seed, why: _note_rerun(progress, c, seed, why),
    }


class _GridBar:
    """The bar over a grid's cells run one after another: done / running / failed (a cell
    that did not complete) and the time left from the finished ones; reused cells are not
    counted as work."""

    def __init__(self, progress: Progress, total: int | None) -> None:
        self.progress, self.total = progress, total
        self.task = progress.add_task("cells (one at a time)", total=total, status="")
        self.eta = _Eta(total)
        self.done = self.failed = self.reused = self.running = 0

    def start(self) -> None:
        self.eta.started()
        self.running = 1
        self._show()

    def result(self, r: Any) -> None:
        if r is None:
            self.reused += 1
            if self.eta.total is not None:
                self.eta.total -= 1
        elif r.summary.get("status") == "completed":
            self.done += 1
        else:
            self.failed += 1
        self.running = 0
        self._show()

    def _show(self) -> None:
        finished = self.done + self.failed
        reused = f" · reused {self.reused}" if self.reused else ""
        self.progress.update(
            self.task, completed=finished + self.reused,
            status=f"done {self.done} · running {self.running} · failed {self.failed}{reused}"
            + self.eta.left(finished),
        )  # fmt: skip


def _runner(
    progress: Progress,
    backend: str,
    jobs: int | None,
    address: str | None,
    batch_runs: int | None = None,
    cfg: ExperimentConfig | None = None,
) -> Any:
    """The parallel cell runner of --backend / --jobs / --batch-runs (None: cells one after
    another, each with its own progress bar), reporting cells running, done and failed on one
    bar. ``batch_runs`` None: the automatic default for ``cfg``."""
    from fedclock.runs.lockstep import auto_batch_runs
    from fedclock.runs.parallel import CellRunner

    if batch_runs is None:
        batch_runs = auto_batch_runs(cfg) if cfg is not None else 1
    if backend == "local" and jobs in (None, 1) and address is None and batch_runs == 1:
        CellRunner(backend, jobs, address=address, batch_runs=batch_runs)  # (checks the values)
        return None
    counts = {"start": 0, "done": 0, "failed": 0, "retry": 0}
    where = f"{backend}, {jobs or 'all'} at a time" if backend == "local" else backend
    eta = _Eta()

    def describe(size: str) -> str:  # groups of runs in lockstep (here when jobs is 1)
        if backend == "local" and jobs is None:  # a group per core (one group: here)
            return f"cells ({size} in lockstep, a group per core)"
        if backend == "local" and jobs == 1:
            return f"cells ({size} in lockstep)"
        return f"cells ({where}, {size} in lockstep)"

    task = progress.add_task(
        describe(str(batch_runs)) if batch_runs > 1 else f"cells ({where})", total=None, status=""
    )

    def on_event(kind: str, label: str, detail: Any) -> None:
        if kind == "plan":
            eta.total = detail
            progress.update(task, total=detail)
            return
        if kind == "groups":  # the groups' actual sizes: e.g. 51 cells on 2 cores, 6–7
            lo, hi = min(detail), max(detail)
            progress.update(task, description=describe(str(hi) if lo == hi else f"{lo}–{hi}"))
            return
        counts[kind] += 1
        if kind == "retry":
            progress.console.print(f"retrying {label}: {detail}")
        elif kind == "failed":
            progress.console.print(f"[red]failed[/] {label}: {detail}")
        finished = counts["done"] + counts["failed"]
        running = counts["start"] - finished - counts["retry"]
        if kind == "start" and counts["start"] == 1:
            eta.started()
        progress.update(
            task, completed=finished,
            status=f"done {counts['done']} · running {running} · failed {counts['failed']}"
            + eta.left(finished),
        )  # fmt: skip

    return CellRunner(backend, jobs, address=address, on_event=on_event, batch_runs=batch_runs)


class _Eta:
    """Time left in a grid of cells, estimated from the finished ones: the wall time since
    the first cell started per finished cell (so cells running side by side count as the
    throughput they give), times the cells left."""

    def __init__(self, total: int | None = None) -> None:
        self.total = total
        self._t0: float | None = None

    def started(self) -> None:
        if self._t0 is None:
            self._t0 = time.perf_counter()

    def left(self, finished: int) -> str:
        if self._t0 is None or not finished or self.total is None:
            return ""
        rest = max(self.total - finished, 0)
        if not rest:
            return ""
        s = (time.perf_counter() - self._t0) / finished * rest
        return f" · ~{_duration(s)} left"


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s // 60:.0f}m{s % 60:02.0f}s"
    return f"{s // 3600:.0f}h{s % 3600 // 60:02.0f}m"


def _write_report(console: Console, folder: Path, seeds: list[int] | None = None) -> Path | None:
    """Write ``folder/report.html`` after a command and print its path. The results are
    written already, so a report that cannot be written is a note, not a failure."""
    from fedclock.report import write_report

    damaged: list[str] = []
    try:
        path = write_report(folder, seeds=seeds, damaged=damaged)
    except (FedclockError, OSError) as exc:
        console.print(f"[yellow]note:[/] no report written: {exc}", highlight=False, soft_wrap=True)
        return None
    except KeyboardInterrupt:  # (a second Ctrl-C: the results are written, the report is not)
        console.print(
            f"[yellow]note:[/] no report written (Ctrl-C); `fedclock report {folder}` writes it.",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
        return None
    except Exception as exc:  # a bug in the report must not turn a finished run into a failure
        what = f"{type(exc).__name__}: {exc}"
        console.print(
            f"[yellow]note:[/] no report written ({what}); `fedclock report {folder}` retries.",
            highlight=False,
            soft_wrap=True,
        )
        return None
    for d in damaged:  # (left out of the page, which says so)
        console.print(f"[yellow]note:[/] left out: {d}", highlight=False, soft_wrap=True)
    console.print(f"report: {path}", highlight=False, soft_wrap=True)
    return path


def _finish_grid(
    console: Console,
    table: Table,
    out_dir: Path,
    rows: list[dict[str, Any]],
    error: str | None,
    json_out: bool,
    seeds: list[int] | None = None,
) -> None:
    """Print the table, write the report, print the --json object ({"out", "rows"}) and a
    cell's error (exit 3)."""
    console.print(table)
    if rows:
        _write_report(console, out_dir, seeds)
    if json_out:
        from fedclock.metrics.recorder import json_safe

        typer.echo(json.dumps({"out": str(out_dir), "rows": json_safe(rows)}))
    if error:
        Console(stderr=True).print(
            f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(3)


def _compare_table(
    cfg: Any, rows: list[dict[str, Any]], names: list[str], seed_list: list[int], out_dir: Path
) -> Table:
    """The console table of a comparison (headline metrics, mean ± std over seeds)."""
    from fedclock.runs.tables import HEADLINE, metric_label

    budget = f", budget {cfg.budget.virtual_time:g} virtual s" if cfg.budget.virtual_time else ""
    spread = " (mean ± std)" if len(seed_list) > 1 else ""
    table = Table(
        title=f"{cfg.name}: {len(rows) or len(names)} strategies × {len(seed_list)} seed(s)"
        f"{budget}{spread}"
    )
    target = cfg.eval.target_accuracy
    cis = bool(rows) and "cis_accuracy_mean" in rows[0]
    # the headline metrics for the console (runs.tables.HEADLINE's ``console``): Fraboni et
    # al.'s problems (client losses measured) show their losses, the others their accuracy
    # and work
    family = "losses" if rows and "federated_loss_tail_mean" in rows[0] else "accuracy"
    cols = []
    for m in HEADLINE:
        if m.console not in ("always", family) or (m.key == "cis_accuracy" and not cis):
            continue
        if m.console != "always" and not any(
            math.isfinite(r.get(f"{m.key}_mean", math.nan)) for r in rows
        ):  # (a metric no run has, e.g. offline losses without a trace's availability)
            continue
        label = metric_label(m.key, m.label, cis=cis)
        if m.key == "time_to_target":
            label = f"time to {target:g} (s)" if target else "time to target"
        elif m.key == "aggregations":
            label = "server steps"
        elif m.key.endswith("_tail"):
            label = label.removesuffix(" (last 10%)")  # (the caption says it)
        cols.append((m.key, label, f".{m.digits}g"))
    ids = [
        k for k in (rows[0] if rows else {})
        if k not in ("strategy", "n_seeds") and not k.endswith(("_mean", "_std"))
    ]  # fmt: skip
    table.add_column("strategy", no_wrap=True)
    for k in ids:
        table.add_column(k, justify="right")
    for _, label, _ in cols:
        table.add_column(label, justify="right")
    for r in rows:
        cells = [str(r[k]) if r[k] != "" else "—" for k in ids]
        for key, _, fmt in cols:
            m, s = r.get(f"{key}_mean", math.nan), r.get(f"{key}_std", math.nan)
            if abs(s) < 1e-9 * max(1.0, abs(m)):
                s = 0.0  # float noise of equal seeds (1.4e-16)
            text = "—" if m != m else format(m, fmt)
            cells.append(text if r["n_seeds"] == 1 or m != m else f"{text} ± {s:.2g}")
        table.add_row(r["strategy"], *cells)
    table.caption = f"{out_dir}/table.csv · {out_dir}/table.md · {out_dir}/accuracy.png"
    return table


@app.command()
# (over 80 lines: its typer options are its signature; the body is about 60 lines)
def compare(
    config: ConfigArg = None,
    preset: PresetOpt = None,
    strategies: StrategiesOpt = None,
    seeds: SeedsOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Output folder (default runs/compare-<name>); finished runs there are reused, "
            "and strategies other commands finished there join the table.",
        ),
    ] = None,
    set_: SetOpt = None,
    data_dir: DataDirOpt = None,
    target_accuracy: Annotated[
        float | None, typer.Option(help="Accuracy for the time-to-target column.")
    ] = None,
    lr_grid: Annotated[
        str | None,
        typer.Option(
            "--lr-grid",
            help="Comma-separated train.lr values: each strategy is reported at the rate with "
            "the lowest final federated loss (default: the config's compare.lr_grid; 'preset' "
            "names it explicitly).",
        ),
    ] = None,
    no_lr_grid: Annotated[
        bool,
        typer.Option(
            "--no-lr-grid", help="Run every strategy at train.lr only, ignoring compare.lr_grid."
        ),
    ] = False,
    lr_tune_on: Annotated[
        str | None,
        typer.Option(
            "--lr-tune-on",
            help="With --lr-grid: every strategy uses the rate selected for this one "
            "(default: compare.lr_tune_on, else each strategy its own best).",
        ),
    ] = None,
    backend: BackendOpt = "local",
    jobs: JobsOpt = None,
    batch_runs: BatchRunsOpt = None,
    address: AddressOpt = None,
    tensorboard: TensorBoardOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Paired comparison of strategies over seeds (common random numbers): table + plot.

    A strategy may carry strategy.* overrides after colons, e.g. fedfix:delta_t=0.2.
    """
    from fedclock.runs import run_compare

    console = _console(json_out, quiet)
    with _user_errors():
        extra = list(set_ or [])
        if target_accuracy is not None:
            extra.append(f"eval.target_accuracy={target_accuracy}")
        cfg = _load(config, preset, extra, data_dir, grid=True, console=console)
        names = _strategy_entries(strategies, cfg, ["fedavg", "drop-stragglers"])
        rates = _lr_rates(lr_grid, no_lr_grid, cfg, console)
        seed_list = _seed_list(seeds, cfg)
        out_dir = _out_dir(out, cfg, "compare")
        with _tensorboard(tensorboard, out_dir), _progress(console, quiet) as progress:
            runner = _runner(progress, backend, jobs, address, batch_runs, cfg)
            cells = len(names) * len(seed_list) * max(1, len(rates or []))
            rows, error = run_compare(
                cfg, names, seed_list, out_dir, lr_grid=rates,
                lr_tune_on=(lr_tune_on or cfg.compare.lr_tune_on) if rates else None,
                runner=runner, **_grid_notes(progress, cfg, out_dir, runner, cells),
            )  # fmt: skip
            _tensorboard_missing(tensorboard, out_dir)
    table = _compare_table(cfg, rows, names, seed_list, out_dir)
    _finish_grid(console, table, out_dir, rows, error, json_out, seed_list)


@app.command()
def sweep(
    config: ConfigArg = None,
    preset: PresetOpt = None,
    over: Annotated[
        str | None,
        typer.Option(help="section.field=v1,v2,... to sweep (default: the config's compare.over)."),
    ] = None,
    strategies: StrategiesOpt = None,
    seeds: SeedsOpt = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Output folder (default runs/sweep-<name>)."),
    ] = None,
    set_: SetOpt = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = "local",
    jobs: JobsOpt = None,
    batch_runs: BatchRunsOpt = None,
    address: AddressOpt = None,
    tensorboard: TensorBoardOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Strategies × values of one config field × seeds (resumable): table.csv/md, pivot.md, plot.

    Strategies that other commands finished in the same --out join the table, so a grid
    split over processes with --strategies ends in one table.
    """
    from fedclock.errors import ConfigError
    from fedclock.runs import headline_metric, parse_over, run_sweep

    console = _console(json_out, quiet)
    with _user_errors():
        cfg = _load(config, preset, list(set_ or []), data_dir, grid=True, console=console)
        text = over or (cfg.compare.over[0] if cfg.compare.over else None)
        if text is None:
            raise ConfigError(
                "Give --over section.field=v1,v2,... (or compare.over in the config)."
            )
        path, values = parse_over(text)
        names = _strategy_entries(strategies, cfg, [cfg.strategy.name])
        seed_list = _seed_list(seeds, cfg)
        out_dir = _out_dir(out, cfg, "sweep")
        with _tensorboard(tensorboard, out_dir), _progress(console, quiet) as progress:
            runner = _runner(progress, backend, jobs, address, batch_runs, cfg)
            rows, error = run_sweep(
                cfg,
                path,
                values,
                names,
                seed_list,
                out_dir,
                runner=runner,
                # (the count of cells is not known here: an entry that does not read the
                # swept field runs at one value only)
                **_grid_notes(progress, cfg, out_dir, runner, None),
            )
            _tensorboard_missing(tensorboard, out_dir)
    metric = headline_metric(rows)
    table = Table(title=f"{cfg.name}: {metric} over {path} ({len(seed_list)} seed(s))")
    table.add_column("strategy", no_wrap=True)
    for v in values:
        table.add_column(str(v), justify="right")
    for name in dict.fromkeys(r["strategy"] for r in rows):
        by_v = {r[path]: r for r in rows if r["strategy"] == name}
        table.add_row(
            name, *(format(by_v[v][f"{metric}_mean"], ".3f") if v in by_v else "—" for v in values)
        )
    table.caption = f"{out_dir}/table.csv · {out_dir}/table.md · {out_dir}/pivot.md · sweep.png"
    _finish_grid(console, table, out_dir, rows, error, json_out)


def _distinct_names(dirs: list[Path]) -> dict[Path, str]:
    """Each folder's shortest path suffix that no other folder shares (``a/fedavg/seed-1``
    and ``b/fedavg/seed-1`` are told apart by ``a/…`` and ``b/…``), so no line of a plot
    overwrites another's; the trailing parts every folder shares (``fedavg/seed-1``) are
    left out of it, since they tell nothing apart."""
    parts = {d: d.resolve().parts for d in dict.fromkeys(dirs)}
    depth = 1
    while True:
        names = {d: p[-depth:] for d, p in parts.items()}
        if len(set(names.values())) == len(names) or depth >= max(map(len, parts.values())):
            break
        depth += 1
    common = 0
    if len(names) > 1:
        shortest = min(map(len, names.values()))
        while common < shortest - 1 and len({n[-1 - common] for n in names.values()}) == 1:
            common += 1
    return {d: "/".join(n[: len(n) - common]) for d, n in names.items()}


def _run_label(strategy: str, seed: object, name: str) -> str:
    """A run's line in a plot: its strategy and seed, then what tells its folder apart
    (without the strategy's name when the folder repeats it, as a cell's folder does)."""
    first, sep, rest = name.partition("/")
    if first == strategy:
        name = rest
    elif first.startswith(strategy + "-"):
        name = first[len(strategy) + 1 :] + sep + rest
    return f"{strategy} (seed {seed})" + (f" · {name}" if name else "")


@app.command()
# (over 80 lines: its typer options are its signature, and each plot kind is a few lines)
def plot(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="Run directories (each with metrics.csv), or sweep folders (each with table.csv)."
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="PNG file (default: accuracy.png in the first run directory, sweeps.png in "
            "the first sweep folder).",
        ),
    ] = None,
    metric: Annotated[
        str,
        typer.Option(
            help="Column of metrics.csv to plot ('exits': every exit's accuracy and the CIS "
            "accuracy of early-exit runs, one panel each); for sweeps, a metric of table.csv "
            "(default: the sweep's headline metric)."
        ),
    ] = "test_accuracy",
    log_x: Annotated[
        bool, typer.Option("--log-x", help="Sweeps: a logarithmic axis for the swept value.")
    ] = False,
    until: Annotated[
        float | None,
        typer.Option(help="Runs: plot only the evaluations up to this virtual time (s)."),
    ] = None,
    y_min: Annotated[
        float | None, typer.Option(help="Runs: the lower end of the metric's axis.")
    ] = None,
) -> None:
    """Overlay accuracy vs virtual time and vs aggregation index for several runs; or, for
    sweep folders, one panel per sweep: the metric against the swept value per strategy."""
    from fedclock.errors import DataError
    from fedclock.metrics.plots import plot_exits, plot_groups, plot_sweeps
    from fedclock.metrics.readers import read_metrics, read_table
    from fedclock.runs import headline_metric

    with _user_errors():
        from fedclock.metrics.recorder import read_summary
        from fedclock.outputs import check_writable

        for name, v in (("--until", until), ("--y-min", y_min)):
            if v is not None and not math.isfinite(v):
                raise DataError(f"{name} must be a finite number, got {v}.")
        if out is not None:
            if out.suffix.lower() != ".png":
                raise DataError(f"--out {out} must name a .png file.")
            check_writable([out])
        tables = [d for d in run_dirs if (d / "table.csv").is_file()]
        if tables:
            if len(tables) < len(run_dirs):
                other = next(d for d in run_dirs if d not in tables)
                raise DataError(
                    f"{other} has no table.csv: give either run directories or sweep folders."
                )
            rows = {}
            for d in tables:
                table = read_table(d)
                if not table or len(table[0]) < 3 or list(table[0])[1].endswith("_mean"):
                    raise DataError(
                        f"{d}/table.csv is not a sweep's table (strategy, swept field, metrics)."
                    )
                rows[d.name] = table
            key = metric
            if key == "test_accuracy":  # the runs' default: the sweep's headline metric
                key = headline_metric(rows[tables[0].name])
            for d in tables:
                if f"{key}_mean" not in rows[d.name][0]:
                    raise DataError(f"{d}/table.csv has no metric '{key}'.")
            if len(rows) < len(tables):
                raise DataError(
                    "Two sweep folders have the same name; rename one to tell them apart."
                )
            target = out or tables[0] / "sweeps.png"
            check_writable([target])
            path = plot_sweeps(rows, target, metric=key, log_x=log_x)
            Console().print(f"wrote {path}")
            return
        target = out or run_dirs[0] / ("exits.png" if metric == "exits" else "accuracy.png")
        check_writable([target])
        groups: dict[str, list[dict[str, Any]]] = {}
        names = _distinct_names(run_dirs)
        for d in run_dirs:
            if not (d / "metrics.csv").is_file():
                raise DataError(f"{d} is not a run directory: it has no metrics.csv.")
            label = names[d]
            s = read_summary(d)  # (damaged: one sentence)
            if s is not None:
                label = _run_label(str(s["strategy"]), s["seed"], names[d])
            metrics = read_metrics(d)
            for col in ("virtual_time", "aggregation"):
                if metrics and col not in metrics:
                    raise DataError(
                        f"{d}/metrics.csv is not a run's metrics table: it has no column '{col}'."
                    )
            if metric == "exits" and "exit1_accuracy" not in metrics:
                raise DataError(f"{d}/metrics.csv has no exit columns (not an early-exit run).")
            if metric != "exits" and metric not in metrics:
                raise DataError(f"{d}/metrics.csv has no column '{metric}'.")
            if until is not None:
                if until <= 0:
                    raise DataError(f"--until must be a positive virtual time, got {until:g}.")
                keep = metrics["virtual_time"] <= until
                metrics = {k: v[keep] for k, v in metrics.items()}
            if metric == "exits" and d.name.startswith("seed-") and s is not None:
                # a comparison's or sweep's cell: its seeds make one line (mean ± std)
                label = f"{s['strategy']} · {d.parent.name}"
                groups.setdefault(label, []).append(metrics)
                continue
            groups[label] = [metrics]
        if metric == "exits":
            path = plot_exits(groups, target, y_min=y_min)
        else:
            path = plot_groups(groups, target, metric=metric, y_min=y_min)
    Console().print(f"wrote {path}")


@app.command()
def tour(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Folder of the tour (a comparison per step).")
    ] = Path("runs/demo"),
    jobs: JobsOpt = None,
    batch_runs: BatchRunsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """The tour (make demo): four short paired comparisons on digits (SALF, the asynchronous
    family, Fed-RAA, CIS), each with its table and the conclusion its numbers support, then
    one report linking all four. Finished runs in --out are reused."""
    from fedclock.report import write_report
    from fedclock.runs import run_compare
    from fedclock.tour import (
        STEPS,
        check_tour_folder,
        conclusions,
        read_summaries,
        write_tour_record,
    )

    console = _console(False, quiet)
    start = time.perf_counter()
    steps: list[dict[str, Any]] = []
    failed = None
    with _user_errors():
        check_tour_folder(out)  # before any compute
        for step in STEPS:
            cfg = _load(None, step.preset, None, None, grid=True, console=console)
            names = list(cfg.compare.strategies)
            seed_list = list(cfg.compare.seeds) or [cfg.seed]
            out_dir = out / step.folder
            console.rule(f"[bold]{step.title}[/]  (fedclock compare --preset {step.preset})")
            with _progress(console, quiet) as progress:
                runner = _runner(progress, "local", jobs, None, batch_runs, cfg)
                rows, error = run_compare(
                    cfg, names, seed_list, out_dir, runner=runner,
                    **_grid_notes(progress, cfg, out_dir, runner, len(names) * len(seed_list)),
                )  # fmt: skip
            console.print(_compare_table(cfg, rows, names, seed_list, out_dir))
            if error:
                failed = failed or error
                Console(stderr=True).print(
                    f"[bold red]error:[/] {escape(str(error))}", highlight=False
                )
            found = read_summaries(out_dir, names, seed_list)
            claims = conclusions(step, found, cfg.eval.target_accuracy)
            line = "; ".join(text for text, _ in claims) + "."
            console.print(f"[bold]conclusion:[/] {line}", highlight=False, soft_wrap=True)
            _write_report(console, out_dir, seed_list)
            steps.append(
                {"folder": step.folder, "preset": step.preset, "title": step.title,
                 "conclusion": line, "claims": [{"text": t, "supported": ok} for t, ok in claims]}
            )  # fmt: skip
        wall = time.perf_counter() - start
        write_tour_record(out, steps, wall)
        path = write_report(out)
    console.rule()
    console.print(
        f"The tour took {wall:.0f} s. One report links all four: [bold]{path}[/]",
        highlight=False,
        soft_wrap=True,
    )
    if failed:
        raise typer.Exit(3)


@app.command()
def report(
    folders: Annotated[
        list[Path],
        typer.Argument(help="Run, comparison, sweep or tour folders (each gets its report.html)."),
    ],
    timeline_window: Annotated[
        str | None,
        typer.Option(
            "--timeline-window",
            metavar="START:END",
            help="The device timelines' window in virtual seconds, e.g. 100:160 "
            "(default: from 0, as many tasks as the page draws).",
        ),
    ] = None,
    chrome_trace: Annotated[
        bool,
        typer.Option(
            "--chrome-trace",
            help="Also write each run's device timeline as timeline.json in Chrome's Trace "
            "Event Format (open it in Perfetto: ui.perfetto.dev).",
        ),
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """Write report.html into each folder from what is there (nothing is re-run): one
    self-contained page that opens offline, with the table, the config, the curves and the
    device timelines."""
    from fedclock.report import write_report

    console = _console(False, quiet)
    with _user_errors():
        window = None if timeline_window is None else _window(timeline_window)
        for folder in folders:
            if not folder.is_dir():
                from fedclock.errors import DataError

                raise DataError(
                    f"{folder} is not a folder; give a run, comparison or sweep folder."
                )
            damaged: list[str] = []
            path = write_report(folder, window=window, damaged=damaged)
            for d in damaged:  # (left out of the page, which says so)
                console.print(f"[yellow]note:[/] left out: {d}", highlight=False, soft_wrap=True)
            console.print(f"wrote {path}", highlight=False, soft_wrap=True)
            if chrome_trace:
                _write_chrome_traces(console, folder)


def _write_chrome_traces(console: Console, folder: Path) -> None:
    """timeline.json (Trace Event Format) beside each run's timeline.csv under ``folder``."""
    from fedclock.errors import DataError
    from fedclock.metrics.timeline import TIMELINE_FILE, write_chrome_trace

    found = sorted(p.parent for p in folder.rglob(TIMELINE_FILE))
    if not found:
        raise DataError(f"{folder} holds no {TIMELINE_FILE} to export as a Chrome trace.")
    for run_dir in found:
        try:
            path = write_chrome_trace(run_dir)
        except ValueError as exc:  # a damaged timeline.csv: its sentence
            console.print(f"[yellow]note:[/] {exc}", highlight=False, soft_wrap=True)
            continue
        console.print(f"wrote {path}", highlight=False, soft_wrap=True)


def _window(text: str) -> tuple[float, float]:
    """``START:END`` in virtual seconds; one sentence if it is not that."""
    from fedclock.errors import ConfigError

    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        lo = hi = math.nan
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
        raise ConfigError(
            f"--timeline-window {text!r} is not START:END in virtual seconds with "
            "0 <= START < END (e.g. 100:160)."
        )
    return lo, hi


@app.command()
def presets(
    name: Annotated[str | None, typer.Argument(help="Print this preset's YAML.")] = None,
) -> None:
    """List the shipped presets, or print one."""
    from fedclock.presets import list_presets, preset_text

    with _user_errors():
        if name:
            typer.echo(preset_text(name), nl=False)
            return
        t = Table(title="fedclock presets (run: fedclock run --preset NAME)")
        t.add_column("name", style="bold")
        t.add_column("description")
        for n, d in list_presets():
            t.add_row(n, d)
        Console().print(t)


@app.command()
def strategies() -> None:
    """List the strategies a config can name."""
    from fedclock.config import STRATEGY_OPTIONS  # (the registry's order; no torch import)

    t = Table(title="strategies (strategy.name)")
    t.add_column("name", style="bold")
    t.add_column("what it is")
    t.add_column("fields it reads (docs/config.md)")
    for name, options in STRATEGY_OPTIONS.items():
        fields = sorted(p for p in options.paths() if p != "strategy.name")
        t.add_row(name, options.summary, ", ".join(fields))
    Console().print(t)


trace_app = typer.Typer(
    help="Device traces: import FedScale's or FLASH's into fedclock's format, export a run's "
    "population (docs/traces.md).",
    no_args_is_help=True,
)
trace_import = typer.Typer(help="Convert another tool's trace into a fedclock trace folder.",
                           no_args_is_help=True)  # fmt: skip
trace_app.add_typer(trace_import, name="import")
app.add_typer(trace_app, name="trace")
TraceOut = Annotated[
    Path,
    typer.Option("--out", "-o", help="The trace folder to write (devices.csv, availability.csv)."),
]


def _write_trace(out: Path, trace: Any) -> None:
    from fedclock.devices.trace import AVAILABILITY_FILE, DEVICES_FILE, write_trace
    from fedclock.errors import ConfigError

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder for the trace.")
    for name in (DEVICES_FILE, AVAILABILITY_FILE):
        path = out / name
        if path.exists() or path.is_symlink():
            first = path.read_bytes()[:40] if path.is_file() and not path.is_symlink() else b""
            if not first.startswith(b"# fedclock-trace"):
                raise ConfigError(
                    f"{path} is a file fedclock did not make; fedclock never writes over it, "
                    "so move it away or give another --out."
                )
    write_trace(out, trace)
    n_avail = (
        "" if trace.availability is None else f", {len(trace.availability.start)} online intervals"
    )
    Console().print(f"wrote {out}: {len(trace)} devices{n_avail}", highlight=False, soft_wrap=True)


@trace_import.command("fedscale")
def trace_import_fedscale(
    capacity: Annotated[Path, typer.Argument(help="FedScale's client_device_capacity pickle.")],
    behave: Annotated[
        Path | None, typer.Argument(help="FedScale's client_behave_trace pickle (availability).")
    ] = None,
    out: TraceOut = Path("trace"),
    reference_flops: Annotated[
        float,
        typer.Option(
            help="FLOPs per sample of the model FedScale's latencies were measured "
            "on (MobileNet-V2 inference: 6e8)"
        ),
    ] = 6.0e8,
) -> None:
    """FedScale's device capacity (and behaviour) pickles as a fedclock trace; the pickles are
    read with an unpickler that builds only dicts, lists, strings and numbers."""
    from fedclock.devices.trace import from_fedscale
    from fedclock.errors import ConfigError

    with _user_errors():
        if not (math.isfinite(reference_flops) and reference_flops > 0):
            raise ConfigError(
                f"--reference-flops must be a positive number, got {reference_flops}."
            )
        _write_trace(out, from_fedscale(capacity, behave, reference_flops))


@trace_import.command("flash")
def trace_import_flash(
    states: Annotated[Path, typer.Argument(help="FLASH's user-behaviour JSON (state traces).")],
    out: TraceOut = Path("trace"),
) -> None:
    """FLASH's state traces as a fedclock trace's availability (ready = screen locked, Wi-Fi
    and charging)."""
    from fedclock.devices.trace import from_flash

    with _user_errors():
        _write_trace(out, from_flash(states))


@trace_app.command("generate")
def trace_generate(
    devices: Annotated[int, typer.Option(help="How many devices.")] = 1000,
    availability: Annotated[
        str,
        typer.Option(
            help="always, bernoulli (each slot online with --online) or diurnal "
            "(a daily cycle per device, random phase)"
        ),
    ] = "diurnal",
    online: Annotated[float, typer.Option(help="The share of slots online (on average).")] = 0.5,
    slot: Annotated[float, typer.Option(help="Slot length in virtual seconds.")] = 3600.0,
    period: Annotated[float, typer.Option(help="The period that repeats, seconds.")] = 86_400.0,
    seed: Annotated[int, typer.Option(help="Seed of the draws.")] = 0,
    out: TraceOut = Path("trace"),
) -> None:
    """A synthetic fleet in fedclock's trace format, for runs with devices that come and go
    where no measured trace is at hand (docs/traces.md)."""
    from fedclock.devices.trace import generate_trace
    from fedclock.errors import ConfigError

    with _user_errors():
        if not 1 <= devices <= 10_000_000:
            raise ConfigError(f"--devices must be from 1 to 10,000,000, got {devices}.")
        try:
            trace = generate_trace(devices, availability=availability, seed=seed, slot_s=slot,
                                   period_s=period, online=online)  # fmt: skip
        except ValueError as exc:
            raise ConfigError(f"{exc}.") from None
        _write_trace(out, trace)


@trace_app.command("export")
def trace_export(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (its config.yaml).")],
    out: TraceOut = Path("trace"),
) -> None:
    """A run's population (one device per client, as its config builds it) as a trace; a
    deployment's (fedclock deploy) as its devices measured themselves."""
    import numpy as np

    from fedclock.config import load_config, read_yaml
    from fedclock.devices.population import build_population
    from fedclock.devices.trace import Trace
    from fedclock.errors import DataError

    with _user_errors():
        if not (run_dir / "config.yaml").is_file():
            raise DataError(f"{run_dir} is not a run folder (it has no config.yaml).")
        cfg = load_config(raw=read_yaml(run_dir / "config.yaml"))
        pop = build_population(cfg.population, cfg.partition.num_clients, cfg.seed)
        n = len(pop)
        ids = pop.device_ids or [f"client-{i}" for i in range(n)]
        speed, up, down = (
            np.array(pop.speed),
            np.array(pop.up_bandwidth),
            np.array(pop.down_bandwidth),
        )
        source = [f"source: the population of run {run_dir} (scenario {cfg.population.scenario}, "
                  f"seed {cfg.seed}), one device per client"]  # fmt: skip
        deployed = _deployment(run_dir)
        if deployed is not None:  # a deployment: the fleet as it measured itself
            for c, v in deployed.get("device_flops_per_s", {}).items():
                speed[int(c)] = float(v)
            for c, v in deployed.get("device_link_bytes_per_s", {}).items():
                up[int(c)] = down[int(c)] = float(v)
            source = [f"source: the devices of deployment {run_dir} ({deployed.get('engine')}) "
                      "as they measured themselves on their last task: FLOP/s of their compute, "
                      "bytes/s of the time between dispatch and reply they were not busy "
                      "(up and down alike); a device never measured keeps its config's profile"]  # fmt: skip
        trace = Trace(
            [f"client-{i}" for i in range(n)], speed, up, down, [""] * n,
            [f"{run_dir.name}:{d}" for d in ids], pop.availability, source,
        )  # fmt: skip
        _write_trace(out, trace)


def _deployment(run_dir: Path) -> dict[str, Any] | None:
    """summary.json's ``deployment`` record of a run made by ``fedclock deploy`` (else None)."""
    from fedclock.metrics.recorder import read_summary

    try:
        summary = read_summary(run_dir)
    except Exception:  # (a damaged summary: the config's population, as for any run)
        return None
    got = None if summary is None else summary.get("deployment")
    return got if isinstance(got, dict) else None


def _tolerant_streams() -> None:
    """A console whose encoding cannot write fedclock's text (PYTHONIOENCODING=ascii, a C
    locale) gets '?' for the characters it lacks instead of a UnicodeEncodeError mid-run."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and (stream.encoding or "").lower().replace("-", "") != "utf8":
            reconfigure(errors="replace")


def _stdout_failed(exc: OSError) -> bool:
    """Whether ``exc`` (an error without a file name) came from writing to the console: the
    innermost frames are rich's or click's output, or a flush of stdout that still fails."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if any(f.filename.replace("\\", "/").endswith(("rich/console.py", "click/utils.py"))
           for f in frames[-3:]):  # fmt: skip
        return True
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        return True
    return False


def _stdout_closed(exc: OSError) -> None:
    """End quietly when stdout cannot be written: nothing more goes to it (the interpreter's
    last flush included), one sentence on stderr unless the reader simply went away (a closed
    pipe, e.g. ``| head``: status 141, as a process that SIGPIPE ended), status 2 otherwise.
    Files already written stay."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    if exc.errno == errno.EPIPE:
        raise typer.Exit(141) from None
    what = exc.strerror or exc.__class__.__name__
    Console(stderr=True).print(
        f"[bold red]error:[/] Could not write to standard output: {what[0].lower()}{what[1:]}.",
        highlight=False, soft_wrap=True,
    )  # fmt: skip
    raise typer.Exit(2) from None


def main() -> None:
    """The ``fedclock`` console script: the app, then :func:`_end_process`."""
    _tolerant_streams()
    try:
        app()
    except OSError as exc:  # raised outside a command's error handling (its last output)
        if exc.filename is None and _stdout_failed(exc):
            try:
                _stdout_closed(exc)
            except typer.Exit as done:
                sys.exit(done.exit_code)
        raise
    except SystemExit as done:  # (typer ends every command with one)
        _end_process(done.code)
    _end_process(0)


def _end_process(code: int | str | None) -> None:
    """End the process as ``sys.exit(code)`` does, without the interpreter's teardown.

    Once torch is imported, freeing every module and object at exit takes ≈ 0.3 s of a
    command's wall time (docs/benchmarks.md), and nothing of fedclock needs it: its files
    are closed when a command returns. What an exit must still do happens here — the
    ``atexit`` handlers (logging, temporary folders, multiprocessing, Ray), then the last
    flush of stdout and stderr (a closed pipe ends as :func:`_stdout_closed` says) — before
    ``os._exit``. A live non-daemon thread (which the interpreter would wait for) takes the
    ordinary exit instead.
    """
    import atexit
    import threading

    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # (sys.exit's rule: a message goes to stderr, status 1)
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except (OSError, ValueError) as exc:
        try:
            _stdout_closed(exc if isinstance(exc, OSError) else OSError(errno.EBADF, str(exc)))
        except typer.Exit as done:
            status = done.exit_code
    with suppress(OSError, ValueError):
        sys.stderr.flush()
    os._exit(status)
