"""The shapes of the records a training output holds (JSON only), checked before any field is used."""
from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Tuple

#: The largest count a record may hold for an epoch, a step or a size (2**53: exact in a float).
LARGEST = 2 ** 53


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < LARGEST


def field_problem(record: Dict, fields: Iterable[Tuple[str, str, bool]]) -> Optional[str]:
    """The first of ``fields`` (``(key, kind, required)``) that ``record`` holds in another shape, as a phrase."""
    tests = {"count": _count, "str": lambda v: isinstance(v, str),
             "dict": lambda v: isinstance(v, dict), "list": lambda v: isinstance(v, list)}
    for key, kind, required in fields:
        if key not in record or (record[key] is None and not required):
            if required:
                return f"{key}: missing"
            continue
        if not tests[kind](record[key]):
            return f"{key}: expected {'a count (an integer >= 0)' if kind == 'count' else 'a ' + kind}, " \
                   f"got {_kind(record[key])}"
    return None


def run_problem(run: Any, where: str = "run") -> Optional[str]:
    """What is wrong with a run's identity (`RunIdentity.record`), or ``None``."""
    if not isinstance(run, dict):
        return f"{where}: expected a dict, got {_kind(run)}"
    found = field_problem(run, [("id", "str", False), ("config", "dict", False), ("world", "dict", False),
                            ("data_sha256", "str", False), ("data_run_id", "str", False)])
    if found is None and isinstance(run.get("world"), dict):
        found = field_problem(run["world"], [(k, "count", False) for k in ("world_size", "batch_size", "global_batch_size")])
        found = found and f"world.{found}"
    return found and f"{where}.{found}"


def marker_problem(marker: Any) -> Optional[str]:
    """What is wrong with a checkpoint marker's shape (`CheckpointMarker`), or ``None`` when every field read is sound.
    """
    if not isinstance(marker, dict):
        return f"expected a JSON object, got {_kind(marker)}"
    found = field_problem(marker, [("epoch", "count", True), ("step", "count", False), ("weights", "str", True),
                               ("weights_bytes", "count", True), ("weights_sha256", "str", False),
                               ("early_stopping", "dict", True),
                               ("history", "list", False), ("segments", "list", False), ("logs", "dict", False),
                               ("epoch_logs", "list", False)])
    if found is None and marker.get("phase", 1) not in (1, 2):
        found = f"phase: expected 1 or 2, got {marker.get('phase')!r}"
    if found is None and isinstance(marker.get("early_stopping"), dict):
        best = marker["early_stopping"].get("best_epoch")
        found = None if best is None or _count(best) else f"early_stopping.best_epoch: expected a count, got {_kind(best)}"
    if found is None and any(not isinstance(s, dict) for s in marker.get("segments") or []):
        found = "segments: expected a list of objects"
    if found is None and any(not isinstance(e, dict) or not all(isinstance(v, (int, float)) for v in e.values())
                             for e in marker.get("epoch_logs") or []):
        found = "epoch_logs: expected a list of objects of numbers"
    if found is None and marker.get("run") is not None:
        found = run_problem(marker["run"])
    return found


def record_problem(record: Any) -> Optional[str]:
    """What is wrong with a run record's shape (``train_run.json``), or ``None``."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {_kind(record)}"
    found = field_problem(record, [("run", "dict", True), ("files", "list", False), ("data", "str", False)])
    if found is None:
        found = run_problem(record["run"])
    if found is None and any(not isinstance(name, str) for name in record.get("files") or []):
        found = "files: expected a list of names"
    return found
