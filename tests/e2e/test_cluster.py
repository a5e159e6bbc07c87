"""Scale-out on a real Spark standalone cluster (master + 2 workers on 127.0.0.1).

The ETL through ``spark-submit --master spark://...``, then training as 2 barrier tasks on the two
workers (``--spark-np 2``): a rank that fails at epoch 2 (prompt, named failure) and the
``--resume`` that then trains to the end; and impossible launches. (Local ranks, ``--spark-np -2``,
are trained, killed and resumed in tests/e2e/test_training_hvd.py.)
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest

from pipelines.launch.cluster import StandaloneCluster
from tests.support.env import BIN, REPO, subprocess_env
from tests.support.imagegen import make_tree
from tests.support.outputs import assert_exact_test_count, read_metrics as metrics

pytestmark = pytest.mark.slow
SIZE = 71
# Seconds from a rank's death to spark-submit's exit (the verdict and Spark's shutdown).
FAULT_TO_EXIT_S = 45


@pytest.fixture(scope="module")
def cluster():
    with StandaloneCluster(workers=2, cores=1, memory="2g") as c:
        yield c


def submit(cluster, script, *args, conf=(), timeout=400):
    cmd = [os.path.join(BIN, "spark-submit"), "--master", cluster.url, "--conf", "spark.executor.memory=1g",
           "--driver-java-options", f"-Dlog4j2.configurationFile={REPO}/conf/log4j2.properties"]
    for c in conf:
        cmd += ["--conf", c]
    start = time.monotonic()
    proc = subprocess.run(cmd + [os.path.join(REPO, "jobs", script), *args], capture_output=True, text=True,
                          env=subprocess_env(SPARK_LOCAL_IP="127.0.0.1", **cluster.client_env), timeout=timeout)
    proc.seconds = time.monotonic() - start
    proc.output = proc.stdout + proc.stderr  # spark-submit merges the Python driver's stderr into stdout
    return proc


def manifest_of(data):
    with open(os.path.join(data, "manifest.json")) as f:
        return json.load(f)


def train_args(data, out, *extra):
    return ["--data", data, "--output", out, "--weights", "none", "--backbone", "tiny", "--batch-size", "4",
            "--no-tensorboard", "--no-pictures", "--cache-dir", out + "-cache", *extra]


SUM = ("from pyspark.sql import SparkSession\n"
       "print('SUM', SparkSession.builder.getOrCreate().sparkContext.parallelize(range(10), 2).sum())\n")


@pytest.fixture(scope="module", autouse=True)
def unauthenticated_driver(cluster, tmp_path_factory):
    """A driver without the cluster's secret, started with this module's first test: Spark's client
    retries its registration for a minute before it gives up, a minute the other tests here use.
    Yields ``(process, its output file)``."""
    script = tmp_path_factory.mktemp("unauthenticated") / "sum.py"
    script.write_text(SUM)
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([os.path.join(BIN, "spark-submit"), "--master", cluster.url, str(script)],
                                stdout=out, stderr=subprocess.STDOUT, text=True,
                                env=subprocess_env(SPARK_LOCAL_IP="127.0.0.1"))
        try:
            yield proc, out
        finally:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def etl_on_cluster(cluster, tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    make_tree(str(base / "tree"), classes=3, per_class=20)
    out = str(base / "etl")
    proc = submit(cluster, "etl.py", "--input", str(base / "tree"), "--output", out, "--image-size", str(SIZE),
                  "--test-fraction", "0.3", "--min-row-groups", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_etl_runs_on_the_cluster(etl_on_cluster):
    out, proc = etl_on_cluster
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    files = manifest["files"]
    on_disk = sum(len(names) for _, _, names in os.walk(os.path.join(os.path.dirname(out), "tree")))
    assert files["found"] == on_disk  # an independent count, not the job's own sum
    assert files["written"] == 64 and manifest["max_world_size"] >= 2
    assert "found" in proc.stdout


def test_a_failing_rank_fails_the_job_promptly_by_name_then_resume(cluster, etl_on_cluster, tmp_path):
    data, _ = etl_on_cluster
    out, mark = str(tmp_path / "out"), str(tmp_path / "fault-time")
    failed = submit(cluster, "train.py", *train_args(data, out, "--epochs", "4", "--patience", "10",
                                                     "--spark-np", "2"),
                    conf=[f"spark.executorEnv.PIPELINES_FAULT_INJECT=rank=1,epoch=2,mode=kill,mark={mark}"])
    ended = time.time()
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "training failed: rank 1 on 127.0.0.1 failed: process killed by signal SIGKILL" in failed.output, \
        failed.output[-3000:]
    with open(mark) as f:
        fault = float(f.read())
    # from the kill to spark-submit's exit (verdict, Spark's shutdown), not the whole job
    assert 0 < ended - fault < FAULT_TO_EXIT_S, ended - fault
    assert not os.path.exists(os.path.join(out, "metrics.json"))

    resumed = submit(cluster, "train.py", *train_args(data, out, "--epochs", "4", "--patience", "10",
                                                      "--spark-np", "2", "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "test accuracy" in resumed.stdout
    # the ranks' output reached spark-submit's console while they ran, prefixed; kept under OUTPUT/logs
    assert "[rank 0 on 127.0.0.1] Epoch 4/4" in resumed.output, resumed.output[-3000:]
    with open(os.path.join(out, "logs", "rank-0.log")) as f:
        assert "Epoch 3/4" in f.read()
    assert os.path.exists(os.path.join(out, "logs", "rank-1.log"))
    m = metrics(out)
    assert m["resumed_after_epoch"] == 2
    assert [h["epoch"] for h in m["history"]] == [1, 2, 3, 4]
    # the resumed run trained as 2 barrier tasks, one on each worker, in step
    assert m["world_size"] == 2 and m["epochs_run_per_rank"] == [2, 2]
    assert m["weights_checksum_per_rank"][0] == m["weights_checksum_per_rank"][1]
    assert_exact_test_count(m, data)


def test_more_tasks_than_slots_is_refused_before_starting(cluster, etl_on_cluster, tmp_path):
    data, _ = etl_on_cluster
    proc = submit(cluster, "train.py", *train_args(data, str(tmp_path / "out"), "--spark-np", "3",
                                                   "--slots-timeout", "30"), timeout=200)
    assert proc.returncode == 2, proc.output[-3000:]
    assert "np=3 Spark tasks requested but the cluster" in proc.output and "offers 2 task slots:" in proc.output
    lines = [line for line in proc.output.splitlines() if "[train driver]" in line]
    checking = next(line for line in lines if "HorovodRunner: np=3 on spark://" in line)
    error = next(line for line in lines if " ERROR " in line)
    # The executors register within --slots-timeout (a loaded CI machine took over 4 s); the wait
    # then ends when their count has settled, or at the timeout, never at the default minute.
    assert _clock(error) - _clock(checking) <= 30 + 2


@pytest.mark.parametrize("conf", [["spark.dynamicAllocation.enabled=true"],
                                  ["spark.dynamicAllocation.enabled=TRUE", "spark.dynamicAllocation.minExecutors=2"]])
def test_dynamic_allocation_is_refused_at_once_by_name(cluster, tmp_path, conf):
    """Without the check: a 60 s wait for slots that never come ("0 task slots"), or, with
    executors, Spark's BarrierJobRunWithDynamicAllocationException traceback."""
    from tests.support.datagen import write_dataset
    write_dataset(str(tmp_path / "data"), train_groups=[4], test_groups=[2])  # passes the data refusals
    proc = submit(cluster, "train.py", *train_args(str(tmp_path / "data"), str(tmp_path / "out"), "--spark-np", "2",
                                                   "--batch-size", "1"), conf=conf, timeout=200)
    assert proc.returncode == 2, proc.output[-3000:]
    lines = [line for line in proc.output.splitlines() if "[train driver]" in line]
    checking = next(line for line in lines if "HorovodRunner: np=2 on spark://" in line)
    error = next(line for line in lines if " ERROR " in line)
    assert error.split(" ERROR ")[1] == (
        f"{conf[0]}: Spark runs no barrier tasks under dynamic allocation (master {cluster.url}); set "
        f"spark.dynamicAllocation.enabled=false (executors: spark.executor.instances or spark.cores.max)")
    assert _clock(error) - _clock(checking) <= 3  # seconds, not the 60 s slot wait
    assert "task slots" not in proc.output and "BarrierJobRunWithDynamicAllocationException" not in proc.output


