"""Rank 0's checkpoints while training runs: each epoch's, and within an epoch at an interval or on
a preemption notice, each with its completion marker; older ones pruned."""
from __future__ import annotations

import os
import time
from typing import Dict, List, Optional

from pipelines.io.atomic import write_json
from pipelines.io.digest import file_sha256
from pipelines.launch.watchdog import progress as tick_watchdog
from pipelines.stack.kerasapi import keras
from pipelines.training.callbacks import BestWeightsEarlyStopping
from pipelines.training.checkpoints.files import FORMAT, frozen_checksum, save_checkpoint
from pipelines.training.checkpoints.names import (
    checkpoint_path,
    checkpoint_position,
    marker_path,
    step_checkpoint_path,
    step_marker_path,
)


class CheckpointMarker(keras.callbacks.Callback):
    """Rank 0: each epoch's checkpoint, then its completion marker; only the newest and best are kept.

    The marker, written atomically after the weights, records their size and sha256 and the frozen weights'
    sha256, so ``--resume`` takes only sound checkpoints of the same frozen weights."""

    def __init__(self, directory: str, early_stopping: BestWeightsEarlyStopping, history: List[Dict],
                 frozen_sha256: Optional[str] = None, extra: Optional[Dict] = None, every: Optional["Interval"] = None,
                 outputs=None):
        super().__init__()
        self.directory = directory
        self.early_stopping = early_stopping
        self.history = history
        self.frozen_sha256 = frozen_sha256
        self.extra = extra or {"phase": 1}
        self.every = every or Interval(None, None, 0)
        self.outputs = outputs  # a URI output receives each step checkpoint as it completes
        self.epoch = 0
        self._last = time.monotonic()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch + 1

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        if self.every.due(self.epoch, step, time.monotonic() - self._last):
            self.write_step(self.epoch, step)

    def on_epoch_end(self, epoch, logs=None):
        number = epoch + 1
        self.history.append({"epoch": number, **{k: float(v) for k, v in (logs or {}).items()}})
        marker = self._write(checkpoint_path(self.directory, number), marker_path(self.directory, number),
                             {"epoch": number, "logs": self.history[-1]}, self.early_stopping.state())
        self._prune(keep={number, marker["early_stopping"]["best_epoch"]})

    def write_step(self, epoch: int, step: int, epoch_logs: Optional[List[Dict]] = None) -> str:
        """A checkpoint after 1-based ``step`` of 1-based ``epoch``, replacing the previous step one; returns the
        marker's file name. ``epoch_logs``: every rank's logs of a fully trained epoch."""
        marker_file = step_marker_path(self.directory, epoch, step)
        where = {"epoch": epoch - 1, "step": step, "logs": None, **({"epoch_logs": epoch_logs} if epoch_logs else {})}
        self._write(step_checkpoint_path(self.directory, epoch, step), marker_file, where,
                    self.early_stopping.state(epoch - 1))
        self._prune(keep={epoch - 1, self.early_stopping.state(epoch - 1)["best_epoch"]}, steps_before=(epoch - 1, step))
        if self.outputs is not None:
            self.outputs.push(last=os.path.basename(marker_file))
        return os.path.basename(marker_file)

    def _write(self, weights: str, marker_file: str, where: Dict, early_stopping: Dict) -> Dict:
        tick_watchdog(f"the write of {os.path.basename(weights)}")
        size = save_checkpoint(self.model, weights)
        marker = {**where, "weights": os.path.basename(weights), "weights_bytes": size,
                  "weights_sha256": file_sha256(weights), "format": FORMAT,
                  "frozen_sha256": self.frozen_sha256, "history": self.history, "early_stopping": early_stopping,
                  **self.extra}
        if marker.get("phase") == 2:  # fine-tuning: what stayed frozen (layers, batch-norm statistics) at this epoch
            marker["non_trainable_sha256"] = frozen_checksum(self.model)
        write_json(marker_file, marker, indent=1)
        tick_watchdog(f"the rank's own work after {os.path.basename(marker_file)}")
        self._last = time.monotonic()
        return marker

    def _prune(self, keep, steps_before: Optional[tuple] = None) -> None:
        """Delete checkpoints neither resume nor best weights need (not in ``keep``, older than ``steps_before``)."""
        for earlier in range(1, max(keep)):
            if earlier not in keep:
                for path in (marker_path(self.directory, earlier), checkpoint_path(self.directory, earlier)):
                    if os.path.exists(path):
                        os.remove(path)
        newest = steps_before or (max(keep), 0)
        stale = [name for name in os.listdir(self.directory)
                 if "-step-" in name and (0, 0) < checkpoint_position(name) < newest]
        for name in sorted(stale, key=lambda n: not n.endswith(".json")):
            os.remove(os.path.join(self.directory, name))


class Interval:
    """When a step checkpoint is due: every ``steps``-th step of the run, or after ``minutes``; never at an
    epoch's last step."""

    def __init__(self, steps: Optional[int], minutes: Optional[float], steps_per_epoch: int):
        self.steps, self.minutes, self.steps_per_epoch = steps, minutes, steps_per_epoch

    def due(self, epoch: int, step: int, seconds_since_last: float) -> bool:
        """Whether 1-based ``step`` of 1-based ``epoch`` ends with a checkpoint."""
        if not 0 < step < self.steps_per_epoch:
            return False
        run_step = (epoch - 1) * self.steps_per_epoch + step
        return bool(self.steps and run_step % self.steps == 0) or \
            bool(self.minutes and seconds_since_last >= 60.0 * self.minutes)
