"""fedclock's log messages (Python ``logging``, logger ``fedclock``): what a run decides on its
own — PruneFL's initial pruning before round 1, Fed-RAA's delay bound K, an executor falling
back to serial work. ``fedclock -v`` (or ``$FEDCLOCK_LOG_LEVEL``) prints them on stderr; a
library user configures ``logging`` as usual."""

from __future__ import annotations

import logging
import os

from fedclock.errors import FedclockError

#: the level of the log records shown on stderr (e.g. INFO). ``fedclock -v`` sets it, so the
#: worker processes of ``compare`` and ``sweep`` (which inherit the environment) show theirs
ENV = "FEDCLOCK_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def show(level: str | None = None) -> bool:
    """Print fedclock's log records at ``level`` or above on stderr (None: ``$FEDCLOCK_LOG_LEVEL``;
    unset or empty: nothing); returns whether they are shown."""
    if level is None:
        level = os.environ.get(ENV, "")
    if not level:
        return False
    name = level.strip().upper()
    if name not in LEVELS:
        raise FedclockError(f"{ENV}={level!r} is not a log level: use one of {', '.join(LEVELS)}.")
    logger = logging.getLogger("fedclock")
    logger.setLevel(name)
    if not any(isinstance(h, _Handler) for h in logger.handlers):
        logger.addHandler(_Handler())
    os.environ[ENV] = name
    return True


def hide() -> None:
    """Undo :func:`show` (its handler, level and environment variable)."""
    logger = logging.getLogger("fedclock")
    logger.handlers = [h for h in logger.handlers if not isinstance(h, _Handler)]
    logger.setLevel(logging.NOTSET)
    os.environ.pop(ENV, None)


class _Handler(logging.Handler):
    """One line per record on stderr (read when the record is written, so a redirected or
    captured stderr gets it): ``fedclock: <level>: <message>``."""

    def emit(self, record: logging.LogRecord) -> None:
        import sys

        try:
            sys.stderr.write(f"fedclock: {record.levelname.lower()}: {record.getMessage()}\n")
            sys.stderr.flush()
        except Exception:  # logging must never break a run
            self.handleError(record)
