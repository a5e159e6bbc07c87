"""Distributed deep-learning pipeline: Spark ETL, Petastorm + Horovod training.

``from pipelines import HorovodRunner`` works (as in a Databricks notebook's
``from sparkdl import HorovodRunner``); the launcher's names are loaded on first use (PEP 562), so
``import pipelines`` stays light: it imports neither TensorFlow, Horovod nor PySpark.
"""

__version__ = "0.1.0"

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
