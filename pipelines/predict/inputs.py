"""What to predict, decided on the driver before Spark starts: an image tree or an ETL split."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from pipelines.contract import MANIFEST, SPLITS
from pipelines.etl.labels import parse_class_folder, path_parts
from pipelines.etl.listing import SKIPPED, display_path, list_files, name_exclusion, size_exclusion
from pipelines.manifest import Manifest
from pipelines.runtime.errors import MissingInput, NotAFolder, Refused
from pipelines.runtime.logs import plural

TREE, ETL_SPLIT = "tree", "etl"


class NoImages(Refused):
    """The input holds no image to predict."""


class Item(NamedTuple):
    """One output row of an image tree, as known before any file is read."""

    path: str  # absolute
    label: Optional[int]  # the model's index of its folder's class
    label_name: Optional[str]
    reason: Optional[str]  # set when its name or size rejects it: then it is never read


@dataclass
class InputPlan:
    """The input, planned: an image tree's items or an ETL split's Parquet parts."""

    kind: str  # TREE or ETL_SPLIT
    root: str
    found: int  # files found, or the split's rows
    rows: int  # output rows expected
    items: List[Item] = field(default_factory=list)
    skipped: List[Tuple[str, str]] = field(default_factory=list)  # (path, reason) of a tree's files that are no input
    parts: list = field(default_factory=list)  # PinnedFiles; local paths after private_copies


def class_index(class_names: Sequence[Optional[str]]) -> Dict[str, int]:
    """``{name: index}`` of the model's classes (unused labels, ``None``, left out)."""
    return {name: i for i, name in enumerate(class_names) if name is not None}


def folder_class(relative_path: str) -> Optional[str]:
    """The class name a file's top-level folder gives (``NNN.name`` -> ``name``); ``None`` directly under the root."""
    parts = path_parts(relative_path)
    if len(parts) < 2:
        return None
    parsed = parse_class_folder(parts[0])
    return parsed.name if parsed is not None else parts[0]


def plan_tree(root: str, class_names: Sequence[Optional[str]], max_file_bytes: int) -> InputPlan:
    """List and classify every file under ``root`` with the ETL's rules, sorted by relative path.

    Hidden names and non-image extensions are skipped; every other file, at any depth, is a row (one rejected by name
    or size carries its reason, unread). Labels are `folder_class` matched by name.

    Raises:
        UnsupportedTree: folder symlinks, FIFOs, devices, unreadable folders. NoImages: no file is input."""
    files = list_files(root)
    index = class_index(class_names)
    items, skipped = [], []
    for f in files:
        excluded = name_exclusion(f.relative_path)
        if excluded is not None and excluded.status == SKIPPED:
            skipped.append((display_path(f.path), excluded.reason))
            continue
        excluded = excluded or size_exclusion(f.size_bytes, max_file_bytes)
        name = folder_class(f.relative_path)
        label = index.get(name) if name is not None else None
        items.append(Item(display_path(f.path), label, name if label is not None else None,
                          excluded.reason if excluded is not None else None))
    if not items:
        raise NoImages(f"no image file under {root}: {plural(len(files), 'file')} found, {len(skipped)} skipped "
                       "(hidden names, other extensions)")
    return InputPlan(TREE, root, len(files), len(items), items, skipped)


def is_etl_split(path: str) -> bool:
    """Whether ``path`` names a split of an ETL output: ``train``/``test`` beside a ``manifest.json``."""
    return os.path.basename(path) in SPLITS and os.path.isfile(os.path.join(os.path.dirname(path), MANIFEST))


def plan_split(split_dir: str, image_size: int) -> InputPlan:
    """An ETL split as input: its manifest's files; refused if stored at another size, `NoImages` if empty."""
    root, split = os.path.split(split_dir)
    manifest = Manifest.read(root)
    if manifest.image_size != image_size:
        raise Refused(f"{split_dir} stores {manifest.image_size}-pixel images, the model takes {image_size}: "
                      "predict on the image tree instead (it is decoded at the model's size)")
    rows = manifest.splits[split].rows
    if rows == 0:
        raise NoImages(f"the ETL split {split_dir} has no row")
    manifest.check_footers(root)  # its parts are files of its run, their footers its counts
    return InputPlan(ETL_SPLIT, split_dir, rows, rows,
                     parts=manifest.part_locations(root, split))


def private_copies(plan: InputPlan, folder: str) -> InputPlan:
    """``plan`` with an ETL split's parts copied into the private ``folder`` (a tree's as it is), which executors
    open by name and nobody can swap for a folder or a link.

    Raises:
        LinkRefused: a part's name no longer holds the file checked."""
    copies = []
    for i, part in enumerate(plan.parts):
        copies.append(os.path.join(folder, f"part-{i:05d}.parquet"))
        part.copy_to(copies[-1])
    return dataclasses.replace(plan, parts=copies)


def plan_input(path: str, class_names: Sequence[Optional[str]], image_size: int,
               max_file_bytes: int) -> InputPlan:
    """The input named by ``--input``: an ETL split when `is_etl_split`, else an image tree (`plan_tree`).

    Raises:
        FileNotFoundError, NotADirectoryError: no such folder.
        ValueError: an ETL output's root (name a split)."""
    path = path.rstrip("/") or "/"
    if is_etl_split(path):
        return plan_split(path, image_size)
    if not os.path.exists(path):
        raise MissingInput(f"input does not exist: {path}")
    if not os.path.isdir(path):
        raise NotAFolder(f"input is not a folder: {path}")
    if os.path.isfile(os.path.join(path, MANIFEST)):
        raise Refused(f"{path} is an ETL output: name one of its splits ({', '.join(SPLITS)}), e.g. "
                      f"--input {os.path.join(path, 'test')}")
    return plan_tree(path, class_names, max_file_bytes)
