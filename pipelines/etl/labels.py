"""Pure functions from a file's place in an image tree (class folder: the root's child) to a label and a split."""
from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Tuple

from pipelines.contract import TEST, TRAIN, VALIDATION
from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural

# the extensions of the formats pipelines.etl.images decodes (by content: a GIF named .jpg is a GIF)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff")
_CLASS_FOLDER = re.compile(r"^([0-9]{3})\.(.+)$")

CALTECH = "caltech"  # every class folder is NNN.name: label = NNN - 1
FOLDERS = "folders"  # plain folder names: labels by sorted name (Keras, torchvision)


@dataclass(frozen=True)
class ClassFolder:
    """A class folder: ``label`` (0-based) and ``name`` (the ``label_name`` column)."""

    label: int
    name: str


@dataclass(frozen=True)
class Layout:
    """The classes of a tree: ``kind`` (`CALTECH` or `FOLDERS`) and the `ClassFolder` of each top-level folder."""

    kind: str
    folders: Dict[str, ClassFolder] = field(default_factory=dict)

    @property
    def classes(self) -> Dict[int, str]:
        return {c.label: c.name for c in self.folders.values()}


def parse_class_folder(folder: str) -> ClassFolder | None:
    """``ClassFolder(55, 'dog')`` for ``'056.dog'``; ``None`` unless ``NNN.name`` with ``NNN`` in 001..999."""
    match = _CLASS_FOLDER.match(folder)
    if not match or int(match.group(1)) == 0:
        return None
    return ClassFolder(int(match.group(1)) - 1, match.group(2))


def decide_layout(folders: Iterable[str]) -> Layout:
    """The layout of a tree from its visible top-level folder names.

    ``caltech``: every class folder ``NNN.name``, label ``NNN - 1``; ``folders``: plain names, labels ``0..k-1`` in
    ``sorted`` order (as Keras and torchvision give them, so label numbers match).

    Raises:
        Refused: a mix of ``NNN.name`` and plain names, one number twice, or two class names equal in NFC."""
    names = sorted(set(folders))
    parsed = {name: parse_class_folder(name) for name in names}
    refuse_lookalike_classes({name: (parsed[name].name if parsed[name] else name) for name in names})
    numbered = [name for name in names if parsed[name] is not None]
    plain = [name for name in names if parsed[name] is None]
    if numbered and plain:
        raise Refused(f"mixed class folder layouts: {plural(len(numbered), 'folder')} named NNN.name (e.g. "
                      f"{numbered[0]!r}) and {plural(len(plain), 'plain name')} (e.g. {plain[0]!r}); use one "
                      "layout: all NNN.name "
                      "(label = NNN - 1) or all plain names (labels by sorted name); prefix a folder to "
                      "leave out with '_' or '.'")
    if not numbered:
        return Layout(FOLDERS, {name: ClassFolder(label, name) for label, name in enumerate(plain)})
    by_label: Dict[int, str] = {}
    for name in numbered:
        label = parsed[name].label
        if label in by_label:
            raise Refused(f"class number {label + 1:03d} is used by two folders: {by_label[label]} and {name}")
        by_label[label] = name
    return Layout(CALTECH, {name: parsed[name] for name in numbered})


def refuse_lookalike_classes(class_names: Dict[str, str]) -> None:
    """Refuse two folders whose class names are equal in NFC: merging would choose a label for the user."""
    seen: Dict[str, str] = {}
    for folder in sorted(class_names):
        key = unicodedata.normalize("NFC", class_names[folder])
        if key in seen:
            first = seen[key]
            raise Refused(f"two class folders have the same name in Unicode (NFC {key!r}): "
                          f"{first.encode('ascii', 'backslashreplace').decode()} and "
                          f"{folder.encode('ascii', 'backslashreplace').decode()} (one composed, one with "
                          "combining marks); rename one or move its files into the other")
        seen[key] = folder


def path_parts(relative_path: str) -> Tuple[str, ...]:
    """The parts of a ``/``-separated relative path, as ``PurePosixPath.parts`` (pathlib is slow for every file)."""
    return tuple(part for part in relative_path.split("/") if part and part != ".")


def has_image_extension(name: str) -> bool:
    """True for the `IMAGE_EXTENSIONS`, in any case."""
    return name.lower().endswith(IMAGE_EXTENSIONS)


def label_for(relative_path: str, layout: Optional[Layout] = None) -> ClassFolder | str:
    """The `ClassFolder` of a file by its path (``layout`` ``None``: ``NNN.name``), or why it has none (``str``)."""
    parts = path_parts(relative_path)
    if len(parts) < 2:
        return "not inside a class folder (expected ROOT/CLASS/...)"
    if layout is None:
        folder = parse_class_folder(parts[0])
        if folder is None:
            return f"not a class folder: {parts[0]!r} is not of the form NNN.name"
        return folder
    folder = layout.folders.get(parts[0])
    if folder is None:
        found = plural(len(layout.folders), "class folder")
        return f"not a class folder: {parts[0]!r} is not a class of this tree ({found})"
    return folder


def n_test(n: int, test_fraction: float) -> int:
    """Test files of ``n``: ``round(test_fraction * n)`` in ``[1, n - 2]`` (``n - 1`` for 2 files); 0 of 1."""
    if n < 2:
        return 0
    room = n - 1 if n == 2 else n - 2
    return min(room, max(1, round(test_fraction * n)))


# the rule for classes too small for three splits, as split_sizes applies it
SPLIT_RULE = ("a class of 1 file only trains; of 2 files, one trains and one is tested (no validation file); "
              "from 3 files on, every split holds it")


def split_sizes(n: int, validation_fraction: float, test_fraction: float) -> Tuple[int, int, int]:
    """``(train, validation, test)`` file counts of a class of ``n`` candidates, by `SPLIT_RULE`.

    Test first (`n_test`), then ``round(validation_fraction * n)``, at least 1, leaving one to train:
    ``n=2`` -> (1, 0, 1), ``n=3`` -> (1, 1, 1), ``n=100, 0.1, 0.2`` -> (70, 10, 20)."""
    test = n_test(n, test_fraction)
    rest = n - test
    validation = 0 if rest < 2 else min(rest - 1, max(1, round(validation_fraction * n)))
    return n - test - validation, validation, test


def _rank(seed: int, relative_path: str) -> bytes:
    return hashlib.sha256(f"{seed}:{relative_path}".encode("utf-8", "surrogateescape")).digest()


def split_class(relative_paths: Iterable[str], seed: int, test_fraction: float,
                validation_fraction: float) -> Dict[str, str]:
    """The split of each file of one class: ``{relative_path: 'train' | 'validation' | 'test'}``.

    Files ranked by ``sha256(f"{seed}:{relative_path}")``: the first ``test`` of `split_sizes` test, the next
    ``validation``, the rest train (adding files may move a few between splits)."""
    ranked = sorted(set(relative_paths), key=lambda p: (_rank(seed, p), p))
    _, validation, test = split_sizes(len(ranked), validation_fraction, test_fraction)
    return {p: TEST if i < test else VALIDATION if i < test + validation else TRAIN for i, p in enumerate(ranked)}
