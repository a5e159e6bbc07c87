"""Pure arithmetic of distributed training: batch sizes, steps per epoch, learning rates and their warmup.

Steps per epoch come from the manifest's global counts, the same on every rank (Horovod deadlocks otherwise)."""
from __future__ import annotations

from dataclasses import dataclass

from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural


@dataclass(frozen=True)
class Steps:
    """Per-epoch step counts, identical on every rank: ``global_batch`` (rows a step), ``steps_per_epoch``,
    ``validation_steps`` (full global batches; informational, validation reads the whole split)."""

    global_batch: int
    steps_per_epoch: int
    validation_steps: int


def plan_steps(train_rows: int, validation_rows: int, batch_size: int, world_size: int) -> Steps:
    """Steps per epoch from the manifest's global row counts.

    Raises:
        ValueError: ``batch_size`` or ``world_size`` below 1, or a global batch larger than the train split."""
    if batch_size < 1 or world_size < 1:
        raise Refused(f"batch size and world size must be >= 1, got {batch_size} and {world_size}")
    global_batch = global_batch_size(batch_size, world_size)
    if train_rows < global_batch:  # validation is the exact one-pass evaluation: any size fits
        raise Refused(f"global batch size {global_batch} (--batch-size {batch_size} x "
                      f"{plural(world_size, 'rank')}) is larger than the train split "
                      f"({plural(train_rows, 'row')}): lower --batch-size")
    return Steps(global_batch, train_rows // global_batch, validation_rows // global_batch)


def global_batch_size(batch_size: int, world_size: int) -> int:
    """Images per optimisation step over all ranks."""
    return batch_size * world_size


def scaled_lr(base_lr: float, world_size: int) -> float:
    """Learning rate for ``world_size`` ranks: ``base_lr * world_size``."""
    return base_lr * world_size


def warmup_lr(epoch: float, base_lr: float, world_size: int, warmup_epochs: float) -> float:
    """Horovod's warmup rate at fractional ``epoch``: linear from ``base_lr`` to ``base_lr * world_size`` at
    ``warmup_epochs``, constant after."""
    target = scaled_lr(base_lr, world_size)
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return target
    return target / world_size * (epoch * (world_size - 1) / warmup_epochs + 1)
