"""The session's set-up, before any test module is imported (no MLflow tracking, short-lived JVMs, the
S3 server's address, the fault hook's token), and the fixtures tests in every folder use: the
local Spark session, the S3 server and its buckets (helpers: tests/support/)."""
import atexit
import csv
import os
import shutil
import socket
import sys
import tempfile

import pytest

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before a test module imports TensorFlow)

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

# The suite's S3 API server (tests/support/s3server.py): its port and the standard AWS_* variables are set
# now, before Spark or any child starts, so every process finds it; it starts on first use.
from tests.support import s3server  # noqa: E402

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


# absl's log handler (TensorFlow logs through it) keeps the sys.stderr of its first use, in a test
# worker one of pytest's capture files, and closes that stream when logging's handlers are closed
# unless it is sys.stderr at that moment (alembic's fileConfig, as MLflow makes a new store, closes
# them all): inside a test with capfd, pytest's own capture file was closed, and every later test of
# the worker failed on it ("I/O operation on closed file"). Its stream follows sys.stderr instead, as
# pipelines.runtime.logs' handler does; only the suite's processes are changed.
try:
    from absl import logging as _absl_logging
except ImportError:  # pragma: no cover - TensorFlow's dependency, on both stacks
    pass
else:
    _absl_logging.PythonHandler.stream = property(lambda self: sys.stderr, lambda self, value: None)


# The tests that do not depend on the stack, by folder: pure Python, the shell scripts, arithmetic,
# whose results are the same on both stacks' TensorFlow, Horovod, pyarrow, PySpark and MLflow. They
# are marked `stackfree`, and make test runs them once, on mission; a test among them that is about
# the stack is marked `current` and runs on both.
STACKFREE = ("unit/benchmarks/", "unit/launch/", "unit/runtime/", "unit/scripts/", "unit/tools/")
TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items):
    for item in items:
        folder = os.path.relpath(str(item.path), TESTS).replace(os.sep, "/")
        if folder.startswith(STACKFREE) and item.get_closest_marker("current") is None:
            item.add_marker(pytest.mark.stackfree)


def pytest_addoption(parser):
    parser.addoption("--durations-csv", metavar="PATH",
                     help="write the phases (setup, call, teardown) of 1 s or more as CSV: seconds,phase,outcome,test")


_DURATIONS = []


def pytest_runtest_logreport(report):
    if report.duration >= 1.0:  # on the controller under xdist, which gets every worker's reports
        _DURATIONS.append((round(report.duration, 2), report.when, report.outcome, report.nodeid))


def pytest_sessionfinish(session):
    path = session.config.getoption("durations_csv")
    if path and not hasattr(session.config, "workerinput"):
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["seconds", "phase", "outcome", "test"])
            writer.writerows(sorted(_DURATIONS, reverse=True))


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


@pytest.fixture(autouse=True)
def _tracking_uri_restored():
    """No test leaves a store as the process's MLflow tracking URI (:func:`mlflow_run` sets it, so
    that ``runs:/`` and ``models:/`` resolve there); a later test resolves its own."""
    yield
    if "mlflow" in sys.modules:
        from pipelines.tracking.store import _set_process_tracking_uri
        _set_process_tracking_uri(None)


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
