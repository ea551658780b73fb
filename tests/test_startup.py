"""Start-up cost: a command imports only what it needs (fresh processes; docs/benchmarks.md,
`startup`). matplotlib (plots), Ray (--backend ray), scikit-learn and SciPy are imported
only by the code that uses them; `import fedclock.cli` needs no torch (`fedclock --help`,
`presets`, `strategies` start in a fraction of a second), and the code `fedclock run` imports
before its first round does not import torch._dynamo (nor SymPy with it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("matplotlib", "ray", "sklearn", "scipy", "pandas")


def imported_after(statement: str, names: tuple[str, ...]) -> list[str]:
    code = f"import sys\n{statement}\nprint(' '.join(n for n in {names!r} if n in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_the_cli_module_imports_no_heavy_package_and_no_torch() -> None:
    assert imported_after("import fedclock.cli", (*HEAVY, "torch")) == []


@pytest.mark.parametrize("module", ["fedclock.experiment", "fedclock.config", "fedclock.data"])
def test_what_a_run_imports_up_front_is_light(module: str) -> None:
    assert imported_after(f"import {module}", (*HEAVY, "torch._dynamo", "sympy")) == []


@pytest.mark.parametrize("command", ["--help", "presets", "strategies"])
def test_the_listing_commands_import_no_torch(command: str) -> None:
    """`fedclock --help`, `presets` and `strategies` run without importing torch (the
    strategies' one-line summaries live on their options classes in config.py)."""
    code = (
        "import sys\nfrom fedclock.cli import app\n"
        f"try:\n    app([{command!r}])\nexcept SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().endswith("NO-TORCH"), out.stderr[-500:]


def test_every_strategy_has_its_summary() -> None:
    from fedclock.strategies import STRATEGIES

    assert all(
        spec.summary and spec.summary == spec.options.summary for spec in STRATEGIES.values()
    )


def test_a_whole_run_and_its_report_import_no_plotting_library(tmp_path) -> None:
    """`fedclock run` — its progress bar's headline metric (fedclock.runs.tables) and its
    report (plotly.js, read off metrics.csv) — imports neither matplotlib nor the
    comparison machinery: they cost half a second of a short run's process."""
    import yaml

    from tests.conftest import tiny_raw

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw(budget={"aggregations": 2})))
    code = (
        "import sys\nfrom fedclock.cli import app\n"
        f"try:\n    app(['run', {str(cfg)!r}, '--out', {str(tmp_path / 'run')!r}])\n"
        "except SystemExit:\n    pass\n"
        "print('IMPORTED:', *(n for n in ('matplotlib', 'fedclock.runs.compare')"
        " if n in sys.modules), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (tmp_path / "run" / "report.html").is_file(), out.stderr[-800:]
    assert out.stderr.strip().splitlines()[-1] == "IMPORTED:", out.stderr[-500:]


_END = """
import atexit, sys, threading, time
from pathlib import Path
from fedclock.cli import _end_process
mark = Path(sys.argv[1])
atexit.register(lambda: mark.write_text(mark.read_text() + "atexit;") if mark.exists()
                else mark.write_text("atexit;"))
if sys.argv[3] == "thread":  # a non-daemon thread the interpreter must wait for
    def late():
        time.sleep(0.3)
        mark.write_text("thread;")
    threading.Thread(target=late).start()
sys.stdout.write("buffered, no newline")
sys.stderr.write("on stderr, no newline")
_end_process(eval(sys.argv[2]))
print("not reached")
"""


@pytest.mark.parametrize(
    ("code", "status", "stderr_tail"),
    [("0", 0, ""), ("None", 0, ""), ("7", 7, ""), ("'one sentence'", 1, "one sentence\n")],
)
@pytest.mark.parametrize("thread", ["", "thread"])
def test_the_console_script_ends_as_sys_exit_would(
    tmp_path, code: str, status: int, stderr_tail: str, thread: str
) -> None:
    """`fedclock` ends its process with os._exit (no teardown of torch's modules), after
    what an exit must do: the atexit handlers run, stdout and stderr are flushed, the status
    is sys.exit's; with a live non-daemon thread it takes the ordinary exit, which waits."""
    mark = tmp_path / "mark"
    got = subprocess.run([sys.executable, "-c", _END, str(mark), code, thread or "-"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert got.returncode == status
    assert got.stdout == "buffered, no newline"
    assert got.stderr == "on stderr, no newline" + stderr_tail
    assert mark.read_text() == ("thread;atexit;" if thread else "atexit;")
