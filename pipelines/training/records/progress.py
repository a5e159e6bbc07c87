"""How far a run got before it was interrupted, so that a continued run can say how much work it redoes."""
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
    """Write ``folder/progress.json`` atomically: ``run_id``'s ``steps_done`` (1-based) after ``epochs_done``; its path.
    """
    path = os.path.join(folder, PROGRESS)
    write_json(path, {"run": run_id, "epoch": int(epochs_done), "step": int(steps_done)}, indent=0)
    return path


def read_mark(folder: Optional[str]) -> Optional[Dict]:
    """``folder/progress.json`` as `write_mark` writes it; ``None`` when absent or malformed (never a refusal)."""
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
    """Steps the interrupted segment of ``run_id`` trained after checkpoint ``marker``; ``None``: not known."""
    if not marker or not mark or mark.get("run") != run_id:
        return None
    done = int(marker.get("epoch") or 0) * steps_per_epoch + int(marker.get("step") or 0)
    reached = mark["epoch"] * steps_per_epoch + mark["step"]
    return max(0, reached - done)
