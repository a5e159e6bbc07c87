"""Pure arithmetic of distributed training: batch sizes, steps, learning rates, checkpoints.

Stated once here, used by the job and tested without Horovod:

* global batch size = per-rank batch size x world size (Horovod's data parallelism: each rank
  computes gradients on its own batch, ``DistributedOptimizer`` averages them);
* steps per epoch = ``train_rows // global_batch`` from the manifest's global counts, the same on
  every rank whatever its shard holds (Horovod deadlocks when ranks run different step counts);
* learning rate = ``base_lr x world_size`` (Goyal et al. 2017, "Accurate, Large Minibatch SGD:
  Training ImageNet in 1 Hour", linear scaling rule), optionally reached by a linear warmup.
"""
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
    """Per-epoch step counts, identical on every rank.

    Attributes:
        global_batch: images per optimisation step over all ranks.
        steps_per_epoch: training steps per epoch (``train_rows // global_batch``).
        validation_steps: ``validation_rows // global_batch``, full global batches in the validation
            split (informational: validation evaluates the whole split, a smaller last batch too).
    """

    global_batch: int
    steps_per_epoch: int
    validation_steps: int


def plan_steps(train_rows: int, validation_rows: int, batch_size: int, world_size: int) -> Steps:
    """Steps per epoch from the manifest's global row counts.

    Raises:
        ValueError: ``batch_size`` or ``world_size`` below 1, or a global batch larger than the
            train split (no full step would fit: the job refuses instead of training on nothing).
            The evaluated splits are never refused: each epoch's validation is the exact evaluation of
            all of it (:func:`pipelines.training.evaluate.exact_validation`), whatever its size.
    """
    if batch_size < 1 or world_size < 1:
        raise Refused(f"batch size and world size must be >= 1, got {batch_size} and {world_size}")
    global_batch = global_batch_size(batch_size, world_size)
    if train_rows < global_batch:  # validation is the exact one-pass evaluation: any size fits
        raise Refused(f"global batch size {global_batch} (--batch-size {batch_size} x "
                      f"{plural(world_size, 'rank')}) is larger than the train split "
                      f"({plural(train_rows, 'row')}): lower --batch-size")
    return Steps(global_batch, train_rows // global_batch, validation_rows // global_batch)


def global_batch_size(batch_size: int, world_size: int) -> int:
    """Images per optimisation step over all ranks: ``batch_size`` per rank x ``world_size`` ranks."""
    return batch_size * world_size


def scaled_lr(base_lr: float, world_size: int) -> float:
    """Learning rate for ``world_size`` ranks: ``base_lr * world_size`` (linear scaling rule)."""
    return base_lr * world_size


def warmup_lr(epoch: float, base_lr: float, world_size: int, warmup_epochs: float) -> float:
    """Learning rate during Horovod's ``LearningRateWarmupCallback`` warmup.

    Horovod's formula (horovod/_keras/callbacks.py): with ``initial_lr = base_lr * size``,
    ``lr(epoch) = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)`` for fractional
    ``epoch`` in ``[0, warmup_epochs]``: it starts at ``base_lr`` and reaches ``base_lr * size``.
    After the warmup the rate stays at ``base_lr * size``.
    """
    target = scaled_lr(base_lr, world_size)
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return target
    return target / world_size * (epoch * (world_size - 1) / warmup_epochs + 1)


# --- checkpoints ------------------------------------------------------------------------------


def checkpoint_path(directory: str, epoch: int) -> str:
    """Checkpoint of 1-based ``epoch``: ``DIR/checkpoint-{epoch}.npz`` (trainable weights and optimizer
    state, :mod:`pipelines.training.model.checkpoints`; the name: :data:`pipelines.contract.CHECKPOINT_WEIGHTS`)."""
    return os.path.join(directory, CHECKPOINT_WEIGHTS.format(epoch=epoch))


def marker_path(directory: str, epoch: int) -> str:
    """Completion marker of a checkpoint, written (atomically) only after its weights file."""
    return os.path.join(directory, CHECKPOINT_MARKER.format(epoch=epoch))


def step_checkpoint_path(directory: str, epoch: int, step: int) -> str:
    """Checkpoint within 1-based ``epoch`` after its 1-based training ``step``:
    ``DIR/checkpoint-{epoch}-step-{step}.npz`` (:data:`pipelines.contract.STEP_CHECKPOINT_WEIGHTS`)."""
    return os.path.join(directory, STEP_CHECKPOINT_WEIGHTS.format(epoch=epoch, step=step))


def step_marker_path(directory: str, epoch: int, step: int) -> str:
    """Completion marker of a step checkpoint (:func:`step_checkpoint_path`)."""
    return os.path.join(directory, STEP_CHECKPOINT_MARKER.format(epoch=epoch, step=step))


def checkpoint_position(name: str) -> Tuple[int, int]:
    """Where in training a checkpoint file (weights or marker) was written, as ``(epochs done,
    steps done in the next epoch)``: ``checkpoint-3`` -> ``(3, 0)``, ``checkpoint-4-step-20`` ->
    ``(3, 20)``; ``(0, 0)`` for a name that is not a checkpoint's. Orders checkpoints in time."""
    match = CHECKPOINT_NAME.match(name)
    if not match:
        return 0, 0
    epoch, step = int(match.group(1)), int(match.group(2) or 0)
    return (epoch - 1, step) if step else (epoch, 0)


def marker_weights(marker: Dict, what: str) -> str:
    """The weights file a checkpoint marker names (``weights``), checked to be a checkpoint's plain
    name in the marker's own folder (:func:`pipelines.contract.plain_name`).

    Raises:
        ValueError: an absolute, ``..``, nested, backslashed, empty or other name; naming ``what``.
    """
    name = plain_name(marker.get("weights") if isinstance(marker, dict) else None, what, CHECKPOINT_NAME)
    if not name.endswith(".npz"):
        raise Refused(f"{what}: the name {name!r} is a marker's, not a checkpoint's weights")
    return name


def checkpoint_markers(folder) -> List[Dict]:
    """Every readable checkpoint marker in ``folder`` (a :class:`pipelines.io.storage.Location`), newest
    first (:func:`checkpoint_position`: a step checkpoint within epoch N+1 is newer than epoch N's),
    each with ``_name`` (its own file name) added; a marker of another shape
    (:func:`pipelines.training.records.shapes.marker_problem`) or whose ``weights`` name is not a
    checkpoint's plain name (:func:`marker_weights`) is left out, with a warning."""
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
    """The newest checkpoint that may be resumed (:func:`sound_checkpoint`), or ``None``.

    Args:
        directory: a local folder, or a :class:`pipelines.io.storage.Location` (a remote ``--output``).
        markers: its :func:`checkpoint_markers`, where the caller has read them already (read here otherwise).

    Returns:
        the marker's content (``epoch``, ``weights``, ``weights_bytes``, and the training state
        saved with it, ``_name``: its file name), or ``None`` when there is none.
    """
    return sound_checkpoint(directory, markers)[0]


def sound_checkpoint(directory, markers: Optional[List[Dict]] = None) -> Tuple[Optional[Dict], List[str]]:
    """The newest checkpoint that may be resumed, and the damaged files passed over on the way.

    A checkpoint counts only with its marker (written after the weights: by rename on a local
    disk, uploaded after them to an object store) naming a weights file beside it whose size and
    sha256 are those the marker records, and which reads whole as an ``.npz``
    (:func:`pipelines.training.model.checkpoints.read_checkpoint`): a missing, truncated,
    NUL-filled or altered file is passed over with a one-line warning naming it. A marker naming
    anything but a checkpoint's plain name beside it is ignored (:func:`checkpoint_markers`). Nor
    is a diverged state ever picked: a checkpoint whose epoch logs, weights, optimizer state or
    best epoch's weights hold a NaN or infinite value is passed over with a warning
    (:func:`non_finite_state`). A sound checkpoint whose best epoch's file is damaged is resumed
    with its own last epoch as the best so far, said in a warning (:func:`best_taken_anew`).

    Args:
        directory: a local folder, or a :class:`pipelines.io.storage.Location`.
        markers: its :func:`checkpoint_markers` (read here when ``None``).

    Returns:
        ``(marker or None, ["checkpoint-3.npz (why)", ...])``: the damaged files passed over, newest first.
    """
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
    """The file of ``marker``'s best epoch when it is another file than the marker's own (a best
    epoch >= 1 before its epoch, or any best of a step checkpoint), else ``None``."""
    best = (marker.get("early_stopping") or {}).get("best_epoch")
    if isinstance(best, int) and best >= 1 and (best != marker.get("epoch") or marker.get("step")):
        return CHECKPOINT_WEIGHTS.format(epoch=best)
    return None


def own_marker(folder, weights: str) -> Dict:
    """The marker an epoch's weights file ``weights`` was written with, from ``folder``, or ``{}``
    when it is missing or unreadable (the file is then checked to read whole only)."""
    try:
        found = folder.join(weights[:-len(".npz")] + ".json").read_json()
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) and found.get("weights") == weights else {}


