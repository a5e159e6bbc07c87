"""Copies of one image: one copy is written, every other copy is a recorded rejection; look-alikes are reported.

Copies: equal decoded pixels (undecoded: bytes); the smallest relative path is kept, the others are ``duplicate``,
or ``label conflict`` in another class. Look-alikes: difference hashes within `LOOK_ALIKE_DISTANCE` bits."""
from __future__ import annotations

from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

import numpy as np

DUPLICATE = "duplicate"
LABEL_CONFLICT = "label conflict"
#: Hamming distance (bits of 64) within which two kept files' difference hashes are look-alikes.
LOOK_ALIKE_DISTANCE = 5
#: Look-alike pairs the manifest lists at most (it counts them all).
LOOK_ALIKES_LISTED = 1000


class Hashed(NamedTuple):
    """One candidate's relative path, label, label name, sha256 of its bytes, and where decoded its `Fingerprint`."""

    relative_path: str
    label: int
    label_name: str
    sha256: str
    pixels: Optional[str] = None
    dhash: Optional[str] = None


def duplicates(files: Iterable[Tuple]) -> Dict[str, str]:
    """The copies not kept, ``{relative_path: reason}``, from `Hashed` tuples (or their first four fields)."""
    groups: Dict[str, List[Hashed]] = {}
    for file in map(lambda f: Hashed(*f), files):
        key = f"pixels:{file.pixels}" if file.pixels else f"bytes:{file.sha256}"
        groups.setdefault(key, []).append(file)
    rejected: Dict[str, str] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort()
        kept = members[0]
        for file in members[1:]:
            same = "same bytes" if file.sha256 == kept.sha256 else "same pixels"
            if file.label == kept.label:
                rejected[file.relative_path] = f"{DUPLICATE}: {same} as {kept.relative_path}"
            else:
                rejected[file.relative_path] = \
                    f"{LABEL_CONFLICT}: {same} as {kept.relative_path} in class {kept.label_name}"
    return rejected


def look_alikes(files: Iterable[Tuple[str, str]], distance: int = LOOK_ALIKE_DISTANCE,
                listed: int = LOOK_ALIKES_LISTED) -> Tuple[List[Tuple[str, str, int]], int]:
    """The pairs of ``(relative_path, dhash as 16 hex digits)`` whose hashes differ in at most ``distance`` bits.

    Returns:
        ``(pairs, count)``: at most ``listed`` ``(path a, path b, bits)``, ``a < b``, by bits, and the count of all."""
    rows = sorted(files)
    paths = [path for path, _ in rows]
    hashes = np.array([int(h, 16) for _, h in rows], np.uint64)
    masks = [np.uint64(sum(1 << int(b) for b in band)) for band in np.array_split(np.arange(64), distance + 1)]
    count, best = 0, np.zeros((0, 3), np.int64)  # rows (bits, i, j): the smallest found so far
    for band, mask in enumerate(masks):
        for i, j in _sharing(hashes & mask):
            xor = hashes[i] ^ hashes[j]
            bits = _popcount(xor)
            first = np.argmax(np.stack([(xor & m) == 0 for m in masks]), axis=0)  # each pair in one band only
            keep = (bits <= distance) & (first == band)
            count += int(keep.sum())
            found = np.stack([bits[keep], i[keep], j[keep]], axis=1).astype(np.int64)
            best = _smallest(np.concatenate([best, found]), listed)
    return [(paths[i], paths[j], int(bits)) for bits, i, j in best.tolist()], count


def _sharing(values: np.ndarray):
    """Index arrays ``(i, j)``, ``i < j``, of every pair of equal ``values``, a batch per gap in sorted order."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    for gap in range(1, len(values)):
        same = ordered[gap:] == ordered[:-gap]
        if not same.any():
            return
        a, b = order[:-gap][same], order[gap:][same]
        yield np.minimum(a, b), np.maximum(a, b)


def _smallest(rows: np.ndarray, n: int) -> np.ndarray:
    return rows[np.lexsort((rows[:, 2], rows[:, 1], rows[:, 0]))][:n]


def _popcount(values: np.ndarray) -> np.ndarray:
    return np.unpackbits(values.astype(">u8").view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)
