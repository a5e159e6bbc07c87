"""Quiet by default: warnings and errors only, from every library, unless ``--verbose``.

Call :func:`quiet_by_default` first thing in an entry point, before TensorFlow or Spark start
(TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL`` when it loads): then TensorFlow's C++ info and
warning lines (oneDNN, CPU features: 18 lines per process), its Python logger's warnings (per
rank), Spark's log4j INFO lines (``conf/log4j2.properties``) and the known harmless Python
warnings listed in :data:`HARMLESS` stay out of the logs. ``--verbose`` (a field of each stage's
config, whose default is the environment's: :mod:`pipelines.runtime.environment`) shows all of them. The
ranks get it in their config (:func:`quiet_libraries` in each rank), Spark's Python workers as a
parameter; this process's choice is kept by the set-up (:func:`is_verbose`) for the code that
decides what third-party output to show (MLflow's, Spark's log level).

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

_verbose = False  # this process's choice, set only by quiet_by_default and quiet_libraries


def is_verbose() -> bool:
    """Whether this process was set up verbose (:func:`quiet_by_default`, :func:`quiet_libraries`)."""
    return _verbose


def quiet_by_default(verbose: bool) -> None:
    """Set the noise level of this process (and its children) before TensorFlow or Spark load.

    Quiet: ``TF_CPP_MIN_LOG_LEVEL=2`` unless already set, the :data:`HARMLESS` warnings ignored.
    Verbose: ``TF_CPP_MIN_LOG_LEVEL=0`` (the processes this one starts inherit it)."""
    global _verbose
    _verbose = verbose
    if verbose:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for category, message, module in HARMLESS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    # Python warnings of child interpreters (Spark's Python workers, horovodrun's ranks)
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning,ignore::FutureWarning")


def quiet_libraries(verbose: bool) -> None:
    """After TensorFlow loaded: its Python logger (and absl's) at ERROR unless ``verbose``, which
    this process keeps (:func:`is_verbose`): a rank's set-up, from its config."""
    global _verbose
    _verbose = verbose
    if verbose:
        return
    for name in ("tensorflow", "absl", "py4j", "petastorm", "h5py", "mlflow"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if "tensorflow" in sys.modules:
        sys.modules["tensorflow"].get_logger().setLevel(logging.ERROR)


def spark_log_options(verbose: bool) -> str:
    """Driver JVM option that loads the quiet log4j configuration (empty when ``verbose`` or missing)."""
    if verbose or not os.path.isfile(LOG4J_CONF):
        return ""
    return f"-Dlog4j2.configurationFile={LOG4J_CONF}"
