"""Row groups of a split's Parquet files, the unit every reader reads and shards."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional, Tuple

import numpy as np
import pyarrow.parquet as pq

from pipelines.runtime.logs import plural
from pipelines.training.data.errors import ImageSizeError, ShardCountError

if TYPE_CHECKING:
    from pipelines.io.pinned import PinnedFile


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group: its file ``part``, its ``index`` there, its ``rows``, the file's footer (``metadata``)."""

    part: "PinnedFile"
    index: int
    rows: int
    metadata: Optional[pq.FileMetaData] = field(default=None, compare=False, repr=False)

    @property
    def path(self) -> str:
        return self.part.uri


def split_row_groups(parts: list) -> List[RowGroup]:
    """Every row group of a split's ``parts`` (footers only): files in the given order, groups in file order."""
    groups: List[RowGroup] = []
    for part in parts:
        with part.open() as f:
            meta = pq.read_metadata(f)
        groups += [RowGroup(part, i, meta.row_group(i).num_rows, meta) for i in range(meta.num_row_groups)]
    return groups


def open_part(part: "PinnedFile"):
    """The Parquet file ``part`` opened for reading as the file pinned (a local one mapped)."""
    return part.open()


def image_pixels(column, group: RowGroup, row_bytes: int) -> np.ndarray:
    """The images of a binary Arrow ``column`` as ``uint8 (n, row_bytes)``, a view of its buffer.

    Raises:
        ImageSizeError: a missing image, or one that is not ``row_bytes`` bytes (each checked)."""
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
    """One row group's ``(images uint8 (n, row_bytes), labels int32 (n,))``, images a view of Arrow's buffer.

    Raises:
        ShardCountError: it holds another number of rows than its footer says.
        ImageSizeError: an image that is not ``row_bytes`` bytes (each checked)."""
    with open_part(group.part) as f:
        table = pq.ParquetFile(f, metadata=group.metadata).read_row_group(group.index, columns=["image", "label"])
    if table.num_rows != group.rows:
        raise count_error(group, table.num_rows)
    chunks = table.column("image")
    column = chunks.chunk(0) if chunks.num_chunks == 1 else chunks.combine_chunks()  # combining copies
    return image_pixels(column, group, row_bytes), table.column("label").to_numpy().astype(np.int32)
