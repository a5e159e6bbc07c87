"""The one refusal type: bad input, known before (or instead of) the work.

A stage's command line and the notebooks turn :class:`Refused` (and only it) into exit code 2 and
one line naming what was refused; any other exception is a failure: exit 1 with its redacted
traceback on the failing rank and at the driver (:func:`failure_text`).
"""
from __future__ import annotations

import logging
import traceback

from pipelines.runtime.redact import redact_text


class Refused(ValueError):
    """The input (options, data, an output folder, a model file) cannot be used as given.

    Raised where the input is checked; the message names the offending value or flag and what to
    do instead. A ``ValueError`` so that callers that caught ``ValueError`` before still do.
    """


class MissingInput(Refused, FileNotFoundError):
    """A path the user named (an input folder, a model, a weights file) does not exist. Also a
    ``FileNotFoundError``, as it was before it was a refusal (``io.UnsupportedOperation`` mixes
    ``OSError`` and ``ValueError`` the same way)."""


class NotAFolder(Refused, NotADirectoryError):
    """A path the user named as a folder (an input, an output) is a file."""


def is_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is a refusal (:class:`Refused`, exit 2) rather than a failure (exit 1)."""
    return isinstance(exc, Refused)


def failure_text(exc: BaseException) -> str:
    """``exc``'s whole traceback, chained causes and contexts included, as Python prints it, with
    secrets masked (:func:`pipelines.runtime.redact.redact_text`): what a failure logs, never a refusal."""
    return redact_text("".join(traceback.format_exception(exc)).rstrip("\n"))


def exit_status(exc: BaseException, log: logging.Logger, where: str = "", say_refusal: bool = True) -> int:
    """A command line's last words on ``exc``, the exception that ended its work, and its exit code:
    2 for a refusal (:class:`Refused`: its message, one line, no traceback; none when
    ``say_refusal`` is false, for a rank whose refusal rank 0 already says), 1 for anything else
    (:func:`failure_text`: ``[WHERE ]failed:`` and the whole redacted traceback). ``where``
    names the failing process (``rank 1 on host-a``)."""
    if is_refusal(exc):
        if say_refusal:
            log.error("%s", redact_text(str(exc)))
        return 2
    log.error("%sfailed:\n%s", f"{where} " if where else "", failure_text(exc))
    return 1
