"""Fixtures of the data layer's unit tests."""
import os

import pytest

from tests.support.datagen import write_dataset
from tests.support.streams import ROWS_PER_GROUP, SIZE, TRAIN_GROUPS, write_train_split


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from pipelines.training.data import load_dataset

    root = str(tmp_path_factory.mktemp("stream") / "etl")
    write_dataset(root, train_groups=TRAIN_GROUPS, test_groups=[3], size=SIZE, rows_per_group=ROWS_PER_GROUP)
    for name in os.listdir(os.path.join(root, "train")):
        os.remove(os.path.join(root, "train", name))
    write_train_split(os.path.join(root, "train"), TRAIN_GROUPS, ROWS_PER_GROUP)
    return load_dataset(root, world_size=1)
