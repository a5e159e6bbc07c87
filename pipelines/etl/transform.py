"""Executor side of the ETL (``mapInArrow``): chunk numbers in, files read in Python, Parquet row groups out.

No file name or byte passes through the JVM (its locale would mangle non-ASCII names). A task writes its own Parquet
file per split below the run's prefix, named after its partition and attempt, and its outcome rows beside them."""
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

IMAGE_SCHEMA = image_schema()
# The Parquet data page size the tasks aim at (pyarrow's default page size).
PAGE_BYTES = 2**20


class SplitWriter:
    """One Parquet file of one split, filled in row groups of exactly ``rows_per_row_group`` rows.

    Images are pasted into one white ``(rows, size, size, 3)`` uint8 buffer, the ``image`` column without a copy;
    only the boxes images covered are whitened again."""

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
            # LZ4 over snappy: snappy's matches end at 64 bytes, so a white border costs it several times the
            # bytes, and it is no faster. pyarrow checks the page size only between batches of values, so its
            # default batch (1024 rows) makes each row group one page: pages of about PAGE_BYTES write faster
            # (benchmarks/etl_bench.py; figures in docs/benchmarks.md, "Figures behind the code's constants").
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
        """Write what is buffered and close the file (none is created for an empty split)."""
        self.flush()
        if self.writer is not None:
            self.writer.close()


class Candidate(NamedTuple):
    """A candidate as the driver decided it: absolute ``path``, ``label`` (0-based), ``label_name``, ``split``."""

    path: str
    label: int
    label_name: str
    split: str


def _read_upto(fd: int, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        part = os.read(fd, min(n - got, 1 << 26))
        if not part:
            break
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_file(path: str, max_file_bytes: int) -> bytes:
    """The bytes of one listed file, at most ``max_file_bytes`` (one byte more read at most).

    Raises:
        ImageRejected: the file vanished, became unreadable or not a regular file, or grew past the limit."""
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
    """The bytes of one listed object below ``source``, by `read_file`'s rule (a ranged read)."""
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
    """`read_file` for a local tree (``source`` ``None`` or local), `read_object` for an object store."""
    if source is None or source.local:
        return read_file(path, max_file_bytes)
    return read_object(source, path, max_file_bytes)


def unexpected_reason(exc: Exception) -> str:
    """The rejection reason of an error no rule foresaw: one line, at most 200 characters of message."""
    return f"unreadable when read ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"


def _task_name() -> str:
    """``<partition>-<attempt id>`` of the running Spark task (``00000-0`` outside Spark)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return f"{context.partitionId():05d}-{context.taskAttemptId()}" if context else "00000-0"


def hash_chunks(batches: Iterator[pa.RecordBatch], chunks: Sequence[Sequence[tuple]], run: "Location",
                max_file_bytes: int, source: Optional["Location"] = None, counter=None,
                max_pixels: Optional[int] = DEFAULT_MAX_PIXELS) -> Iterator[pa.RecordBatch]:
    """The duplicate check's pass (arguments as `process_chunks`): a `HASH_SCHEMA` row per candidate, null where a
    file cannot be read or decoded now (the main pass records why), then one `TASK_SCHEMA` row."""
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
    """Read, resize and write the candidates of the chunks whose numbers this task receives, one file at a time.

    Args:
        batches: Arrow batches whose first column holds chunk numbers (int64) into ``chunks``.
        source: the input's root when on an object store (``None``: local files).
        counter: a Spark accumulator (or ``None``) counting candidates done: the driver's progress.

    Yields:
        one batch of one `TASK_SCHEMA` row (its outcome file, chunks, Parquet files), once every file is closed."""
    zipcache.install()  # this worker's next tasks start without re-reading pyspark.zip
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
