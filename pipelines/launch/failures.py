"""What a failed launch says: which rank failed, on which host, why, and whether it was *lost*.

A rank's failure is one :class:`RankFailure`; a whole job's, :class:`HorovodJobFailed` (root cause
first). Whether a process was lost (taken away: killed, pre-empted) or broke (an exception, a
crash) is decided here from its exit status, and read by :mod:`pipelines.launch.recovery`.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import traceback
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence

from pipelines.runtime.errors import Refused, is_refusal
from pipelines.runtime.redact import redact

log = logging.getLogger("pipelines")

# Signals that say the process was taken away, not that it broke (SIGSEGV, SIGABRT, SIGFPE do).
LOST_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGHUP)


def signal_is_loss(code: int) -> bool:
    """Whether a process's exit status ``code`` (negative: killed by signal ``-code``, as
    ``subprocess`` reports it) means its process was lost (:data:`LOST_SIGNALS`)."""
    return code < 0 and -code in LOST_SIGNALS


@dataclass(frozen=True)
class RankFailure:
    """Why one rank failed: ``cause`` is one line (``Type: message`` or the exit status); ``host``
    where it ran; ``lost``: its process or host was taken away (killed, executor lost), which a
    relaunch may survive (:mod:`pipelines.launch.recovery`); ``refused``: it raised a
    :class:`~pipelines.runtime.errors.Refused` (bad input: the driver exits 2, with one line)."""

    rank: int
    cause: str
    traceback: str = ""
    secondary: bool = False  # a Horovod error caused by another rank's failure
    host: str = ""
    lost: bool = False
    refused: bool = False
    exit_status: Optional[int] = None  # a clean stop of the job's own, with the status it exits with (a preemption)


def describe(failure: RankFailure) -> str:
    """One line: ``rank R on HOST failed: CAUSE`` (``on HOST`` when known)."""
    where = f" on {failure.host}" if failure.host else ""
    return f"rank {failure.rank}{where} failed: {failure.cause}"


class HorovodJobFailed(RuntimeError):
    """A Horovod run failed; ``failures`` lists every rank that reported, root cause first;
    ``world_size``: the ranks the run was launched on (None where the launcher did not say)."""

    def __init__(self, failures: List[RankFailure], world_size: Optional[int] = None):
        self.failures = sorted(failures, key=lambda f: (f.secondary, f.rank))
        self.world_size = world_size
        first = self.failures[0]
        others = ", ".join(f"rank {f.rank}" for f in self.failures[1:])
        super().__init__(describe(first) + (f" (then also: {others})" if others else ""))

    @property
    def refused(self) -> bool:
        """Whether the root cause is a rank's refusal of its input (exit 2), not a failure."""
        return self.failures[0].refused


class RelaunchImpossible(RuntimeError):
    """A job whose rank was lost could not be relaunched (e.g. the cluster no longer offers the
    task slots of its world size); the message names the failure and why."""

    def __init__(self, failure: str, attempt: int, reason: str):
        super().__init__(f"{failure}; attempt {attempt} could not start: {reason}")


_SECONDARY = ("Horovod has been shut down", "HorovodInternalError", "Connection closed by peer",
              "Gloo", "gloo")
# What the storage clients say when the host's own network link is down (pyarrow's S3 through the
# AWS SDK and curl; the OS): the host was cut off, which no rerun of the same code would repeat.
# Seen: "AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7" while a test host's
# link was down. A wrong endpoint says the same and is relaunched at most --max-failures times.
_LINK_LOST = ("AWS Error NETWORK_CONNECTION", "Network is unreachable", "No route to host")


def is_secondary(exc: BaseException) -> bool:
    """Errors a rank gets because a peer died (Horovod shut down, Gloo connections lost) or its
    host's network link went down (:data:`_LINK_LOST`), not a cause of its own code."""
    text = f"{type(exc).__name__}: {exc}"
    return "Horovod" in type(exc).__name__ or any(marker in text for marker in _SECONDARY + _LINK_LOST)


def failure_record(exc: BaseException) -> Dict[str, Any]:
    """The record a rank writes of the exception ``exc`` that ends it: its rank, host, one-line
    cause, its whole traceback (chained causes included; empty for a refusal, whose message says
    it all, and for a stop of the job's own: an exception with ``exit_status``), whether secondary,
    whether a refusal (:class:`~pipelines.runtime.errors.Refused`), that exit status. Redacted."""
    refused = is_refusal(exc)
    stop = getattr(exc, "exit_status", None)  # a stop the job chose (pipelines.training.preemption.Preempted)
    record = {"rank": int(os.environ.get("HOROVOD_RANK", "0")), "cause": f"{type(exc).__name__}: {exc}",
              "traceback": "" if refused or stop else "".join(traceback.format_exception(exc)),
              "secondary": is_secondary(exc), "refused": refused, "exit_status": stop,
              "host": os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()}
    return redact(record)  # a cause or traceback may quote a config's secrets or a URI's userinfo


def log_rank_failure(record: Dict[str, Any]) -> None:
    """A rank's own last words on the exception that ends it (``record``: :func:`failure_record`),
    in its log: ``rank R on HOST failed: CAUSE``, then the redacted traceback (none for a refusal)."""
    text = f"\n{record['traceback'].rstrip()}" if record["traceback"] else ""
    if record.get("exit_status"):  # not a failure: a stop the job chose, said as it is
        log.warning("rank %s on %s stopped: %s", record["rank"], record["host"], record["cause"])
        return
    log.error("rank %s on %s %s: %s%s", record["rank"], record["host"],
              "refused" if record.get("refused") else "failed", record["cause"], text)


class ClusterConfigError(Refused):
    """A Spark setting under which barrier tasks cannot run; the message (one line) names the
    setting and the value to use. A refusal: ``jobs/train.py`` exits with status 2 on it."""


def with_late_ranks(failures: List[RankFailure], missing: Sequence[int], timeout_s: str,
                    hosts: Mapping[int, str]) -> List[RankFailure]:
    """``failures`` with the ranks that never joined Gloo's rendezvous (``missing``, as
    :meth:`pipelines.launch.rendezvous.Rendezvous.missing` gives) as their root cause: each such rank
    that reported no failure of its own becomes a lost :class:`RankFailure` on its host (``hosts``:
    rank -> host) naming the window (``timeout_s``: ``HOROVOD_GLOO_TIMEOUT_SECONDS``) and the option
    that widens it; the other ranks' failures (Gloo's "Wait timeout ... for key(s)" abort) become
    secondary. Unchanged when no rank is missing or the job did not fail."""
    own = {f.rank for f in failures}
    late = [RankFailure(rank, f"did not join Gloo's rendezvous within {timeout_s} s (started late or not at "
                              f"all): raise --rendezvous-timeout", host=hosts.get(rank, ""), lost=True)
            for rank in missing if rank not in own]
    if not failures or not late:
        return failures
    return late + [replace(f, secondary=True) for f in failures]


def exit_cause(code: int) -> str:
    """One line for a process's exit status (negative: the signal that killed it)."""
    if code < 0:
        return f"process killed by signal {signal.Signals(-code).name}"
    return f"process exited with status {code}"
