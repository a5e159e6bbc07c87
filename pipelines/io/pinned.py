"""A data file checked once and read only as that file: :class:`PinnedFile`.

A reader that checks a file by its name and later opens the name again reads whatever the name
holds by then: a folder (whose ``_common_metadata`` Petastorm unpickles), a link to a file outside
the data folder, another file. :func:`pin` opens a local file below its data folder without
following any link (:func:`pipelines.io.nofollow.open_regular`), checks on that descriptor that
it is a regular file, and keeps its identity (device, inode). Every later
:meth:`PinnedFile.open` opens it the same way and reads the descriptor it opened only when it
is still that file: a name swapped since is refused (:class:`~pipelines.io.nofollow.LinkRefused`),
never read. An object store's key has no links and no folder to swap in: it is opened by its key.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple

from pipelines.io.nofollow import LinkRefused, descriptor_path, open_regular, open_write
from pipelines.io.storage import Location


@dataclass(frozen=True)
class PinnedFile:
    """A file below ``root`` (:class:`pipelines.io.storage.Location`), ``relative`` to it
    (``/``-separated), and for a local file its ``identity`` ``(st_dev, st_ino)`` as first opened.
    It pickles (no descriptor is held): a process it is sent to opens and checks it again."""

    root: Location
    relative: str
    identity: Optional[Tuple[int, int]] = None

    @property
    def location(self) -> Location:
        return self.root.join(*self.relative.split("/"))

    @property
    def uri(self) -> str:
        return self.location.uri

    @property
    def local(self) -> bool:
        return self.root.local

    def relative_to(self, other: Location) -> str:
        return self.location.relative_to(other)

    def open_descriptor(self) -> int:
        """A read-only descriptor of this local file, opened below ``root`` without following a
        link and checked to be the regular file pinned; the caller closes it.

        Raises:
            LinkRefused: a link on the way, no longer a regular file, or another file than the
                one pinned (its name was swapped).
        """
        fd = open_regular(self.root.path, self.relative)
        status = os.fstat(fd)
        if self.identity is not None and (status.st_dev, status.st_ino) != self.identity:
            os.close(fd)
            raise LinkRefused(f"{self.uri} is no longer the file first checked (it was replaced): refused")
        return fd

    def open(self):
        """The file for reading as a ``pyarrow`` random-access file: a local one memory-mapped
        through the checked descriptor (:func:`~pipelines.io.nofollow.descriptor_path`), an
        object's by its key."""
        import pyarrow as pa

        if not self.local:
            return self.location.filesystem.open_input_file(self.location.path)
        fd = self.open_descriptor()
        try:
            return pa.memory_map(descriptor_path(fd))
        finally:
            os.close(fd)

    def copy_to(self, path: str, chunk: int = 1 << 20) -> None:
        """Copy the file as :meth:`open` opens it to the new local file ``path`` (mode 0600, not
        through a link: :func:`pipelines.io.nofollow.open_write`): a private copy for a reader that
        opens files by name in other processes (Spark's executors)."""
        with self.open() as source, open_write(path) as target:
            while True:
                block = source.read(chunk)
                if not block:
                    return
                target.write(block)

    def read_bytes(self) -> bytes:
        """The whole file (as :meth:`open` opens it)."""
        with self.open() as f:
            return f.read()


def pin(root: Location, relative: str) -> PinnedFile:
    """The :class:`PinnedFile` of ``root/relative``, a local one opened and checked now.

    Raises:
        LinkRefused: a link on the way, or not a regular file. FileNotFoundError: missing.
    """
    if not root.local:
        return PinnedFile(root, relative)
    fd = open_regular(root.path, relative)
    try:
        status = os.fstat(fd)
    finally:
        os.close(fd)
    return PinnedFile(root, relative, (status.st_dev, status.st_ino))
