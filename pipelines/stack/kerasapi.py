"""The one import point of the Keras 2 API: ``from pipelines.stack.kerasapi import keras``.

Horovod 0.28.1 wraps a Keras 3 optimizer without averaging, so ``distributed_optimizer`` refuses Keras 3."""
from __future__ import annotations

import importlib
from importlib.metadata import version
from typing import Any, Optional

import tensorflow as tf

from pipelines import stack

STACK = stack.active()


class Keras3Error(TypeError):
    """A Keras 3 model, optimizer or ``tf.keras`` where Keras 2 is needed (Horovod would not average its gradients)."""


keras: Any = importlib.import_module(STACK.keras_module)  # a module chosen at run time: untyped
if tf.keras.Model is not keras.Model:  # TF 2.21's tf.keras is Keras 3 unless the stack's variables came first
    _SETTING = " ".join(f"{name}={value}" for name, value in STACK.environment if value is not None)
    raise Keras3Error(f"tf.keras is Keras 3 in this process (TensorFlow {tf.__version__}'s tf.keras was used before "
                      f"{_SETTING} was set): import pipelines before tensorflow, or export {_SETTING}")

__all__ = ["keras", "Keras3Error", "STACK", "keras_version", "require_keras2", "distributed_optimizer"]


def keras_version() -> str:
    """The version of the Keras 2 in use, from its package (``tf.keras`` of TF 2.15 has no ``__version__``)."""
    return version(STACK.keras_package)


def _describe(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def require_keras2(model: Optional[Any] = None, optimizer: Optional[Any] = None) -> None:
    """Refuse a ``model`` or ``optimizer`` (None: not checked) not of this stack's Keras 2 API (legacy optimizers pass).

    Raises:
        Keras3Error: naming the object's class and the module to build it from."""
    where = f"{STACK.keras_module} (Keras 2)"
    if model is not None and not isinstance(model, keras.Model):
        raise Keras3Error(f"the model is a {_describe(model)}, not a {where} model: Horovod would not average "
                          "its gradients; build it with `from pipelines.stack.kerasapi import keras`")
    optimizers = (keras.optimizers.Optimizer, keras.optimizers.legacy.Optimizer)
    if optimizer is not None and not isinstance(optimizer, optimizers):
        raise Keras3Error(f"the optimizer is a {_describe(optimizer)}, not a {where} optimizer: Horovod's "
                          "DistributedOptimizer would wrap it without averaging gradients (each rank would "
                          "train alone); build it with `from pipelines.stack.kerasapi import keras`")


def distributed_optimizer(optimizer: Any, model: Optional[Any] = None, **horovod_options: Any) -> Any:
    """``hvd.DistributedOptimizer(optimizer, **horovod_options)`` after ``require_keras2``; needs ``hvd.init()``.

    Raises:
        Keras3Error: a Keras 3 model or optimizer (before any step)."""
    import horovod.tensorflow.keras as hvd

    require_keras2(model=model, optimizer=optimizer)
    wrapped = hvd.DistributedOptimizer(optimizer, **horovod_options)
    allreduce = getattr(wrapped, "_allreduce_grads", None)
    if horovod_options.get("backward_passes_per_step", 1) == 1 and hasattr(allreduce, "python_function"):
        # Horovod wraps its allreduce in tf.function with AutoGraph on, which every rank pays for at the
        # first trace (docs/stacks.md); the code is written for graph mode, so it traces to the same ops.
        wrapped._allreduce_grads = tf.function(allreduce.python_function, autograph=False)
    return wrapped
