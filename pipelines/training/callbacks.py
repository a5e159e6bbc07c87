"""Keras callbacks of the training job (besides Horovod's own)."""
from __future__ import annotations

import logging
import os
import signal
import statistics
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from pipelines.kerasapi import keras

from pipelines.atomic import write_json
from pipelines.launch.rankenv import FAULT_ENV
from pipelines.training.schedule import checkpoint_path, marker_path

log = logging.getLogger("pipelines")


class BestWeightsEarlyStopping(keras.callbacks.EarlyStopping):
    """``EarlyStopping`` that restores the best weights however training ends, and can resume.

    Keras 2.15 restores the best weights only when it stops the run itself; when the epochs run
    out the model keeps the last epoch's. This one also restores them at the end of training.
    ``state`` (from a checkpoint marker) continues a previous run's patience count and best value.
    """

    def __init__(self, state: Optional[Dict] = None, best_weights: Optional[List] = None, **kwargs):
        super().__init__(restore_best_weights=True, **kwargs)
        self._resume_state = state
        self._resume_best_weights = best_weights
        if state:  # a resumed run that had already finished reports it without calling fit
            self.best_epoch = state["best_epoch"] - 1

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self._resume_state:
            self.best = self._resume_state["best"]
            self.wait = self._resume_state["wait"]
            self.best_epoch = self._resume_state["best_epoch"] - 1  # Keras counts from 0
            self.best_weights = self._resume_best_weights

    def state(self) -> Dict:
        """JSON-ready state: best value, epochs waited, best epoch (1-based), stopped or not."""
        return {"best": float(self.best), "wait": int(self.wait), "best_epoch": int(self.best_epoch) + 1,
                "stopped": bool(self.model.stop_training)}

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self.stopped_epoch == 0 and self.best_weights is not None:
            self.model.set_weights(self.best_weights)


class EpochStats(keras.callbacks.Callback):
    """Adds ``lr``, ``epoch_seconds``, ``train_images_per_second``, ``step_ms`` and, under mixed
    precision, ``loss_scale`` to each epoch's logs.

    ``train_images_per_second`` counts the global batch of every training step (all ranks), over
    the training part of the epoch only (validation excluded). ``step_ms`` is the median wall time of
    one training step in milliseconds, from the start of one step to the start of the next (the last
    ends where validation starts): input, compute and allreduce together, the figure the scaling
    model is fitted to (docs/scaling-model.md). ``loss_scale`` is the dynamic loss scale at the
    epoch's end (Keras' ``LossScaleOptimizer``; absent in float32): a scale that keeps falling means
    float16 gradients overflow.
    """

    def __init__(self, steps_per_epoch: int, global_batch: int):
        super().__init__()
        self.images = steps_per_epoch * global_batch
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
        train_end = self._train_end or end
        train_seconds = train_end - self._start
        logs["lr"] = float(keras.backend.get_value(self.model.optimizer.lr))
        logs["epoch_seconds"] = end - self._start
        logs["train_images_per_second"] = self.images / train_seconds if train_seconds > 0 else 0.0
        logs["step_ms"] = 1000.0 * step_seconds(self._step_starts, train_end)
        scale = loss_scale(self.model.optimizer)
        if scale is not None:
            logs["loss_scale"] = scale


def step_seconds(starts: Sequence[float], end: float) -> float:
    """Median seconds per step from the steps' start times (seconds, increasing) and the end of the
    last step; 0.0 without steps."""
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


