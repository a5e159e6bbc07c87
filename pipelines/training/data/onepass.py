"""One-pass reads: every row of a rank's shard of a split exactly once, its count checked (sequential pyarrow)."""
from __future__ import annotations

from typing import Iterator, Tuple

import numpy as np

from pipelines.runtime.logs import plural
from pipelines.training.data.dataset import Dataset
from pipelines.training.data.errors import ShardCountError
from pipelines.training.data.rowgroups import read_group, split_row_groups
from pipelines.training.data.sharding import one_pass_pieces
from pipelines.training.data.tfdata import batched


class OnePassShard:
    """Every row of one rank's shard of a split (``one_pass_pieces``), once, sequentially; consumers ``verify``."""

    def __init__(self, data: Dataset, split: str, rank: int, world_size: int):
        self.data, self.split, self.rank, self.world_size = data, split, rank, world_size
        self.pieces = one_pass_pieces(split_row_groups(data.parts(split)), rank, world_size)
        self.expected_rows = sum(stop - start for _, start, stop in self.pieces)

    def batches(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """One ``(images uint8 (n, s, s, 3), labels int32 (n,))`` per row group (or the shard's slice of one).

        Raises:
            ShardCountError: a row group holds another number of rows than its footer says.
            DataError: an image that is not the manifest's ``row_bytes`` (each checked)."""
        s = self.data.stored_size
        for group, start, stop in self.pieces:
            images, labels = read_group(group, self.data.row_bytes)
            yield images[start:stop].reshape(-1, s, s, 3), labels[start:stop]

    def dataset(self, batch_size: int):
        """``tf.data`` over ``batches``: ``(uint8 (b, s, s, 3), int32 (b,))``, the last batch possibly smaller."""
        import tensorflow as tf

        s = self.data.stored_size
        ds = tf.data.Dataset.from_generator(self.batches, output_signature=(
            tf.TensorSpec((None, s, s, 3), tf.uint8), tf.TensorSpec((None,), tf.int32)))
        return batched(ds.unbatch(), batch_size, drop_remainder=False)

    def verify(self, counted: int) -> None:
        """Raise ``ShardCountError`` unless ``counted`` equals the shard's rows (metadata)."""
        if counted != self.expected_rows:
            raise ShardCountError(f"rank {self.rank} counted {plural(counted, 'row')} of its {self.split} shard, "
                                  f"whose Parquet metadata holds {self.expected_rows}")


def verify_total(counted: int, data: Dataset, split: str) -> None:
    """Raise ``ShardCountError`` unless the rows counted over all ranks equal the manifest's."""
    expected = data.rows(split)
    if counted != expected:
        raise ShardCountError(f"all ranks counted {plural(counted, 'row')} of the {split} split; the manifest says "
                              f"{expected}")
