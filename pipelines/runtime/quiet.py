"""Quiet by default: warnings and errors only, from every library, unless ``--verbose``.

Call ``quiet_by_default`` first in an entry point, before TensorFlow loads; ranks call ``quiet_libraries``."""
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
    """Whether this process was set up verbose."""
    return _verbose


def quiet_by_default(verbose: bool) -> None:
    """Set the noise level of this process and its children before TensorFlow or Spark load."""
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
    """After TensorFlow loaded (a rank's set-up): its and other libraries' loggers at ERROR unless ``verbose``."""
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
