"""A preemption notice: SIGTERM, what a spot or preemptible machine gets before it is taken away.

Rank 0 checkpoints at the step the ranks agree on and the job exits ``PREEMPTED_EXIT``."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any, Iterator, Optional

from pipelines.launch.watchdog import REPEAT_S

log = logging.getLogger("pipelines")

#: The exit status of a job stopped by a preemption notice after its checkpoint (distinct from
#: 1, a failure; 2, a refusal; 75, a stalled rank: ``STALL_EXIT``).
PREEMPTED_EXIT = 76


class Preempted(RuntimeError):
    """Every rank stopped at the same step after a preemption notice; ``checkpoint``: rank 0's marker name."""

    run_status = "KILLED"  # the MLflow status of a run ended by it (pipelines.tracking.runs.Tracker)
    exit_status = PREEMPTED_EXIT  # a launching driver exits with it too (pipelines.launch.failures)

    def __init__(self, message: str, checkpoint: Optional[str] = None):
        super().__init__(message)
        self.checkpoint = checkpoint


_current: Optional["PreemptionNotice"] = None  # a signal handler is the process's: so is its notice


def current() -> Optional["PreemptionNotice"]:
    """The notice installed in this process, or ``None``."""
    return _current


class PreemptionNotice:
    """SIGTERM's handler while training; a context manager restoring the previous handler on exit.

    The first SIGTERM sets ``requested``; a second (``REPEAT_S`` or more later) ends the process at once."""

    def __init__(self, rank: int = 0, clock=time.monotonic):
        self.rank, self.clock = rank, clock
        self.requested = False
        self._first = 0.0
        self.holding = self.second = False
        self._previous: Any = None  # the SIGTERM handler before ours
        self._installed = False

    def _handle(self, signum, frame) -> None:
        if self.requested and self.clock() - self._first < REPEAT_S:  # the same notice, delivered again
            return
        if self.requested and self.holding:  # the second notice while the checkpoint is written: after it
            self.second = True
            return
        if self.requested:  # the second notice: stop now
            self.stop_now()
            return
        self.requested, self._first = True, self.clock()
        log.warning("rank %d: SIGTERM received: every rank checkpoints at the next step or validation batch and "
                    "stops, unless the run is finishing (its final evaluation, the export); a second SIGTERM "
                    "stops at once", self.rank)

    @staticmethod
    def stop_now() -> None:
        """End the process as SIGTERM's default action does."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def __enter__(self) -> "PreemptionNotice":
        global _current
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
            _current = self
        else:
            log.debug("no SIGTERM handler: training runs outside the main thread")
        return self

    def __exit__(self, *exc) -> None:
        global _current
        if self._installed:
            _current = None
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False


@contextlib.contextmanager
def holding(notice: Optional[PreemptionNotice]) -> Iterator[None]:
    """The block writes the preemption checkpoint: a second SIGTERM meanwhile ends the process after it."""
    if notice is None:
        yield
        return
    notice.holding = True
    try:
        yield
    finally:
        notice.holding = False
        if notice.second:
            notice.stop_now()


def resume_line(output: str) -> str:
    """The line a preempted job ends with: how to continue it exactly."""
    return (f"preempted: the run stopped after its checkpoint in {output}; continue it with the same command and "
            "--resume (it resumes at that step)")