class CheckpointMarker(keras.callbacks.Callback):
    """Rank 0: writes epoch N's checkpoint (trainable weights + optimizer state, a few KB: see
    :mod:`pipelines.training.checkpoints`), then marks it complete, and keeps only the newest and
    the best checkpoints.

    The marker ``checkpoint-N.json`` is written to a temporary name and renamed after the
    checkpoint, and records the checkpoint's size, the sha256 of the frozen weights it goes with
    (``frozen_sha256``), the epoch's logs, the history so far and the early-stopping state, so that
    ``--resume`` picks only complete checkpoints, refuses other frozen weights, and continues
    exactly where training was. ``extra`` goes into every marker: the training phase
    (``{"phase": 1}`` by default; fine-tuning's adds phase 1's outcome, :mod:`pipelines.training.finetune`,
    and each phase 2 marker the sha256 of the weights that are not trained, ``non_trainable_sha256``,
    taken at the epoch's end: the frozen layers and every batch norm's moving statistics).
    """

    def __init__(self, directory: str, early_stopping: BestWeightsEarlyStopping, history: List[Dict],
                 frozen_sha256: Optional[str] = None, extra: Optional[Dict] = None):
        super().__init__()
        self.directory = directory
        self.early_stopping = early_stopping
        self.history = history
        self.frozen_sha256 = frozen_sha256
        self.extra = extra or {"phase": 1}

    def on_epoch_end(self, epoch, logs=None):
        from pipelines.training.checkpoints import FORMAT, save_checkpoint

        number = epoch + 1
        weights = checkpoint_path(self.directory, number)
        size = save_checkpoint(self.model, weights)
        self.history.append({"epoch": number, **{k: float(v) for k, v in (logs or {}).items()}})
        marker = {"epoch": number, "weights": os.path.basename(weights), "weights_bytes": size,
                  "format": FORMAT, "frozen_sha256": self.frozen_sha256, "logs": self.history[-1],
                  "history": self.history, "early_stopping": self.early_stopping.state(), **self.extra}
        if marker.get("phase") == 2:  # fine-tuning: what stayed frozen (layers, batch-norm statistics) at this epoch
            from pipelines.training.checkpoints import frozen_checksum
            marker["non_trainable_sha256"] = frozen_checksum(self.model)
        write_json(marker_path(self.directory, number), marker, indent=1)
        self._prune(keep={number, marker["early_stopping"]["best_epoch"]})

    def _prune(self, keep) -> None:
        """Delete the checkpoints that neither resume nor best-weights restoring need: all but
        the newest and the best."""
        for earlier in range(1, max(keep)):
            if earlier not in keep:
                for path in (marker_path(self.directory, earlier), checkpoint_path(self.directory, earlier)):
                    if os.path.exists(path):
                        os.remove(path)


class DivergenceGuard(keras.callbacks.Callback):
    """Every rank: ends the run on every rank at the same step when any rank's loss is NaN or
    infinite, or, at an epoch's end, any of the epoch's logs or the weights and optimizer state a
    checkpoint would hold (:func:`pipelines.training.checkpoints.checkpoint_variables`).

    After every training step each rank adds whether its own step's logs (``loss``: Keras' running
    mean over the epoch, so it turns non-finite at the very step one batch's loss did) hold a
    non-finite value, 0 or 1, to the others' (``count``: one float32 allreduced with Horovod's Sum);
    every rank sees the same total at the same step, so when it is not 0 all of them gather what
    each found (``gather``: ``allgather_object``) and raise the same
    :class:`~pipelines.training.divergence.TrainingDiverged`, naming the epoch, the step (both
    1-based), each rank that found one and its host. Keras' ``TerminateOnNaN`` stops the rank that
    sees the NaN only, and Horovod's other ranks then wait in the next allreduce for good. Place it
    before early stopping and the checkpoint writer: a diverged epoch is never chosen as best nor
    written. Its cost per step (one scalar allreduce over Gloo) is measured by
    ``benchmarks/divergence_bench.py``. ``count`` and ``gather`` stand in for Horovod's in tests.
    """

    def __init__(self, steps_per_epoch: int, count=None, gather=None):
        super().__init__()
        self.steps = steps_per_epoch
        self.count = count or ranks_flagged
        self.gather = gather or gather_ranks
        self.epoch = 0
        self.hosts: List[str] = []

    def on_train_begin(self, logs=None):
        import socket

        self.hosts = list(self.gather(socket.gethostname()))

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch + 1

    def on_train_batch_end(self, batch, logs=None):
        from pipelines.training.divergence import non_finite_logs, step_place

        self._stop_if_found(non_finite_logs(logs), step_place(self.epoch, batch + 1, self.steps))

    def on_epoch_end(self, epoch, logs=None):
        from pipelines.training.checkpoints import checkpoint_variables
        from pipelines.training.divergence import epoch_end_place, non_finite_arrays, non_finite_logs

        variables = checkpoint_variables(self.model)
        arrays = non_finite_arrays({key: v.numpy() for key, v in variables.items()})
        found = non_finite_logs(logs) + [f"{key} ({variables[key].name})" for key in arrays]
        self._stop_if_found(found, epoch_end_place(epoch + 1, self.steps))

    def _stop_if_found(self, found: List[str], place: str) -> None:
        """The collective step: every rank calls it at the same point, each with what it found."""
        from pipelines.training.divergence import TrainingDiverged, diverged_message

        if not self.count(bool(found)):
            return
        message = diverged_message(place, self.gather(", ".join(found) or None), self.hosts)
        log.error("%s; every rank stops here, nothing is exported", message)  # errors: on every rank
        raise TrainingDiverged(message)


