"""ETL-shaped Parquet datasets written directly with pyarrow: exact row-group layouts for reader tests."""
import json
import os
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.contract import image_schema

IMAGE_SCHEMA = image_schema()


def write_split(split_dir: str, groups_per_file: Sequence[int], size: int, first_id: int = 0,
                rows_per_group: int = 1, names: Sequence[str] = ("c",)) -> int:
    """Write files of ``groups_per_file[i]`` row groups of ``rows_per_group`` rows each; every row's
    ``label`` is its own id (``first_id``, ``first_id + 1``, ...), its pixels are that id mod 256 and
    its ``label_name`` is ``names[id % len(names)]``. Returns the next free id."""
    os.makedirs(split_dir, exist_ok=True)
    row_id = first_id
    for f, groups in enumerate(groups_per_file):
        with pq.ParquetWriter(os.path.join(split_dir, f"part-{f:05d}.parquet"), IMAGE_SCHEMA) as writer:
            for _ in range(groups):
                ids = list(range(row_id, row_id + rows_per_group))
                row_id += rows_per_group
                images = [np.full((size, size, 3), i % 256, np.uint8).tobytes() for i in ids]
                table = pa.table({"path": [f"/x/{i}.jpg" for i in ids], "label": pa.array(ids, pa.int32()),
                                  "label_name": [names[i % len(names)] for i in ids], "image": images,
                                  "height": pa.array([size] * len(ids), pa.int32()),
                                  "width": pa.array([size] * len(ids), pa.int32())}, schema=IMAGE_SCHEMA)
                writer.write_table(table, row_group_size=rows_per_group)
    return row_id


def write_dataset(root: str, train_groups: Sequence[int], test_groups: Sequence[int], size: int = 4,
                  rows_per_group: int = 1, validation_groups: Sequence[int] = None,
                  names: Sequence[str] = ("c",)) -> dict:
    """A minimal ETL output (manifest + train, test and validation splits of row groups of
    ``rows_per_group`` rows, one by default) whose labels are row ids: train's first, then test's,
    then validation's (laid out as ``test_groups`` unless ``validation_groups`` says); the train
    split's label names are ``names``, cycled."""
    next_id = write_split(os.path.join(root, "train"), train_groups, size, rows_per_group=rows_per_group, names=names)
    test_end = write_split(os.path.join(root, "test"), test_groups, size, first_id=next_id,
                           rows_per_group=rows_per_group)
    validation_groups = test_groups if validation_groups is None else validation_groups
    last_id = write_split(os.path.join(root, "validation"), validation_groups, size, first_id=test_end,
                          rows_per_group=rows_per_group)
    manifest = {"image": {"height": size, "width": size, "channels": 3}, "num_classes": last_id,
                "class_names": [str(i) for i in range(last_id)], "rows_per_row_group": rows_per_group,
                "splits": {"train": {"rows": next_id, "row_groups": sum(train_groups)},
                           "test": {"rows": test_end - next_id, "row_groups": sum(test_groups)},
                           "validation": {"rows": last_id - test_end, "row_groups": sum(validation_groups)}}}
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return manifest
