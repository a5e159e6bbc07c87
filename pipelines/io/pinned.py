"""A data file checked once and read only as that file: `PinnedFile`.

A local file is opened without following links and its (device, inode) kept: every later open must find that same
file, never a folder (whose ``_common_metadata`` Petastorm unpickles) or a link. Object store keys: opened by key."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple

from pipelines.io.nofollow import LinkRefused, descriptor_path, open_regular, open_write
from pipelines.io.storage import Location


@dataclass(frozen=True)
class PinnedFile:
    """The file ``relative`` below ``root`` and a local file's ``(st_dev, st_ino)``; pickles without a descriptor."""

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
        """A read-only descriptor of this local file; `LinkRefused` unless it is the file pinned."""
        fd = open_regular(self.root.path, self.relative)
        status = os.fstat(fd)
        if self.identity is not None and (status.st_dev, status.st_ino) != self.identity:
            os.close(fd)
            raise LinkRefused(f"{self.uri} is no longer the file first checked (it was replaced): refused")
        return fd

    def open(self):
        """The file as a ``pyarrow`` random-access file; a local one memory-mapped from the checked descriptor."""
        import pyarrow as pa

        if not self.local:
            return self.location.filesystem.open_input_file(self.location.path)
        fd = self.open_descriptor()
        try:
            return pa.memory_map(descriptor_path(fd))
        finally:
            os.close(fd)

    def copy_to(self, path: str, chunk: int = 1 << 20) -> None:
        """Copy the file to the new local file ``path`` (mode 0600), for readers that open by name."""
        with self.open() as source, open_write(path) as target:
            while True:
                block = source.read(chunk)
                if not block:
                    return
                target.write(block)

    def read_bytes(self) -> bytes:
        with self.open() as f:
            return f.read()


def pin(root: Location, relative: str) -> PinnedFile:
    """The `PinnedFile` of ``root/relative``; a local one is opened now, `LinkRefused` if a link or not a file."""
    if not root.local:
        return PinnedFile(root, relative)
    fd = open_regular(root.path, relative)
    try:
        status = os.fstat(fd)
    finally:
        os.close(fd)
    return PinnedFile(root, relative, (status.st_dev, status.st_ino))
