"""One rank's training loop: Keras' compiled step over the rank's stream, from any step of any epoch."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

from pipelines.runtime.logs import plural


def start_row(epochs_done: int, steps_done: int, steps_per_epoch: int, batch_size: int, first_epoch: int = 0) -> int:
    """The rank's stream row after ``epochs_done`` epochs and ``steps_done`` (``0..steps_per_epoch``) more steps.

    ``batch_size``: rows of one step on this rank; ``first_epoch``: epochs before this phase's stream began.

    Raises:
        ValueError: ``steps_done`` outside ``[0, steps_per_epoch]``, or a position before ``first_epoch``."""
    if not 0 <= steps_done <= steps_per_epoch or epochs_done < first_epoch:
        raise ValueError(f"no position after {plural(epochs_done, 'epoch')} and {plural(steps_done, 'step')} of "
                         f"{steps_per_epoch} (phase from epoch {first_epoch + 1})")
    return ((epochs_done - first_epoch) * steps_per_epoch + steps_done) * batch_size


def run_epochs(model, dataset, callbacks: Sequence, epochs_done: int, steps_done: int, epochs: int,
               steps_per_epoch: int, verbose: int = 0, trained_logs: Optional[Dict[str, float]] = None) -> None:
    """Train epochs ``epochs_done + 1 .. epochs``, the first from step ``steps_done + 1``, as Keras' ``fit`` would.

    Args:
        dataset: this rank's unending batches from ``start_row(epochs_done, steps_done, ...)``.
        callbacks: Keras callbacks, their hooks run in this order (``make_callbacks``').
        trained_logs: the first epoch's logs when its steps were trained before (``steps_done == steps_per_epoch``)."""
    from pipelines.stack.kerasapi import keras

    hooks = keras.callbacks.CallbackList(list(callbacks), add_history=False, add_progbar=False, model=model,
                                         verbose=verbose, epochs=epochs, steps=steps_per_epoch)
    # Horovod: hvd.DistributedOptimizer averages the gradients inside Keras' compiled step (XLA and loss scaling too)
    train_step = model.make_train_function()
    model.stop_training = False
    hooks.on_train_begin()
    iterator = iter(dataset)
    logs: Dict[str, float] = {}
    for epoch in range(epochs_done, epochs):
        model.reset_metrics()
        hooks.on_epoch_begin(epoch)
        step_logs = None
        for step in range(steps_done if epoch == epochs_done else 0, steps_per_epoch):
            hooks.on_train_batch_begin(step)
            step_logs = train_step(iterator)
            hooks.on_train_batch_end(step, step_logs)
            if model.stop_training:
                break
        logs = as_numbers(step_logs) if step_logs is not None else dict(trained_logs or {})
        hooks.on_epoch_end(epoch, logs)  # exact validation, early stopping, rank 0's writers, preemption, elastic
        if model.stop_training:
            break
    hooks.on_train_end(logs)


def as_numbers(logs: Dict) -> Dict[str, float]:
    """A step's logs (scalar tensors: the epoch's running metrics) as Python numbers."""
    return {name: value.numpy().item() if hasattr(value, "numpy") else value for name, value in logs.items()}
