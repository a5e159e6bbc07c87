"""What a failed launch says: which rank failed, on which host, why, and whether it was *lost* (killed,
pre-empted: a relaunch may survive it) or broke."""
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
    """Whether exit status ``code`` (negative: killed by signal ``-code``) is one of ``LOST_SIGNALS``."""
    return code < 0 and -code in LOST_SIGNALS


@dataclass(frozen=True)
class RankFailure:
    """Why one rank failed.

    Attributes:
        cause: one line, ``Type: message`` or the exit status.
        refused: it raised ``Refused`` (the driver exits 2 with one line)."""

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
    """A Horovod run failed: ``failures`` root cause first; ``world_size`` as launched (None if unknown)."""

    def __init__(self, failures: List[RankFailure], world_size: Optional[int] = None):
        self.failures = sorted(failures, key=lambda f: (f.secondary, f.rank))
        self.world_size = world_size
        first = self.failures[0]
        others = ", ".join(f"rank {f.rank}" for f in self.failures[1:])
        super().__init__(describe(first) + (f" (then also: {others})" if others else ""))

    @property
    def refused(self) -> bool:
        """Whether the root cause is a rank's refusal of its input (exit 2)."""
        return self.failures[0].refused


class RelaunchImpossible(RuntimeError):
    """A job whose rank was lost could not be relaunched; the message names the failure and why."""

    def __init__(self, failure: str, attempt: int, reason: str):
        super().__init__(f"{failure}; attempt {attempt} could not start: {reason}")


_SECONDARY = ("Horovod has been shut down", "HorovodInternalError", "Connection closed by peer",
              "Gloo", "gloo")
# What storage clients and the OS say when the host's own network link is down: a loss, not a bug
# (a wrong endpoint says the same, and is relaunched at most --max-failures times).
_LINK_LOST = ("AWS Error NETWORK_CONNECTION", "Network is unreachable", "No route to host")


def is_secondary(exc: BaseException) -> bool:
    """Whether ``exc`` came from a peer's death or the host's lost network link, not the rank's own code."""
    text = f"{type(exc).__name__}: {exc}"
    return "Horovod" in type(exc).__name__ or any(marker in text for marker in _SECONDARY + _LINK_LOST)


def failure_record(exc: BaseException) -> Dict[str, Any]:
    """The redacted record a rank writes of the exception ending it (no traceback for a refusal or own stop)."""
    refused = is_refusal(exc)
    stop = getattr(exc, "exit_status", None)  # a stop the job chose (pipelines.training.preemption.Preempted)
    record = {"rank": int(os.environ.get("HOROVOD_RANK", "0")), "cause": f"{type(exc).__name__}: {exc}",
              "traceback": "" if refused or stop else "".join(traceback.format_exception(exc)),
              "secondary": is_secondary(exc), "refused": refused, "exit_status": stop,
              "host": os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()}
    return redact(record)  # a cause or traceback may quote a config's secrets or a URI's userinfo


def log_rank_failure(record: Dict[str, Any]) -> None:
    """Log a rank's ``failure_record``: ``rank R on HOST failed: CAUSE`` and the traceback (a stop as a warning)."""
    text = f"\n{record['traceback'].rstrip()}" if record["traceback"] else ""
    if record.get("exit_status"):  # not a failure: a stop the job chose, said as it is
        log.warning("rank %s on %s stopped: %s", record["rank"], record["host"], record["cause"])
        return
    log.error("rank %s on %s %s: %s%s", record["rank"], record["host"],
              "refused" if record.get("refused") else "failed", record["cause"], text)


class ClusterConfigError(Refused):
    """A Spark setting under which barrier tasks cannot run; a refusal (exit 2), naming the setting and value to use."""


def with_late_ranks(failures: List[RankFailure], missing: Sequence[int], timeout_s: str,
                    hosts: Mapping[int, str]) -> List[RankFailure]:
    """``failures`` with the ranks that never joined the rendezvous (lost, within ``timeout_s``) as root cause."""
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
