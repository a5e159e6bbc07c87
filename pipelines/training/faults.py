"""The tests' fault hooks inside a rank (:data:`pipelines.launch.rankenv.FAULT_ENV`): a rank that
starts late, fails, is killed, stalls, turns NaN or gets a preemption notice at a known point. A
production run carries none of them (:meth:`FaultInjection.requested`)."""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Optional

import numpy as np

from pipelines.launch.rankenv import FAULT_ENV
from pipelines.stack.kerasapi import keras
from pipelines.training.schedule import marker_path

log = logging.getLogger("pipelines")


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
    known point). ``kill`` and ``term`` with ``step=S`` act after step S of epoch E instead (once
    rank 0's step checkpoints of that step are written): ``term`` sends the rank SIGTERM, a
    preemption notice (:mod:`pipelines.training.preemption`), ``termgroup`` sends it to the rank's
    process group (a launching driver and its ranks at once). With ``val_batch=B``, ``term`` and
    ``stall`` act in epoch E's exact validation instead, after rank R's validation batch B;
    ``val_sleep=S`` makes each of rank R's validation batches S seconds longer (a long validation
    of steady batches). With ``mark``, the wall-clock time of the fault (``time.time()``, seconds) is
    written to PATH first, so a test can time the verdict from the fault rather than from the job's
    start. With an empty ``spec`` it does nothing."""

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

    def on_train_batch_end(self, batch, logs=None):
        if self.active and self.at_step and (self._current, batch + 1) == (self.epoch, self.step):
            log.warning("injecting a fault (%s) after step %d of epoch %d (%s)", self.mode, self.step, self.epoch,
                        FAULT_ENV)
            if self.mode == "termgroup":  # every process of the job's group at once, as a machine's shutdown
                os.killpg(os.getpgid(0), signal.SIGTERM)
            else:
                os.kill(os.getpid(), signal.SIGKILL if self.mode == "kill" else signal.SIGTERM)

    def on_validation_batch_end(self, epoch, batch, logs=None):
        """Called by the exact validation after each batch (:func:`pipelines.training.evaluate.exact_validation`)."""
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
