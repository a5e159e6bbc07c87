"""Quiet by default: warnings and errors only, from every library, unless ``--verbose``.

Call :func:`quiet_by_default` first thing in an entry point, before TensorFlow or Spark start
(TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL`` when it loads): then TensorFlow's C++ info and
warning lines (oneDNN, CPU features: 18 lines per process), its Python logger's warnings (per
rank), Spark's log4j INFO lines (``conf/log4j2.properties``) and the known harmless Python
warnings listed in :data:`HARMLESS` stay out of the logs. ``--verbose`` (or
``PIPELINES_VERBOSE=1``, which the ranks and Spark's workers inherit) shows all of them.

One line stays: ``WARNING: Using incubator modules: jdk.incubator.vector``, which Java 17 prints
at the start of every JVM Spark 4 launches (its launcher always adds that module; no JVM option
turns the line off). Hiding it took a filter process relaying all of the JVM's stderr for the
JVM's whole life (and two fixes of tests it made flaky): not worth one harmless line.
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Optional, Sequence

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


def spark_log_options() -> str:
    """Driver JVM option that loads the quiet log4j configuration (empty when verbose or missing)."""
    if is_verbose([]) or not os.path.isfile(LOG4J_CONF):
        return ""
    return f"-Dlog4j2.configurationFile={LOG4J_CONF}"
