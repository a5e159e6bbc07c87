"""A checkpoint's file names and the run position they stand for."""
from __future__ import annotations

import os
from typing import Dict, Tuple

from pipelines.contract import (
    CHECKPOINT_MARKER,
    CHECKPOINT_NAME,
    CHECKPOINT_WEIGHTS,
    STEP_CHECKPOINT_MARKER,
    STEP_CHECKPOINT_WEIGHTS,
    plain_name,
)
from pipelines.runtime.errors import Refused


def checkpoint_path(directory: str, epoch: int) -> str:
    """Checkpoint of 1-based ``epoch``: ``DIR/checkpoint-{epoch}.npz``."""
    return os.path.join(directory, CHECKPOINT_WEIGHTS.format(epoch=epoch))


def marker_path(directory: str, epoch: int) -> str:
    """Completion marker of a checkpoint, written (atomically) only after its weights file."""
    return os.path.join(directory, CHECKPOINT_MARKER.format(epoch=epoch))


def step_checkpoint_path(directory: str, epoch: int, step: int) -> str:
    """Checkpoint after 1-based ``step`` of 1-based ``epoch``: ``DIR/checkpoint-{epoch}-step-{step}.npz``."""
    return os.path.join(directory, STEP_CHECKPOINT_WEIGHTS.format(epoch=epoch, step=step))


def step_marker_path(directory: str, epoch: int, step: int) -> str:
    """Completion marker of a step checkpoint."""
    return os.path.join(directory, STEP_CHECKPOINT_MARKER.format(epoch=epoch, step=step))


def checkpoint_position(name: str) -> Tuple[int, int]:
    """``(epochs done, steps done in the next epoch)`` of a checkpoint name, e.g. ``checkpoint-4-step-20`` ->
    ``(3, 20)``; anything else ``(0, 0)``. Orders checkpoints in time."""
    match = CHECKPOINT_NAME.match(name)
    if not match:
        return 0, 0
    epoch, step = int(match.group(1)), int(match.group(2) or 0)
    return (epoch - 1, step) if step else (epoch, 0)


def marker_weights(marker: Dict, what: str) -> str:
    """The weights file a checkpoint marker names, checked to be a plain checkpoint name beside it.

    Raises:
        ValueError: an absolute, ``..``, nested, backslashed, empty or other name; naming ``what``."""
    name = plain_name(marker.get("weights") if isinstance(marker, dict) else None, what, CHECKPOINT_NAME)
    if not name.endswith(".npz"):
        raise Refused(f"{what}: the name {name!r} is a marker's, not a checkpoint's weights")
    return name
