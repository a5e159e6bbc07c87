"""Our own reader of a rank's shard (the ``own`` reader): pyarrow row groups, a few threads, flat cache.

Petastorm's contract as training uses it, without Petastorm (which cannot run on pyarrow >= 16):

* the shard is row groups ``rank, rank + world_size, ...`` of the manifest's parts, files in the
  manifest's order and groups in file order
  (:func:`~pipelines.training.data.rowgroups.split_row_groups`; Petastorm's rule, and
  :class:`pipelines.training.data.onepass.OnePassShard`'s);
* it loops forever; each epoch visits every row group of the shard once, in an order drawn from
  ``seed`` and the epoch number (a NumPy ``default_rng((seed, epoch))`` permutation,
  :func:`pipelines.training.data.stream.epoch_order`), so a run repeats its order exactly;
* ``workers`` threads read row groups (``ParquetFile.read_row_group``; pyarrow releases the GIL
  while it reads and decodes) at most ``depth`` row groups ahead of the consumer, from the moment
  the reader is made, and the reader yields them in its order;
* :meth:`ArrowShardReader.restart` makes it read another order from now on (the positioned train
  stream's, :mod:`pipelines.training.data.stream`, opened at any visit): the read-ahead of the previous
  order is cancelled and the iterators over it stop;
* with a cache folder, each row group is decoded from Parquet straight into its flat file, a few
  images at a time (:class:`pipelines.training.data.rowcache.RowGroupFiles`), and every epoch, the
  first too, maps it back; without one (or once the cache is full) it is read whole;
* files are opened through the :class:`pipelines.io.storage.Location`'s ``pyarrow.fs`` filesystem
  (local, S3, GCS, HDFS, fsspec), each file's footer read once
  (:mod:`pipelines.training.data.rowgroups`).

A row group comes out as :class:`Batch`: ``image`` ``uint8 (rows, row_bytes)`` and ``label``
``int32 (rows,)``: the flat form :func:`pipelines.training.data.readers.row_groups_of` reshapes.
"""
from __future__ import annotations

import collections
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Deque, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import pyarrow.parquet as pq

from pipelines.training.data.rowcache import Column, RowGroupFiles
from pipelines.training.data.rowgroups import (
    RowGroup,
    count_error,
    image_pixels,
    open_part,
    read_group,
    split_row_groups,
)
from pipelines.training.data.sharding import shard
from pipelines.training.data.stream import epoch_order

#: bytes of images decoded at a time on the way into the cache: a few images of 299 px cost no more
#: than one, many more do (docs/benchmarks.md, Figures behind the code's constants)
STREAM_BYTES = 1 << 20


def flat_layout(group: RowGroup, row_bytes: int) -> List[Column]:
    """The columns of ``group`` as its flat cache file stores them:
    ``image uint8 (rows, row_bytes)``, ``label int32 (rows,)``."""
    return [("image", "|u1", (group.rows, row_bytes)), ("label", "<i4", (group.rows,))]


