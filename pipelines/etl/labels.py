"""Pure functions that turn a file's place in a Caltech-256-style tree into a label and a split.

Layout: ``ROOT/NNN.name/.../file.jpg``. The class folder is the one directly under the root;
``label = NNN - 1`` (0-based: ``001.ak47`` is 0, ``257.clutter`` is 256) and ``label_name`` is
``name``. Files deeper inside a class folder belong to it. Anything else is reported, never
guessed.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

# The extensions of the formats pipelines.etl.images decodes (content decides the format: a GIF
# named .jpg is read as a GIF).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff")
_CLASS_FOLDER = re.compile(r"^([0-9]{3})\.(.+)$")


@dataclass(frozen=True)
class ClassFolder:
    """A parsed ``NNN.name`` folder: ``label`` is ``NNN - 1`` (int, 0-based)."""

    label: int
    name: str


def parse_class_folder(folder: str) -> ClassFolder | None:
    """Parse a class folder name such as ``'056.dog'``.

    Returns:
        ``ClassFolder(label=55, name='dog')``, or ``None`` when the name is not ``NNN.name``
        with ``NNN`` in 001..999 (``000`` has no 0-based label and is refused too).
    """
    match = _CLASS_FOLDER.match(folder)
    if not match or int(match.group(1)) == 0:
        return None
    return ClassFolder(int(match.group(1)) - 1, match.group(2))


def has_image_extension(name: str) -> bool:
    """True for the :data:`IMAGE_EXTENSIONS` (``.jpg .jpeg .png .gif .bmp .webp .tif .tiff``), in
    any case (``.JPG``, ``.Tiff``)."""
    return name.lower().endswith(IMAGE_EXTENSIONS)


def label_for(relative_path: str) -> ClassFolder | str:
    """Class of a file given its path relative to the dataset root (``/``-separated).

    Returns:
        the :class:`ClassFolder` of its top-level folder, or a one-line reason (``str``) why the
        file belongs to no class: directly under the root, or under a folder not named ``NNN.name``.
    """
    parts = PurePosixPath(relative_path).parts
    if len(parts) < 2:
        return "not inside a class folder (expected ROOT/NNN.name/...)"
    folder = parse_class_folder(parts[0])
    if folder is None:
        return f"not a class folder: {parts[0]!r} is not of the form NNN.name"
    return folder


def is_test(relative_path: str, seed: int, test_fraction: float) -> bool:
    """Deterministic train/test assignment of one file.

    The file is in the test split when ``sha256(f"{seed}:{relative_path}")``, read as a number in
    [0, 1), is below ``test_fraction``. The result depends only on the path relative to the
    root and the seed, so reruns, other machines and other partitionings give the same,
    disjoint split (unlike a second lazy ``randomSplit``).
    """
    digest = hashlib.sha256(f"{seed}:{relative_path}".encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < test_fraction
