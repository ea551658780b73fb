"""Files fedclock writes beside the user's: it never writes over a file it did not make.

- A plot (``.png``) carries ``Software: fedclock …`` in its PNG metadata, so a PNG is
  fedclock's wherever it lies; a report (``.html``) likewise carries
  ``<meta name="generator" content="fedclock …">`` in its first kilobyte.
- A table of a comparison or sweep (``table.csv``, ``table.md``, ``pivot.md``,
  ``lr_grid.csv``) is fedclock's when its SHA-256 is among those that ``grid.json`` in the
  same folder records for that name: it is recorded before the file is written, so a file
  edited by hand since (or put there by someone else) is not overwritten. Folders made
  before the record existed (a ``grid.json`` without ``files``) count a table whose first
  line is the one fedclock writes, and a matplotlib PNG.
- ``grid.json`` is fedclock's when it holds an ``entries`` list.
- A run folder is fedclock's when it holds only a run's files, its ``meta.json`` written by
  fedclock (see :func:`check_run_folder`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fedclock.errors import ConfigError

GRID_FILE = "grid.json"
RUN_FILES = frozenset(
    {
        "config.yaml", "meta.json", "metrics.csv", "summary.json", "clients.csv",
        "checkpoint.pt", "report.html", "timeline.csv", "timeline.json",
    }
)  # fmt: skip
_PNG = b"\x89PNG\r\n\x1a\n"
#: the first line of each table as fedclock writes it (folders from before the record)
_FIRST_LINES = {
    "table.csv": ("strategy,",),
    "lr_grid.csv": ("strategy,",),
    "table.md": ("| strategy |",),
    "pivot.md": ("",),  # "<metric> (mean ± std over seeds)", checked below
}
_KEEP = 50  # digests kept per file name (two commands writing one folder at once)


def png_metadata() -> dict[str, str]:
    """The PNG metadata of every plot fedclock writes."""
    from fedclock import __version__

    return {"Software": f"fedclock {__version__}"}


def _is_our_png(path: Path) -> bool:
    with path.open("rb") as fh:
        head = fh.read(1 << 16)
    if not head.startswith(_PNG):
        return False
    if b"tEXtSoftware\x00fedclock" in head:
        return True
    # a plot of a grid folder from before the tag: matplotlib's, in a folder without the record
    try:
        grid = read_grid_json(path.parent)
    except ConfigError:
        return False
    return grid is not None and "files" not in grid and b"tEXtSoftware\x00Matplotlib" in head


#: the first kilobyte of every HTML page fedclock writes holds this tag (fedclock.report)
HTML_GENERATOR = '<meta name="generator" content="fedclock '


def is_our_html(path: Path) -> bool:
    """Whether ``path`` is a page fedclock wrote (its generator tag in the first 1 KB)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(1024)
    except OSError:
        return False
    return HTML_GENERATOR.encode() in head


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class DamagedFile(ConfigError):
    """A file of fedclock's own that no longer reads (cut short, edited): said as such, not
    as a file fedclock did not make."""


def read_grid_json(folder: Path) -> dict[str, Any] | None:
    """``folder/grid.json`` if it is fedclock's (None: absent); ConfigError if it is not."""
    path = folder / GRID_FILE
    if not os.path.lexists(path):
        return None
    try:
        data = json.loads(path.read_bytes())
    except json.JSONDecodeError as exc:
        if path.is_file() and not path.is_symlink() and _first_line_is_json(path):
            raise DamagedFile(
                f"{path} is damaged (not JSON from line {exc.lineno}); fedclock keeps it: "
                "move it away to record the folder's tables afresh."
            ) from None
        data = None
    except (OSError, ValueError):
        data = None
    if not (isinstance(data, dict) and isinstance(data.get("entries"), list)):
        raise _foreign(path)
    return data


def _first_line_is_json(path: Path) -> bool:
    """Whether ``path`` begins as fedclock's grid.json does (``{`` then ``"entries"``): a
    file of ours cut short or edited, not someone else's."""
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and b'"entries"' in head


def write_grid_json(folder: Path, data: dict[str, Any]) -> None:
    """``folder/grid.json``, atomically (a process beside this one never reads half a file)."""
    path = folder / GRID_FILE
    write_atomic(path, json.dumps(data, indent=1) + "\n")


def _first_line_is_ours(path: Path) -> bool:
    try:
        first = path.read_bytes()[:4096].decode("utf-8").split("\n", 1)[0]
    except (OSError, UnicodeDecodeError):
        return False
    if path.name == "pivot.md":
        return first.endswith("(mean ± std over seeds)")
    return first.startswith(_FIRST_LINES.get(path.name, ("\0",)))


def made_by_fedclock(path: Path) -> bool:
    """Whether fedclock may write ``path``: nothing is there, or a file it made, unchanged."""
    if not os.path.lexists(path):
        return True
    if path.is_symlink() or not path.is_file():
        return False
    try:
        if path.suffix == ".png":
            return _is_our_png(path)
        if path.suffix == ".html":  # a report carries fedclock's generator tag
            return is_our_html(path)
        if path.name == GRID_FILE:
            read_grid_json(path.parent)
            return True
        grid = read_grid_json(path.parent)
    except DamagedFile:
        raise
    except (OSError, ConfigError):
        return False
    if grid is None:
        return False
    if "files" not in grid:  # a folder from before the record
        return _first_line_is_ours(path)
    try:
        return _digest(path.read_bytes()) in grid["files"].get(path.name, ())
    except (OSError, AttributeError, TypeError):
        return False


