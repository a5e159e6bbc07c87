"""The ETL's own listing of its input, independent of Spark's, so that nothing is lost silently.

Spark's file sources skip some files without a word (zero-byte files; names starting with ``_``
or ``.``). Listing the tree ourselves and classifying every file lets the job account for each
one: written, rejected (bad input, with a reason) or skipped (not input, with a reason).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Dict, List, Union

from pipelines.etl.labels import ClassFolder, has_image_extension, label_for, parse_class_folder

REJECTED = "rejected"  # bad input: was meant to be an image and is not usable
SKIPPED = "skipped"    # not input for this job: wrong place, hidden, not an image extension


@dataclass(frozen=True)
class Excluded:
    """Why a file is not written: ``status`` is ``'rejected'`` or ``'skipped'``."""

    status: str
    reason: str


@dataclass(frozen=True)
class ListedFile:
    """A file under the root: absolute ``path``, ``/``-separated ``relative_path``, size in bytes
    (``-1`` when it cannot be read, e.g. a broken symlink)."""

    path: str
    relative_path: str
    size_bytes: int


def spark_ignores(relative_path: str) -> bool:
    """Whether Spark's file listing drops this path (same rule as Spark's ``InMemoryFileIndex``).

    A path component starting with ``.``, or with ``_`` and containing no ``=``, or ending in
    ``._COPYING_`` hides the file from every Spark file source.
    """
    for part in PurePosixPath(relative_path).parts:
        if part.startswith(".") or (part.startswith("_") and "=" not in part) or part.endswith("._COPYING_"):
            return True
    return False


def classify(relative_path: str, size_bytes: int, max_file_bytes: int,
             check_spark_hidden: bool = True) -> Union[ClassFolder, Excluded]:
    """Decide, without reading it, whether a file is input and of which class.

    Args:
        relative_path: path under the root, ``/``-separated.
        size_bytes: file size.
        max_file_bytes: larger files are rejected unread.
        check_spark_hidden: report names Spark's listing ignores (driver side only).

    Returns:
        the file's :class:`ClassFolder`, or an :class:`Excluded` with the reason.
    """
    name = PurePosixPath(relative_path).name
    if "\ufffd" in relative_path:
        return Excluded(REJECTED, "file name is not valid UTF-8: Spark cannot open it by name; rename it")
    if check_spark_hidden and spark_ignores(relative_path):
        return Excluded(SKIPPED, "hidden name (a path part starts with '.' or '_'): Spark's listing ignores it")
    if not has_image_extension(name):
        return Excluded(SKIPPED, "not an image extension (.jpg, .jpeg, .png in any case)")
    label = label_for(relative_path)
    if isinstance(label, str):
        return Excluded(SKIPPED, label)
    if size_bytes < 0:
        return Excluded(REJECTED, "unreadable (broken link or permission denied)")
    if size_bytes == 0:
        return Excluded(REJECTED, "empty file (0 bytes)")
    if size_bytes > max_file_bytes:
        return Excluded(REJECTED, f"file too large: {size_bytes} bytes > {max_file_bytes} bytes (--max-file-mb)")
    return label


def spark_name(name: str) -> str:
    """The name as Spark's JVM sees it: bytes that are not UTF-8 become U+FFFD (Python keeps
    them as surrogate escapes), so both listings can be matched."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class UnsupportedTree(ValueError):
    """The input tree holds something Spark's listing cannot be trusted with; raised before Spark."""


def list_files(root: str) -> List[ListedFile]:
    """Every regular file under ``root``, recursively, sorted by relative path.

    Raises:
        FileNotFoundError: ``root`` does not exist. NotADirectoryError: it is not a folder.
        UnsupportedTree: a folder symlink inside the tree (Spark follows them, into loops and
            duplicates), an unreadable folder (Spark's listing fails on it), or a FIFO, socket or
            device file (reading one blocks).
    """
    if not os.path.exists(root):
        raise FileNotFoundError(f"input folder does not exist: {root}")
    if not os.path.isdir(root):
        raise NotADirectoryError(f"input is not a folder: {root}")

    def refuse(error: OSError) -> None:
        raise UnsupportedTree(f"cannot list {error.filename}: {error.strerror}")

    files = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=refuse):
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)) and not spark_ignores(name):
                raise UnsupportedTree(f"folder symlink {os.path.join(dirpath, name)}: Spark's listing follows "
                                      "folder links (duplicates, loops); copy or move the data instead")
        for filename in filenames:
            path = os.path.join(dirpath, filename)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            try:
                st = os.stat(path)
            except OSError:  # broken symlink: still a file we found and must account for
                files.append(ListedFile(spark_name(path), spark_name(rel), -1))
                continue
            if not stat.S_ISREG(st.st_mode):
                if spark_ignores(rel):
                    continue
                raise UnsupportedTree(f"{path} is not a regular file (FIFO, socket or device): reading it "
                                      "would block; remove it from the input")
            readable = os.access(path, os.R_OK)
            files.append(ListedFile(spark_name(path), spark_name(rel), st.st_size if readable else -1))
    files.sort(key=lambda f: f.relative_path)
    return files


def class_folders(root: str) -> Dict[int, str]:
    """Labels and names of the ``NNN.name`` folders directly under ``root`` (empty ones included).

    Raises:
        ValueError: two folders claim the same number (``001.cat`` and ``001.dog``).
    """
    classes: Dict[int, str] = {}
    for entry in sorted(os.listdir(root)):
        if not os.path.isdir(os.path.join(root, entry)) or spark_ignores(entry):
            continue
        folder = parse_class_folder(entry)
        if folder is None:
            continue
        if folder.label in classes:
            raise ValueError(f"class number {folder.label + 1:03d} is used by two folders: "
                             f"{folder.label + 1:03d}.{classes[folder.label]} and {entry}")
        classes[folder.label] = folder.name
    return classes
