"""Files that appear whole or not at all: a temporary file beside the target (``mkstemp``), then ``os.replace``.

The temporary name is checked to still be that file before the rename: nothing goes through a link planted there."""
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
    """Yield a new temporary file's path (ending in ``suffix``) for writers that open by name; on success it
    replaces ``path``.

    Raises:
        LinkRefused: the temporary name was swapped while it was written."""
    with _temporary(path, suffix) as (fd, tmp):
        yield tmp
        _finish(fd, tmp, path, mode)


@contextlib.contextmanager
def replacing_file(path: str, mode: int = PRIVATE) -> Iterator[BinaryIO]:
    """`replacing` for writers that take a file object: yields the temporary file open for binary writing."""
    with _temporary(path, "") as (fd, tmp):
        with os.fdopen(os.dup(fd), "wb") as f:
            yield f
        _finish(fd, tmp, path, mode)


@contextlib.contextmanager
def _temporary(path: str, suffix: str) -> Iterator[Tuple[int, str]]:
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
    opened, named = os.fstat(fd), os.lstat(tmp)
    if not stat.S_ISREG(named.st_mode) or (named.st_dev, named.st_ino) != (opened.st_dev, opened.st_ino):
        raise LinkRefused(f"{tmp}: the temporary file was replaced while it was written: refused")


def _finish(fd: int, tmp: str, path: str, mode: int) -> None:
    _check_same(fd, tmp)
    os.fchmod(fd, mode)
    os.replace(tmp, path)


def write_json(path: str, value: Any, indent: int = 2, mode: int = PRIVATE) -> None:
    """Write ``value`` as UTF-8 JSON to ``path`` atomically (non-ASCII kept), with ``mode``."""
    with replacing_file(path, mode=mode) as f:
        f.write(json.dumps(value, indent=indent, ensure_ascii=False).encode("utf-8"))
