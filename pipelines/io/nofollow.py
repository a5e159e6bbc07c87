"""Local files opened without following links (``openat``, ``O_NOFOLLOW``), each check made on the descriptor.

Deletions never descend into a link. Not covered: a file's bytes changed in place, a replaced root."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from typing import BinaryIO, Iterator, List

from pipelines.runtime.errors import Refused

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
# errno of an O_NOFOLLOW open meeting a link (ELOOP), or a name on the way that is not a folder (ENOTDIR)
_LINK_ERRNOS = (errno.ELOOP, errno.EMLINK, errno.ENOTDIR)


class LinkRefused(Refused):
    """A name below a data or output folder that is a link, or a folder where a file belongs (or the reverse)."""


def _names(relative: str) -> List[str]:
    names = [n for n in relative.split("/") if n not in ("", ".")]
    if ".." in names:
        raise LinkRefused(f"{relative}: '..' is not a name below a folder")
    return names


def _refusal(root: str, names: List[str], upto: int, exc: OSError) -> Exception:
    shown = os.path.join(root, *names[:upto + 1])
    if exc.errno in _LINK_ERRNOS:
        return LinkRefused(f"{shown} is a symbolic link or not a folder where one belongs: refused "
                           "(a data or output folder's files and folders are its own, never links)")
    return exc


@contextlib.contextmanager
def _folder(root: str, names: List[str]) -> Iterator[int]:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(names):
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise _refusal(root, names, i, exc) from None
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def open_below(root: str, relative: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """A descriptor of ``root/relative`` (``/``-separated, no ``..``), no name below ``root`` followed if a link.

    ``flags``: ``os.open``'s for the last name (``O_NOFOLLOW`` added); ``mode``: of a file ``O_CREAT`` makes.

    Raises:
        LinkRefused: a name on the way or the last one is a link (or a file where a folder belongs)."""
    names = _names(relative)
    if not names:
        return os.open(root, flags | os.O_CLOEXEC, mode)
    with _folder(root, names[:-1]) as parent:
        try:
            return os.open(names[-1], flags | _NOFOLLOW, mode, dir_fd=parent)
        except OSError as exc:
            raise _refusal(root, names, len(names) - 1, exc) from None


def open_regular(root: str, relative: str) -> int:
    """A read-only descriptor of the regular file ``root/relative``; `LinkRefused` if a link or not a file."""
    fd = open_below(root, relative, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: a planted FIFO does not block
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LinkRefused(f"{os.path.join(root, relative)} is not a regular file (a folder, or a device or "
                          "FIFO): refused")
    return fd


def descriptor_path(fd: int) -> str:
    """``/proc/self/fd/<fd>``: opens the file ``fd`` holds whatever happens to its names (Linux)."""
    return f"/proc/self/fd/{fd}"


def open_write(path: str, mode: int = 0o600, append: bool = False) -> BinaryIO:
    """``path`` opened to write or append, its mode set with ``fchmod``; `LinkRefused` if a link or not a file."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0)  # truncated once checked
    folder, name = os.path.split(os.path.abspath(path))
    try:
        fd = open_below(folder, name, flags | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno not in (errno.ENXIO, errno.EISDIR):  # a FIFO nobody reads; a folder
            raise
        raise LinkRefused(f"{path} is not a regular file: refused (nothing written)") from None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
        os.close(fd)
        raise LinkRefused(f"{path} is not a regular file of its own (a device, a FIFO, or a hard link to "
                          "another name): refused (nothing written)")
    if not append:
        os.ftruncate(fd, 0)
    os.fchmod(fd, mode)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab" if append else "wb")


def make_folder(path: str, mode: int = 0o700) -> str:
    """Make the folder ``path`` (and parents) if missing; `LinkRefused` if it is a link or not a folder."""
    os.makedirs(path, mode=mode, exist_ok=True)
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        raise LinkRefused(f"{path} is a symbolic link or not a folder: refused (nothing is written through it)")
    return path


def read_text_below(root: str, relative: str) -> str:
    """The UTF-8 text of the regular file ``root/relative`` (`open_regular`)."""
    with os.fdopen(open_regular(root, relative), "rb") as f:
        return f.read().decode("utf-8")


def list_below(root: str, relative: str) -> List[str]:
    """The sorted names in the folder ``root/relative`` (``[]`` when missing), no link on the way followed."""
    try:
        fd = open_below(root, relative, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return []
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def is_link_below(root: str, relative: str) -> bool:
    """Whether ``root/relative`` itself is a symbolic link (its folders opened without following)."""
    names = _names(relative)
    with _folder(root, names[:-1]) as parent:
        try:
            return stat.S_ISLNK(os.stat(names[-1], dir_fd=parent, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return False


def remove_below(root: str, relative: str) -> bool:
    """Delete the file, link or folder ``root/relative``, following no link; returns whether it existed."""
    names = _names(relative)
    if not names:
        raise LinkRefused(f"{root}: refusing to delete the root itself")
    try:
        with _folder(root, names[:-1]) as parent:
            try:
                kind = os.stat(names[-1], dir_fd=parent, follow_symlinks=False).st_mode
            except FileNotFoundError:
                return False
            if stat.S_ISDIR(kind):
                shutil.rmtree(names[-1], dir_fd=parent)
            else:
                os.unlink(names[-1], dir_fd=parent)
            return True
    except FileNotFoundError:
        return False