def stream_group(group: RowGroup, row_bytes: int) -> Iterator[Tuple[str, np.ndarray]]:
    """The bytes of one row group in :func:`flat_layout`'s columns, decoded a few images at a time
    (about ``STREAM_BYTES`` each): ``("image", uint8 (k, row_bytes))`` pieces, then one
    ``("label", int32 (rows,))``, as :meth:`pipelines.training.data.rowcache.RowGroupFiles.put_pieces`
    writes them.

    Why: a cold epoch decoding whole row groups wrote each image into memory twice (decompressed,
    then decoded) before the cache file's copy; small batches stay in the CPU's cache, and the
    epoch then maps the file back like a warm one (its cost per image: docs/benchmarks.md, Figures
    behind the code's constants).

    Raises:
        ShardCountError, ImageSizeError: as :func:`read_group`, before the piece at fault.
    """
    rows, labels = 0, []
    with open_part(group.part) as f:
        batches = pq.ParquetFile(f, metadata=group.metadata).iter_batches(
            batch_size=max(1, STREAM_BYTES // max(1, row_bytes)), row_groups=[group.index],
            columns=["image", "label"], use_threads=False)
        for batch in batches:
            rows += batch.num_rows
            if rows > group.rows:
                raise count_error(group, rows)
            labels.append(batch.column("label").to_numpy(zero_copy_only=False).astype(np.int32))
            yield "image", image_pixels(batch.column("image"), group, row_bytes)
    if rows != group.rows:
        raise count_error(group, rows)
    yield "label", np.concatenate(labels) if labels else np.zeros(0, np.int32)


class Batch(NamedTuple):
    """One row group as the reader yields it (the fields Petastorm's batches have)."""

    image: np.ndarray  # uint8 (rows, row_bytes)
    label: np.ndarray  # int32 (rows,)


class ArrowShardReader:
    """A looping reader of one rank's shard (module doc); a context manager (its threads stop on
    exit) and an iterator of :class:`Batch` (the looping order from the start, until
    :meth:`restart` gives it another).

    Args:
        groups: the shard's row groups (:func:`~pipelines.training.data.sharding.shard` of
            :func:`~pipelines.training.data.rowgroups.split_row_groups`), not empty.
        row_bytes: bytes of one image (the manifest's ``row_bytes``).
        workers: reader threads (>= 1).
        depth: row groups read ahead at most (>= 1; default ``2 * workers``): the bound on memory.
        cache: flat files of the shard's row groups, or None.
    """

    def __init__(self, groups: Sequence[RowGroup], row_bytes: int, seed: int = 0, workers: int = 2,
                 depth: int = 0, cache: Optional[RowGroupFiles] = None):
        if not groups:
            raise ValueError("a reader needs at least one row group")
        self.groups, self.row_bytes, self.seed, self.cache = groups, row_bytes, seed, cache
        self.depth = depth or 2 * workers
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="arrow-reader")
        self._pending: Deque = collections.deque()
        # one order is read at a time; tf.data may pull an old dataset's generator from another
        # thread while a new one restarts the reader, hence the lock and the order's generation
        self._lock = threading.Lock()
        self._generation = 0
        self._order: Iterator[int] = iter(())
        self._closed = False
        # reading starts with the reader, as Petastorm's does: tf.data's set-up overlaps it
        self._default = self.restart(self._visits())

    def _visits(self) -> Iterator[int]:
        for epoch in itertools.count():
            yield from epoch_order(len(self.groups), self.seed, epoch).tolist()

    def restart(self, visits: Iterable[int]) -> Iterator[Batch]:
        """Read the row groups ``visits`` (shard indices, in order; finite or not) from now on,
        ``depth`` ahead, starting at once. The read-ahead of the previous order is cancelled (a
        row group being read is finished, and lands in the cache) and the iterators over it stop
        (``StopIteration``), this reader's own iteration too.

        Returns:
            an iterator of :class:`Batch`, one per visit; it stops when ``visits`` ends, the reader
            closes or another :meth:`restart` comes. A read error is raised from it.
        """
        with self._lock:
            if self._closed:
                return iter(())
            self._generation += 1
            for future in self._pending:
                future.cancel()
            self._pending.clear()
            self._order = iter(visits)
            self._top_up()
            return self._cursor(self._generation)

    def _cursor(self, generation: int) -> Iterator[Batch]:
        while True:
            with self._lock:
                if self._closed or generation != self._generation:
                    return
                self._top_up()
                if not self._pending:  # a finite order ran out
                    return
                future = self._pending.popleft()
            # waited for outside the lock: a restart meanwhile does not wait for this read
            yield future.result()

    def _load(self, i: int) -> Batch:
        """Row group ``i`` of the shard, from the cache when it holds it, else decoded from Parquet
        into the cache (:func:`stream_group`) and mapped back from there, else (no cache, or a full
        one) read from Parquet."""
        group = self.groups[i]
        if self.cache is not None:
            key = f"{i:06d}"
            cached = self.cache.get(key)
            if cached is None and self.cache.put_pieces(key, flat_layout(group, self.row_bytes),
                                                        stream_group(group, self.row_bytes)):
                cached = self.cache.get(key)
            if cached is not None:
                return Batch(cached["image"], cached["label"])
        return Batch(*read_group(group, self.row_bytes))

    def __iter__(self) -> "ArrowShardReader":
        return self

    def __next__(self) -> Batch:
        # closed: a tf.data prefetch thread may still ask once the reader's block has ended
        return next(self._default)

    def _top_up(self) -> None:
        """Submit reads of the order's next visits up to ``depth`` pending (the lock held)."""
        for i in itertools.islice(self._order, max(0, self.depth - len(self._pending))):
            self._pending.append(self._pool.submit(self._load, i))

    def __enter__(self) -> "ArrowShardReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading ahead and join the threads (a row group being read is finished first)."""
        with self._lock:
            self._closed = True
            for future in self._pending:
                future.cancel()
            self._pending.clear()
        self._pool.shutdown(wait=True)


def open_shard(data, split: str, rank: int, world_size: int, cache_folder: Optional[str], cache_limit: int,
               workers: int, seed: int) -> ArrowShardReader:
    """``--reader own`` (:data:`pipelines.training.data.readers.READERS`): the looping reader of rank
    ``rank``'s row groups of ``split`` of ``data`` (a :class:`~pipelines.training.data.dataset.Dataset`),
    caching at most ``cache_limit`` bytes of flat files in ``cache_folder`` (None: no cache)."""
    cache = RowGroupFiles(cache_folder, cache_limit) if cache_folder else None
    groups = shard(split_row_groups(data.parts(split)), rank, world_size)
    return ArrowShardReader(groups, data.row_bytes, seed, workers, cache=cache)
