"""HorovodRunner's local mode (child processes of the driver, Gloo over loopback) and Spark
barrier tasks on the suite's session, for real (its pure parts: tests/unit/launch/test_launcher.py)."""
import os
import re
import socket

import pytest

from pipelines.launch import HorovodJobFailed, HorovodRunner
from tests.support.env import REPO
from tests.support.rank_work import rank_sum

pytestmark = pytest.mark.current  # on the current stack too (make test's current share)


def _kill_rank_1():
    import os
    import signal

    import horovod.tensorflow as hvd
    import numpy as np
    hvd.init()
    if hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(np.array([1.0]))
    return "unreachable"


@pytest.mark.slow
def test_a_killed_local_rank_is_named_with_its_signal():
    with pytest.raises(HorovodJobFailed,
                       match=rf"^rank 1 on {socket.gethostname()} failed: process killed by signal SIGKILL"):
        HorovodRunner(np=-2).run(_kill_rank_1)


def _raise_on_rank_1():
    import horovod.tensorflow as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank one is broken: password=hunter2")  # an internal error, quoting a secret
    import numpy as np
    hvd.allreduce(np.array([1.0]))
    return "unreachable"


@pytest.mark.slow
def test_local_run_returns_rank_0s_value():
    """With the loopback interface named (the default path runs in the tests below)."""
    assert HorovodRunner(np=-2, network_interface="lo").run(_rank_sum_and_iface, offset=10) == ((21.0, 0), "lo")


def _tuning_env():
    import os
    return {name: os.environ.get(name) for name in ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")}


@pytest.mark.slow
def test_local_ranks_get_the_users_tuning_or_horovods_defaults_not_none_tuples(monkeypatch):
    """Horovod 0.28.1's horovod.runner.run passed HOROVOD_CYCLE_TIME="(None,)" (read as 0 ms: a
    spinning background thread) whatever the launching process had; the ranks must get that
    process's value, or none."""
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "7")
    monkeypatch.delenv("HOROVOD_CACHE_CAPACITY", raising=False)
    assert HorovodRunner(np=-1).run(_tuning_env) == {"HOROVOD_CYCLE_TIME": "7", "HOROVOD_CACHE_CAPACITY": None}
    assert "HOROVOD_RANK" not in os.environ  # the ranks' variables are theirs alone


@pytest.mark.slow
def test_local_failure_names_the_rank_and_the_cause(capfd):
    """The driver gets the failing rank's cause and its whole traceback, redacted; nothing the rank
    printed on its way out (Horovod's task runner prints what propagates) shows the secret."""
    with pytest.raises(HorovodJobFailed,
                       match=rf"rank 1 on {socket.gethostname()} failed: ValueError: rank one is broken") as failed:
        HorovodRunner(np=-2).run(_raise_on_rank_1)
    root = failed.value.failures[0]
    assert not root.refused and not failed.value.refused
    assert root.traceback.startswith("Traceback (most recent call last)") and "in _raise_on_rank_1" in root.traceback
    assert "ValueError: rank one is broken: password=***" in root.traceback
    shown = capfd.readouterr()
    assert "hunter2" not in str(failed.value) + root.traceback + shown.out + shown.err
    assert "rank 1 on" in shown.out + shown.err  # the rank's own last words, with its traceback


# -- which network interface Gloo uses (issue 9, item 4) ----------------------------------------
from pipelines.launch.network import local_interfaces  # noqa: E402


# -- end to end: real Spark, real Horovod ---------------------------------------------------------
SPARK_SCRIPT = '''
import sys
from pyspark.sql import SparkSession
from pipelines import HorovodRunner

def rank_sum(offset):
    import os
    import horovod.tensorflow as hvd
    import numpy as np
    hvd.init()
    total = float(hvd.allreduce(np.array([hvd.rank() + offset], np.float64), op=hvd.Sum).numpy()[0])
    return total, hvd.rank(), os.environ["HOROVOD_GLOO_IFACE"], os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]

if __name__ == "__main__":
    spark = SparkSession.builder.master(sys.argv[1]).config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print("RESULT", HorovodRunner(np=2).run(rank_sum, offset=10), flush=True)
    if len(sys.argv) > 2:  # the user's interface, used as given although the address is on lo
        print("CHOSEN", HorovodRunner(np=2, network_interface=sys.argv[2]).run(rank_sum, offset=1), flush=True)
'''


