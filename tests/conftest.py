"""Shared fixtures: a real local Spark session, the venv's executables."""
import atexit
import json
import os
import shutil
import socket
import sys
import tempfile

import pytest

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before a test module imports TensorFlow)

BIN = os.path.dirname(sys.executable)
# No MLflow tracking unless a test asks for it with --tracking / tracking=True: every job of the
# suite (in this process, its subprocesses, Spark workers and notebook kernels) would otherwise
# create an MLflow store (seconds of migrations) and log its model.
os.environ["PIPELINES_TRACKING"] = "0"
os.environ.pop("MLFLOW_TRACKING_URI", None)  # the tests that track choose their store themselves

# Every JVM the suite starts lives seconds to minutes, on CI's 2 cores: the client compiler alone
# (C1, no C2) and the serial collector halve a Spark start's CPU (a local[2] session and one small
# job: 28 -> 15 CPU-seconds, 17 -> 12 s, measured), and no test checks the JIT or the collector.
# Drivers (spark-submit, pyspark's gateway), the standalone master and workers, and executors
# (spark-conf/spark-defaults.conf) get them; a user's own setting of these variables wins.
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", JAVA_OPTIONS)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", JAVA_OPTIONS)
os.environ.setdefault("SPARK_CONF_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark-conf"))

# The suite's S3 API server (tests/s3server.py): its port and the standard AWS_* variables are set
# now, before Spark or any child starts, so every process finds it; it starts on first use.
from tests import s3server  # noqa: E402

S3_PORT = s3server.free_port()
os.environ.update(s3server.standard_environment(f"http://127.0.0.1:{S3_PORT}"))

# The fault hook (PIPELINES_FAULT_INJECT, a test's variable) acts only where the suite's token file
# arms it (pipelines.launch.rankenv.fault_armed): written here, owner-only, before any child starts,
# so that every rank the suite launches (horovodrun, local ranks, Spark workers and their tasks)
# inherits it; a production process given the hook's variable alone injects nothing.
from pipelines.launch import rankenv  # noqa: E402

