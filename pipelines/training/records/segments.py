"""The segments of a run: each launch that continued it, its world and where it began (pure).

``from_epoch`` and ``from_step`` are 1-based; a continued segment adds ``steps_redone`` (``None``: not known)."""
from __future__ import annotations

from typing import Dict, List, Optional

from pipelines.runtime.logs import plural
from pipelines.training.dataworld import DataWorld

REASONS = ("start", "resume", "relaunch")


def reason_of(resume: bool, relaunched: bool) -> str:
    """Why this launch runs: ``relaunch`` (after a lost rank), ``resume`` (``--resume``), or ``start``."""
    return "relaunch" if relaunched else "resume" if resume else "start"


def segment(world: DataWorld, world_size: int, epochs_done: int, steps_done: int, reason: str) -> Dict:
    """The segment of a launch on ``world_size`` ranks from a checkpoint's position (``0, 0``: the start)."""
    return {"world_size": world_size, "per_rank_batches": world.per_rank_batches(world_size),
            "from_epoch": epochs_done + 1, "from_step": steps_done + 1, "reason": reason}


def run_segments(marker: Optional[Dict], world: DataWorld, world_size: int, reason: str,
                 redone: Optional[int] = None) -> List[Dict]:
    """The segments ``marker`` records (one from the start if none), then this launch's, which redoes ``redone`` steps.
    """
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
    """A segment in words: ``world size 1 (per-rank batches 8) from epoch 2, step 4 (resume, 2 steps redone)``."""
    batches = ", ".join(map(str, entry.get("per_rank_batches") or []))
    why = entry.get("reason")
    if "steps_redone" in entry:
        redone = entry["steps_redone"]
        why = f"{why}, {'steps redone not known' if redone is None else plural(redone, 'step') + ' redone'}"
    return (f"world size {entry.get('world_size')} (per-rank batches {batches}) from epoch {entry.get('from_epoch')}, "
            f"step {entry.get('from_step')} ({why})")


def segment_params(segments: List[Dict]) -> Dict[str, str]:
    """MLflow params of the segments, ``{"segment.1": describe(first), ...}``; a continued run adds its own."""
    return {f"segment.{i}": describe(entry) for i, entry in enumerate(segments, 1)}
