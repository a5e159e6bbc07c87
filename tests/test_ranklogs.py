"""The ranks' output at the driver (pipelines/launch/ranklogs.py), without Spark: a real child process's
output forwarded by ``forward`` to a real ``LogSink`` over TCP."""
import socket
import subprocess
import sys
import threading
import time

from pipelines.launch.ranklogs import LogSink, forward

CHILD = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')\n"


def test_lines_arrive_while_the_child_runs_prefixed_and_kept(tmp_path, capfd):
    sink = LogSink("127.0.0.1", str(tmp_path / "logs"))
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
