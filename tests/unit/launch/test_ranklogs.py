"""The ranks' output at the driver (pipelines/launch/ranklogs.py), without Spark: a real child process's
output forwarded by ``forward`` to a real ``LogSink`` over TCP."""
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from pipelines.launch.ranklogs import LogSink, forward

CHILD = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')\n"


def test_lines_arrive_while_the_child_runs_prefixed_and_kept(tmp_path, capfd):
    sink = LogSink("127.0.0.1", str(tmp_path / "logs"), world_size=4)
    arrivals = {}

    def watch():  # when the sink has the first line, the child is still sleeping
        sink.wait_for({3: 1}, timeout_s=10)
        arrivals["first"] = time.monotonic()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env={"PYTHONUNBUFFERED": "1"})
        with child.stdout:
            sent = forward(child.stdout, sink.address, sink.token, 3, "hostA")
        ended = time.monotonic()
        watcher.join(10)
        assert sent == 2 and sink.wait_for({3: 2})
    finally:
        sink.close()
    assert ended - arrivals["first"] >= 1.0  # live: a second before the child ended
    assert (tmp_path / "logs" / "rank-3.log").read_text() == "first\nsecond\n"
    err = capfd.readouterr().err
    assert "[rank 3 on hostA] first\n" in err and "[rank 3 on hostA] second\n" in err
    assert "first\nsecond\n" in err  # the task's own stderr (the executor's log) has them too


def test_a_connection_without_the_token_is_dropped(tmp_path):
    sink = LogSink("127.0.0.1", str(tmp_path))
    try:
        host, port = sink.address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as conn:
            conn.sendall(b'{"token": "guess", "rank": 0, "host": "x"}\nintruder\n')
        time.sleep(0.5)
        assert not sink.wait_for({0: 1}, timeout_s=0.5)
    finally:
        sink.close()
    assert not (tmp_path / "rank-0.log").exists()


