"""Relaunching a Horovod job whose rank was lost (``--max-failures K``), as Ray's ``FailureConfig``.

A job fails for one of two kinds of reasons, and only one kind is worth a second try:

* **lost**: a rank's process or host went away: killed by SIGKILL (the kernel's OOM killer, a
  container eviction, ``kill -9``), SIGTERM or SIGHUP (pre-emption, a host shut down), a Spark
  executor lost, or no rank reporting an error of its own, only Gloo/Horovod errors about a lost
  peer (a host whose link went down). The same job on a fresh set of processes can succeed.
* **deterministic**: an exception our training code raised (a refused input: ``DataError``,
  ``ValueError``; a bug), a non-zero exit status, or a crash of native code (SIGSEGV, SIGABRT):
  it would fail again the same way, so it is reported at once, never retried.

:func:`run_with_retries` runs a launch function up to ``K + 1`` times, relaunching after lost
failures only; the function it launches learns which attempt it is from
:attr:`pipelines.launch.rankenv.RankEnvironment.attempts` (read at the rank's start), and
continues from its own newest complete checkpoint when ``relaunched`` (the training job's
:func:`pipelines.training.resume.restore` does).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List

from pipelines.launch.failures import HorovodJobFailed, RelaunchImpossible, describe
from pipelines.launch.rankenv import attempts_env

log = logging.getLogger("pipelines")


def is_lost(failure) -> bool:
    """Whether a :class:`~pipelines.launch.failures.HorovodJobFailed` is a lost process or host (worth a
    relaunch): its root cause was marked ``lost``, or every rank that reported failed only of a
    peer's loss (``secondary``: Gloo connections closed, Horovod shut down)."""
    root = failure.failures[0]  # root causes sort first
    return root.lost or root.secondary


class _Attempt:
    """Wraps a rank's function: hands it the attempts so far (:func:`pipelines.launch.rankenv.attempts_env`),
    in the rank's process, before it starts."""

    def __init__(self, main: Callable[..., Any], history: List[Dict]):
        self.main = main
        self.history = history

    def __call__(self, **kwargs: Any) -> Any:
        os.environ.update(attempts_env(self.history))
        return self.main(**kwargs)


def run_with_retries(launch: Callable[[Callable[..., Any]], Any], main: Callable[..., Any],
                     max_failures: int) -> Any:
    """Run ``launch(wrapped_main)`` (one whole Horovod job) up to ``max_failures + 1`` times.

    Relaunches only after a lost rank (:func:`is_lost`); logs one line per attempt when
    ``max_failures > 0`` (``attempt n of K+1``, and why the previous one failed). Each relaunch
    hands its ranks the attempts before it, each with its world size (``world_size`` of the
    :class:`~pipelines.launch.failures.HorovodJobFailed` it ended with), which the launch reads
    from the attempt's ``history`` to size the next (:func:`pipelines.launch.sparkcheck.attempt_world`).

    Args:
        launch: starts every rank of one attempt on the function it is given and returns rank 0's
            value, or raises ``HorovodJobFailed``.
        main: the ranks' function; each attempt runs it wrapped (:class:`_Attempt`).
        max_failures: relaunches allowed (0: fail at the first failure, today's behaviour).

    Raises:
        HorovodJobFailed: a deterministic failure (at once), or the last lost one after
            ``max_failures`` relaunches.
        RelaunchImpossible: a relaunch could not start (e.g. the cluster lost task slots).
    """
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
