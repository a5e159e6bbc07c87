"""Relaunching a Horovod job whose rank was lost (``--max-failures K``); a deterministic failure is not retried."""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List

from pipelines.launch.failures import HorovodJobFailed, RelaunchImpossible, describe
from pipelines.launch.rankenv import attempts_env

log = logging.getLogger("pipelines")


def is_lost(failure) -> bool:
    """Whether a ``HorovodJobFailed`` is worth a relaunch: its root cause is ``lost``, or only a peer's loss."""
    root = failure.failures[0]  # root causes sort first
    return root.lost or root.secondary


class _Attempt:
    """Wraps a rank's function: sets the attempts so far in the rank's environment before it starts."""

    def __init__(self, main: Callable[..., Any], history: List[Dict]):
        self.main = main
        self.history = history

    def __call__(self, **kwargs: Any) -> Any:
        os.environ.update(attempts_env(self.history))
        return self.main(**kwargs)


def run_with_retries(launch: Callable[[Callable[..., Any]], Any], main: Callable[..., Any],
                     max_failures: int) -> Any:
    """Run ``launch(wrapped_main)`` (one whole job) up to ``max_failures + 1`` times, relaunching after lost ranks.

    Raises:
        HorovodJobFailed: a deterministic failure (at once), or the last lost one.
        RelaunchImpossible: a relaunch could not start (e.g. too few task slots)."""
    history: List[Dict] = []
    while True:
        number = len(history) + 1
        if max_failures:
            why = f": relaunching from the newest complete checkpoint after {history[-1]['failure']}" if history else ""
            log.warning("attempt %d of %d%s", number, max_failures + 1, why)
        try:
            return launch(_Attempt(main, list(history)))
        except HorovodJobFailed as exc:
            if not is_lost(exc):
                if max_failures:
                    log.error("attempt %d failed of an error in the job itself, not retried: %s", number, exc)
                raise
            history.append({"attempt": number, "world_size": exc.world_size, "failure": describe(exc.failures[0])})
            if len(history) > max_failures:
                raise
        except ValueError as exc:  # refused before any rank started: on a relaunch, the cluster shrank
            if not history:
                raise
            raise RelaunchImpossible(history[-1]["failure"], number, str(exc)) from exc
