"""The Petastorm reader of a rank's shard; the only module importing Petastorm or diskcache.

One worker thread only (with more, the order follows thread timing); its cache stores flat row groups, no pickles."""
from __future__ import annotations

import contextlib
import io
import os
import warnings
from typing import Iterator, Optional

import diskcache
from diskcache.core import MODE_BINARY, UNKNOWN

from pipelines.training.data import rowcache

#: free bytes a store leaves on the cache's disk for diskcache's SQLite files (rows, WAL)
SQLITE_RESERVE = 1 << 20


class NotCached(diskcache.Timeout):
    """Raised by ``RowGroupDisk.store`` for a value it does not store: ``FanoutCache.set`` then returns False."""


class RowGroupDisk(diskcache.Disk):
    """diskcache serialisation of Petastorm row groups as flat, memory-mapped ``rowcache`` files."""

    def store(self, value, read, key=UNKNOWN):
        """diskcache's ``store``: ``(size in bytes, mode, filename, db value)``, written to its own ``*.rowgroup`` file.

        Raises:
            NotCached: the value is not a flat row group, or the disk is (or would be) full."""
        columns = None if read else rowcache.flat_columns(value)
        if columns is None:
            raise NotCached("not a flat row group")
        size = sum(shape_bytes(dtype, shape) for _, dtype, shape in columns)
        if _free_bytes(self._directory) < size + SQLITE_RESERVE:
            rowcache.say_full_once(self._directory, OSError(28, "no space left for the next row group"))
            raise NotCached("disk full")
        filename, full_path = self.filename(key, value)
        filename, full_path = filename[:-len(".val")] + rowcache.SUFFIX, full_path[:-len(".val")] + rowcache.SUFFIX
        try:
            with _open_new(full_path) as f:
                size = rowcache.write_columns(f, value, columns)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.remove(full_path)
            if isinstance(exc, OSError) and exc.errno in rowcache.FULL_DISK:
                rowcache.say_full_once(self._directory, exc)
                raise NotCached("disk full") from None
            raise
        return size, MODE_BINARY, filename, None

    def fetch(self, mode, filename, value, read):
        """diskcache's ``fetch``: a ``*.rowgroup`` file as read-only mapped arrays; else a miss, never unpickled."""
        if read or mode != MODE_BINARY or not (filename or "").endswith(rowcache.SUFFIX):
            raise rowcache.DamagedEntry(f"{filename or 'an inline value'}: not a flat row group (never unpickled)")
        return rowcache.read_row_group(os.path.join(self._directory, filename))


def shape_bytes(dtype: str, shape) -> int:
    import numpy as np

    return int(np.prod(shape)) * np.dtype(dtype).itemsize


def _free_bytes(folder: str) -> int:
    info = os.statvfs(folder)
    return info.f_bavail * info.f_frsize


def _open_new(full_path: str):
    """An owner-only new file, its folder made first; 10 tries, as another thread's eviction may remove the folder."""
    for attempt in range(10):
        try:
            os.makedirs(os.path.dirname(full_path), mode=rowcache.FOLDER_MODE, exist_ok=True)
            return rowcache.open_private(full_path)
        except FileNotFoundError:
            if attempt == 9:
                raise
    raise AssertionError("unreachable")


def petastorm_seed(seed: int) -> int:
    """The seed Petastorm gets for ``seed``: distinct ones stay distinct, none is 0 (Petastorm's "unseeded"), >= 0."""
    return (seed % (2 ** 63 - 1)) + 1


@contextlib.contextmanager
def open_petastorm_reader(urls, filesystem, rank: int, world_size: int, cache_folder: Optional[str],
                          cache_limit: int, row_size: int, workers: int, seed: int) -> Iterator:
    """A looping Petastorm reader of ``rank``'s row groups of ``urls`` in ``seed``'s order; ``cache_folder`` is
    deleted on exit."""
    # petastorm 0.13 drives pyarrow 14 through APIs pyarrow deprecates, warning on every row group
    # (from its reader threads too: a process-wide filter), and warns that ``schema_fields`` are
    # now full-match patterns.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm(\..*)?$")
    warnings.filterwarnings("ignore", message="schema_fields behavior has changed")
    from petastorm import make_batch_reader

    cache = {}
    if cache_folder:
        cache = dict(cache_type="local-disk", cache_location=cache_folder, cache_size_limit=cache_limit,
                     cache_row_size_estimate=row_size, cache_extra_settings={"disk": RowGroupDisk})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # raised from pyarrow's own modules here
        reader = make_batch_reader(urls, filesystem=filesystem, schema_fields=["image", "label"],
                                   cur_shard=rank, shard_count=world_size, num_epochs=None,
                                   shuffle_row_groups=True, shuffle_rows=False, seed=petastorm_seed(seed),
                                   reader_pool_type="thread", workers_count=1,  # the order: the module's doc
                                   convert_early_to_numpy=True, **cache)
    # The reader owns its lifetime: its __exit__ stops and joins it and deletes its cache. It also
    # prints "Cache cleanup complete.", so stdout is silenced for that exit only (``silence`` is
    # entered on the way out and left after the reader's __exit__).
    silence = contextlib.ExitStack()
    with silence, reader:
        try:
            yield reader
        finally:
            silence.enter_context(contextlib.redirect_stdout(io.StringIO()))
