"""Distributed deep-learning pipeline: Spark ETL, Petastorm + Horovod training.

``from pipelines import HorovodRunner`` works as ``sparkdl``'s does; the launcher's names load on first use,
so ``import pipelines`` imports neither TensorFlow, Horovod nor PySpark."""

import os as _os

from pipelines import stack as _stack
from pipelines.runtime import tflog as _tflog

__version__ = "0.1.0"


def _stack_environment() -> None:
    """Set or remove the installed stack's variables (``Stack.environment``) before TensorFlow is imported."""
    try:
        variables = _stack.active().environment
    except _stack.UnknownStack:  # no TensorFlow here (or one of no stack): nothing trains
        return
    for name, value in variables:
        if value is None:
            _os.environ.pop(name, None)
        else:
            _os.environ[name] = value


_stack_environment()
# TF_CPP_MIN_LOG_LEVEL also for the lines TensorFlow 2.21 logs while it loads (standard library
# only, TensorFlow stays unimported)
_tflog.install()

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
        AttributeError: ``name`` is not one of this package's attributes."""
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'pipelines' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
