"""Our own reader of a rank's shard (the ``own`` reader): pyarrow row groups, a few threads, flat cache.

Petastorm's contract as training uses it, without Petastorm (which cannot run on pyarrow >= 16):

* the shard is row groups ``rank, rank + world_size, ...`` of the manifest's parts, files in the
  manifest's order and groups in file order (:func:`split_row_groups`; Petastorm's rule, and
  :class:`pipelines.training.data.dataset.OnePassShard`'s);
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
* files are opened through the :class:`pipelines.storage.Location`'s ``pyarrow.fs`` filesystem
  (local, S3, GCS, HDFS, fsspec), each file's footer read once.

A row group comes out as :class:`Batch`: ``image`` ``uint8 (rows, s * s * 3)`` and ``label``
``int32 (rows,)``: the flat form :func:`pipelines.training.data.dataset.row_groups_of` reshapes.
"""
from __future__ import annotations

import collections
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Deque, Iterable, Iterator, List, NamedTuple, Optional, Tuple

import numpy as np

from pipelines.errors import Refused
from pipelines.logs import plural
from pipelines.training.data.stream import epoch_order  # noqa: F401 (its home was here; callers import it from here)

#: bytes of images decoded at a time on the way into the cache: 2-8 images of 299 px took the
#: same time, 16 (4 MiB) a third more (one thread, loader_bench's data, 2026-12-02)
STREAM_BYTES = 1 << 20

if TYPE_CHECKING:
    from pipelines.storage import Location
    from pipelines.training.data.rowcache import Column, RowGroupFiles


class ShardCountError(RuntimeError):
    """A read counted another number of rows than the Parquet metadata holds."""


class DataError(Refused):
    """The dataset cannot feed this training run; the message says why and what to change."""


class ImageSizeError(DataError):
    """A row group holds an image of another byte size than the manifest's ``row_bytes``."""


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group: its file ``part`` (:class:`pipelines.storage.Location`), its ``index``
    in that file, its ``rows``, and the file's footer (``metadata``, read once per file)."""

    part: "Location"
    index: int
    rows: int
    metadata: object = field(default=None, compare=False, repr=False)

    @property
    def path(self) -> str:
        return self.part.uri


def split_row_groups(parts: list) -> List[RowGroup]:
    """Every row group of a split's ``parts`` (:meth:`pipelines.training.data.dataset.Dataset.parts`),
    files in the given order and groups in file order (footers only)."""
    import pyarrow.parquet as pq

    groups: List[RowGroup] = []
    for part in parts:
        with part.filesystem.open_input_file(part.path) as f:
            meta = pq.read_metadata(f)
        groups += [RowGroup(part, i, meta.row_group(i).num_rows, meta) for i in range(meta.num_row_groups)]
    return groups


def _open(part: "Location"):
    import pyarrow as pa

    # a local file is mapped: measured 1.6-2x faster than reading it (loader_bench)
    return pa.memory_map(part.path) if part.local else part.filesystem.open_input_file(part.path)


def _pixels(column, group: RowGroup, row_bytes: int) -> np.ndarray:
    """The images of a binary Arrow ``column`` as ``uint8 (n, row_bytes)``, a view of its buffer."""
    if column.null_count:
        raise ImageSizeError(f"{group.path} row group {group.index}: a missing image")
    offsets = np.frombuffer(column.buffers()[1], np.int32, len(column) + 1, column.offset * 4)
    if np.any(np.diff(offsets) != row_bytes):
        raise ImageSizeError(f"{group.path} row group {group.index}: an image is not {plural(row_bytes, 'byte')}")
    if not len(column):
        return np.zeros((0, row_bytes), np.uint8)
    return np.frombuffer(column.buffers()[2], np.uint8)[offsets[0]:offsets[-1]].reshape(-1, row_bytes)


def _count_error(group: RowGroup, rows: int) -> ShardCountError:
    return ShardCountError(f"{group.path} row group {group.index}: read {plural(rows, 'row')}, "
                           f"its footer says {group.rows}")


def read_group(group: RowGroup, row_bytes: int) -> Tuple[np.ndarray, np.ndarray]:
    """The images and labels of one row group, read with pyarrow: ``(uint8 (n, row_bytes),
    int32 (n,))``, the images a view of Arrow's buffer (no copy per image).

    Raises:
        ShardCountError: it holds another number of rows than its footer says.
        ImageSizeError: an image that is not ``row_bytes`` bytes (each one checked).
    """
    import pyarrow.parquet as pq

    with _open(group.part) as f:
        table = pq.ParquetFile(f, metadata=group.metadata).read_row_group(group.index, columns=["image", "label"])
    if table.num_rows != group.rows:
        raise _count_error(group, table.num_rows)
    chunks = table.column("image")
    column = chunks.chunk(0) if chunks.num_chunks == 1 else chunks.combine_chunks()  # combining copies
    return _pixels(column, group, row_bytes), table.column("label").to_numpy().astype(np.int32)


def flat_layout(group: RowGroup, row_bytes: int) -> List["Column"]:
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
    epoch then maps the file back like a warm one (reader's cold epoch 0.17 against 0.27-0.37 ms of
    CPU per image, benchmarks/loader_bench.py's data, one thread, 2026-12-02).

    Raises:
        ShardCountError, ImageSizeError: as :func:`read_group`, before the piece at fault.
    """
    import pyarrow.parquet as pq

    rows, labels = 0, []
    with _open(group.part) as f:
        batches = pq.ParquetFile(f, metadata=group.metadata).iter_batches(
            batch_size=max(1, STREAM_BYTES // max(1, row_bytes)), row_groups=[group.index],
            columns=["image", "label"], use_threads=False)
        for batch in batches:
            rows += batch.num_rows
            if rows > group.rows:
                raise _count_error(group, rows)
            labels.append(batch.column("label").to_numpy(zero_copy_only=False).astype(np.int32))
            yield "image", _pixels(batch.column("image"), group, row_bytes)
    if rows != group.rows:
        raise _count_error(group, rows)
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
        groups: the shard's row groups (:func:`~pipelines.training.data.sharding.shard` of :func:`split_row_groups`), not empty.
        row_bytes: bytes of one image (the manifest's ``row_bytes``).
        workers: reader threads (>= 1).
        depth: row groups read ahead at most (>= 1; default ``2 * workers``): the bound on memory.
        cache: flat files of the shard's row groups, or None.
    """

    def __init__(self, groups: List[RowGroup], row_bytes: int, seed: int = 0, workers: int = 2,
                 depth: int = 0, cache: Optional["RowGroupFiles"] = None):
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
