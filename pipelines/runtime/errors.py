"""The one refusal type: ``Refused`` (and only it) exits 2 with one line; any other exception exits 1."""
from __future__ import annotations

import logging
import traceback

from pipelines.runtime.redact import redact_text


class Refused(ValueError):
    """The input (options, data, output folder, model file) cannot be used as given; the message says what to do."""


class MissingInput(Refused, FileNotFoundError):
    """A path the user named does not exist (also a ``FileNotFoundError``)."""


class NotAFolder(Refused, NotADirectoryError):
    """A path the user named as a folder is a file."""


def is_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is a refusal (exit 2) rather than a failure (exit 1)."""
    return isinstance(exc, Refused)


def failure_text(exc: BaseException) -> str:
    """``exc``'s whole traceback, chained causes included, redacted: what a failure logs."""
    return redact_text("".join(traceback.format_exception(exc)).rstrip("\n"))


def exit_status(exc: BaseException, log: logging.Logger, where: str = "", say_refusal: bool = True) -> int:
    """Log ``exc``, the exception that ended a command's work, and return its exit code.

    2 for ``Refused`` (its one-line message, unless ``say_refusal`` is false: rank 0 already said it); else 1 after
    ``[WHERE ]failed:`` and the redacted traceback (``where``: e.g. ``rank 1 on host-a``)."""
    if is_refusal(exc):
        if say_refusal:
            log.error("%s", redact_text(str(exc)))
        return 2
    log.error("%sfailed:\n%s", f"{where} " if where else "", failure_text(exc))
    return 1
