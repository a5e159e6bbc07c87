"""Pure arithmetic of distributed training: batch sizes, steps, learning rates, checkpoints.

Steps per epoch come from the manifest's global counts, the same on every rank (Horovod deadlocks otherwise)."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from pipelines.contract import (
    CHECKPOINT_MARKER,
    CHECKPOINT_NAME,
    CHECKPOINT_WEIGHTS,
    STEP_CHECKPOINT_MARKER,
    STEP_CHECKPOINT_WEIGHTS,
    plain_name,
)
from pipelines.io.storage import Location, resolve
from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural
from pipelines.training.divergence import non_finite_logs
from pipelines.training.model.checkpoints import DamagedCheckpoint, non_finite_checkpoint, read_checkpoint
from pipelines.training.records.shapes import marker_problem


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


# --- checkpoints ------------------------------------------------------------------------------


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


def checkpoint_markers(folder) -> List[Dict]:
    """Every readable checkpoint marker in ``folder`` (a ``Location``), newest first, with ``_name`` added;
    malformed ones are skipped with a warning."""
    import logging

    markers = []
    infos = sorted(folder.list(recursive=False), key=lambda i: checkpoint_position(i.base_name), reverse=True)
    for info in infos:
        if CHECKPOINT_NAME.match(info.base_name) and info.base_name.endswith(".json"):
            what = f"checkpoint marker {folder.join(info.base_name).uri}"
            try:
                marker = folder.join(info.base_name).read_json()
                problem = marker_problem(marker)
                if problem:
                    raise ValueError(f"{what} is not a marker's shape: {problem}")
                marker_weights(marker, what)
            except ValueError as exc:  # JSONDecodeError too
                logging.getLogger("pipelines").warning("ignored: %s", exc)
                continue
            except OSError:
                continue
            markers.append({**marker, "_name": info.base_name})
    return markers


def newest_complete_checkpoint(directory, markers: Optional[List[Dict]] = None) -> Optional[Dict]:
    """The newest checkpoint that may be resumed (``sound_checkpoint``'s marker), or ``None``."""
    return sound_checkpoint(directory, markers)[0]


def sound_checkpoint(directory, markers: Optional[List[Dict]] = None) -> Tuple[Optional[Dict], List[str]]:
    """The newest sound checkpoint (size, sha256 and finiteness checked) and the damaged files passed over.

    If only the best epoch's file is damaged, the marker's own epoch becomes the best.

    Returns:
        ``(marker or None, ["checkpoint-3.npz (why)", ...])``, newest first."""
    log = logging.getLogger("pipelines")
    folder = directory if isinstance(directory, Location) else resolve(directory)
    passed: List[str] = []
    for marker in checkpoint_markers(folder) if markers is None else markers:
        damage = file_damage(folder, marker["weights"], marker)
        if damage:
            log.warning("ignored: checkpoint %s in %s is damaged (%s): an older sound one is resumed",
                        marker["weights"], folder.uri, damage)
            passed.append(f"{marker['weights']} ({damage})")
            continue
        found = non_finite_state(folder, marker)
        if found:
            log.warning("ignored: checkpoint %s in %s holds non-finite values (%s): a diverged state is never resumed",
                        marker["_name"], folder.uri, ", ".join(found))
            continue
        best = best_name(marker)
        damage = best and file_damage(folder, best, own_marker(folder, best))
        if not damage:
            return marker, passed
        taken = best_taken_anew(folder, marker)
        log.warning("checkpoint %s in %s, the best epoch's weights, is damaged (%s): %s", best, folder.uri, damage,
                    f"resuming {marker['_name']} with epoch {taken['epoch']} as the best so far" if taken else
                    f"{marker['_name']} is passed over")
        passed.append(f"{best} ({damage})")
        if taken:
            return taken, passed
    return None, passed


def best_name(marker: Dict) -> Optional[str]:
    """The file of ``marker``'s best epoch when it differs from the marker's own, else ``None``."""
    best = (marker.get("early_stopping") or {}).get("best_epoch")
    if isinstance(best, int) and best >= 1 and (best != marker.get("epoch") or marker.get("step")):
        return CHECKPOINT_WEIGHTS.format(epoch=best)
    return None


def own_marker(folder, weights: str) -> Dict:
    """The marker written with epoch weights file ``weights``, or ``{}`` when missing or unreadable."""
    try:
        found = folder.join(weights[:-len(".npz")] + ".json").read_json()
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) and found.get("weights") == weights else {}


