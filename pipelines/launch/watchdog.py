"""A bound on how long a live rank may go without progress: ``Watchdog``; a stalled rank exits ``STALL_EXIT``.

A rank stuck while alive keeps Gloo from timing out, so each rank watches itself; waits on peers get ``grace_s``
more, so the rank that stopped on its own work ends first and is named."""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterator, Optional

from pipelines.launch.child import write_outcome
from pipelines.runtime.redact import redact

log = logging.getLogger("pipelines")

DEFAULT_STALL_TIMEOUT_S = 600.0  # ten minutes: longer than any step, evaluation batch or checkpoint here
STALL_EXIT = 75  # a stalled rank's exit status (EX_TEMPFAIL: worth another try)
#: Seconds within which a second SIGTERM (to a rank or its driver) is the first one delivered again, not a second notice.
REPEAT_S = 2.0


def grace_s(timeout_s: float) -> float:
    """Extra seconds for a rank that may be waiting on peers: half of ``timeout_s``, at least 15."""
    return max(timeout_s / 2, 15.0)


class Watchdog:
    """Ends this rank when no ``tick`` came for ``timeout_s`` seconds (plus ``grace_s`` after ``waits=True``).

    Args:
        on_stall: called once, from the watchdog's thread, with a one-line description.
        clock: monotonic seconds."""

    def __init__(self, timeout_s: float, on_stall: Optional[Callable[[str], None]] = None,
                 clock: Callable[[], float] = time.monotonic):
        if not timeout_s > 0:
            raise ValueError(f"a stall timeout must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.on_stall = on_stall or end_stalled_rank
        self.clock = clock
        self._last, self._where, self._waits = clock(), "the start of training", False
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.fired = False

    def tick(self, where: str, waits: bool = False) -> None:
        """Progress: ``where`` is what the rank does next (``"step 3 of epoch 2"``), ``waits`` whether it may wait on peers."""
        self._last, self._where, self._waits = self.clock(), where, waits

    def deadline_s(self) -> float:
        """Seconds allowed after the last tick."""
        return self.timeout_s + (grace_s(self.timeout_s) if self._waits else 0.0)

    def check(self) -> bool:
        """Whether the rank has stalled; calls ``on_stall`` on the first stall."""
        idle = self.clock() - self._last
        if self.fired or idle <= self.deadline_s():
            return self.fired
        self.fired = True
        self.on_stall(f"no progress for {idle:.0f} s in {self._where} (--stall-timeout {self.timeout_s:g} s)")
        return True

    def start(self) -> "Watchdog":
        """Start the daemon thread and make this the watchdog ``progress`` ticks."""
        global _running
        _running = self
        self.tick(self._where, self._waits)
        self._stopped.clear()
        self._thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching."""
        global _running
        if _running is self:
            _running = None
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(min(1.0, self.timeout_s / 10)):
            if self.check():
                return


_running: Optional[Watchdog] = None  # the rank's watchdog: a stall ends the process, so it is the process's


def progress(where: str, waits: bool = False) -> None:
    """Tick the watchdog running in this process, if any."""
    if _running is not None:
        _running.tick(where, waits)


@contextlib.contextmanager
def watching(timeout_s: Optional[float], where: str) -> Iterator[None]:
    """A ``Watchdog`` of ``timeout_s`` over the block, first ticked at ``where``; none when ``timeout_s`` is falsy."""
    if not timeout_s:
        yield
        return
    watchdog = Watchdog(timeout_s)
    watchdog.tick(where)
    watchdog.start()
    try:
        yield
    finally:
        watchdog.stop()


def thread_stacks() -> str:
    """Every thread's Python stack in this process except the caller's."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    return "\n".join(f"Thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}"
                     for ident, frame in sys._current_frames().items() if ident != me)


def stall_record(why: str, environ=os.environ) -> Dict[str, Any]:
    """A stalled rank's failure record: ``RankStalled: WHY``, every thread's stack, ``lost``."""
    return redact({"status": "error", "rank": int(environ.get("HOROVOD_RANK", "0")),
                   "host": environ.get("HOROVOD_HOSTNAME") or socket.gethostname(),
                   "cause": f"RankStalled: {why}", "traceback": thread_stacks(),
                   "secondary": False, "refused": False, "lost": True})


def end_stalled_rank(why: str) -> None:
    """Log and write the stall record as the rank's outcome, then ``os._exit(STALL_EXIT)``."""
    record = stall_record(why)
    log.error("rank %s on %s stalled: %s\n%s", record["rank"], record["host"], why, record["traceback"].rstrip())
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    write_outcome(record)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(STALL_EXIT)
