"""The ETL's own listing of its input: the only one, so that nothing is lost silently.

The driver lists the tree and classifies every file: a candidate image (read later by a Spark
task, in Python), rejected (bad input, with a reason) or skipped (not input, with a reason).
Spark's file sources are not used: they skip some files without a word (zero-byte files, names
starting with ``_`` or ``.``), list and open names in the JVM's locale encoding (non-ASCII names
are lost under ``LC_ALL=C``) and hold whole files in the JVM heap.

A tree on an object store (``s3://...``) is listed through :mod:`pipelines.storage`
(:func:`list_objects`): every object below the prefix is a file, classified by the same rules;
there are no links, FIFOs or undecodable names there (keys are UTF-8).

Local names are listed as bytes and decoded as UTF-8 whatever the caller's locale; bytes that are not
UTF-8 are kept as surrogate escapes (``surrogateescape``), so such a file can still be opened and
reported (:func:`display_path`), but it is rejected: its name cannot go into the Parquet
``path`` column, which is UTF-8 text.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple, Union

from pipelines.errors import MissingInput, NotAFolder, Refused
from pipelines.etl.labels import (IMAGE_EXTENSIONS, ClassFolder, Layout, decide_layout, has_image_extension, label_for,
                                  path_parts)

if TYPE_CHECKING:
    from pipelines.storage import Location

REJECTED = "rejected"  # bad input: was meant to be an image and is not usable
SKIPPED = "skipped"    # not input for this job: wrong place, hidden, not an image extension


@dataclass(frozen=True)
class Excluded:
    """Why a file is not written: ``status`` is ``'rejected'`` or ``'skipped'``."""

    status: str
    reason: str


HIDDEN = Excluded(SKIPPED, "hidden name (a path part starts with '.' or '_'), skipped as Spark and Hadoop do")


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
    for part in path_parts(relative_path):
        if part.startswith(".") or (part.startswith("_") and "=" not in part) or part.endswith("._COPYING_"):
            return True
    return False


def classify(relative_path: str, size_bytes: int, max_file_bytes: int, layout: Optional[Layout] = None,
             check_spark_hidden: bool = True) -> Union[ClassFolder, Excluded]:
    """Decide, without reading it, whether a file is input and of which class.

    The first reason that applies is the one reported, in this order: a hidden name (the user's
    way to leave a file or folder out, as Spark's), the file's place (directly under the root, or
    under a folder that is no class: not input whatever its name or extension), its extension,
    its name's encoding, its size. So a file is rejected (bad input) only when it would otherwise
    be input, and a loose file at the root is reported as such, never by its extension.

    Args:
        relative_path: path under the root, ``/``-separated.
        size_bytes: file size.
        max_file_bytes: larger files are rejected unread.
        layout: the tree's classes (:func:`class_folders`); ``None`` reads ``NNN.name`` folders.
        check_spark_hidden: report names Spark's listing ignores (driver side only).

    Returns:
        the file's :class:`ClassFolder`, or an :class:`Excluded` with the reason.
    """
    if check_spark_hidden and spark_ignores(relative_path):
        return HIDDEN
    label = label_for(relative_path, layout)
    if isinstance(label, str):
        return Excluded(SKIPPED, label)
    excluded = name_exclusion(relative_path, check_spark_hidden=False)
    return excluded or size_exclusion(size_bytes, max_file_bytes) or label


def name_exclusion(relative_path: str, check_spark_hidden: bool = True) -> Optional[Excluded]:
    """Why a file is no image input, judging by its name alone; ``None`` when it may be one.

    Skipped: a hidden name (:func:`spark_ignores`, when ``check_spark_hidden``), an extension that
    is not an image's (:data:`~pipelines.etl.labels.IMAGE_EXTENSIONS`, any case). Rejected: an
    image's name that is not valid UTF-8 (outputs store paths as UTF-8 text); checked last, so a
    file that is no input anyway is skipped as such, not counted as bad input.
    """
    if check_spark_hidden and spark_ignores(relative_path):
        return HIDDEN
    if not has_image_extension((path_parts(relative_path) or ('',))[-1]):
        return Excluded(SKIPPED, f"not an image extension ({' '.join(IMAGE_EXTENSIONS)}, any case)")
    if not is_utf8(relative_path):
        return Excluded(REJECTED, "file name is not valid UTF-8 (shown with \\x escapes): the Parquet path "
                                  "column is UTF-8 text; rename it")
    if "" in relative_path.split("/") or "." in relative_path.split("/"):
        # an object key such as 'class//x.jpg': pyarrow's filesystems refuse to open such a path
        return Excluded(REJECTED, "key has an empty or '.' path segment ('//' or '/./'), which the "
                                  "filesystem cannot open; rename it")
    return None


def size_exclusion(size_bytes: int, max_file_bytes: int) -> Optional[Excluded]:
    """Why a listed file cannot be read, judging by its size (``-1``: unreadable, ``0``: empty, or
    larger than ``max_file_bytes``), all rejected; ``None`` when it can be read."""
    if size_bytes < 0:
        return Excluded(REJECTED, "unreadable (broken link or permission denied)")
    if size_bytes == 0:
        return Excluded(REJECTED, "empty file (0 bytes)")
    if size_bytes > max_file_bytes:
        return Excluded(REJECTED, f"file too large: {size_bytes} bytes > {max_file_bytes} bytes (--max-file-mb)")
    return None


def reason_kind(reason: str) -> str:
    """The kind of a reason, for counts: its text before the first ``:`` or `` (``
    (``"file too large: 9 bytes > 8 bytes"`` -> ``"file too large"``)."""
    return reason.split(":")[0].split(" (")[0]


def decode_name(raw: bytes) -> str:
    """File-system bytes -> ``str``, as UTF-8 whatever the locale; other bytes become surrogate
    escapes, so :func:`encode_name` gives the same bytes back."""
    return raw.decode("utf-8", "surrogateescape")


def encode_name(name: str) -> bytes:
    """The file-system bytes of a name from :func:`decode_name` (open files with these)."""
    return name.encode("utf-8", "surrogateescape")


def is_utf8(name: str) -> bool:
    """False when the name holds bytes that were not UTF-8 (surrogate escapes)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def display_path(name: str) -> str:
    """A name for reports (JSON, logs): unchanged when it is UTF-8, else with each byte that is
    not shown as ``\\xNN`` (``caf\\xe9.jpg``), so two such names never collide into one."""
    return encode_name(name).decode("utf-8", "backslashreplace")


class UnsupportedTree(Refused):
    """The input tree holds something the job cannot read safely; raised before Spark."""


def list_files(root: str) -> List[ListedFile]:
    """Every regular file under ``root``, recursively, sorted by relative path.

    Raises:
        FileNotFoundError: ``root`` does not exist. NotADirectoryError: it is not a folder.
        UnsupportedTree: a folder symlink inside the tree (following them leads into loops and
            duplicates; not following them would drop their files silently), an unreadable
            folder, or a FIFO, socket or device file (reading one blocks).

    Paths are ``str`` decoded from the file system's bytes by :func:`decode_name` (UTF-8 whatever
    the locale); the root is taken as given.
    """
    if not os.path.exists(root):
        raise MissingInput(f"input folder does not exist: {root}")
    if not os.path.isdir(root):
        raise NotAFolder(f"input is not a folder: {root}")

    def refuse(error: OSError) -> None:
        name = error.filename
        name = display_path(decode_name(name)) if isinstance(name, bytes) else name
        raise UnsupportedTree(f"cannot list {name}: {error.strerror}")

    files = []
    # Bytes in, UTF-8 out: the caller's locale (LC_ALL=C) must not decide what a name means.
    root_bytes = os.fsencode(root)
    prefix = decode_name(root_bytes).rstrip("/")
    for dirpath, dirnames, filenames in os.walk(root_bytes, onerror=refuse):
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)) and not spark_ignores(decode_name(name)):
                raise UnsupportedTree(f"folder symlink {display_path(decode_name(os.path.join(dirpath, name)))}: "
                                      "the job does not follow folder links (loops, duplicates); copy or move "
                                      "the data instead")
        # os.walk joins from root_bytes, so the relative folder is what follows it. Names are joined
        # by concatenation: os.path.relpath per file was a quarter of listing 10,000 files, and
        # os.path.join a fifth.
        folder = dirpath[len(root_bytes):].lstrip(b"/")
        folder = folder + b"/" if folder else b""
        base = dirpath if dirpath.endswith(b"/") else dirpath + b"/"
        for filename in filenames:
            raw = base + filename
            rel = decode_name(folder + filename)
            path = f"{prefix}/{rel}"
            try:
                st = os.stat(raw)
            except OSError:  # broken symlink: still a file we found and must account for
                files.append(ListedFile(path, rel, -1))
                continue
            if not stat.S_ISREG(st.st_mode):
                if spark_ignores(rel):
                    continue
                raise UnsupportedTree(f"{display_path(path)} is not a regular file (FIFO, socket or device): "
                                      "reading it would block; remove it from the input")
            readable = os.access(raw, os.R_OK)
            files.append(ListedFile(path, rel, st.st_size if readable else -1))
    files.sort(key=lambda f: f.relative_path)
    return files