def file_damage(folder, weights: str, marker: Dict) -> Optional[str]:
    """Why checkpoint file ``weights`` in ``folder`` cannot be resumed (size, sha256, read), or ``None``."""
    try:
        read_checkpoint(folder.join(weights), marker.get("weights_bytes"), marker.get("weights_sha256"))
    except DamagedCheckpoint as exc:
        return str(exc)
    return None


def best_taken_anew(folder, marker: Dict) -> Optional[Dict]:
    """``marker`` with its own epoch as the best so far; ``None`` when that epoch's file or value is missing."""
    stopping, epoch = marker.get("early_stopping") or {}, marker.get("epoch")
    monitor = stopping.get("monitor")
    logs = [entry for entry in marker.get("history") or [] if isinstance(entry, dict) and entry.get("epoch") == epoch]
    value = logs[-1].get(monitor) if logs and monitor else None
    if not isinstance(value, (int, float)) or not isinstance(epoch, int) or epoch < 1:
        return None
    own = CHECKPOINT_WEIGHTS.format(epoch=epoch)
    if marker.get("step") and file_damage(folder, own, own_marker(folder, own)):
        return None
    return {**marker, "early_stopping": {**stopping, "best": float(value), "wait": 0, "best_epoch": epoch}}


def non_finite_state(folder, marker: Dict) -> List[str]:
    """What a checkpoint holds that is NaN or infinite (logs, weights' keys, best's keys); ``[]`` when finite."""
    found = non_finite_logs(marker.get("logs"))
    names = [marker["weights"], *filter(None, [best_name(marker)])]
    for name in names:
        found += [f"{name}: {key}" for key in non_finite_checkpoint(folder.join(name))]
    return found


@dataclass(frozen=True)
class Segment:
    """One ``fit`` call: epochs ``initial_epoch + 1 .. epochs`` of ``steps`` steps, the first after
    ``steps_done`` steps; the rank's stream is read from ``start_row``."""

    initial_epoch: int
    epochs: int
    steps: int
    steps_done: int
    start_row: int


def fit_segments(epochs_done: int, steps_done: int, epochs: int, steps_per_epoch: int, batch_size: int,
                 first_epoch: int = 0) -> List[Segment]:
    """The ``fit`` calls that continue a run from ``(epochs_done, steps_done)`` up to ``epochs``.

    Raises:
        ValueError: ``steps_done`` outside ``[0, steps_per_epoch]``, or a position before ``first_epoch``."""
    if not 0 <= steps_done <= steps_per_epoch or epochs_done < first_epoch:
        raise ValueError(f"no position after {plural(epochs_done, 'epoch')} and {plural(steps_done, 'step')} of "
                         f"{steps_per_epoch} (phase from epoch {first_epoch + 1})")

    def row(epoch: int, step: int) -> int:
        return ((epoch - first_epoch) * steps_per_epoch + step) * batch_size

    if not steps_done:
        return [Segment(epochs_done, epochs, steps_per_epoch, 0, row(epochs_done, 0))]
    rest = Segment(epochs_done, epochs_done + 1, steps_per_epoch - steps_done, steps_done, row(epochs_done, steps_done))
    if epochs_done + 1 >= epochs:
        return [rest]
    return [rest, Segment(epochs_done + 1, epochs, steps_per_epoch, 0, row(epochs_done + 1, 0))]
