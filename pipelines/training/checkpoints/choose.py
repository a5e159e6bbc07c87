"""Which checkpoint a run continues from: markers read, damage and non-finite values found, the newest sound one."""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

from pipelines.contract import CHECKPOINT_NAME, CHECKPOINT_WEIGHTS
from pipelines.io.storage import Location, resolve
from pipelines.training.checkpoints.files import DamagedCheckpoint, non_finite_checkpoint, read_checkpoint
from pipelines.training.checkpoints.names import checkpoint_position, marker_weights
from pipelines.training.divergence import non_finite_logs
from pipelines.training.records.shapes import marker_problem


def checkpoint_markers(folder) -> List[Dict]:
    """Every readable checkpoint marker in ``folder`` (a ``Location``), newest first, with ``_name`` added;
    malformed ones are skipped with a warning."""
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
