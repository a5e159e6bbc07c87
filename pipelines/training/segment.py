"""The job's callbacks over a run that ``fit`` trains in two calls (a resume within an epoch), seen as one run."""
from __future__ import annotations

from typing import Dict, List

from pipelines.stack.kerasapi import keras

_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")


class InSegment(keras.callbacks.Callback):
    """``callback`` as one of several ``fit`` calls sees it: batch numbers moved by ``steps_done``,
    ``on_train_begin`` only when ``first``, ``on_train_end`` only when ``last`` or stopping; ``params["steps"]``
    is the whole epoch's."""

    def __init__(self, callback, steps_done: int, first: bool, last: bool, steps_per_epoch: int):
        super().__init__()
        self.callback, self.steps_done, self.first, self.last = callback, steps_done, first, last
        self.steps_per_epoch = steps_per_epoch
        for hook in _BATCH_HOOKS:
            setattr(self, hook, self._moved(getattr(callback, hook)))
        for hook in ("on_epoch_begin", "on_epoch_end", "on_test_begin", "on_test_end", "on_test_batch_begin",
                     "on_test_batch_end", "on_predict_begin", "on_predict_end"):
            setattr(self, hook, getattr(callback, hook))
        # Keras converts the logs to NumPy for callbacks that ask: ask as the wrapped one does
        self._supports_tf_logs = getattr(callback, "_supports_tf_logs", False)

    def _moved(self, hook):
        def moved(batch, logs=None):
            return hook(batch + self.steps_done, logs)
        return moved

    def set_model(self, model) -> None:
        super().set_model(model)
        self.callback.set_model(model)

    def set_params(self, params) -> None:
        super().set_params(params)
        self.callback.set_params({**params, "steps": self.steps_per_epoch})

    def on_train_begin(self, logs=None):
        if self.first:
            self.callback.on_train_begin(logs)

    def on_train_end(self, logs=None):
        if self.last or self.model.stop_training:
            self.callback.on_train_end(logs)


def in_segment(callbacks: List, index: int, count: int, steps_done: int, steps_per_epoch: int) -> List:
    """The callbacks of ``fit`` call ``index`` of ``count``, each wrapped in ``InSegment`` (not ``ProgbarLogger``)."""
    if count == 1 and not steps_done:
        return callbacks
    return [c if isinstance(c, keras.callbacks.ProgbarLogger) else
            InSegment(c, steps_done, index == 0, index == count - 1, steps_per_epoch) for c in callbacks]


def end_epoch(model, callbacks: List, epoch: int, steps_per_epoch: int, logs: Dict, verbose: int) -> None:
    """Run the end of 0-based ``epoch`` alone (``fit``'s hooks, no step) with this rank's recorded ``logs``."""
    model.stop_training = False  # as fit begins
    hooks = keras.callbacks.CallbackList(callbacks, add_history=False, add_progbar=False, model=model,
                                         verbose=verbose, epochs=epoch + 1, steps=steps_per_epoch)
    hooks.on_train_begin()
    hooks.on_epoch_begin(epoch)
    hooks.on_epoch_end(epoch, dict(logs))
    hooks.on_train_end()
