"""Readers' leases on an ETL run: a training's files are never deleted while it reads them.

A reader rewrites ``OUTPUT/runs/<run id>/readers/<reader>.json`` every `REFRESH_S` s; a commit keeps every older run
with a lease younger than `TTL_S` by the store's clock (`store_time`). `hold`: lease first, then reread the manifest."""
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

#: seconds a lease lives after its last refresh: ten refreshes missed before a commit may delete the run
TTL_S = 600.0
#: seconds between a holder's refreshes
REFRESH_S = 60.0


class InputReplaced(RuntimeError):
    """The ETL output was committed anew between reading its manifest and leasing its run: start again."""


@dataclass(frozen=True)
class Lease:
    """A lease file as a commit judges it: age in seconds by the store's clock, and whether it is live."""

    reader: str
    age_s: float
    live: bool


def lease_location(output, run_id: str, reader: str):
    """``OUTPUT/runs/<run id>/readers/<reader>.json``, ``run_id`` and ``reader`` checked to be plain names."""
    return output.join(RUNS, plain_name(run_id, "an ETL run id"), READERS,
                       plain_name(reader, "a reader's id") + ".json")


def write_lease(location, reader: str, run_id: str, now: Optional[float] = None) -> None:
    """Write or refresh the lease; ``now`` (Unix s) is information only: the store's time of the write ages it."""
    now = time.time() if now is None else now
    stamp = dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    location.write_json({"reader": reader, "run_id": run_id, "refreshed": now, "refreshed_utc": stamp,
                         "ttl_s": TTL_S})


def store_time(folder) -> float:
    """Now by the clock of the store holding ``folder``: the mtime, Unix s, of a probe file written there."""
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
    """Every lease on the run folder ``run``; live when ``-ttl_s < age < ttl_s`` (a time far ahead is not believed)."""
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
    """A held lease: written on `start`, refreshed by a daemon thread (failures only logged), deleted on `stop`."""

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
    """Lease the run ``run_id`` of ``output`` for ``reader``, then check the manifest still names it.

    Returns:
        the started `ReaderLease`; stop it (or leave its ``with`` block) when done.

    Raises:
        InputReplaced: the manifest names another run now (the lease is deleted again)."""
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