def test_an_unreachable_driver_leaves_the_lines_in_the_executor_log(capfd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    child = subprocess.Popen([sys.executable, "-c", "print('only here')"], stdout=subprocess.PIPE)
    with child.stdout:
        assert forward(child.stdout, f"127.0.0.1:{port}", "t", 1, "hostB") == 0
    child.wait()
    err = capfd.readouterr().err
    assert "rank 1: its output cannot reach the driver at 127.0.0.1:" in err and "only here\n" in err


# -- the sink takes only what our tasks send: issue 24 item 3 -----------------------------------

def _send(sink, data: bytes, wait_s: float = 5.0) -> bytes:
    """Connect to ``sink``, send ``data``, and return what the sink sends back before it closes
    the connection (b"": closed; a hang past ``wait_s`` raises socket.timeout)."""
    host, port = sink.address.rsplit(":", 1)
    with socket.create_connection((host.strip("[]"), int(port)), timeout=wait_s) as conn:
        try:
            conn.sendall(data)
            return conn.recv(1)
        except ConnectionResetError:  # closed with our bytes unread: as good as b""
            return b""


def _header(sink, rank=0, host="hostA", token=None) -> bytes:
    import json
    return json.dumps({"token": sink.token if token is None else token, "rank": rank, "host": host}).encode() + b"\n"


def test_the_sink_listens_on_the_drivers_address_only():
    """Bound to 127.0.0.2 (a loopback address of its own): the same port on 127.0.0.1 is closed."""
    sink = LogSink("127.0.0.2", None, 1)
    try:
        port = int(sink.address.rsplit(":", 1)[1])
        assert sink.address == f"127.0.0.2:{port}" and sink._server.server_address[0] == "127.0.0.2"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        sink.close()


def test_an_ipv6_driver_address_is_bracketed_and_reached():
    sink = LogSink("::1", None, 1)
    try:
        assert sink.address.startswith("[::1]:")
        child = subprocess.Popen([sys.executable, "-c", "print('over v6')"], stdout=subprocess.PIPE)
        with child.stdout:
            assert forward(child.stdout, sink.address, sink.token, 0, "h6") == 1
        assert sink.wait_for({0: 1})
    finally:
        sink.close()


@pytest.mark.parametrize("header", [
    b'{"token": "guess", "rank": 0, "host": "x"}\n',  # the wrong token
    b'{"token": "%s", "rank": -7, "host": "x"}\n',  # ranks outside 0 .. world_size - 1
    b'{"token": "%s", "rank": 2, "host": "x"}\n',
    b'{"token": "%s", "rank": "1", "host": "x"}\n',  # not an integer
    b'{"token": "%s", "rank": true, "host": "x"}\n',
    b'{"token": "%s", "rank": 1.0, "host": "x"}\n',
    b'{"token": "%s", "rank": 0, "host": 5}\n',  # a host that is no string
    b'["%s", 0, "x"]\n',  # no object
    b'not json\n',
])
def test_a_header_the_sink_refuses_ends_the_connection_and_prints_nothing(header, capfd):
    sink = LogSink("127.0.0.1", None, 2)
    try:
        data = (header.replace(b"%s", sink.token.encode()) if b"%s" in header else header) + b"intruder\n"
        assert _send(sink, data) == b""
        assert sink.hosts == {} and sink.received == {}
    finally:
        sink.close()
    assert "intruder" not in capfd.readouterr().err


def test_the_token_is_compared_in_constant_time(monkeypatch):
    import hmac

    from pipelines.launch import ranklogs
    calls, real = [], hmac.compare_digest
    monkeypatch.setattr(ranklogs.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    assert ranklogs.check_header({"token": "t0k", "rank": 0, "host": "h"}, "t0k", 1) == (0, "h")
    assert ranklogs.check_header({"token": "guess", "rank": 0, "host": "h"}, "t0k", 1) is None
    assert calls == [(b"t0k", b"t0k"), (b"guess", b"t0k")]


def test_an_endless_header_is_cut_at_its_bound_and_dropped():
    """A header line with no end (1 MiB here; 300 MiB grew the driver by 300 MiB before): the sink
    reads at most HEADER_BYTES of it and closes the connection."""
    from pipelines.launch.ranklogs import HEADER_BYTES
    sink = LogSink("127.0.0.1", None, 1)
    try:
        host, port = sink.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(b"x" * (HEADER_BYTES + 10))
            assert conn.recv(1) == b""  # closed after HEADER_BYTES, before any newline
        assert sink.hosts == {}
    finally:
        sink.close()


def test_a_silent_connection_is_closed_after_the_header_timeout():
    sink = LogSink("127.0.0.1", None, 1, header_timeout_s=0.5)
    try:
        started = time.monotonic()
        assert _send(sink, b"", wait_s=5) == b""
        assert time.monotonic() - started < 4
    finally:
        sink.close()


def _free_slots(sink) -> int:
    """The sink's free connection slots: its semaphore's count (the sink keeps no public one)."""
    return sink._server._slots._value


def _wait_until(condition, message: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def test_connections_beyond_the_cap_are_closed_at_once_and_a_rank_still_gets_through_later():
    from pipelines.launch.ranklogs import SPARE_CONNECTIONS
    # a header timeout far above the refusal's bound: the test tells them apart on a loaded machine
    sink = LogSink("127.0.0.1", None, 1, header_timeout_s=60.0)
    host, port = sink.address.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(1 + SPARE_CONNECTIONS)]
    try:
        _wait_until(lambda: _free_slots(sink) == 0, "the sink did not take the idle connections")
        threads_before, started = threading.active_count(), time.monotonic()
        assert _send(sink, b"", wait_s=30) == b""
        assert time.monotonic() - started < 15  # refused at once, not by the 60 s header timeout
        assert threading.active_count() <= threads_before  # and no thread started for it
        for conn in idle:  # closed by their peer: their slots are free again
            conn.close()
        # once the sink's handlers have seen them close (on a loaded machine that takes a moment;
        # a connection that comes first is refused, as it should be)
        _wait_until(lambda: _free_slots(sink) >= len(idle), "the sink did not free the closed connections' slots")
        child = subprocess.Popen([sys.executable, "-c", "print('late')"], stdout=subprocess.PIPE)
        with child.stdout:
            assert forward(child.stdout, sink.address, sink.token, 0, "h") == 1
        assert sink.wait_for({0: 1})
    finally:
        for conn in idle:
            conn.close()
        sink.close()


def test_a_second_connection_for_a_rank_is_refused():
    sink = LogSink("127.0.0.1", None, 2)
    try:
        host, port = sink.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as first:
            first.sendall(_header(sink, 1, "real") + b"one\n")
            assert sink.wait_for({1: 1})
            assert _send(sink, _header(sink, 1, "forger") + b"forged\n") == b""
        assert sink.hosts == {1: "real"}
    finally:
        sink.close()


@pytest.mark.parametrize("host, shown", [
    ("goodhost]\n[rank 0 on goodhost", "goodhost???rank 0 on goodhost"),  # a forged second line
    ("h\x1b[2K\x1b[1Ggood", "h??2K??1Ggood"),  # terminal escape codes
    ("h\r\tx\x00", "h??x?"),
    ("ünïcode-host", "ünïcode-host"),  # printable non-ASCII stays
    ("a" * 300, "a" * 255),
])
def test_the_host_a_task_names_is_printed_printable(host, shown, capfd, tmp_path):
    sink = LogSink("127.0.0.1", str(tmp_path), 1)
    try:
        address, port = sink.address.rsplit(":", 1)
        with socket.create_connection((address, int(port)), timeout=5) as conn:
            conn.sendall(_header(sink, 0, host) + b"a line\n")
        assert sink.wait_for({0: 1})
    finally:
        sink.close()
    assert capfd.readouterr().err == f"[rank 0 on {shown}] a line\n" and sink.hosts == {0: shown}
    assert (tmp_path / "rank-0.log").read_bytes() == b"a line\n"


def test_a_long_line_is_printed_in_bounded_pieces_and_kept_whole(tmp_path, capfd):
    from pipelines.launch.ranklogs import LINE_BYTES
    sink = LogSink("127.0.0.1", str(tmp_path), 1)
    long = b"y" * (2 * LINE_BYTES + 5)
    try:
        child = subprocess.Popen([sys.executable, "-c", f"print('y' * {len(long)}); print('end')"],
                                 stdout=subprocess.PIPE)
        with child.stdout:
            assert forward(child.stdout, sink.address, sink.token, 0, "h") == 2
        assert sink.wait_for({0: 2})  # whole lines counted, not pieces
    finally:
        sink.close()
    assert (tmp_path / "rank-0.log").read_bytes() == long + b"\nend\n"
    shown = [line for line in capfd.readouterr().err.splitlines() if line.startswith("[rank 0 on h] ")]
    assert [len(line) - len("[rank 0 on h] ") for line in shown] == [LINE_BYTES, LINE_BYTES, 5, 3]


SECRET = "S3CR3T-IN-A-CAUSE"
CHAINED = f"""
def load():
    raise KeyError("{{'AccountKey': '{SECRET}'}}")
try:
    load()
except KeyError as exc:
    raise RuntimeError("store s3://bucket refused: --storage-option secret_key={SECRET} --token {SECRET}") from exc
"""


def test_a_chained_traceback_reaches_an_owner_only_rank_log_redacted(tmp_path, capfd):
    """A rank that dies of an uncaught exception whose cause quotes credentials: Python prints both
    tracebacks; the rank log (mode 0600 in a 0700 folder), the driver's stderr and the task's own
    stderr keep both, with every secret masked."""
    sink = LogSink("127.0.0.1", str(tmp_path / "logs"), world_size=1)
    try:
        child = subprocess.Popen([sys.executable, "-c", CHAINED], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env={"PYTHONUNBUFFERED": "1"})
        with child.stdout:
            sent = forward(child.stdout, sink.address, sink.token, 0, "hostA")
        assert child.wait() == 1 and sink.wait_for({0: sent})
    finally:
        sink.close()
    log = tmp_path / "logs" / "rank-0.log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600 and stat.S_IMODE(log.parent.stat().st_mode) == 0o700
    kept, err = log.read_text(), capfd.readouterr().err
    for text in (kept, err):
        assert SECRET not in text
        assert "The above exception was the direct cause of the following exception" in text
        assert "KeyError" in text and "RuntimeError: store s3://bucket refused" in text
        assert "'AccountKey': '***'" in text and "secret_key=*** --token ***" in text


def test_an_older_rank_log_becomes_owner_only(tmp_path):
    """A rank log left by an earlier run with a looser mode (another umask) is made 0600 as it is reopened."""
    (tmp_path / "rank-0.log").write_text("earlier\n")
    os.chmod(tmp_path / "rank-0.log", 0o644)
    sink = LogSink("127.0.0.1", str(tmp_path), world_size=1)
    try:
        child = subprocess.Popen([sys.executable, "-c", "print('now')"], stdout=subprocess.PIPE)
        with child.stdout:
            sent = forward(child.stdout, sink.address, sink.token, 0, "hostA")
        assert sink.wait_for({0: sent})
    finally:
        sink.close()
    assert (tmp_path / "rank-0.log").read_text() == "earlier\nnow\n"
    assert stat.S_IMODE((tmp_path / "rank-0.log").stat().st_mode) == 0o600
