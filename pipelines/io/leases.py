"""Readers' leases on an ETL run: a training's files are never deleted while it reads them.

An ETL commit deletes the runs older than itself (:mod:`pipelines.etl.commit`). A training that
reads the run the manifest named when it started would lose its files mid-run, so it holds a
lease on that run for as long as it reads it::

    OUTPUT/runs/<run id>/readers/<reader>.json   {"reader", "run_id", "refreshed" (Unix s, UTC),
                                                  "refreshed_utc", "ttl_s"}

written by the reader (training's rank 0, ``<reader>`` its training run id) before it reads a
part, rewritten every :data:`REFRESH_S` seconds by a thread of its own, and deleted when it is done
(:class:`ReaderLease`). A commit keeps every older run with a live lease (:func:`leases_on`) and
deletes it at a later commit, once no lease on it is live.

A lease's age is read on one clock, the store's: the modification time the store gave the lease
file at its last rewrite (S3's ``LastModified``, a local or NFS file's ``mtime``) against the
modification time it gives a probe file the judge writes next to it (:func:`store_time`). Neither
host's clock enters, so a holder or a judge whose clock is off by any amount judges alike; the
times written inside the file are informative only. A lease is live while it is less than
:data:`TTL_S` old by that clock, so the lease of a training that crashed or was killed expires
:data:`TTL_S` after its last refresh. What remains: a file system whose clients set a file's
time themselves (some FUSE mounts of object stores) brings the writing host's clock back.

The race between a reader and a commit is closed by order: the reader writes its lease, then reads
the manifest again (:func:`hold`). If the manifest still names the leased run, any commit that
replaces it writes its manifest later and so lists the lease; if not, the run may be gone already
and the reader refuses (:class:`InputReplaced`) rather than read half a run. Both writes are one
PUT on an object store, a rename on a local disk (:meth:`pipelines.io.storage.Location.write_json`);
the store must list a file once written (S3 does, since 2020).
"""
from __future__ import annotations

import datetime as dt
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import List, Optional

from pipelines.contract import MANIFEST, READERS, RUNS, plain_name

log = logging.getLogger("pipelines")

#: seconds a lease lives after its last refresh: ten refreshes missed (a stalled store, a paused
#: process) before a commit may delete the run under a reader
TTL_S = 600.0
#: seconds between a holder's refreshes
REFRESH_S = 60.0


class InputReplaced(RuntimeError):
    """The ETL output was committed anew between reading its manifest and leasing its run: start
    the reader again (it reads the new run). A failure, not a refusal: nothing the user gave was wrong."""


@dataclass(frozen=True)
class Lease:
    """A lease file as a commit judges it: ``reader``, seconds since its last refresh (``age_s``,
    by the store's clock: :func:`leases_on`), and whether it is ``live``."""

    reader: str
    age_s: float
    live: bool


def lease_location(output, run_id: str, reader: str):
    """``OUTPUT/runs/<run id>/readers/<reader>.json`` (:class:`pipelines.io.storage.Location`);
    ``run_id`` and ``reader`` checked to be plain names."""
    return output.join(RUNS, plain_name(run_id, "an ETL run id"), READERS,
                       plain_name(reader, "a reader's id") + ".json")


def write_lease(location, reader: str, run_id: str, now: Optional[float] = None) -> None:
    """Write (or refresh) the lease at ``location``; ``now``: Unix seconds (default: this host's
    clock), written as information only: the store's time of the write is what ages the lease."""
    now = time.time() if now is None else now
    stamp = dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    location.write_json({"reader": reader, "run_id": run_id, "refreshed": now, "refreshed_utc": stamp,
                         "ttl_s": TTL_S})


def store_time(folder) -> float:
    """Now, by the clock of the store that holds ``folder`` (a :class:`pipelines.io.storage.Location`):
    the modification time, Unix seconds, the store gives a probe file written there (then deleted).

    Raises:
        OSError: the store refuses the write or the read.
    """
    probe = folder.join(f".clock-{secrets.token_hex(6)}")
    probe.write_bytes(b"")
    try:
        mtime = probe.info().mtime
    finally:
        probe.delete()
    if mtime is None:
        raise OSError(f"{folder.uri}: the store gives its files no modification time")
    return mtime.timestamp()


def leases_on(run, ttl_s: float = TTL_S) -> List[Lease]:
    """Every lease on the ETL run folder ``run`` (``OUTPUT/runs/<run id>``), live or not, by
    reader. A lease is live when ``-ttl_s < age < ttl_s``, its age the store's time now
    (:func:`store_time`, probed only when there is a lease) less the store's modification time of
    its file (a file time further ahead than ``ttl_s`` is not to be believed); ``ttl_s``: seconds
    (default :data:`TTL_S`)."""
    import pyarrow.fs as pafs

    listed = [info for info in run.join(READERS).list(recursive=False)
              if info.type == pafs.FileType.File and info.base_name.endswith(".json")
              and not info.base_name.startswith((".", "_"))]
    if not listed:
        return []
    now = store_time(run.join(READERS))
    leases = []
    for info in listed:
        age = now - (info.mtime.timestamp() if info.mtime else float("-inf"))
        leases.append(Lease(info.base_name[:-len(".json")], age, -ttl_s < age < ttl_s))
    return leases


class ReaderLease:
    """A held lease: written on :meth:`start`, refreshed every :data:`REFRESH_S` seconds by a
    daemon thread, deleted on :meth:`stop` (a context manager: ``with ReaderLease(...)``). A
    refresh that fails is logged and tried again at the next period, never raised into the
    reader (its own reads fail soon enough if the store is gone)."""

    def __init__(self, location, reader: str, run_id: str, refresh_s: float = REFRESH_S):
        self.location, self.reader, self.run_id, self.refresh_s = location, reader, run_id, refresh_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "ReaderLease":
        write_lease(self.location, self.reader, self.run_id)
        self._thread = threading.Thread(target=self._refresh, name="reader-lease", daemon=True)
        self._thread.start()
        return self

    def _refresh(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                write_lease(self.location, self.reader, self.run_id)
            except OSError as exc:
                log.warning("could not refresh the lease %s: %s", self.location.uri, exc)

    def stop(self) -> None:
        """Stop refreshing and delete the lease (a failure to delete is logged: it expires)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.location.delete()
        except OSError as exc:
            log.warning("could not delete the lease %s (it expires %.0f s after its last refresh): %s",
                        self.location.uri, TTL_S, exc)

    def __enter__(self) -> "ReaderLease":
        return self if self._thread else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def hold(output, run_id: str, reader: str, refresh_s: float = REFRESH_S) -> ReaderLease:
    """Lease the ETL run ``run_id`` of ``output`` (:class:`pipelines.io.storage.Location`) for
    ``reader``, then check that the manifest still names it (the module's order). Returns the
    started :class:`ReaderLease`; stop it (or leave its ``with`` block) when done.

    Raises:
        InputReplaced: the manifest names another run now (the lease is deleted again).
    """
    lease = ReaderLease(lease_location(output, run_id, reader), reader, run_id, refresh_s).start()
    try:
        current = output.join(MANIFEST).read_json().get("run_id")
    except (OSError, ValueError) as exc:
        current = f"unreadable ({exc})"
    if current != run_id:
        lease.stop()
        raise InputReplaced(f"{output.uri} was committed anew (ETL run {run_id} -> {current}) while this run "
                            "started; start it again to read the new run")
    return lease
