"""Row groups of a split's Parquet files, the unit every reader reads and shards.

A split's row groups are listed from the files' footers alone (:func:`split_row_groups`: files in
the manifest's order, groups in file order); :func:`read_group` reads one with pyarrow into
``(images uint8 (n, row_bytes), labels int32 (n,))``, the images a view of Arrow's buffer, each
image's byte size and the group's row count checked against what the manifest and the footer say.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Tuple

import numpy as np
import pyarrow.parquet as pq

from pipelines.runtime.logs import plural
from pipelines.training.data.errors import ImageSizeError, ShardCountError

if TYPE_CHECKING:
    from pipelines.io.pinned import PinnedFile


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group: its file ``part`` (:class:`pipelines.io.pinned.PinnedFile`), its
    ``index`` in that file, its ``rows``, and the file's footer (``metadata``, read once per file)."""

    part: "PinnedFile"
    index: int
    rows: int
    metadata: object = field(default=None, compare=False, repr=False)

    @property
    def path(self) -> str:
        return self.part.uri


def split_row_groups(parts: list) -> List[RowGroup]:
    """Every row group of a split's ``parts`` (:meth:`pipelines.training.data.dataset.Dataset.parts`),
    files in the given order and groups in file order (footers only)."""
    groups: List[RowGroup] = []
    for part in parts:
        with part.open() as f:
            meta = pq.read_metadata(f)
        groups += [RowGroup(part, i, meta.row_group(i).num_rows, meta) for i in range(meta.num_row_groups)]
    return groups


def open_part(part: "PinnedFile"):
    """The Parquet file ``part`` opened for reading, as the file pinned
    (:meth:`pipelines.io.pinned.PinnedFile.open`): a local file mapped (faster than reading it:
    docs/benchmarks.md, Figures behind the code's constants), another through its filesystem."""
    return part.open()


def image_pixels(column, group: RowGroup, row_bytes: int) -> np.ndarray:
    """The images of a binary Arrow ``column`` of ``group`` as ``uint8 (n, row_bytes)``, a view of
    its buffer.

    Raises:
        ImageSizeError: a missing image, or one that is not ``row_bytes`` bytes (each checked).
    """
    if column.null_count:
        raise ImageSizeError(f"{group.path} row group {group.index}: a missing image")
    offsets = np.frombuffer(column.buffers()[1], np.int32, len(column) + 1, column.offset * 4)
    if np.any(np.diff(offsets) != row_bytes):
        raise ImageSizeError(f"{group.path} row group {group.index}: an image is not {plural(row_bytes, 'byte')}")
    if not len(column):
        return np.zeros((0, row_bytes), np.uint8)
    return np.frombuffer(column.buffers()[2], np.uint8)[offsets[0]:offsets[-1]].reshape(-1, row_bytes)


def count_error(group: RowGroup, rows: int) -> ShardCountError:
    """The error of a read of ``group`` that counted ``rows`` where its footer says another number."""
    return ShardCountError(f"{group.path} row group {group.index}: read {plural(rows, 'row')}, "
                           f"its footer says {group.rows}")


def read_group(group: RowGroup, row_bytes: int) -> Tuple[np.ndarray, np.ndarray]:
    """The images and labels of one row group, read with pyarrow: ``(uint8 (n, row_bytes),
    int32 (n,))``, the images a view of Arrow's buffer (no copy per image).

    Raises:
        ShardCountError: it holds another number of rows than its footer says.
        ImageSizeError: an image that is not ``row_bytes`` bytes (each one checked).
    """
    with open_part(group.part) as f:
        table = pq.ParquetFile(f, metadata=group.metadata).read_row_group(group.index, columns=["image", "label"])
    if table.num_rows != group.rows:
        raise count_error(group, table.num_rows)
    chunks = table.column("image")
    column = chunks.chunk(0) if chunks.num_chunks == 1 else chunks.combine_chunks()  # combining copies
    return image_pixels(column, group, row_bytes), table.column("label").to_numpy().astype(np.int32)
