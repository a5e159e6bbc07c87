"""Rank 0's progress lines within an epoch (steps done, images/s, time left), at most every ``EVERY_S``."""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from pipelines.runtime.progress import format_duration, rate_and_left
from pipelines.stack.kerasapi import keras

log = logging.getLogger("pipelines")

#: Seconds between two progress lines of an epoch, at most (while steps end).
EVERY_S = 10.0


def epoch_line(epoch: int, epochs: int, done: int, steps: int, global_batch: int, elapsed_s: float,
               validation_s: Optional[float] = None, ran: Optional[int] = None, resumed_at: int = 0) -> str:
    """One progress line of 1-based ``epoch`` of ``epochs``, after ``done`` of ``steps`` steps.

    Args:
        validation_s: seconds the previous epoch's validation took (``None``: not known yet).
        ran: the steps of ``done`` this process ran (``None``: all); the rate counts these only.
        resumed_at: the 1-based step this process resumed at; 0: not said."""
    ran = done if ran is None else ran
    note = f", resumed at step {resumed_at:,}" if resumed_at else ""
    head = (f"epoch {epoch}/{epochs}: {done:,}/{steps:,} {'step' if steps == 1 else 'steps'} "
            f"({100 * done // steps} %{note})")
    rate, left = rate_and_left(ran, ran + max(0, steps - done), elapsed_s)
    if rate is None:
        return f"{head}, rate not known yet ({format_duration(max(0.0, elapsed_s))} elapsed)"
    speed = f"{head}, {rate * global_batch:.1f} images/s"
    if done >= steps:
        return f"{speed}, steps done in {format_duration(elapsed_s)}, then validation"
    if validation_s is None:
        return f"{speed}, {format_duration(left)} left in the epoch's steps, then validation"
    return f"{speed}, {format_duration(left + validation_s)} left in the epoch"


class EpochProgress(keras.callbacks.Callback):
    """Rank 0's progress lines within each epoch; place it after the exact validation (reads ``val_seconds``)."""

    def __init__(self, steps_per_epoch: int, global_batch: int, epochs: Optional[int] = None,
                 epochs_done: int = 0, steps_done: int = 0, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic, write: Optional[Callable[[str], None]] = None):
        super().__init__()
        self.steps, self.global_batch, self.every_s = steps_per_epoch, global_batch, every_s
        self.epochs, self.epochs_done, self.steps_done = epochs, epochs_done, steps_done
        self.clock, self.write = clock, write or (lambda line: log.info("%s", line))
        self.epoch = 0
        self.validation_s: Optional[float] = None
        self._start = self._last = 0.0
        self._before = 0  # steps of the epoch an earlier process ran
        self._noted = True  # the resumed step said (or nothing to say)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch + 1
        self._before = self.steps_done if epoch == self.epochs_done else 0
        self._noted = not self._before
        self._start = self._last = self.clock()

    def on_train_batch_end(self, batch, logs=None):
        now, done = self.clock(), batch + 1
        if done >= self.steps or now - self._last >= self.every_s:
            self._last = now
            epochs = self.epochs or self.params.get("epochs", self.epoch)
            resumed_at = 0 if self._noted else self._before + 1
            self._noted = True
            self.write(epoch_line(self.epoch, epochs, done, self.steps, self.global_batch, now - self._start,
                                  self.validation_s, ran=done - self._before, resumed_at=resumed_at))

    def on_epoch_end(self, epoch, logs=None):
        if logs and "val_seconds" in logs:
            self.validation_s = float(logs["val_seconds"])