@pytest.mark.slow
def test_spark_ranks_on_a_non_default_loopback_address(tmp_path):
    """SPARK_LOCAL_IP=127.0.1.1 (Debian's hostname address): Gloo runs over lo; the rendezvous is
    reached at the address Spark gives task 0."""
    import subprocess
    import sys
    from tests.support.env import subprocess_env
    script = tmp_path / "loopback.py"
    script.write_text(SPARK_SCRIPT)
    other = next(name for name, addresses in local_interfaces().items()  # e.g. eth0
                 if any("." in a and not a.startswith("127.") for a in addresses))
    proc = subprocess.run([sys.executable, str(script), "local[2]", other], capture_output=True, text=True,
                          timeout=300, env=subprocess_env(SPARK_LOCAL_IP="127.0.1.1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the rendezvous address, with the job's token: ADDR:PORT/TOKEN (pipelines.launch.rendezvous.gloo_address)
    assert re.search(r"RESULT \(21.0, 0, 'lo', '127\.0\.1\.1:\d+/[\w-]{32}'\)", proc.stdout), proc.stdout
    assert re.search(rf"CHOSEN \(3.0, 0, '{other}', '127\.0\.1\.1:\d+/[\w-]{{32}}'\)", proc.stdout), proc.stdout


def _rank_sum_and_iface(offset):
    import os
    return rank_sum(offset), os.environ["HOROVOD_GLOO_IFACE"]


@pytest.mark.slow
@pytest.mark.parametrize("spark_np, how", [(2, "flag"), (-2, "env")])  # Spark tasks / local ranks
def test_train_refuses_a_missing_interface_with_exit_2_before_any_rank(tmp_path, spark_np, how):
    import os
    import subprocess
    import sys
    from tests.support.env import subprocess_env
    from tests.support.datagen import write_dataset
    repo = REPO
    write_dataset(str(tmp_path / "data"), train_groups=[4], test_groups=[2])  # passes the data refusals
    args = [sys.executable, os.path.join(repo, "jobs", "train.py"), "--data", str(tmp_path / "data"),
            "--output", str(tmp_path / "out"), "--spark-np", str(spark_np), "--batch-size", "1"]
    env = subprocess_env(HOROVOD_GLOO_IFACE="nosuch0") if how == "env" else subprocess_env()
    if how == "flag":
        args += ["--network-interface", "nosuch0"]
        env.pop("HOROVOD_GLOO_IFACE", None)
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "network interface 'nosuch0' (HOROVOD_GLOO_IFACE / --network-interface) does not exist on host" in errors[0]
    assert "lo (127.0.0.1" in errors[0]
    assert "barrier tasks on" not in proc.stderr and "rank 0" not in proc.stderr  # no task, no rank started


@pytest.mark.slow
def test_the_status_store_names_each_executor_s_host(spark):
    """Real Spark (the session's local master): its one executor is the driver, on the driver's host."""
    from pipelines.launch.sparkcheck import executor_id_hosts

    sc = spark.sparkContext
    assert executor_id_hosts(sc) == {"driver": sc.getConf().get("spark.driver.host")}
    assert executor_id_hosts(sc, active_only=True) == executor_id_hosts(sc)


@pytest.mark.slow
def test_one_local_rank_with_rank_logs_runs_and_keeps_its_log(tmp_path):
    """np=-1 with a log folder (``jobs/train.py --spark-np -1``): Horovod 0.28.1's launcher failed
    with a math domain error before the rank started."""
    assert HorovodRunner(np=-1, log_dir=str(tmp_path)).run(_tuning_env)["HOROVOD_CACHE_CAPACITY"] is None
    assert os.path.isfile(tmp_path / "rank.0" / "stdout")


@pytest.mark.slow
def test_spark_on_ipv6_is_refused_with_exit_2_before_any_task(tmp_path):
    """SPARK_LOCAL_IP=::1 with --spark-np 2: refused as "host '[0:0:0:0:0:0:0:1]' does not resolve" before."""
    from tests.support.training import refused_launch

    proc, errors = refused_launch(tmp_path, 2, 2, SPARK_LOCAL_IP="::1")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "no IPv4 address" in errors[0] and "Horovod's Gloo rendezvous is IPv4 only" in errors[0]
    assert "does not resolve" not in proc.stderr and "barrier tasks on" not in proc.stderr


def _listening(pids):
    """``{(pid, address, port)}`` of the TCP sockets the processes ``pids`` listen on (psutil)."""
    import psutil
    found = set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            connections = proc.net_connections(kind="inet") if hasattr(proc, "net_connections") else \
                proc.connections(kind="inet")
        except psutil.Error:  # it ended between the listing and the look
            continue
        found |= {(pid, c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}
    return found


def _answer(address, port, path):
    """What a listening socket answers to an HTTP ``GET path`` within 2 s (b"" if it says nothing)."""
    with socket.create_connection((address, port), timeout=2) as conn:
        conn.sendall(f"GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except OSError:  # silent (a Gloo pair waits for its peer's bytes), or reset
            pass
        return b"".join(chunks)


@pytest.mark.slow
def test_a_local_training_job_listens_on_loopback_alone_and_serves_no_part_of_its_job(tmp_path):
    """``jobs/train.py --spark-np -2`` while it runs: every socket the driver and its ranks listen
    on is bound to loopback (Horovod's function mode served the pickled job and its config on
    every interface), the driver's Gloo rendezvous and whichever of the ranks' short-lived Gloo pair
    listeners the sampling catches among them, and none
    of the driver's answers an HTTP GET (of ``/``, or of the path Horovod's store served the job
    at) with the config (a marker in its --output) or a pickle. (The ranks' sockets are Gloo's
    pairs: a probe's bytes would break the job.)"""
    import subprocess
    import sys
    import time

    import psutil

    from tests.support.env import subprocess_env
    from tests.support.datagen import write_dataset

    data, marker = str(tmp_path / "data"), "marker-7f3a9c1e5d"
    write_dataset(data, train_groups=[4, 4], test_groups=[3], size=12, rows_per_group=2)
    out = str(tmp_path / f"out-{marker}")
    repo = REPO
    job = subprocess.Popen([sys.executable, os.path.join(repo, "jobs", "train.py"), "--data", data, "--output", out,
                            "--weights", "none", "--backbone", "tiny", "--batch-size", "2", "--image-size", "8",
                            "--epochs", "3", "--patience", "5", "--no-tensorboard", "--spark-np", "-2"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=subprocess_env())
    seen, answers, roles = set(), {}, {}
    try:
        while job.poll() is None:
            tree = [job.pid] + [c.pid for c in psutil.Process(job.pid).children(recursive=True)]
            for pid, address, port in _listening(tree) - seen:
                seen.add((pid, address, port))
                roles[pid] = "driver" if pid == job.pid else "rank"
                if pid == job.pid:  # a rank's are Gloo's pairs, which a stray byte would break
                    try:
                        answers[(address, port)] = [_answer(address, port, path) for path in ("/", "/runfunc/func")]
                    except OSError:
                        answers[(address, port)] = []  # closed in between
            time.sleep(0.05)
    finally:
        if job.poll() is None:
            job.kill()
        output = job.communicate()[0].decode(errors="replace")
    assert job.returncode == 0, output[-3000:]
    assert {address for _, address, _ in seen} <= {"127.0.0.1", "::1"}, seen
    # the driver's rendezvous always; Gloo's pair listeners live only until their peer has connected, so
    # a loaded machine's sampling can miss them (every one it saw is on loopback, checked above)
    assert "driver" in roles.values(), (seen, roles)
    for (address, port), replies in answers.items():
        for reply in replies:
            body = reply.split(b"\r\n\r\n", 1)[-1]
            assert marker.encode() not in reply and not body.startswith((b"\x80\x04", b"\x80\x05")), \
                (address, port, reply[:200])


@pytest.mark.slow
def test_the_suites_own_session_has_no_ui_and_its_driver_on_loopback(spark):
    """Real Spark: the session spark_session started (tests/conftest.py, local[2])."""
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.ui.enabled") == "false" and conf.get("spark.ui.killEnabled") == "false"
    assert spark.sparkContext.uiWebUrl is None
    if not os.environ.get("SPARK_LOCAL_IP"):
        assert conf.get("spark.driver.host") == conf.get("spark.driver.bindAddress") == "127.0.0.1"
