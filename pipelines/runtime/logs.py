"""Logging set-up shared by the jobs (one format naming stage and rank), and ``plural`` for counted nouns."""
from __future__ import annotations

import logging
import sys
from typing import Optional

LOGGER_NAME = "pipelines"


class _StderrHandler(logging.StreamHandler):
    """Writes to the current ``sys.stderr`` at each record (test runners and notebooks swap it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def setup_logging(stage: str, rank: Optional[int] = None, level: int = logging.INFO) -> logging.Logger:
    """Configure and return the ``pipelines`` logger for one process, messages tagged ``[train rank 1]``."""
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
    """``count`` and ``noun``, plural unless ``count`` is 1: ``plural(3, "class")`` -> ``"3 classes"``; ``nouns``:
    an irregular plural."""
    if count == 1:
        return f"{count} {noun}"
    if not nouns:
        nouns = noun + ("es" if noun.endswith(("s", "x", "z", "sh")) else "s")
    return f"{count} {nouns}"
