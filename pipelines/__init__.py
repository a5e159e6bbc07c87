"""Distributed deep-learning pipeline: Spark ETL, Petastorm + Horovod training.

``from pipelines import HorovodRunner`` works (as in a Databricks notebook's
``from sparkdl import HorovodRunner``); the launcher's names are loaded on first use (PEP 562), so
``import pipelines`` stays light: it imports neither TensorFlow, Horovod nor PySpark.
"""

import os as _os

__version__ = "0.1.0"


def _keras_environment() -> None:
    """Set ``TF_USE_LEGACY_KERAS`` for the installed stack, before TensorFlow is imported.

    The one place every process that trains gets it: each launch path imports `pipelines` first
    (jobs/*.py, horovodrun's ranks running them, HorovodRunner's local ranks and Spark barrier tasks
    unpickling our function, notebook kernels, the tests), and children inherit it. On the current
    stack (TF 2.21) "1" makes `tf.keras` Keras 2 (tf_keras), the API Horovod averages; without it 12
    of Horovod's 13 Keras tests fail. On mission (TF 2.15, no tf_keras) it must be unset: TF 2.15
    reads it too, and `tf.keras` then fails to import. pipelines.stack.kerasapi refuses a process where
    TensorFlow came first. Reads package metadata only (pipelines.stack), imports nothing heavy.
    """
    from pipelines import stack

    try:
        legacy = stack.active().keras_module == "tf_keras"
    except stack.UnknownStack:  # no TensorFlow here (or one of no stack): nothing trains
        return
    if legacy:
        _os.environ["TF_USE_LEGACY_KERAS"] = "1"
    else:
        _os.environ.pop("TF_USE_LEGACY_KERAS", None)


_keras_environment()


def _quiet_tensorflow_load() -> None:
    """TF_CPP_MIN_LOG_LEVEL also for the lines TensorFlow 2.21 logs while it loads
    (:mod:`pipelines.runtime.tflog`; standard library only, TensorFlow stays unimported)."""
    from pipelines.runtime import tflog

    tflog.install()


_quiet_tensorflow_load()

# name -> submodule that defines it; loaded by __getattr__ on first access only.
_LAZY = {
    "HorovodRunner": "pipelines.launch",
    "HorovodJobFailed": "pipelines.launch",
    "ClusterConfigError": "pipelines.launch",
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
