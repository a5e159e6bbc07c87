"""Local files opened without following links and checked on the opened descriptor: the one place.

A data or output folder may hold names someone else planted: a part replaced by a folder, a run
folder or ``runs/`` that is a symbolic link, a link where a log or ``history.csv`` will be
written. Every check here is made on what was opened, never on a name looked up again later:

* :func:`open_below` opens ``relative`` below a ``root`` folder one name at a time (``openat``
  from the folder opened before), each with ``O_NOFOLLOW``, so no folder or file on the way may
  be a link (``root`` itself is what the user named, and may be one);
* :func:`open_regular` adds the check that what was opened is a regular file (``fstat``), and
  :func:`descriptor_path` names that descriptor (``/proc/self/fd/N``) for a library that opens
  files by path (pyarrow's memory map): the path reopens the file the descriptor holds, whatever
  was renamed or planted since;
* :func:`open_write` opens a file to write or append with ``O_NOFOLLOW``, refuses one that is
  not a regular file, and sets its mode on the descriptor (``fchmod``): no file is chmodded
  through a link;
* :func:`remove_below` deletes a file or folder below a root without following a link anywhere
  (``shutil.rmtree`` with ``dir_fd``, which never descends into a link), and
  :func:`list_below` lists a folder opened the same way.

What it does not protect against: the file's own bytes changing in place (someone who may write
the file may rewrite it), and a ``root`` that is itself replaced by whoever owns its parent.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from typing import BinaryIO, Iterator, List

from pipelines.runtime.errors import Refused

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
# errno of an open with O_NOFOLLOW whose last name is a link (ELOOP), or whose name on the way
# is not a folder (ENOTDIR: a file, or with O_DIRECTORY, a link)
_LINK_ERRNOS = (errno.ELOOP, errno.EMLINK, errno.ENOTDIR)


class LinkRefused(Refused):
    """A name below a data or output folder that is a link, a folder where a file belongs, or a
    file where a folder belongs: refused, the message naming it."""


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
    """A descriptor of the folder ``root/names...``, each name opened without following a link."""
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
    """A descriptor of ``root/relative`` opened with ``flags``, no name below ``root`` followed
    if it is a link.

    Args:
        root: a local folder (absolute or relative to the working folder).
        relative: ``/``-separated names below it (no ``..``).
        flags: ``os.open`` flags for the last name (``O_NOFOLLOW`` and ``O_CLOEXEC`` are added).
        mode: permission bits of a file ``O_CREAT`` makes.

    Raises:
        LinkRefused: a name on the way or the last one is a link (or a file where a folder belongs).
        FileNotFoundError, OSError: as ``os.open``.
    """
    names = _names(relative)
    if not names:
        return os.open(root, flags | os.O_CLOEXEC, mode)
    with _folder(root, names[:-1]) as parent:
        try:
            return os.open(names[-1], flags | _NOFOLLOW, mode, dir_fd=parent)
        except OSError as exc:
            raise _refusal(root, names, len(names) - 1, exc) from None


def open_regular(root: str, relative: str) -> int:
    """A read-only descriptor of the regular file ``root/relative`` (:func:`open_below`), checked
    by ``fstat`` on that descriptor; the caller closes it.

    Raises:
        LinkRefused: a link on the way, or not a regular file (a folder, a device, a FIFO).
        FileNotFoundError: it does not exist.
    """
    fd = open_below(root, relative, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: a planted FIFO does not block
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LinkRefused(f"{os.path.join(root, relative)} is not a regular file (a folder, or a device or "
                          "FIFO): refused")
    return fd


def descriptor_path(fd: int) -> str:
    """``/proc/self/fd/<fd>``: a path that opens the file ``fd`` holds (Linux), for libraries that
    open by path. It stays that file while ``fd`` is open, whatever happens to its names."""
    return f"/proc/self/fd/{fd}"


def open_write(path: str, mode: int = 0o600, append: bool = False) -> BinaryIO:
    """``path`` opened to write (truncated) or to append, created with ``mode`` if missing, never
    through a link; the mode is set on the opened descriptor (``fchmod``), whatever an older file's
    mode or the umask.

    Raises:
        LinkRefused: ``path`` is a symbolic link or not a regular file (nothing is written or
            chmodded).
    """
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
    """Make the folder ``path`` (and its parents) if missing; refuse one that is a link.

    Raises:
        LinkRefused: ``path`` is a symbolic link (to a folder or not) or not a folder.
    """
    os.makedirs(path, mode=mode, exist_ok=True)
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        raise LinkRefused(f"{path} is a symbolic link or not a folder: refused (nothing is written through it)")
    return path


def read_text_below(root: str, relative: str) -> str:
    """The UTF-8 text of the regular file ``root/relative`` (:func:`open_regular`)."""
    with os.fdopen(open_regular(root, relative), "rb") as f:
        return f.read().decode("utf-8")


def list_below(root: str, relative: str) -> List[str]:
    """The names in the folder ``root/relative`` (sorted; ``[]`` when it is missing), no name on
    the way followed if it is a link.

    Raises:
        LinkRefused: ``relative`` or a folder on the way is a link or a file.
    """
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
    """Delete the file, link or folder ``root/relative`` (a folder with everything below it),
    following no link on the way or inside it: a link is removed itself, never what it names.

    Returns:
        whether something was deleted (False: it did not exist).

    Raises:
        LinkRefused: a folder on the way is a link.
    """
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