def test_the_cluster_takes_only_drivers_that_hold_its_secret(cluster, unauthenticated_driver):
    """spark.authenticate on the master, the workers and their executors: the secret is in an
    owner-only file, never in a process's arguments (which every user can read); the web UIs have no
    kill links; a driver without the secret is refused. (Every other job here is submitted with it:
    ``submit`` passes ``cluster.client_env``.)"""
    import psutil

    defaults = os.path.join(cluster.conf_dir, "spark-defaults.conf")
    assert os.stat(cluster.conf_dir).st_mode & 0o777 == 0o700 and os.stat(defaults).st_mode & 0o777 == 0o600
    with open(defaults) as f:
        text = f.read()
    secret = re.search(r"^spark\.authenticate\.secret (\S+)$", text, re.M).group(1)
    assert re.search(r"^spark\.authenticate true$", text, re.M) and len(secret) == 64
    assert re.search(r"^spark\.ui\.killEnabled false$", text, re.M)
    daemons = [psutil.Process(p.pid) for p in cluster.processes]
    for proc in daemons + [c for d in daemons for c in d.children(recursive=True)]:
        try:
            assert secret not in " ".join(proc.cmdline())
        except psutil.Error:  # an executor that has ended since the listing
            pass
    refused, out = unauthenticated_driver
    refused.wait(timeout=200)
    out.seek(0)
    said = out.read()  # the master drops its unauthenticated connection: no context
    assert refused.returncode != 0 and not re.search(r"^SUM 45$", said, re.M), said[-2000:]
    assert "Error initializing SparkContext" in said or "stopped SparkContext" in said, said[-3000:]