def file_damage(folder, weights: str, marker: Dict) -> Optional[str]:
    """Why the checkpoint file ``weights`` in ``folder`` cannot be resumed from, against the size
    and sha256 ``marker`` records (:func:`pipelines.training.model.checkpoints.read_checkpoint`), or ``None``."""
    try:
        read_checkpoint(folder.join(weights), marker.get("weights_bytes"), marker.get("weights_sha256"))
    except DamagedCheckpoint as exc:
        return str(exc)
    return None


def best_taken_anew(folder, marker: Dict) -> Optional[Dict]:
    """``marker`` with its own last epoch (``epoch``) as the best so far, when its best epoch's file
    is lost: that epoch's weights are the marker's own file (an epoch checkpoint) or, for a step
    checkpoint, the epoch's sound file; the best value is that epoch's ``monitor`` in the history,
    patience counts from it. ``None`` when there is no such epoch or value (a marker written before
    ``monitor`` was recorded)."""
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
    """What a complete checkpoint (``marker``, in ``folder``: a :class:`pipelines.io.storage.Location`)
    holds that is NaN or infinite: its epoch's logs (``"val_loss (nan)"``), then the keys of its
    weights file's arrays, then those of its best epoch's file (``"checkpoint-2.npz: trainable_0000"``,
    when that file is another one and can be read). ``[]``: finite, it may be resumed."""
    found = non_finite_logs(marker.get("logs"))
    names = [marker["weights"], *filter(None, [best_name(marker)])]
    for name in names:
        found += [f"{name}: {key}" for key in non_finite_checkpoint(folder.join(name))]
    return found


