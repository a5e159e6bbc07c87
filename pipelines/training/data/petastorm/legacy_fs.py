"""Petastorm on any ``pyarrow.fs`` filesystem: a legacy ``pyarrow.filesystem.FileSystem`` over one.

Petastorm 0.13.1 opens a dataset with ``pq.ParquetDataset(..., validate_schema=False,
metadata_nthreads=10)``, which pyarrow 14 accepts only on its legacy path, and takes that path only
when it is handed a legacy ``pyarrow.filesystem.FileSystem``: a new-style ``pyarrow.fs`` S3
filesystem fails (``validate_schema`` ValueError) and pyarrow's own legacy ``S3FSWrapper`` calls
s3fs's now-asynchronous ``_ls`` (``'coroutine' object is not iterable``). :class:`LegacyFileSystem`
gives that legacy path the calls it makes (``isdir``, ``isfile``, ``ls``, ``walk``, ``open``,
``exists``) answered by the :class:`pipelines.io.storage.Location`'s ``pyarrow.fs`` filesystem, so the
same S3/GCS/HDFS/fsspec filesystem that reads the manifest also feeds Petastorm's readers, given
the URLs it maps back (:func:`split_urls`).
"""
from __future__ import annotations

import posixpath
import warnings

import pyarrow.fs as pafs

from pipelines.io.paths import local_url

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # pyarrow.filesystem is deprecated, and what petastorm needs
    from pyarrow import filesystem as legacyfs


def petastorm_url(location) -> str:
    """The URL to give Petastorm for a :class:`pipelines.io.storage.Location` read through
    :class:`LegacyFileSystem`: ``file:///bucket/key``.

    Petastorm turns an ``s3://`` URL into a path with fsspec's s3fs (not installed here, and not
    needed) even when it is handed a filesystem; a ``file://`` URL becomes its path as it is,
    ``/bucket/key``, which the wrapper maps back to the store's ``bucket/key``.
    """
    return "file://" + (location.path if location.local else "/" + location.path)


class LegacyFileSystem(legacyfs.FileSystem):
    """The legacy-API view of a ``pyarrow.fs.FileSystem`` (read-only: what Petastorm calls).

    Petastorm's paths are ``/bucket/key`` (:func:`petastorm_url`); the store's are ``bucket/key``.
    It pickles (the filesystem does), so a process reader pool could carry it too.
    """

    def __init__(self, filesystem: pafs.FileSystem, local: bool = False):
        self.fs = filesystem
        self.local = local

    def __reduce__(self):
        return LegacyFileSystem, (self.fs, self.local)

    def _store(self, path: str) -> str:
        """Petastorm's path -> the filesystem's."""
        path = path.rstrip("/")
        return path if self.local else path.lstrip("/")

    def _petastorm(self, path: str) -> str:
        """The filesystem's path -> Petastorm's."""
        return path if self.local else "/" + path

    def _info(self, path: str) -> pafs.FileInfo:
        return self.fs.get_file_info(self._store(path))

    def exists(self, path: str) -> bool:
        return self._info(path).type != pafs.FileType.NotFound

    def isdir(self, path: str) -> bool:
        return self._info(path).type == pafs.FileType.Directory

    def isfile(self, path: str) -> bool:
        return self._info(path).type == pafs.FileType.File

    def _isfilestore(self) -> bool:
        return False  # object stores: no empty folders, no rename (pyarrow asks when writing only)

    def ls(self, path: str):
        """Full paths of the entries directly below ``path``."""
        selector = pafs.FileSelector(self._store(path), recursive=False)
        return sorted(self._petastorm(info.path) for info in self.fs.get_file_info(selector))

    def walk(self, path: str):
        """``os.walk``'s triples ``(folder, subfolder names, file names)``, top down."""
        selector = pafs.FileSelector(self._store(path), recursive=False)
        infos = self.fs.get_file_info(selector)
        folders = sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)
        files = sorted(i.base_name for i in infos if i.type == pafs.FileType.File)
        yield path, folders, files
        for folder in folders:
            yield from self.walk(posixpath.join(path, folder))

    def open(self, path: str, mode: str = "rb"):
        """A seekable input file (``rb`` only: readers never write through this)."""
        if mode != "rb":
            raise ValueError(f"LegacyFileSystem opens files for reading only, not {mode!r}")
        return self.fs.open_input_file(self._store(path))

    def stat(self, path: str):
        info = self._info(path)
        return {"size": info.size, "kind": "directory" if info.type == pafs.FileType.Directory else "file"}

    @property
    def pathsep(self) -> str:
        return "/"


def split_urls(data, split: str):
    """``file://`` URLs of the Parquet files of ``split`` of ``data`` (a
    :class:`~pipelines.training.data.dataset.Dataset`), as Petastorm wants them: for a URI root, the
    URLs :class:`LegacyFileSystem` maps back to the store (:func:`petastorm_url`)."""
    return [local_url(part.path) if part.local else petastorm_url(part) for part in data.parts(split)]


def petastorm_filesystem(data):
    """What Petastorm reads ``data``'s URI root through (``None`` for local files: its own)."""
    location = data.location
    return None if location.local else LegacyFileSystem(location.filesystem)