def ranks_flagged(flag: bool) -> float:
    """The number of ranks whose ``flag`` is true (Horovod allreduce, Sum, of one float32)."""
    import horovod.tensorflow as hvd_tf
    import tensorflow as tf

    return float(hvd_tf.allreduce(tf.constant(float(flag), tf.float32), op=hvd_tf.Sum, name="divergence_count"))


def gather_ranks(value) -> list:
    """Every rank's ``value``, by rank (Horovod's ``allgather_object``)."""
    import horovod.tensorflow as hvd_tf

    return hvd_tf.allgather_object(value, name="divergence_gather")


class TrackEpochs(keras.callbacks.Callback):
    """Rank 0: each epoch's logs (loss, accuracy, val_loss, val_accuracy, lr, epoch_seconds,
    train_images_per_second, already averaged over ranks) to the MLflow run at ``step`` = the
    epoch (1-based), through a :class:`pipelines.tracking.Tracker`, which never raises here: a
    tracking failure must not stop training."""

    def __init__(self, tracker):
        super().__init__()
        self.tracker = tracker

    def on_epoch_end(self, epoch, logs=None):
        self.tracker.log_epoch(epoch + 1, logs or {})


class SyncOutputs(keras.callbacks.Callback):
    """Rank 0, after the callbacks that write the epoch's files: a URI ``--output`` receives them,
    the checkpoint's marker last (:meth:`pipelines.training.outputs.Outputs.push`); nothing for a
    local one."""

    def __init__(self, outputs):
        super().__init__()
        self.outputs = outputs

    def on_epoch_end(self, epoch, logs=None):
        self.outputs.push(last=os.path.basename(marker_path("", epoch + 1)))


def start_late(spec: str, rank: int) -> None:
    """Test hook: with ``late=S`` in the fault ``spec`` (:class:`FaultInjection`'s), rank R (``rank``
    is this one) sleeps S seconds before it joins Horovod, as a rank on a slow host starts late."""
    parts = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
    if "late" in parts and int(parts.get("rank", 0)) == rank:
        log.warning("injecting a fault (late) at the start: %s s (%s)", parts["late"], FAULT_ENV)
        time.sleep(float(parts["late"]))