def class_folders(root: str) -> Layout:
    """The :class:`~pipelines.etl.labels.Layout` of the visible folders directly under ``root``
    (empty ones included; hidden ones, ``.x`` and ``_x``, and loose files are no class).

    Raises:
        ValueError: a mix of ``NNN.name`` and plain folder names, or two folders with the same
            number (``001.cat`` and ``001.dog``); see :func:`pipelines.etl.labels.decide_layout`.
    """
    names = []
    for entry in sorted(decode_name(e) for e in os.listdir(os.fsencode(root))):
        if os.path.isdir(os.path.join(os.fsencode(root), encode_name(entry))) and not spark_ignores(entry):
            names.append(entry)
    return decide_layout(names)


def list_tree(root: "Location") -> Tuple[List[ListedFile], Layout]:
    """Every file under ``root`` and the tree's layout: :func:`list_files` and :func:`class_folders`
    for a local folder, :func:`list_objects` for a prefix on an object store.

    Raises:
        FileNotFoundError, NotADirectoryError, UnsupportedTree, ValueError: see those functions.
    """
    if root.local:
        return list_files(root.path), class_folders(root.path)
    return list_objects(root)


def list_objects(root: "Location") -> Tuple[List[ListedFile], Layout]:
    """Every object below the prefix ``root`` (recursively, one listing), as :class:`ListedFile`
    (``path``: the object's URI, ``relative_path``: its key below the prefix), sorted by relative
    path, and the :class:`~pipelines.etl.labels.Layout` of the visible folders directly below it
    (a folder of an object store is a key prefix, or an empty ``name/`` marker object).

    Raises:
        FileNotFoundError: nothing lies under the prefix. ValueError: see :func:`class_folders`.
    """
    import pyarrow.fs as pafs

    infos = root.list(recursive=True)
    if not infos:
        raise MissingInput(f"input folder does not exist: {root.uri} (no object under that prefix)")
    files, folders = [], set()
    for info in infos:
        rel = info.path[len(root.path) + 1:]
        if info.type == pafs.FileType.File:
            files.append(ListedFile(root.join(rel).uri, rel, info.size))
        if "/" in rel or info.type == pafs.FileType.Directory:
            top = rel.split("/")[0]
            if top and not spark_ignores(top):
                folders.add(top)
    files.sort(key=lambda f: f.relative_path)
    return files, decide_layout(sorted(folders))
