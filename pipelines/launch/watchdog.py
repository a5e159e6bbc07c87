"""A bound on how long a live rank may go without progress: :class:`Watchdog`.

A rank that stops while alive (a read from a hung mount or object store, a deadlocked reader
thread, a callback that never returns) keeps its Horovod background thread running, so Gloo's
timeouts never fire; the other ranks wait in their next allreduce and the job never ends
(horovod#2107, #1550, #4050). Horovod's own stall shutdown (``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``)
did not fire here, with Horovod 0.28.1, Gloo and TensorFlow 2.15 (the trial: docs/benchmarks.md,
Figures behind the code's constants).

So every rank watches itself. The training loop ticks (:meth:`Watchdog.tick`) at each step's start
and end, each epoch's start and end, and the work inside them ticks the running watchdog too
(:func:`progress`): each batch of an exact evaluation (validation, test), each check of the
preemption notice between them, each checkpoint's write. Each tick says whether what follows may
wait on other ranks (``waits=True``: a training step, a collective of the validation, which block
while a peer is late) or is the rank's own work (``waits=False``: between steps, an evaluation's
batch, a checkpoint's write). A rank stalls when no tick came for ``timeout_s`` after its own work, or for
``timeout_s + grace_s`` (:func:`grace_s`) while it may be waiting: the rank that stopped outside a
collective ends first, and its peers, waiting for it in one, then fail of its loss (Gloo's closed
connections) within seconds, never of their own deadline. A stalled rank reports (:func:`stall_record`:
its rank, host, what it last did, every thread's stack) and ends its process, which its launcher
sees as a *lost* rank: ``--max-failures`` relaunches it from the newest complete checkpoint.
"""
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


def grace_s(timeout_s: float) -> float:
    """Extra seconds a rank that may be waiting on its peers (``waits=True``) gets beyond
    ``timeout_s``: half of it, at least 15 s, so that a peer that stopped on its own work ends
    first and is named (ending a process and closing its Gloo connections takes about a second)."""
    return max(timeout_s / 2, 15.0)


class Watchdog:
    """Ends this rank when it makes no progress (:meth:`tick`) for ``timeout_s`` seconds
    (``timeout_s + grace_s(timeout_s)`` after a tick with ``waits=True``).

    Args:
        timeout_s: seconds (> 0) without a tick after the rank's own work.
        on_stall: called once, from the watchdog's thread, with the stall's one-line description;
            the default (:func:`end_stalled_rank`) reports and ends the process.
        clock: monotonic seconds (``time.monotonic``; a test's own clock).

    :meth:`start` starts its thread (a daemon) and makes it the one :func:`progress` ticks,
    :meth:`stop` stops it; :meth:`check` is one look.
    """

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
        """Progress: ``where`` says what the rank does next (``"step 3 of epoch 2"``), ``waits``
        whether it may wait on other ranks there."""
        self._last, self._where, self._waits = self.clock(), where, waits

    def deadline_s(self) -> float:
        """Seconds allowed after the last tick: ``timeout_s``, plus :func:`grace_s` when it waits."""
        return self.timeout_s + (grace_s(self.timeout_s) if self._waits else 0.0)

    def check(self) -> bool:
        """Whether the rank has stalled; on the first stall, call ``on_stall`` with its description."""
        idle = self.clock() - self._last
        if self.fired or idle <= self.deadline_s():
            return self.fired
        self.fired = True
        self.on_stall(f"no progress for {idle:.0f} s in {self._where} (--stall-timeout {self.timeout_s:g} s)")
        return True

    def start(self) -> "Watchdog":
        """Start watching (a daemon thread looking every ``min(1, timeout_s / 10)`` seconds)."""
        global _running
        _running = self
        self.tick(self._where, self._waits)
        self._stopped.clear()
        self._thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (the rank left the part that ticks)."""
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
    """A tick of the watchdog that runs in this process (:meth:`Watchdog.tick`), from work deep
    inside a step or an epoch's end; nothing when none runs."""
    if _running is not None:
        _running.tick(where, waits)


@contextlib.contextmanager
def watching(timeout_s: Optional[float], where: str) -> Iterator[None]:
    """A :class:`Watchdog` of ``timeout_s`` over the block, first ticked at ``where`` (its work
    ticks it with :func:`progress`); none when ``timeout_s`` is ``None`` or 0."""
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
    """Every thread's Python stack in this process, the watchdog's own left out: where each stopped."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    return "\n".join(f"Thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}"
                     for ident, frame in sys._current_frames().items() if ident != me)


def stall_record(why: str, environ=os.environ) -> Dict[str, Any]:
    """A stalled rank's failure record (the fields of :func:`pipelines.launch.failures.failure_record`):
    ``RankStalled: WHY``, its rank and host (Horovod's variables), every thread's stack as its
    traceback, ``lost`` (a relaunch may not stall again), never secondary nor a refusal."""
    return redact({"status": "error", "rank": int(environ.get("HOROVOD_RANK", "0")),
                   "host": environ.get("HOROVOD_HOSTNAME") or socket.gethostname(),
                   "cause": f"RankStalled: {why}", "traceback": thread_stacks(),
                   "secondary": False, "refused": False, "lost": True})


def end_stalled_rank(why: str) -> None:
    """A stalled rank's last words, then its end: the record logged (``rank R on HOST stalled:``
    and every thread's stack), written as the rank's outcome where its launcher reads one
    (:func:`pipelines.launch.child.write_outcome`), and the process ended with :data:`STALL_EXIT`
    at once (its main thread cannot be interrupted where it stopped)."""
    record = stall_record(why)
    log.error("rank %s on %s stalled: %s\n%s", record["rank"], record["host"], why, record["traceback"].rstrip())
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    write_outcome(record)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(STALL_EXIT)
