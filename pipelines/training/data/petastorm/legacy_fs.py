"""Petastorm over the parts the manifest names and nothing else: a legacy filesystem of pinned files.

Petastorm 0.13.1 opens a dataset with ``pq.ParquetDataset(..., validate_schema=False,
metadata_nthreads=10)``, which pyarrow 14 accepts only on its legacy path, and takes that path only
when it is handed a legacy ``pyarrow.filesystem.FileSystem``: a new-style ``pyarrow.fs`` S3
filesystem fails (``validate_schema`` ValueError) and pyarrow's own legacy ``S3FSWrapper`` calls
s3fs's now-asynchronous ``_ls`` (``'coroutine' object is not iterable``).

It is also where a path becomes a folder: handed one path (a list of one part, too), pyarrow asks
``isdir`` and, for a folder, lists it and reads its ``_common_metadata``, whose pickled schema
Petastorm unpickles; handed its own local filesystem, it opens each part again by name.
:class:`PinnedPartsFileSystem` answers those calls for the parts of a
:class:`~pipelines.training.data.dataset.Dataset` alone (:meth:`~pipelines.training.data.dataset.Dataset.pin_parts`):
no path is a folder, only the parts are files, nothing can be listed, and a part opens as the file
pinned (:meth:`pipelines.io.pinned.PinnedFile.open`), local or in a bucket, whatever its name
holds by then. :func:`split_urls` gives Petastorm the URLs it maps back.
"""
from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # pyarrow.filesystem is deprecated, and what petastorm needs
    from pyarrow import filesystem as legacyfs


def petastorm_url(part) -> str:
    """The URL to give Petastorm for a :class:`pipelines.io.pinned.PinnedFile`:
    ``file:///path`` of a local part, ``file:///bucket/key`` of an object's.

    Petastorm turns an ``s3://`` URL into a path with fsspec's s3fs (not installed here, and not
    needed) even when it is handed a filesystem; a ``file://`` URL becomes its path as it is,
    which :class:`PinnedPartsFileSystem` maps back to the part.
    """
    path = part.location.path
    return "file://" + (path if part.local else "/" + path)


class PinnedPartsFileSystem(legacyfs.FileSystem):
    """The legacy-API view of a fixed set of pinned parts (read-only: what Petastorm calls).

    Args:
        parts: :class:`pipelines.io.pinned.PinnedFile` s; each is the file at its
            :func:`petastorm_url`'s path, and nothing else exists.

    It pickles (the parts do), so a process reader pool could carry it too.
    """

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
        """The part at ``path`` as the file pinned (``rb`` only: readers never write through this).

        Raises:
            FileNotFoundError: not a part. pipelines.io.nofollow.LinkRefused: the part's name now
                holds another file, a folder or a link.
        """
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
    """``file://`` URLs of the Parquet files of ``split`` of ``data`` (a
    :class:`~pipelines.training.data.dataset.Dataset`), as Petastorm wants them
    (:func:`petastorm_url`), read through :func:`petastorm_filesystem`."""
    return [petastorm_url(part) for part in data.parts(split)]


def petastorm_filesystem(data):
    """What Petastorm reads ``data``'s parts through, local or in a bucket: the
    :class:`PinnedPartsFileSystem` of every split's pinned parts."""
    return PinnedPartsFileSystem([part for parts in data.pin_parts().values() for part in parts])
