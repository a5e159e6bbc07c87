"""The ranks' output, live at the driver: each barrier task sends its rank's lines to the driver's ``LogSink``.

Anyone reaching the port can connect, so the sink bounds what it accepts (token, one connection per rank, sizes)."""
from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import socket
import socketserver
import sys
import threading
import time
from typing import IO, BinaryIO, Dict, Optional, Tuple, cast

from pipelines.io import nofollow
from pipelines.launch.network import join_host_port, resolve, split_host_port
from pipelines.runtime.redact import redact_text

log = logging.getLogger("pipelines")


HEADER_BYTES = 4096  # a header is ~100 bytes: token, rank, host name (at most 255 bytes)
LINE_BYTES = 64 * 1024  # a longer line is printed in pieces (its rank-R.log keeps it whole)
SPARE_CONNECTIONS = 8  # connections beyond one per rank, open at once: a retry, a stray scanner
HOST_CHARS = 255  # the longest host name DNS allows


def prefix(rank: int, host: str) -> str:
    """The prefix of a rank's lines at the driver."""
    return f"[rank {rank} on {host}] "


def printable_host(host: str) -> str:
    """``host`` as printed: non-printable characters and brackets made ``?``, cut to ``HOST_CHARS``."""
    return "".join(c if c.isprintable() and c not in "[]" else "?" for c in host[:HOST_CHARS])


def check_header(header: object, token: str, world_size: int) -> Optional[Tuple[int, str]]:
    """``(rank, host)`` of a valid connection header (matching ``token``, rank in range), else None."""
    if not isinstance(header, dict):
        return None
    given, rank, host = header.get("token"), header.get("rank"), header.get("host")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), token.encode()):
        return None
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        return None
    if not isinstance(host, str):
        return None
    return rank, printable_host(host)


class _Server(socketserver.ThreadingTCPServer):
    """A threading TCP server on one address with at most ``limit`` connections open at once."""

    daemon_threads = True

    def __init__(self, family: int, address: str, handler, limit: int):
        self.address_family = family
        self._slots = threading.BoundedSemaphore(limit)
        super().__init__((address, 0), handler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):  # full: closed at once, no thread started
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class LogSink:
    """Driver side: a TCP server that prints the ranks' lines as they arrive.

    Args:
        advertised_host: the address the executors reach this process at.
        log_dir: local folder for ``rank-R.log`` (mode 0600), or None.
        bind_host: the address to listen on if not ``advertised_host`` (``spark.driver.bindAddress``).

    Raises:
        ValueError, OSError: the host to listen on does not resolve; is not this machine's."""

    def __init__(self, advertised_host: str, log_dir: Optional[str] = None, world_size: int = 1,
                 bind_host: Optional[str] = None, header_timeout_s: float = 10.0):
        self.token = secrets.token_hex(16)
        self.log_dir = log_dir
        self.world_size = world_size
        self.header_timeout_s = header_timeout_s
        if log_dir:
            nofollow.make_folder(log_dir)
        self.received: Dict[int, int] = {}
        self.hosts: Dict[int, str] = {}
        self._lock = threading.Condition()
        sink = self

        class Handler(socketserver.StreamRequestHandler):
            def setup(self):
                self.request.settimeout(sink.header_timeout_s)
                super().setup()

            def handle(self):
                sink._receive(self.request, cast(BinaryIO, self.rfile))

        address = resolve(bind_host or advertised_host)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._server = _Server(family, address, Handler, world_size + SPARE_CONNECTIONS)
        self.address = join_host_port(advertised_host, self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, name="rank-log-sink", daemon=True).start()

    def _claim(self, stream: BinaryIO) -> Optional[Tuple[int, str]]:
        """Read and check a connection's header; ``(rank, host)`` once the rank is claimed by this connection."""
        line = stream.readline(HEADER_BYTES)
        if not line.endswith(b"\n"):
            return None  # too long, or the peer stopped: either way not one of our tasks
        try:
            claimed = check_header(json.loads(line), self.token, self.world_size)
        except ValueError:
            return None
        with self._lock:
            if claimed is None or claimed[0] in self.hosts:  # one connection per rank
                return None
            self.hosts[claimed[0]] = claimed[1]
        return claimed

    def _receive(self, conn: socket.socket, stream: BinaryIO) -> None:
        try:
            claimed = self._claim(stream)
        except OSError:  # the header did not come within header_timeout_s
            return
        if claimed is None:
            return
        rank, host = claimed
        conn.settimeout(None)  # a rank may be silent for an epoch; the connection lives as long as it
        shown = prefix(rank, host)
        with _owner_only_log(self.log_dir, rank) as keep:
            for piece in iter(lambda: stream.readline(LINE_BYTES), b""):
                text = redact_text(piece.decode(errors="replace"))
                keep.write(text.encode())
                keep.flush()
                sys.stderr.write(shown + text.rstrip("\n") + "\n")
                sys.stderr.flush()
                if piece.endswith(b"\n"):  # a whole line: the count the task compares with
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


def _owner_only_log(log_dir: Optional[str], rank: int) -> BinaryIO:
    """``rank-R.log`` in ``log_dir`` opened by ``owner_only_append``; the null device without a folder."""
    return owner_only_append(os.path.join(log_dir, f"rank-{rank}.log") if log_dir else None)


def owner_only_append(path: Optional[str]) -> BinaryIO:
    """``path`` opened to append, mode 0600, never through a link (then, or for None, the null device)."""
    if not path:
        return open(os.devnull, "ab")
    try:
        return nofollow.open_write(path, 0o600, append=True)
    except nofollow.LinkRefused as exc:
        logging.getLogger("pipelines").warning("rank log not kept: %s", exc)
        return open(os.devnull, "ab")


def _connect(address: Optional[str], header: Dict) -> Optional[socket.socket]:
    if not address:
        return None
    host, port = split_host_port(address)
    try:
        conn = socket.create_connection((host, int(port)), timeout=10)
        conn.sendall(json.dumps(header).encode() + b"\n")
        return conn
    except OSError as exc:
        sys.stderr.write(f"rank {header['rank']}: its output cannot reach the driver at {address} ({exc}); "
                         f"it stays in this executor's log\n")
        return None


def forward(stream: IO[bytes], address: Optional[str], token: str, rank: int, host: str) -> int:
    """Task side: copy a rank's ``stream``, redacted, to stderr and to the sink at ``address`` (None: stderr only).

    Returns:
        The number of lines sent to the sink (0 when it could not be reached)."""
    conn = _connect(address, {"token": token, "rank": rank, "host": host})
    sent = 0
    try:
        for raw in stream:
            line = redact_text(raw.decode(errors="replace")).encode()  # the executor's log keeps no secret either
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
