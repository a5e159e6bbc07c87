"""Keras callbacks of the training job (besides Horovod's own)."""
from __future__ import annotations

import io
import logging
import os
import statistics
import time
from typing import Dict, List, Optional, Sequence

from pipelines.io import nofollow
from pipelines.launch.watchdog import progress as tick_watchdog
from pipelines.stack.kerasapi import keras
from pipelines.training.checkpoints.files import checkpoint_variables
from pipelines.training.checkpoints.names import marker_path
from pipelines.training.divergence import (
    TrainingDiverged,
    diverged_message,
    epoch_end_place,
    non_finite_arrays,
    non_finite_logs,
    step_place,
)
from pipelines.training.preemption import Preempted, holding
from pipelines.training.records import progress

log = logging.getLogger("pipelines")


class BestWeightsEarlyStopping(keras.callbacks.EarlyStopping):
    """``EarlyStopping`` that restores the best weights however training ends (Keras: only on its own stop).

    ``state`` (from a checkpoint marker) continues a previous run's patience count and best value."""

    def __init__(self, state: Optional[Dict] = None, best_weights: Optional[List] = None, **kwargs):
        super().__init__(restore_best_weights=True, **kwargs)
        self._resume_state = state
        self._resume_best_weights = best_weights
        if state:  # a resumed run that had already finished reports it without calling fit
            self.best_epoch = state["best_epoch"] - 1

    @classmethod
    def of_rule(cls, rule, steps_per_epoch: int, **kwargs) -> "BestWeightsEarlyStopping":
        """Early stopping by ``rule`` (a ``StoppingRule``); ``kwargs``: ``state``, ``best_weights``."""
        return cls(monitor=rule.monitor, mode=rule.mode, patience=rule.patience(steps_per_epoch),
                   min_delta=rule.min_delta, verbose=0, **kwargs)

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self._resume_state and self._resume_state["best_epoch"] >= 1:  # 0: a step checkpoint of epoch 1
            self.best = self._resume_state["best"]
            self.wait = self._resume_state["wait"]
            self.best_epoch = self._resume_state["best_epoch"] - 1  # Keras counts from 0
            self.best_weights = self._resume_best_weights

    def state(self, epochs_done: Optional[int] = None) -> Dict:
        """JSON-ready state: ``best``, ``wait``, ``best_epoch`` (1-based; 0 and best ``None`` before epoch 1 ends),
        ``stopped``, ``monitor`` (``--resume`` requires the same)."""
        if epochs_done == 0:
            return {"best": None, "wait": 0, "best_epoch": 0, "stopped": False, "monitor": self.monitor}
        return {"best": float(self.best), "wait": int(self.wait), "best_epoch": int(self.best_epoch) + 1,
                "stopped": bool(self.model.stop_training), "monitor": self.monitor}

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self.stopped_epoch == 0 and self.best_weights is not None:
            self.model.set_weights(self.best_weights)


