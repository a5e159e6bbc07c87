"""The one import point of the Keras 2 API: ``from pipelines.stack.kerasapi import keras``.

On the mission stack (TensorFlow 2.15) Keras 2 is ``tf.keras``; on the current stack (TensorFlow
2.21) ``tf.keras`` and ``import keras`` are Keras 3 and Keras 2 is the ``tf_keras`` package
(:data:`pipelines.stack.STACKS` says which). Horovod 0.28.1 averages gradients of Keras 2 optimizers
only: ``hvd.DistributedOptimizer`` wraps a Keras 3 optimizer without error and without averaging,
so each rank silently trains alone. :func:`distributed_optimizer` is the project's only way to
that wrapper and refuses Keras 3 objects first.

``TF_USE_LEGACY_KERAS=1`` (set by ``import pipelines``, before any of our code imports TensorFlow)
makes TensorFlow's own ``tf.keras`` the same Keras 2 on 2.21 (TF reads it when ``tf.keras`` is
first used), which MLflow's TensorFlow flavour relies on; importing this module checks that it took effect. Imported by training,
prediction and tools code only (it imports TensorFlow).
"""
from __future__ import annotations

import importlib
from importlib.metadata import version
from typing import Any, Optional

import tensorflow as tf

from pipelines import stack

STACK = stack.active()


class Keras3Error(TypeError):
    """A Keras 3 model or optimizer, or a TensorFlow whose ``tf.keras`` is Keras 3, where the Keras 2
    API is needed (Horovod would not average its gradients)."""


keras: Any = importlib.import_module(STACK.keras_module)  # a module chosen at run time: untyped
if tf.keras.Model is not keras.Model:  # TF 2.21's tf.keras is Keras 3 unless the stack's variables came first
    _SETTING = " ".join(f"{name}={value}" for name, value in STACK.environment if value is not None)
    raise Keras3Error(f"tf.keras is Keras 3 in this process (TensorFlow {tf.__version__}'s tf.keras was used before "
                      f"{_SETTING} was set): import pipelines before tensorflow, or export {_SETTING}")

__all__ = ["keras", "Keras3Error", "STACK", "keras_version", "require_keras2", "distributed_optimizer"]


def keras_version() -> str:
    """The version of the Keras 2 in use: its package's (:attr:`pipelines.stack.Stack.keras_package`;
    ``tf.keras`` of TF 2.15 is the ``keras`` 2.15 package, whose API module has no ``__version__``)."""
    return version(STACK.keras_package)


def _describe(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def require_keras2(model: Optional[Any] = None, optimizer: Optional[Any] = None) -> None:
    """Refuse a ``model`` or ``optimizer`` that is not of this stack's Keras 2 API.

    A legacy optimizer (``keras.optimizers.legacy``) is Keras 2 too. ``None`` is not checked.

    Raises:
        Keras3Error: naming the object's class and the module to build it from.
    """
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
    """``hvd.DistributedOptimizer(optimizer, **horovod_options)`` (gradients averaged over ranks by
    allreduce at each step), after :func:`require_keras2` has checked ``optimizer`` and, if given,
    the ``model`` it will compile. Needs ``hvd.init()`` first. Horovod's gradient allreduce is
    traced without AutoGraph (below); the step is Horovod's own, bit for bit
    (``tests/ranks/test_averaging.py``).

    Raises:
        Keras3Error: a Keras 3 model or optimizer (before any step).
    """
    import horovod.tensorflow.keras as hvd

    require_keras2(model=model, optimizer=optimizer)
    wrapped = hvd.DistributedOptimizer(optimizer, **horovod_options)
    allreduce = getattr(wrapped, "_allreduce_grads", None)
    if horovod_options.get("backward_passes_per_step", 1) == 1 and hasattr(allreduce, "python_function"):
        # Horovod wraps its gradient allreduce in tf.function with AutoGraph on, so every rank
        # converts Horovod's allreduce code to graph code when the train step is first traced
        # (over a second of each rank's start: docs/stacks.md). That code is written for
        # graph mode (explicit tf.cond, Python branches on Python values only): traced as written,
        # it builds the same ops.
        wrapped._allreduce_grads = tf.function(allreduce.python_function, autograph=False)
    return wrapped
