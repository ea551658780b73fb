"""User-facing errors: each carries one sentence that names the problem.

The CLI prints the message of a :class:`FedclockError` and exits with status 2,
never a traceback. Library code raises these for anything a user can fix
(config fields, data files, impossible settings); programming errors stay
ordinary exceptions.
"""


class FedclockError(Exception):
    """An error a user can fix; ``str(err)`` is one clear sentence."""


class ConfigError(FedclockError):
    """A config field is unknown, missing or has an invalid value."""


class DataError(FedclockError):
    """A data file is missing, truncated or not in the expected format."""


class DivergenceError(FedclockError):
    """Training produced a non-finite loss or parameters."""


class CheckpointError(FedclockError):
    """A checkpoint cannot be written, read back or resumed from."""


def short(value: object, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error sentence quotes at most a short
    prefix of a bad value (a huge one is never printed whole)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = f"{text[:limit]}…"
    return text
