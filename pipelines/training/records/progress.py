"""How far a run got before it was interrupted, so that a continued run can say how much work it redoes.

Rank 0 keeps :data:`pipelines.contract.PROGRESS` (``progress.json``) in its output folder: the
newest training step it saw end, ``{"run": <training run id>, "epoch": <epochs done>, "step":
<steps done in the next epoch>}`` (the coordinates of a checkpoint marker), rewritten atomically
after every step (a small local file: about 0.1 ms a step, where a step takes 100 ms or more) and
uploaded to a URI ``--output`` at most every :data:`UPLOAD_EVERY_S` seconds. A run continued from
a checkpoint (``--resume``, a relaunch) reads it before it trains: the steps the interrupted
segment trained after that checkpoint are trained again (:func:`steps_redone`). A lost rank, a
SIGKILL or a lost host loses them; a preemption notice checkpoints the step it arrived in, so
nothing is redone. Recorded in the continued segment (:mod:`pipelines.training.records.segments`),
``metrics.json`` and the MLflow run (issue 38).
"""
from __future__ import annotations

import json
import os
from typing import Dict, Optional

from pipelines.contract import PROGRESS
from pipelines.io.atomic import write_json
from pipelines.training.records.shapes import field_problem

#: The most bytes a mark is read to: one is about 70 (a longer file is not one).
MARK_BYTES = 4096

#: Seconds between two uploads of the mark to a URI ``--output``, at least (a PUT each).
UPLOAD_EVERY_S = 30.0


def write_mark(folder: str, run_id: str, epochs_done: int, steps_done: int) -> str:
    """Write ``folder/progress.json`` atomically: ``run_id``'s newest step, ``steps_done``
    (1-based count) within the epoch after ``epochs_done``. Returns its path."""
    path = os.path.join(folder, PROGRESS)
    write_json(path, {"run": run_id, "epoch": int(epochs_done), "step": int(steps_done)}, indent=0)
    return path


def read_mark(folder: Optional[str]) -> Optional[Dict]:
    """``folder/progress.json`` as written by :func:`write_mark`; ``None`` when there is none or
    it is not such a record (a mark is a figure, never a reason to refuse a run)."""
    if not folder:
        return None
    try:
        with open(os.path.join(folder, PROGRESS), "rb") as f:
            content = f.read(MARK_BYTES + 1)
        mark = json.loads(content.decode("utf-8")) if len(content) <= MARK_BYTES else None
    except (OSError, ValueError):
        return None
    if not isinstance(mark, dict) or not isinstance(mark.get("run"), str) or \
            field_problem(mark, [("epoch", "count", True), ("step", "count", True)]):
        return None
    return mark


def steps_redone(mark: Optional[Dict], marker: Optional[Dict], steps_per_epoch: int, run_id: str) -> Optional[int]:
    """Training steps the interrupted segment of run ``run_id`` trained after the checkpoint
    ``marker`` that a continued run starts from, which it trains again: the mark's global step
    (``epoch x steps_per_epoch + step``) minus the checkpoint's, at least 0.

    ``None`` (not known): no checkpoint (a run from its start redoes nothing it recorded), no
    mark, or a mark of another run (an output replaced since).
    """
    if not marker or not mark or mark.get("run") != run_id:
        return None
    done = int(marker.get("epoch") or 0) * steps_per_epoch + int(marker.get("step") or 0)
    reached = mark["epoch"] * steps_per_epoch + mark["step"]
    return max(0, reached - done)
