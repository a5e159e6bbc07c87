"""The ETL's own listing of its input, the only one (Spark's file sources skip files silently).

Every file is a candidate, rejected (bad input) or skipped (not input), with a reason. Rejected unread: FIFOs,
sockets, devices, links out of the tree, folder links (loops, duplicates), object keys with a ``..`` segment."""
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
    """Why a file is not written: ``status`` `REJECTED` or `SKIPPED`, and the ``reason``."""

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
    """A file under the root; ``size_bytes`` -1: unreadable; ``unread``: why it must never be opened, if so."""

    path: str
    relative_path: str
    size_bytes: int
    unread: Optional[str] = None


def spark_ignores(relative_path: str) -> bool:
    """Whether Spark's listing hides it: a part starting ``.``, or ``_`` without ``=``, or ending ``._COPYING_``."""
    for part in path_parts(relative_path):
        if part.startswith(".") or (part.startswith("_") and "=" not in part) or part.endswith("._COPYING_"):
            return True
    return False


def classify(relative_path: str, size_bytes: int, max_file_bytes: int, layout: Optional[Layout] = None,
             check_spark_hidden: bool = True, unread: Optional[str] = None) -> Union[ClassFolder, Excluded]:
    """Decide, without reading it, whether a file is input and of which class: its `ClassFolder`, or `Excluded`.

    The first reason that applies is reported, in this order: a ``..`` segment, a hidden name, a folder link, its place
    (no class folder), its extension, its name's encoding, ``unread``, its size; so a file is rejected (bad input)
    only when it would otherwise be input."""
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
    """Why a file is no image input by its name alone (`classify`'s order); ``None`` when it may be one."""
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
    """Why a file cannot be read by its size (-1 unreadable, 0 empty, over ``max_file_bytes``); ``None``: it can."""
    if size_bytes < 0:
        return Excluded(REJECTED, "unreadable (broken link or permission denied)")
    if size_bytes == 0:
        return Excluded(REJECTED, "empty file (0 bytes)")
    if size_bytes > max_file_bytes:
        return Excluded(REJECTED, f"file too large: {size_bytes} bytes > {max_file_bytes} bytes (--max-file-mb)")
    return None


def reason_kind(reason: str) -> str:
    """The kind of a reason, for counts: ``"file too large: 9 bytes > 8 bytes"`` -> ``"file too large"``."""
    return reason.split(":")[0].split(" (")[0]


def decode_name(raw: bytes) -> str:
    """File-system bytes as ``str``, UTF-8 whatever the locale, other bytes as surrogate escapes."""
    return raw.decode("utf-8", "surrogateescape")


def encode_name(name: str) -> bytes:
    """The file-system bytes of a name from `decode_name`."""
    return name.encode("utf-8", "surrogateescape")


def is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def display_path(name: str) -> str:
    r"""A name for reports: non-UTF-8 bytes shown as ``\xNN`` (``caf\xe9.jpg``), so two names never collide."""
    return encode_name(name).decode("utf-8", "backslashreplace")


class UnsupportedTree(Refused):
    """The input tree holds something the job cannot read safely; raised before Spark."""


def list_files(root: str) -> List[ListedFile]:
    """Every file under ``root``, sorted by relative path; folder links listed, not followed.

    Raises:
        MissingInput, NotAFolder: ``root`` is missing or not a folder. UnsupportedTree: an unreadable folder."""
    if not os.path.exists(root):
        raise MissingInput(f"input folder does not exist: {root}")
    if not os.path.isdir(root):
        raise NotAFolder(f"input is not a folder: {root}")

    def refuse(error: OSError) -> None:
        name = error.filename
        name = display_path(decode_name(name)) if isinstance(name, bytes) else name
        raise UnsupportedTree(f"cannot list {name}: {error.strerror}")

    files = []
    # bytes in, UTF-8 out: the caller's locale (LC_ALL=C) must not decide what a name means
    root_bytes = os.fsencode(root)
    inside = os.path.realpath(root_bytes).rstrip(b"/") + b"/"
    prefix = decode_name(root_bytes).rstrip("/")
    for dirpath, dirnames, filenames in os.walk(root_bytes, onerror=refuse):
        # joined by concatenation: os.path.relpath and os.path.join per file are slow on large trees
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
    """One `ListedFile` from its bytes path; ``inside``: the resolved root with a trailing ``/``."""
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
    """The `Layout` of the visible folders directly under ``root``; raises `Refused` as `decide_layout`."""
    names = []
    for entry in sorted(decode_name(e) for e in os.listdir(os.fsencode(root))):
        full = os.path.join(os.fsencode(root), encode_name(entry))
        if os.path.isdir(full) and not os.path.islink(full) and not spark_ignores(entry):
            names.append(entry)
    return decide_layout(names)


def list_tree(root: "Location") -> Tuple[List[ListedFile], Layout]:
    """Every file under ``root`` and the tree's layout, for a local folder or an object store's prefix."""
    if root.local:
        return list_files(root.path), class_folders(root.path)
    return list_objects(root)


def list_objects(root: "Location") -> Tuple[List[ListedFile], Layout]:
    """Every object below the prefix ``root`` (``path`` its URI) and the layout; `MissingInput` if none."""
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
