"""The segments of a run: each launch that continued it, its world and where it began (issue 38).

A run interrupted and continued (``--resume``, a relaunch after a lost rank) is trained in
segments, each on a world size of its own (:mod:`pipelines.training.dataworld`: the arithmetic is
the data world's throughout). A segment is recorded as::

    {"world_size": 1, "per_rank_batches": [8], "from_epoch": 2, "from_step": 4, "reason": "resume",
     "steps_redone": 2}

``from_epoch`` and ``from_step`` are the 1-based epoch and step of its first training step (``1,
1`` for a run's start; after a step checkpoint written after step 3 of epoch 2: ``2, 4``; after
epoch 2's checkpoint: ``3, 1``); ``reason`` is ``start``, ``resume`` or ``relaunch``; a
continued segment's ``steps_redone`` is what the interrupted one trained after that checkpoint
(:func:`pipelines.training.records.progress.steps_redone`; ``None``: not known). The list
travels in every checkpoint marker (``segments``), like the history, so it holds the segments
whose work a checkpoint kept, and ends in ``metrics.json`` (``segments``, ``interruptions``) and
the MLflow run (a ``segment.<i>`` param each, the ``interruptions`` and ``steps_redone``
metrics). Pure.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from pipelines.runtime.logs import plural
from pipelines.training.dataworld import DataWorld

REASONS = ("start", "resume", "relaunch")


def reason_of(resume: bool, relaunched: bool) -> str:
    """Why this launch runs: ``relaunch`` (after a lost rank), ``resume`` (``--resume``), or ``start``."""
    return "relaunch" if relaunched else "resume" if resume else "start"


def segment(world: DataWorld, world_size: int, epochs_done: int, steps_done: int, reason: str) -> Dict:
    """The segment of a launch on ``world_size`` ranks of a run of data world ``world``, from a
    checkpoint's position (``epochs_done``, ``steps_done`` of the next epoch; ``0, 0``: the start)."""
    return {"world_size": world_size, "per_rank_batches": world.per_rank_batches(world_size),
            "from_epoch": epochs_done + 1, "from_step": steps_done + 1, "reason": reason}


def run_segments(marker: Optional[Dict], world: DataWorld, world_size: int, reason: str,
                 redone: Optional[int] = None) -> List[Dict]:
    """The run's segments with this launch's last: those the checkpoint ``marker`` it continues
    records (a marker written before segments were recorded: one segment on the data world from
    the start, ``reason`` ``start``), then this launch's at the marker's position, with the steps
    it trains again, ``redone``. No marker: a run from its start, one segment."""
    if not marker:
        return [segment(world, world_size, 0, 0, reason)]
    earlier = marker.get("segments")
    if not isinstance(earlier, list) or not earlier:
        earlier = [segment(world, world.size, 0, 0, "start")]
    continued = segment(world, world_size, int(marker.get("epoch") or 0), int(marker.get("step") or 0), reason)
    return [*earlier, {**continued, "steps_redone": redone}]


def interruptions(segments: List[Dict]) -> int:
    """How often the run was interrupted and continued: segments after the first."""
    return max(0, len(segments) - 1)


def steps_redone(segments: List[Dict]) -> int:
    """Steps trained twice over the run: the continued segments' ``steps_redone`` that are known."""
    return sum(entry.get("steps_redone") or 0 for entry in segments[1:])


def describe(entry: Dict) -> str:
    """``world size 1 (per-rank batches 8) from epoch 2, step 4 (resume, 2 steps redone)``: a
    segment in words (a continued one says its steps redone, or that they are not known)."""
    batches = ", ".join(map(str, entry.get("per_rank_batches") or []))
    why = entry.get("reason")
    if "steps_redone" in entry:
        redone = entry["steps_redone"]
        why = f"{why}, {'steps redone not known' if redone is None else plural(redone, 'step') + ' redone'}"
    return (f"world size {entry.get('world_size')} (per-rank batches {batches}) from epoch {entry.get('from_epoch')}, "
            f"step {entry.get('from_step')} ({why})")


def segment_params(segments: List[Dict]) -> Dict[str, str]:
    """MLflow params of the segments: ``{"segment.1": describe(first), ...}``, 1-based (a continued
    MLflow run logs only the params it lacks: each launch adds its own)."""
    return {f"segment.{i}": describe(entry) for i, entry in enumerate(segments, 1)}
