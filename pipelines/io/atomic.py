"""Files that appear whole or not at all: write to a temporary file beside the target, then rename.

``os.replace`` within one folder is atomic on POSIX file systems, so a reader (``--resume``, a
training run reading features, a later stage reading a manifest) sees the old file or the new
one, never half of one, even when the writer is killed mid-write.

The temporary file is made by :func:`tempfile.mkstemp` in the target's folder: an unpredictable
name, created with ``O_CREAT | O_EXCL`` (a symlink or file planted there by someone else is never
opened, let alone followed) and mode 0600. Its descriptor is kept: the name is checked to still be
that file before the rename, and the mode is set on the descriptor (``fchmod``), so nothing is
written or chmodded through a link planted in the folder. The file keeps mode 0600 unless the
writer asks for another (``mode``): files holding run state (checkpoints, their markers, run
records) stay owner-only; published results that other accounts read (a model, its contract,
pictures) pass ``mode=PUBLIC``.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from typing import Any, BinaryIO, Iterator, Tuple

from pipelines.io.nofollow import LinkRefused

PRIVATE = 0o600  # run state: readable by the job's own account only
PUBLIC = 0o644  # published results (model.keras, model.json, pictures): readable by every account


@contextlib.contextmanager
def replacing(path: str, suffix: str = "", mode: int = PRIVATE) -> Iterator[str]:
    """Yield the path of a new, empty temporary file (mode 0600) in ``path``'s folder, for writers
    that open files by name (Keras, matplotlib); on success it gets ``mode`` and replaces ``path``,
    on an error it is removed and the error propagates (``path`` is left as it was).

    The temporary file's descriptor stays open: before the rename the name is checked to still be
    that file (not swapped for a link or another file: :func:`_check_same`), and its mode is set
    on the descriptor, never through a name. Writers that take a file object use
    :func:`replacing_file`, which writes through the descriptor itself.

    Args:
        path: the file to write (its final name is replaced by a rename, never followed if a link).
        suffix: ending of the temporary name, for writers that choose a format by it
            (Keras' ``.keras``, ``.h5``).
        mode: permission bits of the file once written (:data:`PRIVATE` or :data:`PUBLIC`).

    Raises:
        pipelines.io.nofollow.LinkRefused: the temporary name was swapped while it was written.
    """
    with _temporary(path, suffix) as (fd, tmp):
        yield tmp
        _finish(fd, tmp, path, mode)


@contextlib.contextmanager
def replacing_file(path: str, mode: int = PRIVATE) -> Iterator[BinaryIO]:
    """:func:`replacing` for writers that take a file object: yield the temporary file open for
    binary writing (its descriptor: no name is opened again)."""
    with _temporary(path, "") as (fd, tmp):
        with os.fdopen(os.dup(fd), "wb") as f:
            yield f
        _finish(fd, tmp, path, mode)


@contextlib.contextmanager
def _temporary(path: str, suffix: str) -> Iterator[Tuple[int, str]]:
    """``(descriptor, name)`` of a new temporary file beside ``path``; closed, and removed unless
    renamed, on the way out."""
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=f".tmp{suffix}", dir=folder)
    try:
        yield fd, tmp
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)  # a name, removed itself: never what a link names
        raise
    finally:
        os.close(fd)


def _check_same(fd: int, tmp: str) -> None:
    """Refuse when the name ``tmp`` no longer is the file ``fd`` holds (swapped for a link or
    another file while a writer had it)."""
    opened, named = os.fstat(fd), os.lstat(tmp)
    if not stat.S_ISREG(named.st_mode) or (named.st_dev, named.st_ino) != (opened.st_dev, opened.st_ino):
        raise LinkRefused(f"{tmp}: the temporary file was replaced while it was written: refused")


def _finish(fd: int, tmp: str, path: str, mode: int) -> None:
    _check_same(fd, tmp)
    os.fchmod(fd, mode)
    os.replace(tmp, path)


def write_json(path: str, value: Any, indent: int = 2, mode: int = PRIVATE) -> None:
    """Write ``value`` as UTF-8 JSON to ``path`` atomically (non-ASCII kept as is), with ``mode``."""
    with replacing_file(path, mode=mode) as f:
        f.write(json.dumps(value, indent=indent, ensure_ascii=False).encode("utf-8"))
