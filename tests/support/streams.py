"""A real Parquet dataset whose images say their row id, for the positioned train stream's tests,
and a rank's inputs over it."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.support.datagen import IMAGE_SCHEMA

SIZE = 4  # image side (px) of the fakes and of the Parquet dataset


def image_of(row_id: int, size: int = SIZE) -> np.ndarray:
    """Row ``row_id``'s image: uint8 ``(size, size, 3)``, another for every id (below 256) and not
    its own mirror image, so a flip and a swapped row both show."""
    y, x, c = np.meshgrid(np.arange(size), np.arange(size), np.arange(3), indexing="ij")
    return ((row_id * 31 + x * 7 + y * 3 + c) % 256).astype(np.uint8)


TRAIN_GROUPS, ROWS_PER_GROUP = [8, 7, 6], 2  # 21 row groups of 2 rows: a pass of 42 rows


def write_train_split(split_dir, groups_per_file, rows_per_group):
    """The train split of :func:`tests.support.datagen.write_dataset`'s layout (labels are row ids), with
    :func:`image_of`'s images, which a flip changes."""
    row_id = 0
    for f, groups in enumerate(groups_per_file):
        with pq.ParquetWriter(os.path.join(split_dir, f"part-{f:05d}.parquet"), IMAGE_SCHEMA) as writer:
            for _ in range(groups):
                ids = list(range(row_id, row_id + rows_per_group))
                row_id += rows_per_group
                table = pa.table({"path": [f"/x/{i}.jpg" for i in ids], "label": pa.array(ids, pa.int32()),
                                  "label_name": ["c"] * len(ids), "image": [image_of(i).tobytes() for i in ids],
                                  "height": pa.array([SIZE] * len(ids), pa.int32()),
                                  "width": pa.array([SIZE] * len(ids), pa.int32())}, schema=IMAGE_SCHEMA)
                writer.write_table(table, row_group_size=rows_per_group)


def rank_of(rank: int, size: int):
    """A ``Rank`` ``rank`` of ``size``, its host's only one, of one thread (no Horovod started)."""
    from pipelines.training.rank import Rank

    return Rank(rank, size, local_rank=0, local_size=1, threads=1)


def inputs_of(data, tmp_path, reader="own", **options):
    from pipelines.training.config import TrainConfig
    from pipelines.training.inputs import ImageInputs

    config = TrainConfig(data=data.root, output=str(tmp_path / "out"), batch_size=2, shuffle_buffer=5, seed=3,
                         reader=reader, reader_workers=2, augment="flip", **options)
    return ImageInputs(config, data, rank_of(0, 1), None, data.stored_size)
