"""The tests' fault hooks inside a rank: late start, failure, kill, stall, NaN or preemption at a known
point. A production run carries none of them."""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Optional

import numpy as np

from pipelines.launch.rankenv import FAULT_ENV
from pipelines.stack.kerasapi import keras
from pipelines.training.checkpoints.names import marker_path

log = logging.getLogger("pipelines")


def start_late(spec: str, rank: int) -> None:
    """Test hook: with ``late=S`` in the fault ``spec``, rank R sleeps S seconds before joining Horovod."""
    parts = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
    if "late" in parts and int(parts.get("rank", 0)) == rank:
        log.warning("injecting a fault (late) at the start: %s s (%s)", parts["late"], FAULT_ENV)
        time.sleep(float(parts["late"]))


class FaultInjection(keras.callbacks.Callback):
    """Test hook: ``spec`` = ``"rank=R,epoch=E,mode=raise|kill|stall|nan[,step=S][,mark=PATH][,late=S]"``.

    ``nan``: before step S (default 1) of epoch E rank R's first trainable weight becomes NaN. ``raise``,
    ``kill``, ``stall``: at the end of epoch E, once its checkpoint is complete (other ranks wait up to a
    minute for rank 0's marker in ``directory``). ``kill``, ``term``, ``termgroup`` with ``step=S``: after step
    S instead (SIGKILL, SIGTERM, SIGTERM to the process group). ``val_batch=B``: ``term``/``stall`` after
    validation batch B; ``val_sleep=S``: S seconds more per validation batch. ``mark=PATH``: ``time.time()``
    written there first (epoch-end and validation faults). An empty ``spec`` does nothing."""

    def __init__(self, spec: str, rank: int, directory: str = ""):
        super().__init__()
        parts = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
        self.active = bool(parts) and int(parts.get("rank", 0)) == rank
        self.epoch = int(parts.get("epoch", 0))
        self.step = int(parts.get("step", 1))
        self.at_step = "step" in parts and parts.get("mode") in ("kill", "term", "termgroup")
        self.mode = parts.get("mode", "raise")
        self.mark = parts.get("mark")
        self.val_batch = int(parts["val_batch"]) if "val_batch" in parts else None
        self.val_sleep = float(parts.get("val_sleep", 0))
        self.directory = directory
        self._current = 0

    @classmethod
    def requested(cls, spec: str, rank: int, directory: str = "") -> "Optional[FaultInjection]":
        """The hook for ``rank`` when the test variable gave a ``spec``, else ``None``; rank 0 warns once."""
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

    def on_train_batch_end(self, batch, logs=None):
        if self.active and self.at_step and (self._current, batch + 1) == (self.epoch, self.step):
            log.warning("injecting a fault (%s) after step %d of epoch %d (%s)", self.mode, self.step, self.epoch,
                        FAULT_ENV)
            if self.mode == "termgroup":  # every process of the job's group at once, as a machine's shutdown
                os.killpg(os.getpgid(0), signal.SIGTERM)
            else:
                os.kill(os.getpid(), signal.SIGKILL if self.mode == "kill" else signal.SIGTERM)

    def on_validation_batch_end(self, epoch, batch, logs=None):
        """Called by the exact validation after each batch."""
        if self.active and self.val_sleep:
            time.sleep(self.val_sleep)
        if self.active and (epoch + 1, batch) == (self.epoch, self.val_batch):
            log.warning("injecting a fault (%s) after validation batch %d of epoch %d (%s)", self.mode, batch,
                        self.epoch, FAULT_ENV)
            if self.mark:
                with open(self.mark, "w") as f:
                    f.write(repr(time.time()))
            if self.mode == "term":
                os.kill(os.getpid(), signal.SIGTERM)
            while self.mode == "stall":
                time.sleep(60)

    def on_epoch_end(self, epoch, logs=None):
        if self.active and self.mode != "nan" and not self.at_step and self.val_batch is None \
                and epoch + 1 == self.epoch:
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
