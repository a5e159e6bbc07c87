"""The Petastorm reader of a rank's shard (the ``petastorm`` reader; the mission stack's).

The only module that imports Petastorm or diskcache (its cache's store): the current stack,
whose pyarrow Petastorm 0.13.1 cannot import, never loads it (whether it can is
:func:`pipelines.training.data.petastorm.petastorm_available`). :func:`open_petastorm_reader` is
what :func:`pipelines.training.data.readers.open_reader` opens for ``--reader petastorm``
(through :func:`pipelines.training.data.petastorm.open_shard`).

Its order is reproducible: Petastorm 0.13's ventilator permutes the shard's row groups once with
``seed`` (one order, repeated every pass; a seed of 0 means "no seed" to Petastorm, so the seed
given is mapped to a non-zero one, :func:`petastorm_seed`) and queues them to the pool's one worker
thread, whose results come back in that order. With more workers the pool takes results in turn
only while the ventilator keeps ahead: a worker whose queue is momentarily empty is skipped
(``ThreadPool.current_worker_done``), so from the second pass on the order follows the threads'
timing. One worker reads far faster than a rank trains (docs/training.md), so the reader keeps one
whatever ``workers`` says (our reader's threads, which keep its order at any count). Its train stream
is still not positioned (:func:`pipelines.training.data.readers.exact_positions` is False): the
reader cannot be started at a row group, so training over it keeps ``tf.data``'s seeded shuffle
buffer and flips, and a run resumed mid-epoch starts its stream afresh (the batches differ from an
uninterrupted run's).

Petastorm's ``LocalDiskCache`` is a ``diskcache.FanoutCache``; by default it pickles each row
group, and every warm read unpickles it (a planted cache file would run code: diskcache
CVE-2025-69872), converts Arrow's binary column to an object array of Python ``bytes`` and
training joins those. :class:`RowGroupDisk` is a ``diskcache.Disk`` (diskcache's own extension
point, passed through Petastorm's ``cache_extra_settings``) that stores a row group in the flat
format of :mod:`pipelines.training.data.rowcache` and never unpickles: a value diskcache stored
pickled reads as a miss. (Anything that is not a flat row group, which training refuses anyway,
is not cached at all.) Its keys are strings, which diskcache stores raw. A full disk stops
storing (said once) instead of failing the reader.
"""
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
    """Raised by :meth:`RowGroupDisk.store` for a value it does not store: ``FanoutCache.set``
    takes a ``Timeout`` for "not stored" and returns False, so Petastorm's reader goes on."""


class RowGroupDisk(diskcache.Disk):
    """diskcache serialisation of Petastorm row groups as flat, memory-mapped files (module doc)."""

    def store(self, value, read, key=UNKNOWN):
        """diskcache's ``store``: ``(size in bytes, mode, filename, db value)``; a row group is
        written to its own owner-only ``*.rowgroup`` file (removed again if writing fails).

        Raises:
            NotCached: the value is not a flat row group, or the disk is (or would be) full.
        """
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
        """diskcache's ``fetch``: a ``*.rowgroup`` file comes back as a dict of read-only arrays
        over one memory map of the file; anything else (a pickled value, planted or old) is a miss
        (an ``OSError`` for diskcache's ``get``), never unpickled."""
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
    """An owner-only new file (:func:`rowcache.open_private`), its folder made first; tried 10
    times, as diskcache's own ``Disk._write`` does, because another thread's eviction removes
    folders that became empty (``Disk.remove``) between our ``makedirs`` and ``open``."""
    for attempt in range(10):
        try:
            os.makedirs(os.path.dirname(full_path), mode=rowcache.FOLDER_MODE, exist_ok=True)
            return rowcache.open_private(full_path)
        except FileNotFoundError:
            if attempt == 9:
                raise
    raise AssertionError("unreachable")


def petastorm_seed(seed: int) -> int:
    """The seed Petastorm gets for ``seed`` (any int): distinct seeds (under 2**62 in size) stay distinct, none is 0,
    which Petastorm 0.13 reads as "unseeded" (``ConcurrentVentilator``, ``ThreadPool``), and each
    fits numpy's ``default_rng`` (non-negative)."""
    return (seed % (2 ** 63 - 1)) + 1


@contextlib.contextmanager
def open_petastorm_reader(urls, filesystem, rank: int, world_size: int, cache_folder: Optional[str],
                          cache_limit: int, row_size: int, workers: int, seed: int) -> Iterator:
    """A looping Petastorm batch reader of rank ``rank``'s row groups of ``urls`` (file:// URLs;
    Petastorm's ``cur_shard``/``shard_count``, the rule of :func:`pipelines.training.data.sharding.shard`;
    ``filesystem`` the legacy filesystem of the pinned parts,
    :func:`~pipelines.training.data.petastorm.legacy_fs.petastorm_filesystem`), with a local-disk cache of
    flat files in ``cache_folder`` (None: no cache; :func:`pipelines.training.data.readers.open_reader`),
    its row groups in the order ``seed`` gives (the module's doc; ``workers`` is not used: one thread).

    Yields the reader, stopped and joined on exit (which deletes ``cache_folder``).
    """
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
