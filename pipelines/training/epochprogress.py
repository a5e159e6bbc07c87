"""Training's progress within an epoch, on rank 0: steps done out of the epoch's, images/s and the
time left in the epoch, in the log (rank 0's stderr: the terminal, ``horovodrun``'s output, a Spark
rank's ``rank-0.log``).

``epoch 2/10: 120/400 steps (30 %), 45.2 images/s, 1 min 2 s left in the epoch``

A line comes at the end of the first step that is at least :data:`EVERY_S` seconds after the
previous line (or the epoch's start), so at least every 10 s while steps end (one a step when a
step takes longer), and one after the epoch's last step (``steps done in ..., then validation``).
The rate is the mean since the epoch began, by the same rule as the ETL's and batch inference's
lines (:func:`pipelines.runtime.progress.rate_and_left`): in a run's first epoch the first lines include
tracing the step and are pessimistic. Images/s count the global batch (every rank's images).
The time left is the epoch's remaining steps at that rate plus its validation (the exact
evaluation at the epoch's end) as long as the previous epoch's took (its ``val_seconds``); in the
first epoch a run trains, that is not known yet and the line says ``left in the epoch's steps,
then validation``. Keras' own ``ProgbarLogger`` (``verbose=2``) still prints each epoch's results.

A run resumed within an epoch (a step checkpoint) trains the rest of that epoch in a ``fit`` call
of its own (:func:`pipelines.training.schedule.fit_segments`): the line still says the run's epoch
out of the run's epochs, and the steps done out of the whole epoch's, but the rate (and so the
time left) counts only the steps this process ran, over its own time; the epoch's first line says
where it resumed once: ``epoch 1/2: 70/200 steps (35 %, resumed at step 58), ...``.
"""
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
    """One progress line of an epoch.

    Args:
        epoch, epochs: the epoch (1-based) and the run's last epoch.
        done, steps: training steps done in this epoch and the epoch's steps (``done <= steps``).
        global_batch: images a step trains, over all ranks.
        elapsed_s: seconds since the epoch began.
        validation_s: seconds the previous epoch's validation took (``None``: not known yet).
        ran: the steps of ``done`` this process ran, in ``elapsed_s`` (``None``: all of them); fewer
            in an epoch resumed from a step checkpoint, whose first ``done - ran`` steps an earlier
            process ran: the rate and the time left count ``ran`` only.
        resumed_at: the 1-based step this process resumed the epoch at, said in the head
            (``(35 %, resumed at step 58)``); 0: not said.

    Returns:
        ``"epoch <e>/<E>: <done>/<steps> steps (<percent> %), <rate> images/s, <left> left in the
        epoch"``, the percentage floored, the rate ``ran x global_batch / elapsed_s`` with one
        decimal, the time left ``(steps - done) / (ran / elapsed_s)`` plus ``validation_s``
        (:func:`pipelines.runtime.progress.format_duration`); without ``validation_s``, ``left in the
        epoch's steps, then validation``; after the last step ``steps done in <elapsed>, then
        validation``; before any rate exists, ``rate not known yet``.
    """
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
    """Rank 0's progress lines within each epoch (:func:`epoch_line`, cadence in the module's
    docstring). Put it after the exact validation (whose ``val_seconds`` it reads at the epoch's end);
    ``clock`` (seconds, monotonic) and ``write`` (one line) stand in for the tests.

    Args:
        steps_per_epoch, global_batch: the plan's (:class:`pipelines.training.schedule.Steps`).
        epochs: the run's last epoch (the phase's, ``config.fit.epochs``); ``None``: the ``fit``
            call's ``epochs``, which is the run's only in a run of one call.
        epochs_done, steps_done: where this process resumed (``Resume.initial_epoch`` and
            ``initial_step``, :func:`pipelines.training.schedule.fit_segments`' arguments): the
            epoch ``epochs_done + 1`` began after ``steps_done`` steps an earlier process ran, with
            the step numbers moved by that (:class:`pipelines.training.segment.InSegment`); the rate
            counts the steps run here only. ``(0, 0)``: a fresh run, or from an epoch's end.
    """

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
