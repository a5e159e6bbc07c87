"""One-pass reads: every row of a rank's shard of a split exactly once, its count checked.

Exact evaluation (each epoch's validation, the test split at the end) and the feature cache read
a split once, sequentially, with pyarrow, whichever the ``--reader`` (a looping reader could lose
rows to its worker pool, Petastorm's at the end of a bounded read): :class:`OnePassShard` for a
rank's shard, :func:`verify_total` for the sum over all ranks against the manifest.
"""
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
    """Every row of one rank's shard of a split, exactly once, read with pyarrow.

    The shard is :func:`~pipelines.training.data.sharding.one_pass_pieces` of the split's row
    groups: whole row groups ``rank, rank + world_size, ...`` (the readers' rule) while the split
    has at least as many as ranks, else a contiguous range of its rows, so that no world size is
    refused for a short split; either way the ranks' shards are disjoint and cover the split.
    Reading is sequential, so no row can be lost to a worker pool, and every consumer checks what
    it counted with :meth:`verify`: for evaluation and the feature cache.
    """

    def __init__(self, data: Dataset, split: str, rank: int, world_size: int):
        self.data, self.split, self.rank, self.world_size = data, split, rank, world_size
        self.pieces = one_pass_pieces(split_row_groups(data.parts(split)), rank, world_size)
        self.expected_rows = sum(stop - start for _, start, stop in self.pieces)

    def batches(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """One ``(images uint8 (n, s, s, 3), labels int32 (n,))`` per row group (or the shard's
        slice of one), in shard order.

        Raises:
            ShardCountError: a row group holds another number of rows than its footer says.
            DataError: an image that is not the manifest's ``row_bytes`` (each checked).
        """
        s = self.data.stored_size
        for group, start, stop in self.pieces:
            images, labels = read_group(group, self.data.row_bytes)
            yield images[start:stop].reshape(-1, s, s, 3), labels[start:stop]

    def dataset(self, batch_size: int):
        """``tf.data`` over :meth:`batches`: ``(uint8 (b, s, s, 3), int32 (b,))``, the last batch
        possibly smaller, through the tail training's datasets share
        (:func:`~pipelines.training.data.tfdata.batched`)."""
        import tensorflow as tf

        s = self.data.stored_size
        ds = tf.data.Dataset.from_generator(self.batches, output_signature=(
            tf.TensorSpec((None, s, s, 3), tf.uint8), tf.TensorSpec((None,), tf.int32)))
        return batched(ds.unbatch(), batch_size, drop_remainder=False)

    def verify(self, counted: int) -> None:
        """Raise :class:`~pipelines.training.data.errors.ShardCountError` unless ``counted`` equals
        the shard's rows (metadata)."""
        if counted != self.expected_rows:
            raise ShardCountError(f"rank {self.rank} counted {plural(counted, 'row')} of its {self.split} shard, "
                                  f"whose Parquet metadata holds {self.expected_rows}")


def verify_total(counted: int, data: Dataset, split: str) -> None:
    """Raise :class:`~pipelines.training.data.errors.ShardCountError` unless the rows counted over
    all ranks equal the manifest's."""
    expected = data.rows(split)
    if counted != expected:
        raise ShardCountError(f"all ranks counted {plural(counted, 'row')} of the {split} split; the manifest says "
                              f"{expected}")