def _clock(line):
    h, m, s = (int(x) for x in line.split(" ")[0].split(":"))
    return h * 3600 + m * 60 + s


LOCAL_RUN = '''
import sys
from pyspark.sql import SparkSession
from pipelines import HorovodJobFailed, HorovodRunner

if __name__ == "__main__":
    spark = SparkSession.builder.master(sys.argv[1]).config("spark.executor.memory", "1g").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        HorovodRunner(np=2).run(print)
    except HorovodJobFailed as exc:
        print("FAILED", exc, flush=True)
'''


def test_an_executor_without_its_interface_is_a_named_rank_failure(tmp_path):
    """HOROVOD_GLOO_IFACE set on the worker hosts (spark-env.sh), unknown to the driver: each barrier
    task refuses it on its host, the job fails as HorovodJobFailed naming rank and host, no rank starts."""
    script = tmp_path / "run.py"
    script.write_text(LOCAL_RUN)
    with StandaloneCluster(workers=1, cores=2, memory="2g", env={"HOROVOD_GLOO_IFACE": "nosuch0"}) as c:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(script), c.url], capture_output=True, text=True, timeout=200,
                              env=subprocess_env(SPARK_LOCAL_IP="127.0.0.1", **c.client_env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = next(line for line in proc.stdout.splitlines() if line.startswith("FAILED"))
    assert failed.startswith("FAILED rank 0 on 127.0.0.1 failed: Refused: network interface 'nosuch0' "
                             "(HOROVOD_GLOO_IFACE / "
                             "--network-interface) does not exist on host 127.0.0.1; its interfaces: ")
    assert failed.endswith("(then also: rank 1)") and "lo (127.0.0.1" in failed
    assert time.monotonic() - start < 120
