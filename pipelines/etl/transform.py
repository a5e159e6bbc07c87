"""Executor side of the ETL: chunk numbers in, files read in Python, Parquet row groups out.

Runs inside Spark's Python workers through ``DataFrame.mapInArrow``. Each task receives the
numbers of its chunks of the driver's candidate list (shipped in the function's closure), reads
each file itself with :func:`read_file` (at most ``max_file_bytes + 1`` bytes, so a file that grew
since the listing is rejected, never loaded whole), decodes it with the pure functions of
:mod:`pipelines.etl.images` and appends it to this task's Parquet file of its split, written with
pyarrow in row groups of exactly ``rows_per_row_group`` rows. No file passes through the JVM:
neither its name (the JVM's locale encoding would mangle non-ASCII names) nor its bytes (the JVM
heap would hold whole files). The decoded images never travel back through the JVM (a
round trip of ``size**2 * 3`` bytes per row through Spark's row format and parquet-java, whose
row groups cannot be smaller than 100 rows). Nor do the per-file outcomes (written, or rejected
with a reason): a task writes them beside its Parquet files and Spark gets back one small row
per task (:mod:`pipelines.etl.outcomes`).

A tree on an object store is read the same way, through :mod:`pipelines.io.storage`
(:func:`read_object`: at most ``max_file_bytes + 1`` bytes, one ranged GET); Spark's
``binaryFile`` source is not used (the pip-installed Spark has no ``s3a`` connector, and on local
files it is no faster: see the README's ETL figures). Each task writes its Parquet files through
the output's ``pyarrow.fs`` filesystem (``pq.ParquetWriter(..., filesystem=...)``), so nothing
depends on Spark reaching the store.

Commit protocol: a task writes below its run's prefix (``OUTPUT/runs/<run id>/<split>/``) and
names its files after its partition and attempt; the driver keeps only the files named in the
summaries of successful tasks and deletes any other (a failed or speculative attempt's), then
names the kept ones in the manifest (:mod:`pipelines.etl.commit`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from typing import TYPE_CHECKING, Dict, Iterator, NamedTuple, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.contract import image_schema, row_bytes
from pipelines.etl.images import (
    DEFAULT_MAX_PIXELS,
    FittedImage,
    ImageRejected,
    centred_box,
    decode_and_fit,
    fingerprint,
)
from pipelines.etl.listing import REJECTED, encode_name
from pipelines.etl.outcomes import HASH_SCHEMA, OUTCOME_SCHEMA, WRITTEN, RowFile
from pipelines.runtime import zipcache

if TYPE_CHECKING:
    from pipelines.io.storage import Location

# The training data: what each split's Parquet files hold (the stages' contract).
IMAGE_SCHEMA = image_schema()
# The Parquet data page size the tasks aim at (pyarrow's default page size).
PAGE_BYTES = 2**20


class SplitWriter:
    """One Parquet file of one split, filled in row groups of exactly ``rows_per_row_group`` rows.

    Images are pasted straight into one preallocated white ``(rows, size, size, 3)`` uint8
    buffer per row group, which becomes the ``image`` column without another copy. After a row
    group is written, only the boxes that images covered are whitened again: the margins stayed
    white, and a small image (28 px in 299) leaves 99 % of its row untouched, so whitening whole
    rows was most of the work per row (``benchmarks/etl_bench.py``, "write/proc").
    """

    def __init__(self, target: "Location", rows_per_row_group: int, image_size: int):
        self.target = target
        self.rows_per_row_group = rows_per_row_group
        self.row_bytes = row_bytes(image_size)
        self.images = np.full((rows_per_row_group, image_size, image_size, 3), 255, np.uint8)
        self.columns: Dict[str, list] = {name: [] for name in IMAGE_SCHEMA.names if name != "image"}
        self.boxes: list = []  # the (rows, columns) slices each buffered row's image covers
        self.writer: Optional[pq.ParquetWriter] = None
        self.rows = 0

    def append(self, fitted: FittedImage, path: str, label: int, label_name: str) -> None:
        """Add one image (RGB, at most ``size x size``) and its row's other columns."""
        box = centred_box(fitted.image.size, self.images.shape[1])
        self.images[len(self.boxes)][box] = np.asarray(fitted.image)
        self.boxes.append(box)
        for name, value in (("path", path), ("label", label), ("label_name", label_name),
                            ("height", fitted.height), ("width", fitted.width)):
            self.columns[name].append(value)
        if len(self.columns["path"]) == self.rows_per_row_group:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows as one row group and whiten the boxes their images covered."""
        n = len(self.columns["path"])
        if n == 0:
            return
        if self.writer is None:
            self.target.parent.makedirs()
            # Decoded pixels gain nothing from a dictionary. LZ4 (LZ4_RAW in the file) over snappy:
            # snappy's matches end at 64 bytes, so a white border costs it several times the bytes,
            # and it is no faster (benchmarks/etl_bench.py, "write/proc"; the figures: docs/benchmarks.md,
            # Figures behind the code's constants). On an object store the file is one
            # (multipart) upload: it appears whole when closed.
            # write_batch_size: pyarrow checks the page size only between batches of values, so its
            # default (1024 rows) makes each row group one page, built in a fresh buffer of tens of
            # MiB; pages of about PAGE_BYTES write faster (same benchmark, same figures).
            self.writer = pq.ParquetWriter(self.target.path, IMAGE_SCHEMA, filesystem=self.target.filesystem,
                                           compression="lz4", use_dictionary=["label", "label_name"],
                                           write_statistics=["label"], data_page_size=PAGE_BYTES,
                                           write_batch_size=max(1, PAGE_BYTES // self.row_bytes))
        offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * self.row_bytes).tobytes())
        images = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(self.images[:n])])
        arrays = {name: pa.array(values, IMAGE_SCHEMA.field(name).type) for name, values in self.columns.items()}
        arrays["image"] = images
        self.writer.write_table(pa.Table.from_pydict(arrays, schema=IMAGE_SCHEMA), row_group_size=n)
        self.rows += n
        for row, box in zip(self.images, self.boxes):
            row[box] = 255
        self.boxes = []
        self.columns = {name: [] for name in self.columns}

    def close(self) -> None:
        """Write what is buffered and close the file (nothing is created for an empty split)."""
        self.flush()
        if self.writer is not None:
            self.writer.close()


class Candidate(NamedTuple):
    """One file the driver listed as a candidate image: absolute ``path`` (str, UTF-8 decoded by
    :func:`pipelines.etl.listing.decode_name`), ``label`` (0-based), ``label_name`` and ``split``
    (``train`` | ``test``), all decided on the driver."""

    path: str
    label: int
    label_name: str
    split: str


def _read_upto(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes from ``fd`` (fewer only at the end of the file)."""
    parts, got = [], 0
    while got < n:
        part = os.read(fd, min(n - got, 1 << 26))
        if not part:
            break
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_file(path: str, max_file_bytes: int) -> bytes:
    """The bytes of one listed file, never more than ``max_file_bytes + 1`` read into memory.

    Args:
        path: as listed (surrogate escapes are turned back into the file's own bytes, so the
            caller's locale does not matter).
        max_file_bytes: the ``--max-file-mb`` limit in bytes.

    Returns:
        the whole file (``bytes``, at most ``max_file_bytes`` long).

    Raises:
        ImageRejected: the file vanished, became unreadable or not a regular file, or grew past
            the limit since it was listed.
    """
    try:
        # O_NONBLOCK: a file replaced by a FIFO since the listing must not block the task.
        fd = os.open(encode_name(path), os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ImageRejected("vanished after listing (no such file when read)") from None
    except OSError as exc:
        raise ImageRejected(f"unreadable when read: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        size = info.st_size
        if not stat.S_ISREG(info.st_mode):
            raise ImageRejected("not a regular file when read (replaced since listing)")
        # Read what fstat promises plus one byte, so a file that grew is seen without loading it.
        data = _read_upto(fd, min(size, max_file_bytes) + 1)
        if len(data) > size and len(data) <= max_file_bytes:
            data += _read_upto(fd, max_file_bytes + 1 - len(data))
        if len(data) > max_file_bytes:
            raise ImageRejected(f"file too large: grew past {max_file_bytes} bytes since listing (--max-file-mb)")
        return data
    except OSError as exc:
        raise ImageRejected(f"unreadable when read: {exc.strerror}") from None
    finally:
        os.close(fd)


def read_object(source: "Location", uri: str, max_file_bytes: int) -> bytes:
    """The bytes of one listed object of the tree ``source`` (an object store), never more than
    ``max_file_bytes + 1`` read into memory (:func:`read_file`'s rule).

    Args:
        source: the input tree's root. uri: the object's URI as listed (below ``source``).
        max_file_bytes: the ``--max-file-mb`` limit in bytes.

    Returns:
        the whole object (``bytes``, at most ``max_file_bytes`` long).

    Raises:
        ImageRejected: the object vanished, became unreadable, or grew past the limit since it
            was listed; its key is not below ``source`` or holds a ``..`` segment (never read).
    """
    key = uri[len(source.uri) + 1:]
    if not uri.startswith(source.uri + "/") or ".." in key.split("/"):  # the listing rejects these: never read
        raise ImageRejected("key has a '..' path segment, which names a file outside the input; unread")
    target = source.join(key)
    try:
        with target.filesystem.open_input_file(target.path) as f:
            data = f.read(max_file_bytes + 1)  # a ranged read: no more is fetched or held
    except FileNotFoundError:
        raise ImageRejected("vanished after listing (no such object when read)") from None
    except (OSError, ValueError) as exc:  # ValueError: pyarrow.ArrowInvalid, a key it cannot address
        raise ImageRejected(f"unreadable when read: {' '.join(str(exc).split())[:200]}") from None
    if len(data) > max_file_bytes:
        raise ImageRejected(f"file too large: grew past {max_file_bytes} bytes since listing (--max-file-mb)")
    return data


def read_candidate(path: str, source: Optional["Location"], max_file_bytes: int) -> bytes:
    """:func:`read_file` for a local tree (``source`` ``None`` or local), :func:`read_object` for
    a tree on an object store. Raises ImageRejected."""
    if source is None or source.local:
        return read_file(path, max_file_bytes)
    return read_object(source, path, max_file_bytes)


def unexpected_reason(exc: Exception) -> str:
    """The rejection reason of an error no rule foresaw while reading or decoding one file:
    ``"unreadable when read (ArrowInvalid: ...)"``, one line, at most 200 characters of message."""
    return f"unreadable when read ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"


def _task_name() -> str:
    """``<partition>-<attempt id>`` of the running Spark task (``00000-0`` outside Spark): the
    names of its files, distinct across attempts."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return f"{context.partitionId():05d}-{context.taskAttemptId()}" if context else "00000-0"


def hash_chunks(batches: Iterator[pa.RecordBatch], chunks: Sequence[Sequence[tuple]], run: "Location",
                max_file_bytes: int, source: Optional["Location"] = None, counter=None,
                max_pixels: Optional[int] = DEFAULT_MAX_PIXELS) -> Iterator[pa.RecordBatch]:
    """The sha256 and the :func:`~pipelines.etl.images.fingerprint` of each candidate file of the
    chunks whose numbers this task receives: the duplicate check's pass (:mod:`pipelines.etl.dedupe`),
    before the split is decided.

    Args:
        batches, chunks, run, max_file_bytes, source, counter, max_pixels: as in
            :func:`process_chunks` (same chunks, same bounded read: :func:`read_candidate`).

    Writes ``run/_tasks/hashes-<task>.arrow`` (:class:`pipelines.etl.outcomes.RowFile`): a
    :data:`~pipelines.etl.outcomes.HASH_SCHEMA` row per candidate, ``path``, ``sha256`` (64 hex
    digits; null when the file cannot be read now: the main pass reads it again and records why),
    ``pixels`` and ``dhash`` (null when it does not decode: the main pass rejects it).

    Yields:
        one Arrow batch of one :data:`~pipelines.etl.outcomes.TASK_SCHEMA` row naming that file.
    """
    zipcache.install()
    hashes = RowFile(run, "hashes", _task_name(), HASH_SCHEMA)
    numbers = [chunk for batch in batches for chunk in batch.column(0).to_pylist()]
    for chunk in numbers:
        for candidate in map(Candidate._make, chunks[chunk]):
            digest = pixels = dhash = None
            try:
                data = read_candidate(candidate.path, source, max_file_bytes)
                digest = hashlib.sha256(data).hexdigest()
                pixels, dhash = dataclasses.astuple(fingerprint(data, max_pixels))
            except Exception:  # noqa: BLE001 - any failure is the main pass's to record, with its reason
                pass
            finally:
                data = None  # never hold two files
            hashes.append(candidate.path, digest, pixels, dhash)
            if counter is not None:
                counter.add(1)
    yield hashes.close(numbers)


def process_chunks(batches: Iterator[pa.RecordBatch], chunks: Sequence[Sequence[tuple]], run: "Location",
                   image_size: int, max_pixels: int, max_file_bytes: int,
                   rows_per_row_group: int, source: Optional["Location"] = None,
                   counter=None) -> Iterator[pa.RecordBatch]:
    """Read, resize and write the candidate files of the chunks whose numbers this task receives.

    Args:
        batches: Arrow batches from Spark whose first column holds chunk numbers (int64), indexes
            into ``chunks``; which task gets which number does not matter.
        chunks: the driver's candidates, cut into contiguous chunks (shipped in the closure), each
            candidate a plain tuple of :class:`Candidate`'s fields
            (:func:`pipelines.etl.layout.closure_chunks`).
        run: the run's prefix (:class:`pipelines.io.storage.Location`, local or on an object
            store), where this task writes ``<split>/part-<partition>-<attempt>.parquet``.
        image_size, max_pixels, max_file_bytes: as in ``ETLConfig``.
        rows_per_row_group: rows per Parquet row group (the last one of a file may hold fewer).
        source: the input tree's root when it is on an object store (``None``: local files).
        counter: a Spark accumulator (or ``None``) this task adds 1 to per candidate it is done
            with, written or rejected: the driver's progress (:func:`pipelines.runtime.spark.log_progress`).

    Writes, besides the Parquet files, ``run/_tasks/outcomes-<task>.arrow``: one
    :data:`~pipelines.etl.outcomes.OUTCOME_SCHEMA` row per candidate of its chunks.

    Yields:
        one Arrow batch of one :data:`~pipelines.etl.outcomes.TASK_SCHEMA` row (that file, the chunk
        numbers, the Parquet files), once every file is closed (so it never names a half-written one).

    Memory: one file's bytes and its decoded pixels at a time (see :mod:`pipelines.etl.memory`),
    and at most one batch of outcome rows.
    """
    zipcache.install()  # this worker's next tasks start without re-reading pyspark.zip (see the module)
    task = _task_name()
    writers: Dict[str, SplitWriter] = {}
    outcomes = RowFile(run, "outcomes", task, OUTCOME_SCHEMA)
    numbers = [chunk for batch in batches for chunk in batch.column(0).to_pylist()]
    for chunk in numbers:
        for candidate in map(Candidate._make, chunks[chunk]):
            if counter is not None:
                counter.add(1)  # a task's updates reach the driver when it succeeds: all its files done
            try:
                data = read_candidate(candidate.path, source, max_file_bytes)
                fitted = decode_and_fit(data, image_size, max_pixels)
            except ImageRejected as exc:
                outcomes.append(candidate.path, REJECTED, None, None, None, exc.reason)
                continue
            except Exception as exc:  # noqa: BLE001 - any error about one file is that file's rejection
                outcomes.append(candidate.path, REJECTED, None, None, None, unexpected_reason(exc))
                continue
            finally:
                data = None  # never hold two files: the next read starts with nothing held
            split = candidate.split
            if split not in writers:
                writers[split] = SplitWriter(run.join(split, f"part-{task}.parquet"), rows_per_row_group,
                                             image_size)
            writers[split].append(fitted, candidate.path, candidate.label, candidate.label_name)
            outcomes.append(candidate.path, WRITTEN, split, candidate.label, f"{split}/part-{task}.parquet", None)
    for writer in writers.values():
        writer.close()
    yield outcomes.close(numbers, [f"{split}/part-{task}.parquet" for split, w in writers.items() if w.rows])
