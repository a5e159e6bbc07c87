"""Copies of one image: one copy is written, every other copy is a recorded rejection; look-alikes
are reported.

Trees gathered from the web hold the same photo more than once, under one class or under two, and
not always as the same bytes: re-saved losslessly in another format, with a comment or other
metadata added. Split file by file, the copies could land in train and in test, and the test figure
would then be measured partly on training images. So before the split the ETL reads every
candidate once more, in a first Spark pass (:func:`pipelines.etl.transform.hash_chunks`): the
sha256 of its bytes, and, decoded, its :class:`pipelines.etl.images.Fingerprint` (the sha256 of its
pixels as the ETL reads them, and a 64-bit difference hash). It keeps one file per image
(:func:`duplicates`); only the kept files are split, so each image is in one split only.

The rule, a pure function of the set of ``(relative path, class, hashes)``: files are copies when
their pixels are equal (or, where a file could not be decoded, their bytes); in each group of
copies, the file with the smallest relative path (Python's ``str`` order: by code point, so by the
bytes of its UTF-8 name) is kept, in its class. Every other copy is rejected:

* ``"duplicate: same bytes as <kept path>"`` when it is in the kept file's class (``same pixels``
  when only the pixels are equal);
* ``"label conflict: same bytes as <kept path> in class <name>"`` when it is in another class (the
  same image labelled twice): it is recorded, and the kept file's class wins.

Look-alikes, the kept files whose difference hashes lie within :data:`LOOK_ALIKE_DISTANCE` bits of
each other (a JPEG re-encoded at another quality, a resized copy; the distances measured on the
sample photos: docs/benchmarks.md), are not rejected, since two photos of one scene can be
legitimately close: they are reported (:func:`look_alikes`), a warning with the pairs.

A file its hash pass could not read has no hash and stays a candidate: the main pass reads it again
and records why it cannot be used.
"""
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
    """What the duplicate check knows of one candidate: its relative path, label and label name,
    the sha256 of its bytes, and, where it decoded, the sha256 of its pixels and its difference
    hash (:class:`pipelines.etl.images.Fingerprint`; ``None`` otherwise)."""

    relative_path: str
    label: int
    label_name: str
    sha256: str
    pixels: Optional[str] = None
    dhash: Optional[str] = None


def duplicates(files: Iterable[Tuple]) -> Dict[str, str]:
    """The copies not kept, with why.

    Args:
        files: :class:`Hashed` tuples (or their first four fields: bytes only) of each hashed
            candidate (any order; paths unique).

    Returns:
        ``{relative_path: reason}`` for every file of a group of copies but the group's smallest
        relative path (see the module for the rule and the reasons' wording); ``{}`` when no two
        are copies. The same for any order of ``files``.
    """
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
    """The pairs of files whose difference hashes differ in at most ``distance`` bits.

    By the pigeonhole principle two hashes that close agree exactly on at least one of
    ``distance + 1`` bands of their bits, so only the files that share a band's value are compared
    (all files sharing one: a block of identical hashes, such as blank images, is compared in full).

    Args:
        files: ``(relative_path, dhash as 16 hex digits)`` (paths unique, any order).
        distance: the largest Hamming distance reported, 0 to 63.
        listed: the pairs returned at most (the first in order).

    Returns:
        ``(pairs, count)``: ``(path a, path b, bits)`` with ``a < b``, ordered by bits then paths,
        at most ``listed`` of them, and how many pairs there are in all.
    """
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
    """Index arrays ``(i, j)``, ``i < j``, of every pair of equal ``values``, a batch at a time
    (the pairs whose ranks in the sorted order differ by 1, then by 2, ...)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    for gap in range(1, len(values)):
        same = ordered[gap:] == ordered[:-gap]
        if not same.any():
            return
        a, b = order[:-gap][same], order[gap:][same]
        yield np.minimum(a, b), np.maximum(a, b)


def _smallest(rows: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` smallest ``(bits, i, j)`` rows, in order (paths sorted: index order is path order)."""
    return rows[np.lexsort((rows[:, 2], rows[:, 1], rows[:, 0]))][:n]


def _popcount(values: np.ndarray) -> np.ndarray:
    """Set bits of each uint64."""
    return np.unpackbits(values.astype(">u8").view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)
