"""Executor side of the ETL: ``binaryFile`` Arrow batches in, Parquet row groups out.

Runs inside Spark's Python workers through ``DataFrame.mapInArrow``: one Python call per Arrow
batch, not per row. Each image is decoded with the pure functions of :mod:`pipelines.etl.images`
and appended to this task's Parquet file of its split, written with pyarrow in row groups of
exactly ``rows_per_row_group`` rows. The decoded images never travel back through the JVM (a
round trip of ``size**2 * 3`` bytes per row through Spark's row format and parquet-java, whose
row groups cannot be smaller than 100 rows); Spark gets back one small outcome row per input
file, which is also how rejected files are reported.

Commit protocol: a task names its files after its partition and attempt; the driver keeps only
the files named in the outcomes of successful tasks and deletes any other (a failed or
speculative attempt's).
"""
from __future__ import annotations

import os
import re
from typing import Dict, Iterator, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.etl.images import FittedImage, ImageRejected, decode_and_fit, paste_centred
from pipelines.etl.labels import is_test
from pipelines.etl.listing import REJECTED, Excluded, classify

TRAIN, TEST = "train", "test"
WRITTEN = "written"

# The training data: what each split's Parquet files hold.
IMAGE_SCHEMA = pa.schema([
    ("path", pa.string()),
    ("label", pa.int32()),
    ("label_name", pa.string()),
    ("image", pa.binary()),  # size * size * 3 bytes, uint8 RGB, row-major HWC
    ("height", pa.int32()),  # of the original, after EXIF orientation
    ("width", pa.int32()),
])
# What Spark gets back: one row per input file.
OUTCOME_SCHEMA = pa.schema([
    ("path", pa.string()),
    ("status", pa.string()),  # written | rejected | skipped
    ("split", pa.string()),   # train | test, for written rows
    ("label", pa.int32()),
    ("file", pa.string()),    # the Parquet file (relative to the staging folder), for written rows
    ("reason", pa.string()),  # why not written
])
OUTCOME_DDL = "path STRING, status STRING, split STRING, label INT, file STRING, reason STRING"

_FILE_SCHEME = re.compile(r"^file:(//)?")


def local_path(spark_path: str) -> str:
    """``file:/a/b.jpg`` or ``file:///a/b.jpg`` (Spark's ``path`` column) -> ``/a/b.jpg``."""
    return _FILE_SCHEME.sub("", spark_path, count=1)


class SplitWriter:
    """One Parquet file of one split, filled in row groups of exactly ``rows_per_row_group`` rows.

    Images are pasted straight into one preallocated white ``(rows, size, size, 3)`` uint8
    buffer per row group, which becomes the ``image`` column without another copy.
    """

    def __init__(self, path: str, rows_per_row_group: int, image_size: int):
        self.path = path
        self.rows_per_row_group = rows_per_row_group
        self.row_bytes = image_size * image_size * 3
        self.images = np.full((rows_per_row_group, image_size, image_size, 3), 255, np.uint8)
        self.columns: Dict[str, list] = {name: [] for name in IMAGE_SCHEMA.names if name != "image"}
        self.writer: Optional[pq.ParquetWriter] = None
        self.rows = 0

    def append(self, fitted: FittedImage, path: str, label: int, label_name: str) -> None:
        """Add one image (RGB, at most ``size x size``) and its row's other columns."""
        paste_centred(fitted.image, self.images[len(self.columns["path"])])
        for name, value in (("path", path), ("label", label), ("label_name", label_name),
                            ("height", fitted.height), ("width", fitted.width)):
            self.columns[name].append(value)
        if len(self.columns["path"]) == self.rows_per_row_group:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows as one row group and reset the buffer to white."""
        n = len(self.columns["path"])
        if n == 0:
            return
        if self.writer is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            # Decoded pixels gain nothing from a dictionary; snappy shrinks the white borders.
            self.writer = pq.ParquetWriter(self.path, IMAGE_SCHEMA, compression="snappy",
                                           use_dictionary=["label", "label_name"], write_statistics=["label"])
        offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * self.row_bytes).tobytes())
        images = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(self.images[:n])])
        arrays = {name: pa.array(values, IMAGE_SCHEMA.field(name).type) for name, values in self.columns.items()}
        arrays["image"] = images
        self.writer.write_table(pa.Table.from_pydict(arrays, schema=IMAGE_SCHEMA), row_group_size=n)
        self.rows += n
        self.images[:n] = 255
        self.columns = {name: [] for name in self.columns}

    def close(self) -> None:
        """Write what is buffered and close the file (nothing is created for an empty split)."""
        self.flush()
        if self.writer is not None:
            self.writer.close()


def process_batches(batches: Iterator[pa.RecordBatch], root: str, staging: str, image_size: int, seed: int,
                    test_fraction: float, max_pixels: int, max_file_bytes: int,
                    rows_per_row_group: int) -> Iterator[pa.RecordBatch]:
    """Resize every image of one Spark task's ``binaryFile`` rows into Parquet files per split.

    Args:
        batches: Arrow batches from Spark with at least ``path`` (str) and ``content`` (binary).
        root: absolute local path of the input root.
        staging: folder, visible to the driver, where this task writes
            ``<split>/part-<partition>-<attempt>.parquet``.
        image_size, seed, test_fraction, max_pixels, max_file_bytes: as in ``ETLConfig``.
        rows_per_row_group: rows per Parquet row group (the last one of a file may hold fewer).

    Yields:
        one Arrow batch with :data:`OUTCOME_SCHEMA`, one row per input row, once the task's
        files are closed (so an outcome never names a half-written file).
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    task = f"{context.partitionId():05d}-{context.taskAttemptId()}" if context else "00000-0"
    prefix = root.rstrip("/") + "/"
    writers: Dict[str, SplitWriter] = {}
    outcomes: Dict[str, list] = {name: [] for name in OUTCOME_SCHEMA.names}

    def record(path: str, status: str, split=None, label=None, file=None, reason=None) -> None:
        for name, value in zip(OUTCOME_SCHEMA.names, (path, status, split, label, file, reason)):
            outcomes[name].append(value)

    for batch in batches:
        paths = batch.column(batch.schema.get_field_index("path")).to_pylist()
        contents = batch.column(batch.schema.get_field_index("content"))
        for i, spark_path in enumerate(paths):
            path = local_path(spark_path)
            content = contents[i].as_py() or b""
            relative = path[len(prefix):] if path.startswith(prefix) else path
            outcome = classify(relative, len(content), max_file_bytes, check_spark_hidden=False)
            if isinstance(outcome, Excluded):
                record(path, outcome.status, reason=outcome.reason)
                continue
            try:
                fitted = decode_and_fit(content, image_size, max_pixels)
            except ImageRejected as exc:
                record(path, REJECTED, reason=exc.reason)
                continue
            split = TEST if is_test(relative, seed, test_fraction) else TRAIN
            if split not in writers:
                writers[split] = SplitWriter(os.path.join(staging, split, f"part-{task}.parquet"),
                                             rows_per_row_group, image_size)
            writers[split].append(fitted, path, outcome.label, outcome.name)
            record(path, WRITTEN, split=split, label=outcome.label, file=f"{split}/part-{task}.parquet")
    for writer in writers.values():
        writer.close()
    yield pa.RecordBatch.from_pydict(outcomes, schema=OUTCOME_SCHEMA)
