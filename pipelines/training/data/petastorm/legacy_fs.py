"""Petastorm over the parts the manifest names and nothing else: a legacy ``pyarrow.filesystem`` of pinned files.

No path is a folder and nothing lists, so Petastorm never unpickles a ``_common_metadata``."""
from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # pyarrow.filesystem is deprecated, and what petastorm needs
    from pyarrow import filesystem as legacyfs


def petastorm_url(part) -> str:
    """Petastorm's URL for a ``PinnedFile``: ``file:///path`` or ``file:///bucket/key`` (``s3://`` would need s3fs)."""
    path = part.location.path
    return "file://" + (path if part.local else "/" + path)


class PinnedPartsFileSystem(legacyfs.FileSystem):
    """The legacy-API view of a fixed set of pinned ``parts``, read-only; it pickles (the parts do)."""

    def __init__(self, parts):
        self.parts = {petastorm_url(part)[len("file://"):]: part for part in parts}

    def __reduce__(self):
        return PinnedPartsFileSystem, (list(self.parts.values()),)

    def exists(self, path: str) -> bool:
        return path in self.parts

    def isdir(self, path: str) -> bool:
        return False  # never a folder: pyarrow would list it and read its _common_metadata

    def isfile(self, path: str) -> bool:
        return path in self.parts

    def _isfilestore(self) -> bool:
        return False  # no empty folders, no rename (pyarrow asks when writing only)

    def ls(self, path: str):
        raise OSError(f"{path}: the data's parts are read as the manifest names them, never listed")

    def walk(self, path: str):
        raise OSError(f"{path}: the data's parts are read as the manifest names them, never listed")

    def open(self, path: str, mode: str = "rb"):
        """The part at ``path`` as the file pinned (``rb`` only).

        Raises:
            FileNotFoundError: not a part.
            LinkRefused: the part's name now holds another file, a folder or a link."""
        if mode != "rb":
            raise ValueError(f"PinnedPartsFileSystem opens files for reading only, not {mode!r}")
        if path not in self.parts:
            raise FileNotFoundError(f"{path}: not a part the manifest names")
        return self.parts[path].open()

    def stat(self, path: str):
        if path not in self.parts:
            raise FileNotFoundError(f"{path}: not a part the manifest names")
        with self.parts[path].open() as f:
            return {"size": f.size(), "kind": "file"}

    @property
    def pathsep(self) -> str:
        return "/"


def split_urls(data, split: str):
    """``file://`` URLs of ``split``'s Parquet files, to read through ``petastorm_filesystem``."""
    return [petastorm_url(part) for part in data.parts(split)]


def petastorm_filesystem(data):
    """The ``PinnedPartsFileSystem`` of every split's pinned parts of ``data``."""
    return PinnedPartsFileSystem([part for parts in data.pin_parts().values() for part in parts])