FAULT_TOKEN_DIR = tempfile.mkdtemp(prefix="pipelines-test-faults-")
FAULT_TOKEN = os.path.join(FAULT_TOKEN_DIR, "token")
with os.fdopen(os.open(FAULT_TOKEN, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as _token:
    _token.write(rankenv.FAULT_TOKEN_TEXT)
os.environ.update(rankenv.fault_token_env(FAULT_TOKEN))
atexit.register(shutil.rmtree, FAULT_TOKEN_DIR, True)


@pytest.fixture(scope="session")
def spark():
    """A real ``local[2]`` SparkSession for the whole test session."""
    from pipelines.runtime.spark import spark_session

    session = spark_session("pipelines-tests", "local[2]", {"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """The suite's ``moto_server`` (any credentials accepted), started once."""
    server = s3server.start(S3_PORT, str(tmp_path_factory.mktemp("s3") / "moto.log"))
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server) -> str:
    """A fresh, empty bucket on the suite's S3 server: ``s3://<name>`` is yours for the test."""
    return s3_server.bucket()


def subprocess_env(**extra: str) -> dict:
    """The environment for child jobs: this venv first on PATH, quiet TensorFlow."""
    env = dict(os.environ)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def etl_parts(output: str, split: str) -> list:
    """The local paths of the Parquet files the manifest of the ETL output ``output`` names for
    ``split`` (the only files of it a reader may read)."""
    from pipelines.manifest import Manifest

    return [part.path for part in Manifest.read(output).part_locations(output, split)]


def read_metrics(output: str) -> dict:
    """The ``metrics.json`` a training run wrote to ``output``."""
    with open(os.path.join(output, "metrics.json")) as f:
        return json.load(f)


@pytest.fixture(autouse=True)
def _tracking_uri_restored():
    """No test leaves a store as the process's MLflow tracking URI (:func:`mlflow_run` sets it, so
    that ``runs:/`` and ``models:/`` resolve there); a later test resolves its own."""
    yield
    if "mlflow" in sys.modules:
        from pipelines.tracking.store import _set_process_tracking_uri
        _set_process_tracking_uri(None)


def dump_python_stacks() -> str:
    """The stacks of every other Python process on the machine (``py-spy dump``), for a test that
    timed out: they say which process (a kernel, a launcher, a rank) waits, and on what."""
    import shutil
    import subprocess

    spy = shutil.which("py-spy", path=BIN)
    if not spy:
        return "(py-spy is not installed: no stacks)"
    dumps = []
    for pid in sorted(int(name) for name in os.listdir("/proc") if name.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if pid != os.getpid() and "python" in command:
            proc = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            dumps.append(f"== pid {pid}: {command[:300]}\n{proc.stdout}{proc.stderr}")
    return "\n".join(dumps)


def parquet_test_rows(data) -> int:
    """The test split's rows of the ETL output ``data`` (a path, URI or ``pipelines.io.storage.Location``),
    counted in the footers of the Parquet files its manifest names: not the manifest's own count,
    which the training run took its expected count from."""
    import pyarrow.parquet as pq

    from pipelines.manifest import Manifest
    from pipelines.io.storage import Location, resolve

    root = data if isinstance(data, Location) else resolve(data)
    rows = 0
    for part in Manifest.read(root).part_locations(root, "test"):
        with root.filesystem.open_input_file(part.path) as f:
            rows += pq.ParquetFile(f).metadata.num_rows
    return rows


def assert_exact_test_count(report: dict, data) -> None:
    """A run evaluated every test row once: the rows it counted, the rows it expected, and the rows
    the test split's Parquet files hold (:func:`parquet_test_rows` of the ETL output ``data``)
    are one number."""
    test, rows = report["test"], parquet_test_rows(data)
    assert rows > 0 and test["count"] == test["expected_count"] == rows, (test, rows)


def mlflow_run(output: str):
    """The one MLflow run a job logged for ``output``, as its ``mlflow_run.json`` records it (store
    and run id): ``(client, run)``. Fails when the run's experiment holds any other run. The store
    becomes this process's tracking URI too: ``runs:/`` and ``models:/`` URIs, and a server's
    proxied artifacts, resolve through it."""
    from pipelines.tracking import RUN_FILE, open_store

    with open(os.path.join(output, RUN_FILE)) as f:
        record = json.load(f)
    client = open_store(record["tracking_uri"])
    runs = client.search_runs([record["experiment_id"]])
    assert [r.info.run_id for r in runs] == [record["run_id"]], [r.info.run_id for r in runs]
    return client, runs[0]


@pytest.fixture(scope="session")
def test_hosts():
    """Seven test hosts (``scripts/testhosts.sh``, through tests/testhosts.py): h1 for a Spark master,
    h2 for an S3 server, h3-h7 for workers (four for a job of 4 ranks, and a spare that lets a job
    relaunch at its world size when a worker host is lost). Skips, printing the machine's refusal, where network
    namespaces cannot be made (not root, ``ip netns add`` refused); removed even when tests fail."""
    from tests.testhosts import TestHosts, refusal

    reason = refusal()
    if reason:
        pytest.skip(reason)
    hosts = TestHosts(7)
    try:
        yield hosts
    finally:
        hosts.down()


@pytest.fixture(scope="session")
def hosts_cluster(test_hosts, tmp_path_factory):
    """A Spark standalone cluster across the test hosts: the master on h1, one worker of 1 core on
    each of h3-h7, ``moto_server`` on h2 (port 9000). Yields ``(cluster, s3 server, worker hosts)``;
    the workers' environment (which executors inherit) points AWS_ENDPOINT_URL at h2."""
    from pipelines.launch.cluster import Place, StandaloneCluster

    master, s3_host, *workers = test_hosts.hosts
    base = tmp_path_factory.mktemp("hosts")
    s3 = s3server.start(9000, str(base / "moto.log"), host=s3_host.address, command=test_hosts.command(s3_host))
    places = [Place(w.address, tuple(test_hosts.command(w)), os.path.join(w.folder, "spark-worker")) for w in workers]
    try:
        with StandaloneCluster(cores=1, memory="1g", work_dir=str(base / "cluster"),
                               env=s3server.standard_environment(s3.endpoint),
                               master_at=Place(master.address, tuple(test_hosts.command(master))),
                               workers_at=places) as cluster:
            yield cluster, s3, workers
    finally:
        s3.stop()


@pytest.fixture(autouse=True)
def _pipelines_log_reaches_caplog(request):
    """A test that reads ``caplog`` sees the ``pipelines`` logger's records exactly once, whatever an
    earlier test in the same worker did: ``pipelines.runtime.logs.setup_logging`` stops that logger's
    propagation to the root logger, where caplog listens, so its handler is put on the logger itself."""
    if "caplog" not in request.fixturenames:
        yield
        return
    import logging
    handler, logger = request.getfixturevalue("caplog").handler, logging.getLogger("pipelines")
    propagate = logger.propagate
    logger.propagate = False  # one copy of each record: the direct handler's
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


@pytest.fixture
def refused_port():
    """A local port bound by this test and never listening: a connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
