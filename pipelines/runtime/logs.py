"""Logging set-up shared by the jobs: one format, the stage and (under Horovod) the rank in it; and
:func:`plural`, the one way a message says a count of things ("1 class", "3 classes")."""
from __future__ import annotations

import logging
import sys
from typing import Optional

LOGGER_NAME = "pipelines"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record (test runners and
    notebooks swap it), never to a stream closed since set-up."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def setup_logging(stage: str, rank: Optional[int] = None, level: int = logging.INFO) -> logging.Logger:
    """Configure and return the ``pipelines`` logger for one process.

    Every message carries the stage and, when given, the rank (``[train rank 1]``), so that an
    error from any rank can be traced to it. Progress messages are the caller's to restrict to
    rank 0; errors are logged by every rank.
    """
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers.clear()
    handler = _StderrHandler()
    where = stage if rank is None else f"{stage} rank {rank}"
    handler.setFormatter(logging.Formatter(f"%(asctime)s [{where}] %(levelname)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return logger


def plural(count: float, noun: str, nouns: str = "") -> str:
    """``count`` followed by ``noun``, in the plural unless ``count`` is 1: every message that
    counts things says it this way, never ``f"{n} classes"`` (which printed "1 classes").

    ``plural(1, "class")`` -> ``"1 class"``, ``plural(3, "class")`` -> ``"3 classes"``,
    ``plural(0, "row group")`` -> ``"0 row groups"``. The regular English plural of the last word:
    ``-es`` after s, x, z, sh, else ``-s`` (``-ch`` is either: epochs, batches); ``nouns`` gives
    any other (``plural(n, "batch", "batches")``).
    """
    if count == 1:
        return f"{count} {noun}"
    if not nouns:
        nouns = noun + ("es" if noun.endswith(("s", "x", "z", "sh")) else "s")
    return f"{count} {nouns}"
