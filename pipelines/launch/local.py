"""Local ranks (``HorovodRunner(np=-N)``): N child processes of the driver.

The job and outcomes pass through files in a mode-0700 folder, never a socket; Gloo uses 127.0.0.1."""
from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional

import cloudpickle

from pipelines.io import nofollow
from pipelines.launch.barrier import rank_env, rank_plan
from pipelines.launch.child import die_with_parent, rank_command
from pipelines.launch.failures import HorovodJobFailed, RankFailure, exit_cause, signal_is_loss, with_late_ranks
from pipelines.launch.rankenv import gloo_timeout
from pipelines.launch.ranklogs import owner_only_append
from pipelines.launch.rendezvous import Rendezvous
from pipelines.runtime.redact import redact_text

log = logging.getLogger("pipelines")

LOOPBACK = "127.0.0.1"  # every socket of a local run: the rendezvous, and Gloo's own over lo
STOP_GRACE_S = 5.0  # a rank stopped after another's failure gets SIGTERM, then SIGKILL after this


def pad_rank(rank: int, size: int) -> str:
    """Horovod's rank log folder suffix: ``rank`` zero-padded to the digits of ``size - 1`` (``"0"`` for size 1)."""
    return str(rank).zfill(len(str(max(size - 1, 0))))


def run_local(main: Callable[..., Any], kwargs: Dict[str, Any], world_size: int, iface: Optional[str],
              log_dir: Optional[str], rank_timeouts: Optional[Dict[str, str]] = None) -> Any:
    """Run ``main(**kwargs)`` on ``world_size`` child ranks, Gloo over ``iface`` (None: ``lo``); return rank 0's value.

    ``log_dir``: where ``rank.R/stdout`` and ``rank.R/stderr`` are kept.

    Raises:
        HorovodJobFailed: a rank raised, died, or never joined the rendezvous."""
    host = socket.gethostname()
    slots = rank_plan([host] * world_size)
    with tempfile.TemporaryDirectory(prefix="hvd-local-") as work:  # mode 0700: the job is the owner's alone
        job = os.path.join(work, "job.pkl")
        with open(job, "wb") as f:
            f.write(cloudpickle.dumps((main, kwargs)))
        results = [os.path.join(work, f"result-{rank}.json") for rank in range(world_size)]
        rendezvous = Rendezvous(LOOPBACK, [(host, world_size)], world_size)
        choices = {"iface": iface or "lo", "gpus": [], "addresses": []}
        ranks: List[subprocess.Popen] = []
        try:
            with passing_on_sigterm(ranks):  # the ranks started so far, then all of them
                for slot in slots:
                    env = rank_env(slot, host, world_size, f"{LOOPBACK}:{rendezvous.port}", choices, os.environ,
                                   rendezvous.token)
                    ranks.append(_start_rank(job, results[slot["rank"]],
                                             dict(os.environ, **env, **(rank_timeouts or {})), slot["rank"],
                                             world_size, log_dir))
                ended = _wait(ranks)
        finally:
            _stop(ranks)
            rendezvous.stop()
        records = {rank: _read(path) for rank, path in enumerate(results)}
    failures = with_late_ranks(collect_failures(records, ended, host), rendezvous.missing(),
                               gloo_timeout({**os.environ, **(rank_timeouts or {})}),
                               dict.fromkeys(range(world_size), host))
    if failures:
        raise HorovodJobFailed(failures, world_size)
    return cloudpickle.loads(base64.b64decode(records[0]["result"]))


@contextlib.contextmanager
def passing_on_sigterm(ranks: List[subprocess.Popen]) -> Iterator[None]:
    """While the block runs (main thread only), pass a SIGTERM to this driver on to every running rank.

    A repeat within ``REPEAT_S`` is the same notice; one later ends the driver at once."""
    from pipelines.launch.watchdog import REPEAT_S

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: List[float] = []

    def handle(signum, frame) -> None:
        if first and time.monotonic() - first[0] >= REPEAT_S:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if not first:
            first.append(time.monotonic())
            log.warning("SIGTERM received: passed on to every rank, which checkpoints and stops (a second SIGTERM "
                        "ends this driver at once)")
        for proc in ranks:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _start_rank(job: str, result: str, env: Dict[str, str], rank: int, world_size: int,
                log_dir: Optional[str]) -> subprocess.Popen:
    """One rank's process, its output pumped to the driver's and to its log folder (refused if a link)."""
    folder = os.path.join(log_dir, f"rank.{pad_rank(rank, world_size)}") if log_dir else None
    if folder:
        nofollow.make_folder(log_dir)
        nofollow.make_folder(folder)
    proc = subprocess.Popen(rank_command(job, result), env=dict(env, PYTHONUNBUFFERED="1"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=die_with_parent)
    pumps = [threading.Thread(target=_pump, args=(stream, f"[{rank}]<{name}>:", name,
                                                  os.path.join(folder, name) if folder else None),
                              name=f"rank-{rank}-{name}", daemon=True)
             for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
    proc.pumps = pumps  # type: ignore[attr-defined]
    for pump in pumps:
        pump.start()
    return proc


def _pump(stream: BinaryIO, shown: str, name: str, keep: Optional[str]) -> None:
    """Copy a rank's stream line by line, redacted, to our stream ``name`` prefixed ``shown``, and to ``keep``."""
    with stream, owner_only_append(keep) as kept:
        for raw in stream:
            line = redact_text(raw.decode(errors="replace"))
            kept.write(line.encode())
            kept.flush()
            console = getattr(sys, name)  # looked up each time: a test may capture it
            console.write(shown + line.rstrip("\n") + "\n")
            console.flush()


def _wait(ranks: List[subprocess.Popen]) -> Dict[int, int]:
    """Wait until every rank has ended or one has failed; ``rank -> exit status`` of those that ended by themselves."""
    ended: Dict[int, int] = {}
    while len(ended) < len(ranks):
        for rank, proc in enumerate(ranks):
            if rank not in ended and proc.poll() is not None:
                ended[rank] = proc.returncode
        if any(code != 0 for code in ended.values()):
            break
        time.sleep(0.1)
    return ended


def _stop(ranks: List[subprocess.Popen]) -> None:
    """End every running rank (SIGTERM, SIGKILL after ``STOP_GRACE_S``) and wait as long again for its output."""
    for proc in ranks:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in ranks:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pump in proc.pumps:  # type: ignore[attr-defined]  # bounded: a process the rank left behind may hold its pipes open
            pump.join(STOP_GRACE_S)


def _read(path: str) -> Optional[Dict[str, Any]]:
    """A rank's outcome record (written by rename, so whole), or None if it wrote none."""
    if not os.path.exists(path):
        return None
    with open(path) as f:  # whole files only: written by rename
        return json.load(f)


def collect_failures(records: Dict[int, Optional[Dict[str, Any]]], ended: Dict[int, int],
                     host: str) -> List[RankFailure]:
    """The failures of a local run; empty when every rank succeeded. A rank without a record failed, even with 0."""
    failures = [RankFailure(r["rank"], r["cause"], r.get("traceback", ""), r.get("secondary", False),
                            r.get("host") or host, lost=r.get("lost", False), refused=r.get("refused", False),
                            exit_status=r.get("exit_status"))
                for r in records.values() if r is not None and r["status"] == "error"]
    for rank, code in sorted(ended.items()):
        if records.get(rank) is None:
            cause = exit_cause(code) if code else "process ended without writing its result"
            failures.append(RankFailure(rank, cause, host=host, lost=signal_is_loss(code)))
    return failures