class FaultInjection(keras.callbacks.Callback):
    """Test hook: ``spec`` = ``"rank=R,epoch=E,mode=raise|kill|stall|nan[,step=S][,mark=PATH][,late=S]"`` (the rank's
    :attr:`pipelines.launch.rankenv.RankEnvironment.fault`, from the test's variable). ``nan`` makes
    rank R's own loss NaN at step S (1-based, default 1) of epoch E: before that step it sets its
    first trainable weight to NaN, so its forward pass, and through the allreduced gradients every
    rank's weights, turn non-finite in a real training step (:class:`DivergenceGuard` stops the run
    there). The other modes make
    rank R fail at the end of epoch E (1-based), once that epoch's checkpoint is complete (another rank
    than 0 waits up to a minute for rank 0's marker in ``directory``): ``raise`` raises RuntimeError,
    ``kill`` sends itself SIGKILL, ``stall`` sleeps for good (the other ranks wait in epoch E+1's
    first allreduce, so no later checkpoint can complete: a test then takes the rank's host away at a
    known point). With ``mark``, the wall-clock time of the fault (``time.time()``, seconds) is
    written to PATH first, so a test can time the verdict from the fault rather than from the job's
    start. With an empty ``spec`` it does nothing."""

    def __init__(self, spec: str, rank: int, directory: str = ""):
        super().__init__()
        parts = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
        self.active = bool(parts) and int(parts.get("rank", 0)) == rank
        self.epoch = int(parts.get("epoch", 0))
        self.step = int(parts.get("step", 1))
        self.mode = parts.get("mode", "raise")
        self.mark = parts.get("mark")
        self.directory = directory
        self._current = 0

    @classmethod
    def requested(cls, spec: str, rank: int, directory: str = "") -> "Optional[FaultInjection]":
        """The hook for ``rank`` where the test variable gave a ``spec``, else ``None``: a production
        run carries no test callback at all. A run that has one says so once, at its start, on rank 0."""
        if not spec:
            return None
        if rank == 0:
            log.warning("test hook %s is set (%s): a fault will be injected", FAULT_ENV, spec)
        return cls(spec, rank, directory)

    def on_epoch_begin(self, epoch, logs=None):
        self._current = epoch + 1

    def on_train_batch_begin(self, batch, logs=None):
        if self.active and self.mode == "nan" and (self._current, batch + 1) == (self.epoch, self.step):
            log.warning("injecting a fault (nan) at epoch %d, step %d (%s)", self.epoch, self.step, FAULT_ENV)
            weight = self.model.trainable_weights[0]
            weight.assign(np.full(weight.shape, np.nan, weight.dtype.as_numpy_dtype))

    def on_epoch_end(self, epoch, logs=None):
        if self.active and self.mode != "nan" and epoch + 1 == self.epoch:
            deadline = time.monotonic() + 60
            while self.directory and not os.path.exists(marker_path(self.directory, self.epoch)) \
                    and time.monotonic() < deadline:
                time.sleep(0.1)
            log.warning("injecting a fault (%s) at the end of epoch %d (%s)", self.mode, self.epoch, FAULT_ENV)
            if self.mark:
                with open(self.mark, "w") as f:
                    f.write(repr(time.time()))
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            while self.mode == "stall":
                time.sleep(60)
            raise RuntimeError(f"injected fault at the end of epoch {self.epoch} ({FAULT_ENV})")


class WatchdogTicks(keras.callbacks.Callback):
    """Ticks a rank's :class:`~pipelines.launch.watchdog.Watchdog` from inside ``fit``: before each
    step (``waits``: the step's allreduce waits on every rank) and after it (the rank's own work
    until the next one). The pair :meth:`around` gives goes first and last among the callbacks:
    the first ticks, at each epoch's end, that the end-of-epoch work begins (validation's and the
    checkpoint's collectives: ``waits``), the last that it ended (the rank's own work again). The
    last one starts the watchdog when training begins and stops it when training ends."""

    def __init__(self, watchdog, ends: bool):
        super().__init__()
        self.watchdog, self.ends, self._epoch = watchdog, ends, 0

    @classmethod
    def around(cls, watchdog) -> "tuple":
        """``(first, last)``: the callbacks to put before and after every other one."""
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


class EpochCSVLogger(keras.callbacks.CSVLogger):
    """Keras' ``CSVLogger`` (``history.csv``: one row of logs per epoch), its ``epoch`` column
    counted from 1 as everything else of a run counts them (the console, checkpoints,
    ``metrics.json``'s history and best epoch); Keras' own logger writes the 0-based index."""

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch + 1, logs)