class EpochStats(keras.callbacks.Callback):
    """Adds ``lr``, ``epoch_seconds``, ``train_images_per_second``, ``step_ms`` and ``loss_scale`` to epoch logs.

    Training time excludes validation; ``step_ms`` is the median step; ``loss_scale`` only under mixed precision."""

    def __init__(self, steps_per_epoch: int, global_batch: int):
        super().__init__()
        self.global_batch = global_batch
        self.epochs_run = 0
        self._start = self._train_end = 0.0
        self._step_starts: List[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._train_end = 0.0
        self._step_starts = []

    def on_train_batch_begin(self, batch, logs=None):
        self._step_starts.append(time.perf_counter())

    def on_test_begin(self, logs=None):
        if not self._train_end:
            self._train_end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        end = time.perf_counter()
        self.epochs_run += 1
        if not self._step_starts and "epoch_seconds" in (logs or {}):  # trained by an earlier process
            return
        train_end = self._train_end or end
        train_seconds = train_end - self._start
        logs["lr"] = float(keras.backend.get_value(self.model.optimizer.lr))
        logs["epoch_seconds"] = end - self._start
        images = len(self._step_starts) * self.global_batch  # the steps this process ran (a resumed epoch: the rest)
        logs["train_images_per_second"] = images / train_seconds if train_seconds > 0 else 0.0
        logs["step_ms"] = 1000.0 * step_seconds(self._step_starts, train_end)
        scale = loss_scale(self.model.optimizer)
        if scale is not None:
            logs["loss_scale"] = scale


def step_seconds(starts: Sequence[float], end: float) -> float:
    """Median seconds per step from the steps' increasing start times and the last step's end; 0.0 if none."""
    if not starts:
        return 0.0
    bounds = list(starts) + [end]
    return statistics.median(b - a for a, b in zip(bounds, bounds[1:]))


def loss_scale(optimizer) -> Optional[float]:
    """The current loss scale of a Keras 2 ``LossScaleOptimizer`` (``None`` for any other optimizer)."""
    scale = getattr(optimizer, "loss_scale", None)
    if scale is None or not hasattr(optimizer, "inner_optimizer"):
        return None
    return float(keras.backend.get_value(scale))


class DivergenceGuard(keras.callbacks.Callback):
    """Every rank: stops all ranks at the same step when any rank's loss, logs or weights turn non-finite.

    Each step and validation batch every rank allreduces ``(diverged, preempted)`` flags, so all raise
    together (``TerminateOnNaN`` would hang the other ranks). Place it before early stopping and checkpoints.
    A SIGTERM (``notice``) stops every rank at the same point, after rank 0's checkpoint (``on_preempted``)."""

    def __init__(self, steps_per_epoch: int, count=None, gather=None, notice=None, on_preempted=None, agree=None):
        super().__init__()
        self.steps = steps_per_epoch
        self.count = count or ranks_flagged
        self.gather = gather or gather_ranks
        self.agree = agree or rank0_value
        self.notice, self.on_preempted = notice, on_preempted
        self.deferred = False
        self.epoch = 0
        self.hosts: List[str] = []

    def on_train_begin(self, logs=None):
        import socket

        self.hosts = list(self.gather(socket.gethostname()))

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch + 1

    def on_train_batch_end(self, batch, logs=None):
        preempted = self._stop_if_found(non_finite_logs(logs), step_place(self.epoch, batch + 1, self.steps),
                                        bool(self.notice and self.notice.requested))
        if preempted and batch + 1 < self.steps:
            self._stop_preempted(batch + 1)
        self.deferred = self.deferred or preempted  # the epoch's last step: stop once the epoch is checkpointed

    def _stop_preempted(self, step: int) -> None:
        with holding(self.notice):  # a second SIGTERM waits for the checkpoint
            checkpoint = self.on_preempted(self.epoch, step) if self.on_preempted else None
        checkpoint = self.agree(checkpoint)  # every rank: after rank 0's checkpoint is complete
        raise Preempted(f"preempted: every rank stopped after step {step} of epoch {self.epoch} (a SIGTERM)",
                        checkpoint)

    def on_validation_batch_end(self, epoch, batch, logs=None):
        """After each of this rank's validation batches: the check (collective)."""
        self._check_in_validation(True, logs, f"validation batch {batch} of epoch {epoch + 1}")

    def on_validation_shard_end(self, epoch, logs=None):
        """This rank's shard done: a check for each batch another rank still validates."""
        while self._check_in_validation(False, logs, f"the other ranks' validation of epoch {epoch + 1}"):
            pass

    def _check_in_validation(self, validating: bool, logs, after: str) -> bool:
        """One collective check in validation; returns whether any rank still validates."""
        tick_watchdog(f"the preemption check after {after}", waits=True)
        still, notices = self.count((validating, bool(self.notice and self.notice.requested)))
        tick_watchdog(f"the rank's own work after the check after {after}")
        if notices:
            epoch_logs = self.gather({key: float(value) for key, value in (logs or {}).items()})
            with holding(self.notice):
                checkpoint = self.on_preempted(self.epoch, self.steps, epoch_logs) if self.on_preempted else None
            checkpoint = self.agree(checkpoint)
            raise Preempted(f"preempted: every rank stopped in the validation of epoch {self.epoch}, its steps "
                            "trained (a SIGTERM)", checkpoint)
        return bool(still)

    def on_epoch_end(self, epoch, logs=None):
        variables = checkpoint_variables(self.model)
        arrays = non_finite_arrays({key: v.numpy() for key, v in variables.items()})
        found = non_finite_logs(logs) + [f"{key} ({variables[key].name})" for key in arrays]
        notice = bool(self.notice and self.notice.requested)  # after validation: stop at the epoch's end
        self.deferred = self._stop_if_found(found, epoch_end_place(epoch + 1, self.steps), notice) or self.deferred

    def _stop_if_found(self, found: List[str], place: str, preempted: bool = False) -> bool:
        """The collective check, at the same point on every rank; returns whether any rank had the notice."""
        diverged, notices = self.count((bool(found), preempted))
        if not diverged:
            return bool(notices)
        message = diverged_message(place, self.gather(", ".join(found) or None), self.hosts)
        log.error("%s; every rank stops here, nothing is exported", message)  # errors: on every rank
        raise TrainingDiverged(message)


class PreemptAtEpochEnd(keras.callbacks.Callback):
    """Every rank, after every other epoch-end callback: raises ``Preempted`` once rank 0's checkpoint is complete
    when ``guard`` deferred a notice."""

    def __init__(self, guard: DivergenceGuard):
        super().__init__()
        self.guard = guard

    def on_epoch_end(self, epoch, logs=None):
        if self.guard.deferred:
            name = self.guard.agree(os.path.basename(marker_path("", epoch + 1)))
            raise Preempted(f"preempted: every rank stopped after epoch {epoch + 1} (a SIGTERM)", name)


class HostsUpdateCheck(keras.callbacks.Callback):
    """Elastic mode, every rank at an epoch's end after its checkpoint: Horovod's ``check_host_updates()``.

    Raises ``HostsUpdatedInterrupt`` on every rank alike; not after the last epoch nor an early stop."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 < self.params.get("epochs", 0) and not self.model.stop_training:
            self.state.check_host_updates()


def rank0_value(value):
    """Rank 0's ``value`` on every rank (``broadcast_object``); collective, returns once rank 0 reached it."""
    import horovod.tensorflow as hvd_tf

    return hvd_tf.broadcast_object(value, root_rank=0, name="preempted_checkpoint")


def ranks_flagged(flags: Sequence[bool]) -> tuple:
    """For each of ``flags``, the number of ranks whose flag is true (one float32 allreduce, Sum)."""
    import horovod.tensorflow as hvd_tf
    import tensorflow as tf

    summed = hvd_tf.allreduce(tf.constant([float(f) for f in flags], tf.float32), op=hvd_tf.Sum,
                              name="divergence_count")
    return tuple(float(v) for v in summed.numpy())


def gather_ranks(value) -> list:
    """Every rank's ``value``, by rank (Horovod's ``allgather_object``)."""
    import horovod.tensorflow as hvd_tf

    return hvd_tf.allgather_object(value, name="divergence_gather")


class TrackEpochs(keras.callbacks.Callback):
    """Rank 0: each epoch's logs to MLflow at ``step`` = the 1-based epoch (never raises)."""

    def __init__(self, tracker):
        super().__init__()
        self.tracker = tracker

    def on_epoch_end(self, epoch, logs=None):
        self.tracker.log_epoch(epoch + 1, logs or {})


class ProgressMark(keras.callbacks.Callback):
    """Rank 0, after each step: the run's newest step in its output folder (``progress.write_mark``).

    A URI ``--output`` (``outputs``) receives it at most every ``every_s`` seconds."""

    def __init__(self, folder: str, run_id: str, outputs=None, every_s: float = progress.UPLOAD_EVERY_S,
                 clock=time.monotonic):
        super().__init__()
        self.folder, self.run_id, self.outputs, self.every_s, self.clock = folder, run_id, outputs, every_s, clock
        self._epoch, self._uploaded = 0, clock()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch  # epochs done before this one

    def on_train_batch_end(self, batch, logs=None):
        name = os.path.basename(progress.write_mark(self.folder, self.run_id, self._epoch, batch + 1))
        now = self.clock()
        if self.outputs is not None and now - self._uploaded >= self.every_s:
            self._uploaded = now
            self.outputs.upload(name)


class SyncOutputs(keras.callbacks.Callback):
    """Rank 0, after the callbacks that write the epoch's files: uploads them to a URI ``--output``, marker last."""

    def __init__(self, outputs):
        super().__init__()
        self.outputs = outputs

    def on_epoch_end(self, epoch, logs=None):
        tick_watchdog(f"the upload of epoch {epoch + 1}'s files")
        self.outputs.push(last=os.path.basename(marker_path("", epoch + 1)))


class WatchdogTicks(keras.callbacks.Callback):
    """Ticks a rank's ``Watchdog`` inside ``fit`` before and after each step; ``around`` gives the pair to put
    first and last (the last also starts and stops the watchdog)."""

    def __init__(self, watchdog, ends: bool):
        super().__init__()
        self.watchdog, self.ends, self._epoch = watchdog, ends, 0

    @classmethod
    def around(cls, watchdog) -> "tuple":
        """``(first, last)`` callbacks."""
        return cls(watchdog, ends=False), cls(watchdog, ends=True)

    def on_train_begin(self, logs=None):
        if self.ends:
            self.watchdog.start()

    def on_train_end(self, logs=None):
        if self.ends:
            self.watchdog.stop()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch + 1
        if self.ends:
            self.watchdog.tick(f"the start of epoch {self._epoch}")

    def on_train_batch_begin(self, batch, logs=None):
        if self.ends:
            self.watchdog.tick(f"step {batch + 1} of epoch {self._epoch}", waits=True)

    def on_train_batch_end(self, batch, logs=None):
        if self.ends:
            self.watchdog.tick(f"the rank's own work after step {batch + 1} of epoch {self._epoch}")

    def on_epoch_end(self, epoch, logs=None):
        if self.ends:
            self.watchdog.tick(f"the rank's own work after epoch {epoch + 1}")
        else:
            self.watchdog.tick(f"the validation and checkpoint of epoch {epoch + 1}", waits=True)


def stop_watchdogs(callbacks) -> None:
    """Stop the watchdog of any ``WatchdogTicks`` in ``callbacks`` (a ``fit`` that raises calls no ``on_train_end``)."""
    for callback in callbacks:
        if isinstance(callback, WatchdogTicks) and callback.ends:
            callback.watchdog.stop()


class EpochCSVLogger(keras.callbacks.CSVLogger):
    """Keras' ``CSVLogger`` (``history.csv``) with 1-based epochs, opened never through a link."""

    def on_train_begin(self, logs=None):
        """Open ``history.csv`` to append (no header if it has a line) or anew.

        Raises:
            pipelines.io.nofollow.LinkRefused: it is a symbolic link or not a regular file."""
        self.append_header = True
        if self.append and os.path.lexists(self.filename):
            folder, name = os.path.split(os.path.abspath(self.filename))
            self.append_header = not nofollow.read_text_below(folder, name).split("\n", 1)[0]
        binary = nofollow.open_write(self.filename, 0o644, append=self.append)
        self.csv_file = io.TextIOWrapper(binary, encoding="utf-8", newline="")

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch + 1, logs)