def _foreign(path: Path) -> ConfigError:
    what = "a folder" if path.is_dir() else "a file fedclock did not make (or one changed since)"
    return ConfigError(
        f"{path} is {what}; fedclock never writes over files it did not make, so move it "
        "away or give another --out."
    )


def check_writable(paths: Iterable[Path]) -> None:
    """ConfigError naming the first of ``paths`` that fedclock may not write."""
    for path in paths:
        if path.parent.exists() and not path.parent.is_dir():
            raise ConfigError(f"{path.parent} is a file; give a folder for the output.")
        if not made_by_fedclock(path):
            raise _foreign(path)


def write_output(path: Path, data: bytes) -> None:
    """Write a table of a grid folder: checked, its digest recorded in ``grid.json``, then
    written atomically."""
    check_writable([path])
    path.parent.mkdir(parents=True, exist_ok=True)
    grid = read_grid_json(path.parent) or {"entries": []}
    files = grid.get("files")
    if not isinstance(files, dict):
        files = grid["files"] = {}
    known = [d for d in files.get(path.name, []) if isinstance(d, str)]
    files[path.name] = [*known, _digest(data)][-_KEEP:]
    write_grid_json(path.parent, grid)
    write_atomic(path, data)


#: test-only (the fault-injection suite, tests/test_faults.py): called as ``hook(path,
#: stage)`` at every write of a file fedclock makes — ``temporary`` (the temporary file
#: written and synced, not yet renamed), ``renamed`` (``path`` replaced, the folder not yet
#: synced) and ``appended`` (a row appended to metrics.csv) — so a test can kill the process
#: at an exact write; None in normal use
fault_hook: Callable[[Path, str], None] | None = None


def temporary_name(path: Path) -> Path:
    """Where :func:`write_atomic` writes ``path`` first: ``.NAME.PID.tmp`` in its folder (the
    one pattern :func:`is_temporary` recognises)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``path`` whole or not at all: to :func:`temporary_name`, flushed and synced, then
    renamed over ``path`` (and the folder synced). A ``path`` that is a symbolic link is
    refused (nothing is written through a link); an ``OSError`` (a full disk, a read-only
    folder) names ``path`` and leaves the old file as it was."""
    if path.is_symlink():
        raise ConfigError(
            f"{path} is a symbolic link; fedclock writes only its own files, not through "
            "links: remove the link."
        )
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = temporary_name(path)
    try:
        with tmp.open("wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        if fault_hook is not None:
            fault_hook(path, "temporary")
        os.replace(tmp, path)
        if fault_hook is not None:
            fault_hook(path, "renamed")
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # the rename survives a power cut once the folder is synced
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_temporary(name: str) -> bool:
    """A temporary file fedclock writes before renaming it (left behind by a kill)."""
    return name.startswith(".") and name.endswith(".tmp")


def clean_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary files (``.NAME.PID.tmp``) that killed fedclock processes left in
    ``folder``: those whose process is gone (a live process's, e.g. a second command in the
    same ``--out``, stay). Returns what was removed."""
    gone: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return gone
    for p in entries:
        parts = p.name.rsplit(".", 2)
        if not (is_temporary(p.name) and len(parts) == 3 and parts[1].isdigit()):
            continue
        pid = int(parts[1])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue  # (alive: not ours to remove)
        except ProcessLookupError:
            pass
        except OSError:
            continue  # (another user's process: alive)
        try:
            if p.is_file() and not p.is_symlink():
                p.unlink()
                gone.append(p)
        except OSError:
            pass
    return gone


def is_run_folder(folder: Path) -> bool:
    """Whether ``folder`` holds nothing but a fedclock run's files (and fedclock's plots)."""
    names = [p for p in folder.iterdir() if not is_temporary(p.name)]
    if not names:
        return True
    for p in names:
        if p.name in RUN_FILES:
            continue
        if not (p.suffix == ".png" and made_by_fedclock(p)):
            return False
    meta = folder / "meta.json"
    if not meta.is_file():  # killed between creating metrics.csv and writing meta.json
        return {p.name for p in names} <= {"metrics.csv", "config.yaml"}
    try:
        data = json.loads(meta.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("versions"), dict)


def check_no_links(root: Path, path: Path) -> None:
    """ConfigError if a folder (or file) from ``root`` down to ``path`` is a symbolic link: a
    comparison's or sweep's runs are written inside its ``--out``, never through a link that
    may lead out of it (``root`` itself, the folder the user gave, may be a link)."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        parts = ()
    here = root
    for part in parts:
        here = here / part
        if here.is_symlink():
            raise ConfigError(
                f"{here} is a symbolic link; fedclock writes a comparison's or sweep's runs "
                f"only inside its --out {root}, not through links: remove the link."
            )


def check_run_folder(folder: Path) -> None:
    """ConfigError unless ``folder`` is absent, empty or holds a fedclock run."""
    if not os.path.lexists(folder):
        return
    if folder.is_symlink():
        raise ConfigError(
            f"{folder} is a symbolic link; fedclock writes a run into a folder of its own, "
            "not through links: remove the link or give another --out."
        )
    if not folder.is_dir():
        raise ConfigError(f"{folder} is a file; fedclock writes a run into a folder.")
    if not is_run_folder(folder):
        meta = folder / "meta.json"
        if meta.is_file() and not meta.is_symlink():
            try:
                json.loads(meta.read_bytes())
            except json.JSONDecodeError as exc:
                raise DamagedFile(
                    f"{meta} is damaged (not JSON from line {exc.lineno}); fedclock keeps "
                    "the run folder: move it away to run it again."
                ) from None
            except (OSError, ValueError):
                pass
        raise ConfigError(
            f"Run folder {folder} holds files fedclock did not make; fedclock never writes "
            "over them, so move them away or give another --out."
        )
