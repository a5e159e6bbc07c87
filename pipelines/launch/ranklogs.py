"""The ranks' output, live at the driver: what TorchDistributor and Databricks' HorovodRunner do.

A Spark barrier task runs its rank as a child process whose output (stdout and stderr, one
stream) would otherwise end in the executor's log on the worker host. :func:`forward` reads it
line by line in the task, echoes each line to the executor's stderr (the worker's log keeps it)
and sends it over TCP to the driver's :class:`LogSink`, which prints it as it arrives, prefixed
``[rank R on HOST]``, and appends it to ``rank-R.log`` in a log folder when one is given.

The sink listens on an ephemeral port of the driver's host (the address executors already reach
the driver at, ``spark.driver.host``); a connection must first send the run's random token, so
other connections to the port are dropped. Streaming is best effort: a task that cannot reach the
sink still runs its rank, and its lines stay in the executor's log.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import socketserver
import sys
import threading
import time
from typing import BinaryIO, Dict, Optional

log = logging.getLogger("pipelines")


def prefix(rank: int, host: str) -> str:
    """The prefix of a rank's lines at the driver."""
    return f"[rank {rank} on {host}] "


class LogSink:
    """Driver side: a TCP server that prints the ranks' lines as they arrive.

    Args:
        advertised_host: the address the executors reach this process at.
        log_dir: a local folder for ``rank-R.log`` (each rank's lines, unprefixed), or None.

    ``address`` (``host:port``) and ``token`` are what each task needs; :meth:`wait_for` waits for
    the lines the tasks said they sent; :meth:`close` stops the server. ``hosts`` maps each rank
    whose task connected to its host (as the task named it): which rank a lost host ran.
    """

    def __init__(self, advertised_host: str, log_dir: Optional[str] = None):
        self.token = secrets.token_hex(16)
        self.log_dir = log_dir
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        self.received: Dict[int, int] = {}
        self.hosts: Dict[int, str] = {}
        self._lock = threading.Condition()
        sink = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                sink._receive(self.rfile)

        self._server = socketserver.ThreadingTCPServer(("", 0), Handler)
        self._server.daemon_threads = True
        self.address = f"{advertised_host}:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="rank-log-sink", daemon=True).start()

    def _receive(self, stream: BinaryIO) -> None:
        try:
            header = json.loads(stream.readline())
        except ValueError:
            return
        if header.get("token") != self.token:
            return
        rank, shown = int(header["rank"]), prefix(int(header["rank"]), str(header["host"]))
        self.hosts[rank] = str(header["host"])
        path = os.path.join(self.log_dir, f"rank-{rank}.log") if self.log_dir else os.devnull
        with open(path, "ab") as keep:
            for line in stream:
                keep.write(line)
                keep.flush()
                sys.stderr.write(shown + line.decode(errors="replace").rstrip("\n") + "\n")
                sys.stderr.flush()
                with self._lock:
                    self.received[rank] = self.received.get(rank, 0) + 1
                    self._lock.notify_all()

    def wait_for(self, sent: Dict[int, int], timeout_s: float = 10.0) -> bool:
        """Wait until the sink has every line the tasks sent (``rank -> lines``); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while any(self.received.get(r, 0) < n for r, n in sent.items()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _connect(address: Optional[str], header: Dict) -> Optional[socket.socket]:
    if not address:
        return None
    host, port = address.rsplit(":", 1)
    try:
        conn = socket.create_connection((host, int(port)), timeout=10)
        conn.sendall(json.dumps(header).encode() + b"\n")
        return conn
    except OSError as exc:
        sys.stderr.write(f"rank {header['rank']}: its output cannot reach the driver at {address} ({exc}); "
                         f"it stays in this executor's log\n")
        return None


def forward(stream: BinaryIO, address: Optional[str], token: str, rank: int, host: str) -> int:
    """Task side: copy ``stream`` (a rank's output) line by line to this process's stderr and to
    the driver's sink at ``address`` (``host:port``; None: stderr only) until it ends.

    Returns:
        the number of lines the sink was sent (0 when it could not be reached).
    """
    conn = _connect(address, {"token": token, "rank": rank, "host": host})
    sent = 0
    try:
        for line in stream:
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
            if conn is not None:
                try:
                    conn.sendall(line if line.endswith(b"\n") else line + b"\n")
                    sent += 1
                except OSError:
                    conn = None
    finally:
        if conn is not None:
            conn.close()
    return sent
