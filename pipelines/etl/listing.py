"""The ETL's own listing of its input: the only one, so that nothing is lost silently.

The driver lists the tree and classifies every file: a candidate image (read later by a Spark
task, in Python), rejected (bad input, with a reason) or skipped (not input, with a reason).
Spark's file sources are not used: they skip some files without a word (zero-byte files, names
starting with ``_`` or ``.``), list and open names in the JVM's locale encoding (non-ASCII names
are lost under ``LC_ALL=C``) and hold whole files in the JVM heap.

A tree on an object store (``s3://...``) is listed through :mod:`pipelines.io.storage`
(:func:`list_objects`): every object below the prefix is a file, classified by the same rules;
there are no links, FIFOs or undecodable names there (keys are UTF-8), but a key may hold ``..``
segments, which are rejected unread (:func:`name_exclusion`): nothing outside the prefix is read.

Local trees are walked without following folder links. What cannot be read safely is recorded as
a rejection, unread, never a reason to stop the job: a FIFO, socket or device (reading one blocks
or never ends), a file symlink whose target lies outside the tree, a folder symlink (following
them leads into loops and duplicates). A file symlink whose target lies inside the tree is
followed: it is read as the file it names, so beside its target it is a duplicate
(:mod:`pipelines.etl.dedupe`).

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

from pipelines.etl.labels import (
    IMAGE_EXTENSIONS,
    ClassFolder,
    Layout,
    decide_layout,
    has_image_extension,
    label_for,
    path_parts,
)
from pipelines.runtime.errors import MissingInput, NotAFolder, Refused

if TYPE_CHECKING:
    from pipelines.io.storage import Location

REJECTED = "rejected"  # bad input: was meant to be an image and is not usable
SKIPPED = "skipped"    # not input for this job: wrong place, hidden, not an image extension


@dataclass(frozen=True)
class Excluded:
    """Why a file is not written: ``status`` is ``'rejected'`` or ``'skipped'``."""

    status: str
    reason: str


# The listing's own rejections (ListedFile.unread): files it records and never opens.
NOT_REGULAR = "not a regular file (FIFO, socket or device): unread, reading it would block"
LINK_OUT = "symlink to a file outside the input tree: unread"
FOLDER_LINK = "folder symlink: not followed (loops, duplicates), its files are not input; copy or move the data"
DOT_DOT = Excluded(REJECTED, "key has a '..' path segment, which names a file outside the input: unread, rename it")
HIDDEN = Excluded(SKIPPED, "hidden name (a path part starts with '.' or '_'), skipped as Spark and Hadoop do")


@dataclass(frozen=True)
class ListedFile:
    """A file under the root: absolute ``path``, ``/``-separated ``relative_path``, size in bytes
    (``-1`` when it cannot be read, e.g. a broken symlink); ``unread``: why the listing already knows
    it must not be opened (a FIFO, a link leaving the tree), ``None`` for a plain file."""

    path: str
    relative_path: str
    size_bytes: int
    unread: Optional[str] = None


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
             check_spark_hidden: bool = True, unread: Optional[str] = None) -> Union[ClassFolder, Excluded]:
    """Decide, without reading it, whether a file is input and of which class.

    The first reason that applies is the one reported, in this order: a ``..`` segment (an object
    key naming a file outside the input: rejected, never read), a hidden name (the user's
    way to leave a file or folder out, as Spark's), a folder link, the file's place (directly
    under the root, or under a folder that is no class: not input whatever its name or
    extension), its extension, its name's encoding, what the listing found it to be
    (``unread``), its size. So a file is rejected (bad input) only when it would otherwise be
    input, and a loose file at the root is reported as such, never by its extension.

    Args:
        relative_path: path under the root, ``/``-separated.
        size_bytes: file size.
        max_file_bytes: larger files are rejected unread.
        layout: the tree's classes (:func:`class_folders`); ``None`` reads ``NNN.name`` folders.
        check_spark_hidden: report names Spark's listing ignores (driver side only).
        unread: :attr:`ListedFile.unread`, a rejection reason when the file would be input.

    Returns:
        the file's :class:`ClassFolder`, or an :class:`Excluded` with the reason.
    """
    if ".." in relative_path.split("/"):  # before the hidden rule, which '..' would also match
        return DOT_DOT
    if check_spark_hidden and spark_ignores(relative_path):
        return HIDDEN
    if unread == FOLDER_LINK:  # a folder of input wherever it is, top-level class folders included
        return Excluded(REJECTED, unread)
    label = label_for(relative_path, layout)
    if isinstance(label, str):
        return Excluded(SKIPPED, label)
    excluded = name_exclusion(relative_path, check_spark_hidden=False)
    if excluded is None and unread is not None:
        excluded = Excluded(REJECTED, unread)
    return excluded or size_exclusion(size_bytes, max_file_bytes) or label


def name_exclusion(relative_path: str, check_spark_hidden: bool = True) -> Optional[Excluded]:
    """Why a file is no image input, judging by its name alone; ``None`` when it may be one.

    Rejected first: a ``..`` segment (an object key that would name an object outside the input
    prefix, whatever its extension). Skipped: a hidden name (:func:`spark_ignores`, when
    ``check_spark_hidden``), an extension that is not an image's
    (:data:`~pipelines.etl.labels.IMAGE_EXTENSIONS`, any case). Rejected: an image's name that is not
    valid UTF-8 (outputs store paths as UTF-8 text), an object key with an empty or ``.`` segment;
    checked last, so a file that is no input anyway is skipped as such, not counted as bad input.
    """
    if ".." in relative_path.split("/"):
        return DOT_DOT
    if check_spark_hidden and spark_ignores(relative_path):
        return HIDDEN
    if not has_image_extension((path_parts(relative_path) or ('',))[-1]):
        return Excluded(SKIPPED, f"not an image extension ({' '.join(IMAGE_EXTENSIONS)}, any case)")
    if not is_utf8(relative_path):
        return Excluded(REJECTED, "file name is not valid UTF-8 (shown with \\x escapes): the Parquet path "
                                  "column is UTF-8 text; rename it")
    segments = relative_path.split("/")
    if "" in segments or "." in segments:
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
    """Every file under ``root``, recursively, sorted by relative path.

    Folder symlinks are not followed; each is listed as one entry (``unread``: :data:`FOLDER_LINK`).
    FIFOs, sockets and devices (:data:`NOT_REGULAR`) and file symlinks whose resolved target
    (``os.path.realpath``) is not below the root's (:data:`LINK_OUT`) are listed with ``unread``
    set, so the job records them as rejections and never opens them. A file symlink into the tree
    is followed (its size is the target's); a broken one has size ``-1``.

    Raises:
        FileNotFoundError: ``root`` does not exist. NotADirectoryError: it is not a folder.
        UnsupportedTree: an unreadable folder.

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
    inside = os.path.realpath(root_bytes).rstrip(b"/") + b"/"
    prefix = decode_name(root_bytes).rstrip("/")
    for dirpath, dirnames, filenames in os.walk(root_bytes, onerror=refuse):
        # os.walk joins from root_bytes, so the relative folder is what follows it. Names are joined
        # by concatenation: os.path.relpath per file was a quarter of listing 10,000 files, and
        # os.path.join a fifth.
        folder = dirpath[len(root_bytes):].lstrip(b"/")
        folder = folder + b"/" if folder else b""
        base = dirpath if dirpath.endswith(b"/") else dirpath + b"/"
        links = [name for name in dirnames if os.path.islink(base + name)]  # os.walk does not descend them
        for filename in filenames + links:
            rel = decode_name(folder + filename)
            files.append(_listed(base + filename, f"{prefix}/{rel}", rel, inside, filename in links))
    files.sort(key=lambda f: f.relative_path)
    return files


def _listed(raw: bytes, path: str, rel: str, inside: bytes, folder_link: bool) -> ListedFile:
    """One :class:`ListedFile` of :func:`list_files`, from its bytes path ``raw``; ``inside``: the
    resolved root with a trailing ``/``."""
    if folder_link:
        return ListedFile(path, rel, 0, FOLDER_LINK)
    try:
        st = os.stat(raw)
    except OSError:  # broken symlink: still a file we found and must account for
        return ListedFile(path, rel, -1)
    if not stat.S_ISREG(st.st_mode):
        return ListedFile(path, rel, 0, NOT_REGULAR)
    if os.path.islink(raw) and not os.path.realpath(raw).startswith(inside):
        return ListedFile(path, rel, st.st_size, LINK_OUT)
    return ListedFile(path, rel, st.st_size if os.access(raw, os.R_OK) else -1)


def class_folders(root: str) -> Layout:
    """The :class:`~pipelines.etl.labels.Layout` of the visible folders directly under ``root``
    (empty ones included; hidden ones, ``.x`` and ``_x``, folder symlinks (:data:`FOLDER_LINK`) and
    loose files are no class).

    Raises:
        ValueError: a mix of ``NNN.name`` and plain folder names, or two folders with the same
            number (``001.cat`` and ``001.dog``); see :func:`pipelines.etl.labels.decide_layout`.
    """
    names = []
    for entry in sorted(decode_name(e) for e in os.listdir(os.fsencode(root))):
        full = os.path.join(os.fsencode(root), encode_name(entry))
        if os.path.isdir(full) and not os.path.islink(full) and not spark_ignores(entry):
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
