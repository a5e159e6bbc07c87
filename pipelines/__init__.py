"""Distributed deep-learning pipeline: Spark ETL, Petastorm + Horovod training.

``from pipelines import HorovodRunner`` works (as in a Databricks notebook's
``from sparkdl import HorovodRunner``); the launcher's names are loaded on first use (PEP 562), so
``import pipelines`` stays light: it imports neither TensorFlow, Horovod nor PySpark.
"""

import os as _os

__version__ = "0.1.0"

# The one place every process that trains sets this, before TensorFlow is imported: each launch
# path imports `pipelines` first (jobs/*.py, horovodrun's ranks running them, HorovodRunner's local
# ranks and Spark barrier tasks unpickling our function, notebook kernels, the tests), and children
# inherit it. TensorFlow >= 2.16 reads it at import: `tf.keras` is then Keras 2 (tf_keras), the API
# Horovod averages; without it 12 of Horovod's 13 Keras tests fail on TF 2.21. TF 2.15 ignores it.
# pipelines.kerasapi refuses a process where TensorFlow came first.
_os.environ["TF_USE_LEGACY_KERAS"] = "1"

# name -> submodule that defines it; loaded by __getattr__ on first access only.
_LAZY = {
    "HorovodRunner": "pipelines.launcher",
    "HorovodJobFailed": "pipelines.launcher",
    "ClusterConfigError": "pipelines.launcher",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    """The launcher's public names, imported on first access.

    Raises:
        AttributeError: ``name`` is not one of this package's attributes.
    """
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'pipelines' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
