"""Our own reader of a rank's shard (``--reader own``): Petastorm's contract on pyarrow alone."""
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
    """The columns of ``group``'s flat cache file: ``image uint8 (rows, row_bytes)``, ``label int32 (rows,)``."""
    return [("image", "|u1", (group.rows, row_bytes)), ("label", "<i4", (group.rows,))]


def stream_group(group: RowGroup, row_bytes: int) -> Iterator[Tuple[str, np.ndarray]]:
    """One row group's flat-file pieces, decoded ``STREAM_BYTES`` of images at a time (small enough for the CPU cache).

    Raises:
        ShardCountError, ImageSizeError: as ``read_group``, before the piece at fault."""
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
    """A looping reader of one rank's shard; a context manager (threads stop on exit) and an iterator of ``Batch``.

    Args:
        depth: row groups read ahead at most (>= 1; default ``2 * workers``): the bound on memory.
        cache: flat files of the shard's row groups, or None."""

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
        """Read the row groups ``visits`` (shard indices) from now on; earlier iterators stop.

        Returns:
            ``Batch`` items until ``visits`` ends, the reader closes or another ``restart``; read errors raise."""
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
        """Row group ``i``: from the cache, else decoded into the cache and mapped back, else read from Parquet."""
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
    """``--reader own``: the looping reader of ``rank``'s row groups, caching <= ``cache_limit`` bytes (None: none)."""
    cache = RowGroupFiles(cache_folder, cache_limit) if cache_folder else None
    groups = shard(split_row_groups(data.parts(split)), rank, world_size)
    return ArrowShardReader(groups, data.row_bytes, seed, workers, cache=cache)