@dataclass(frozen=True)
class Segment:
    """One ``fit`` call of a run: epochs ``initial_epoch + 1 .. epochs`` (Keras' arguments), each of
    ``steps`` training steps, the first of them after ``steps_done`` steps of its epoch (0, or a step
    checkpoint's), reading the rank's stream from row ``start_row``."""

    initial_epoch: int
    epochs: int
    steps: int
    steps_done: int
    start_row: int


def fit_segments(epochs_done: int, steps_done: int, epochs: int, steps_per_epoch: int, batch_size: int,
                 first_epoch: int = 0) -> List[Segment]:
    """The ``fit`` calls that continue a run after ``epochs_done`` epochs and ``steps_done`` steps
    of the next (a checkpoint's position; ``(0, 0)``: a fresh run) up to ``epochs``: one, or, within
    an epoch, the rest of it and then the epochs after it (Keras starts ``fit`` at an epoch's first
    step only). ``steps_done == steps_per_epoch`` (a checkpoint of the epoch's trained steps, its
    validation interrupted) gives a first segment of no step: the epoch's end alone
    (:func:`pipelines.training.segment.end_epoch`). A rank reads ``batch_size`` rows of its stream per step
    (:mod:`pipelines.training.data.stream`), from the phase's ``first_epoch`` on (a fine-tuning phase
    opens its stream anew), so the stream row of a position is
    ``((epochs_done - first_epoch) * steps_per_epoch + steps_done) * batch_size``.

    Raises:
        ValueError: ``steps_done`` outside ``[0, steps_per_epoch]``, or a position before ``first_epoch``.
    """
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
