"""Quiet by default: warnings and errors only, from every library, unless ``--verbose``.

Call :func:`quiet_by_default` first thing in an entry point, before TensorFlow or Spark start
(TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL`` when it loads): then TensorFlow's C++ info and
warning lines (oneDNN, CPU features: 18 lines per process), its Python logger's warnings (per
rank), Spark's log4j INFO lines (``conf/log4j2.properties``) and the known harmless Python
warnings listed in :data:`HARMLESS` stay out of the logs, and so does Java's line about Spark's
incubator module when this process starts the JVM (:func:`jvm_stderr_filtered`). ``--verbose`` (or
``PIPELINES_VERBOSE=1``, which the ranks and Spark's workers inherit) shows all of them.
"""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import warnings
from typing import Iterator, Optional, Sequence

VERBOSE_ENV = "PIPELINES_VERBOSE"
LOG4J_CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "log4j2.properties")

# (category, message regex, module regex) of warnings known to be harmless here.
HARMLESS = [
    (DeprecationWarning, "", ""),
    (PendingDeprecationWarning, "", ""),
    (FutureWarning, "", r"(petastorm|pyarrow|pandas|tensorflow|keras|horovod|pyspark)"),
    (UserWarning, r".*(is slow compared to the batch time|Gradients do not exist|"
                  r"SparkContext.*deprecated|`np\.bool8` is a deprecated).*", ""),
    (RuntimeWarning, r".*(os\.fork\(\) was called|overflow encountered in cast).*", ""),
]

# Spark 4's launcher gives every JVM it builds --add-modules=jdk.incubator.vector (JavaModuleOptions,
# unconditionally), and Java 17 then prints this line on stderr as it starts (ModuleBootstrap: a
# plain System.err.println that no JVM option turns off), on every ETL, batch inference or
# --spark-np start. Harmless: Spark uses the module for vectorised BLAS.
JVM_INCUBATOR_WARNING = "WARNING: Using incubator modules: jdk.incubator.vector"

# The filter the JVM writes its stderr through: every line passed on as it comes, but the one given.
# It ignores SIGINT (Ctrl-C reaches the whole process group; PySpark's JVM ignores it too) and ends
# when the JVM closes its stderr, that is when the JVM exits.
_DROP_LINE = """\
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
drop, out = sys.argv[1].encode(), sys.stdout.buffer
try:
    for line in iter(sys.stdin.buffer.readline, b""):
        if line.rstrip(b"\\r\\n") != drop:
            out.write(line)
            out.flush()
except OSError:  # our stderr is gone (a closed pipe): nothing left to show
    pass
"""


def is_verbose(argv: Optional[Sequence[str]] = None) -> bool:
    """``--verbose`` in ``argv`` (default ``sys.argv``), or ``PIPELINES_VERBOSE=1`` in the environment."""
    args = sys.argv[1:] if argv is None else argv
    return "--verbose" in args or os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def quiet_by_default(argv: Optional[Sequence[str]] = None) -> bool:
    """Set the noise level of this process (and its children) before TensorFlow or Spark load.

    Quiet: ``TF_CPP_MIN_LOG_LEVEL=2`` unless already set, the :data:`HARMLESS` warnings ignored.
    Verbose: ``TF_CPP_MIN_LOG_LEVEL=0`` and ``PIPELINES_VERBOSE=1`` exported. Returns verbose."""
    verbose = is_verbose(argv)
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        return True
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for category, message, module in HARMLESS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    # Python warnings of child interpreters (Spark's Python workers, horovodrun's ranks)
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning,ignore::FutureWarning")
    return False


def quiet_libraries() -> None:
    """After TensorFlow loaded: its Python logger (and absl's) at ERROR unless verbose."""
    if is_verbose([]):
        return
    for name in ("tensorflow", "absl", "py4j", "petastorm", "h5py", "mlflow"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if "tensorflow" in sys.modules:
        sys.modules["tensorflow"].get_logger().setLevel(logging.ERROR)


@contextlib.contextmanager
def jvm_stderr_filtered() -> Iterator[None]:
    """While the block runs, this process's stderr (fd 2), and so that of any JVM it starts, goes
    through a small filter process that drops :data:`JVM_INCUBATOR_WARNING` and passes every other
    line on at once; the JVM keeps writing through it for its whole life, this process's own fd 2
    is restored when the block ends. Verbose (:func:`is_verbose`): nothing is filtered.

    A filter process rather than a JVM option because none exists (see the constant); rather than
    a thread because the JVM outlives any block of ours and writes until it exits. When the filter
    cannot start, the block runs unfiltered.
    """
    if is_verbose([]):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        drop = subprocess.Popen([sys.executable, "-S", "-c", _DROP_LINE, JVM_INCUBATOR_WARNING],
                                stdin=subprocess.PIPE, stdout=saved, stderr=saved)
    except OSError:  # no filter: the line shows, the job runs
        os.close(saved)
        yield
        return
    threading.Thread(target=drop.wait, name="jvm-stderr-filter", daemon=True).start()  # reaped when it ends
    os.dup2(drop.stdin.fileno(), 2)
    drop.stdin.close()  # the pipe's write end is now fd 2 alone, then the JVM's
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def spark_log_options() -> str:
    """Driver JVM option that loads the quiet log4j configuration (empty when verbose or missing)."""
    if is_verbose([]) or not os.path.isfile(LOG4J_CONF):
        return ""
    return f"-Dlog4j2.configurationFile={LOG4J_CONF}"
