"""Pure functions that turn a file's place in an image tree into a label and a split.

Two layouts, decided from the names of the folders directly under the root
(:func:`decide_layout`):

- ``caltech``: every class folder is ``NNN.name`` (Caltech-256); ``label = NNN - 1`` (0-based:
  ``001.ak47`` is 0, ``257.clutter`` is 256) and ``label_name`` is ``name``.
- ``folders``: no class folder is ``NNN.name`` (``birds/``, ``fish/``: the layout of Keras'
  ``image_dataset_from_directory`` and torchvision's ``ImageFolder``); labels ``0..k-1`` go to
  the folder names in sorted order and ``label_name`` is the folder name.

A mix of both is refused, and so are two class folders whose class names are the same text in
Unicode NFC (``café`` typed precomposed and ``café`` with a combining accent, as macOS writes it):
they look like one class and would be two (:func:`refuse_lookalike_classes`). The class folder
is the one directly under the root; files deeper inside it belong to it. Anything else is
reported, never guessed.

The train/validation/test split is stratified per class (:func:`split_class`), decided on the driver.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Tuple

from pipelines.contract import TEST, TRAIN, VALIDATION
from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural

# The extensions of the formats pipelines.etl.images decodes (content decides the format: a GIF
# named .jpg is read as a GIF).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff")
_CLASS_FOLDER = re.compile(r"^([0-9]{3})\.(.+)$")

CALTECH = "caltech"  # every class folder is NNN.name: label = NNN - 1
FOLDERS = "folders"  # plain folder names: labels by sorted name (Keras, torchvision)


@dataclass(frozen=True)
class ClassFolder:
    """A class folder: ``label`` (int, 0-based) and ``name`` (the ``label_name`` column)."""

    label: int
    name: str


@dataclass(frozen=True)
class Layout:
    """The classes of a tree: ``kind`` (:data:`CALTECH` or :data:`FOLDERS`) and ``folders``, the
    :class:`ClassFolder` of each top-level folder name."""

    kind: str
    folders: Dict[str, ClassFolder] = field(default_factory=dict)

    @property
    def classes(self) -> Dict[int, str]:
        """``{label: name}`` of every class folder."""
        return {c.label: c.name for c in self.folders.values()}


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


def decide_layout(folders: Iterable[str]) -> Layout:
    """The layout of a tree from the names of its visible top-level folders.

    Args:
        folders: the folder names directly under the root, hidden ones (``.x``, ``_x``) already
            left out by the caller (:func:`pipelines.etl.listing.class_folders`).

    Returns:
        - all ``NNN.name`` -> ``Layout('caltech', ...)``, ``label = NNN - 1``;
        - none -> ``Layout('folders', ...)``, labels ``0..k-1`` by the folder names sorted by
          Unicode code point (Python's ``sorted`` on ``str``, which is also the byte order of
          their UTF-8 names; what Keras' ``image_dataset_from_directory`` and torchvision's
          ``ImageFolder`` do, so a model's label numbers match theirs);
        - no folder at all -> an empty ``Layout('folders')`` (the caller refuses it).

    Raises:
        Refused: a mix of ``NNN.name`` and other folders (naming one of each), two ``NNN.name``
            folders with the same number, or two class names equal in NFC
            (:func:`refuse_lookalike_classes`).
    """
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
    """Refuse two folders whose class names (``{folder: class name}``: the folder name, or the
    ``name`` of ``NNN.name``) are equal once normalised to Unicode NFC (``unicodedata.normalize``).

    Why a refusal and not a merge: the two spellings are two folders on disk, and in the ``caltech``
    layout two class numbers; merging would choose a label for the user, and keeping both gives two
    classes that print as one name. The user renames one (or moves its files into the other).

    Raises:
        Refused: naming both folders, with ``\\u`` escapes so the difference is visible.
    """
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
    """The parts of a ``/``-separated relative path as ``PurePosixPath(relative_path).parts`` gives
    them (empty and ``.`` parts dropped), without building a path object: the listing calls this
    for every file, and ``pathlib`` made up half of listing 10,000 files."""
    return tuple(part for part in relative_path.split("/") if part and part != ".")


def has_image_extension(name: str) -> bool:
    """True for the :data:`IMAGE_EXTENSIONS` (``.jpg .jpeg .png .gif .bmp .webp .tif .tiff``), in
    any case (``.JPG``, ``.Tiff``)."""
    return name.lower().endswith(IMAGE_EXTENSIONS)


def label_for(relative_path: str, layout: Optional[Layout] = None) -> ClassFolder | str:
    """Class of a file given its path relative to the dataset root (``/``-separated).

    Args:
        relative_path: the file's path under the root.
        layout: the tree's :class:`Layout`; ``None`` reads the top-level folder as ``NNN.name``.

    Returns:
        the :class:`ClassFolder` of its top-level folder, or a one-line reason (``str``) why the
        file belongs to no class: directly under the root, or under a folder that is no class.
    """
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
    """How many of a class's ``n`` candidate files go to the test split.

    ``0`` when ``n < 2`` (one file cannot be in two splits: it trains); otherwise
    ``round(test_fraction * n)`` (Python's ``round``, half to even), at least 1, and at most ``n - 1``
    for 2 files and ``n - 2`` from 3 files on (one file left to validation, one to train, whatever
    the fractions): ``n=2`` -> 1, ``n=10, f=0.3`` -> 3, ``n=10, f=0.01`` -> 1, ``n=3, f=0.9`` -> 1.
    """
    if n < 2:
        return 0
    room = n - 1 if n == 2 else n - 2
    return min(room, max(1, round(test_fraction * n)))


# The rule for classes too small for three splits, as split_sizes applies it and the summary and
# manifest ("split_rule") state it.
SPLIT_RULE = ("a class of 1 file only trains; of 2 files, one trains and one is tested (no validation file); "
              "from 3 files on, every split holds it")


def split_sizes(n: int, validation_fraction: float, test_fraction: float) -> Tuple[int, int, int]:
    """``(train, validation, test)`` file counts of a class of ``n`` candidate files.

    The test split is served first (:func:`n_test`), then validation: ``round(validation_fraction * n)``
    (half to even), at least 1 and at most what leaves one file to train. So, for any fractions, a
    class of 1 file only trains, a class of 2 trains and is tested but has no validation file, and
    from 3 files on every split holds the class (:data:`SPLIT_RULE`): ``n=1`` -> (1, 0, 0),
    ``n=2`` -> (1, 0, 1), ``n=3`` -> (1, 1, 1) (``0.5, 0.45`` too), ``n=10, 0.1, 0.1`` -> (8, 1, 1),
    ``n=100, 0.1, 0.2`` -> (70, 10, 20).
    """
    test = n_test(n, test_fraction)
    rest = n - test
    validation = 0 if rest < 2 else min(rest - 1, max(1, round(validation_fraction * n)))
    return n - test - validation, validation, test


def _rank(seed: int, relative_path: str) -> bytes:
    return hashlib.sha256(f"{seed}:{relative_path}".encode("utf-8", "surrogateescape")).digest()


def split_class(relative_paths: Iterable[str], seed: int, test_fraction: float,
                validation_fraction: float) -> Dict[str, str]:
    """The split of each file of one class: stratified, seeded and deterministic.

    The class's files are ranked by ``sha256(f"{seed}:{relative_path}")`` (ties, impossible in
    practice, by path); the first ``test`` of :func:`split_sizes` are the test split, the next
    ``validation`` the validation split, the rest train. A pure function of the seed, the fractions
    and the *set* of paths (relative to the root): the order they come in, the machine and the
    Spark partitioning do not matter, so a rerun on the same tree gives the same, disjoint splits,
    and the test files are those a two-split ETL with the same seed and test fraction chose.
    Trade-off: a file's split depends on the other files of its class, so adding or removing files
    can move a few files of that class between the splits (a per-file hash threshold would not, but
    can leave a small class with no test image at all).

    Returns:
        ``{relative_path: 'train' | 'validation' | 'test'}`` (the names of :mod:`pipelines.contract`).
    """
    ranked = sorted(set(relative_paths), key=lambda p: (_rank(seed, p), p))
    _, validation, test = split_sizes(len(ranked), validation_fraction, test_fraction)
    return {p: TEST if i < test else VALIDATION if i < test + validation else TRAIN for i, p in enumerate(ranked)}
