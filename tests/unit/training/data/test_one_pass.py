"""One-pass reads (exact evaluation, feature cache) read every row of every shard exactly once.

Petastorm 0.13.1's ``num_epochs=1`` reader lost rows here (16 of 21 one-row row groups in 6 of
30 passes); these tests repeat the read many times over the same layout, on both splits, and
check each pass row by row against the Parquet metadata.
"""
from collections import Counter

import numpy as np
import pytest

from pipelines.training.data import OnePassShard, ShardCountError, load_dataset, verify_total
from pipelines.training.data.sharding import shard
from tests.support.datagen import write_dataset
from tests.support.readers import READERS

PASSES = 100


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("one-pass") / "etl")
    write_dataset(root, train_groups=[8, 7, 6], test_groups=[10, 9])  # 21 and 19 one-row row groups
    return load_dataset(root, world_size=1)


@pytest.mark.parametrize("split, ids", [("train", range(0, 21)), ("test", range(21, 40))])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_row_once_in_every_pass(data, split, ids, world_size):
    for _ in range(PASSES):
        seen = Counter()
        for rank in range(world_size):
            shard = OnePassShard(data, split, rank, world_size)
            labels = [int(x) for _, batch in shard.batches() for x in batch]
            shard.verify(len(labels))
            seen.update(labels)
        assert seen == Counter(ids)
        verify_total(sum(seen.values()), data, split)


def test_pixels_belong_to_their_row(data):
    for images, labels in OnePassShard(data, "test", 1, 2).batches():
        assert images.dtype == np.uint8 and images.shape[1:] == (4, 4, 3)
        assert [int(i[0, 0, 0]) for i in images] == [int(x) % 256 for x in labels]


def test_shards_follow_row_group_round_robin(data):
    sizes = [OnePassShard(data, "train", r, 4).expected_rows for r in range(4)]
    assert sizes == [6, 5, 5, 5]  # 21 one-row groups: group i to rank i % 4


@pytest.mark.parametrize("items, world_size", [(21, 4), (8, 8), (3, 5), (0, 2), (7, 1)])
def test_the_sharding_rule_gives_each_item_to_one_rank_and_shards_within_one_of_each_other(items, world_size):
    """The one rule every reader and the feature cache use: item i to rank i % world_size (Petastorm's
    cur_shard/shard_count); a list stays a list, an array's shard is a view of it."""
    shards = [list(shard(list(range(items)), rank, world_size)) for rank in range(world_size)]
    assert sorted(i for s in shards for i in s) == list(range(items))
    assert all(i % world_size == rank for rank, s in enumerate(shards) for i in s)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    array = np.arange(items * 2).reshape(items, 2)
    assert np.shares_memory(shard(array, world_size - 1, world_size), array) or items < world_size


@pytest.mark.parametrize("rank, world_size", [(-1, 2), (2, 2), (0, 0), (5, 3)])
def test_a_rank_outside_the_world_is_refused_by_the_sharding_rule(rank, world_size):
    with pytest.raises(ValueError, match=f"rank {rank} is not one of {world_size} ranks"):
        shard([1, 2, 3], rank, world_size)


def test_a_short_count_fails_with_both_numbers(data):
    shard = OnePassShard(data, "test", 0, 2)
    with pytest.raises(ShardCountError, match=r"counted 9 rows .* holds 10"):
        shard.verify(9)
    with pytest.raises(ShardCountError, match=r"counted 18 rows of the test split; the manifest says 19"):
        verify_total(18, data, "test")


def test_tf_dataset_and_feature_rows_are_exact(data):
    """The evaluation's and the feature cache's input: the tf.data view of the same one-pass read."""
    from pipelines.stack.kerasapi import keras

    from pipelines.training.data.features import compute_shard
    from pipelines.backbones import backbone_spec
    from pipelines.training.model.build import preprocessing

    image = keras.Input((4, 4, 3), dtype="uint8")  # the uint8 batches, preprocessed by the model's own layers
    backbone = keras.Model(image, keras.layers.GlobalAveragePooling2D()(preprocessing(image, 4, 4, backbone_spec("xception"))))
    for _ in range(5):  # tf.data adds no reading of its own: a few passes show it drops nothing
        for split, ids in (("train", range(0, 21)), ("test", range(21, 40))):
            got = []
            for rank in range(2):
                shard = OnePassShard(data, split, rank, 2)
                features, labels = compute_shard(backbone, shard.dataset(batch_size=4))
                shard.verify(len(labels))
                assert features.shape == (len(labels), 3)
                # preprocess_input maps pixel value v to v / 127.5 - 1
                np.testing.assert_allclose(features[:, 0], (labels % 256) / 127.5 - 1, atol=1e-6)
                got += labels.tolist()
            assert sorted(got) == list(ids)


@pytest.mark.parametrize("reader", READERS)
def test_the_training_pipeline_keeps_every_image_with_its_label(data, tmp_path, reader):
    """Training's input (a looping reader, each of both -> row groups -> shuffle -> batch ->
    prefetch): full batches of the stored uint8 images, unconverted (the model casts and
    preprocesses), each image's pixels still those of its own row (row id = label), every row of
    the split delivered."""
    import tensorflow as tf

    from pipelines.training.data import make_dataset, open_reader

    with open_reader(data, "train", 0, 1, str(tmp_path / "cache"), reader=reader) as opened:
        ds = make_dataset(opened, 4, batch_size=5, shuffle_buffer=8, seed=1)
        seen = Counter()
        for images, labels in ds.take(40):  # 200 rows: over 9 passes of the 21
            assert images.dtype == tf.uint8 and images.shape == (5, 4, 4, 3) and labels.dtype == tf.int32
            expected = (labels.numpy() % 256).astype(np.uint8)  # the row's constant pixel value
            np.testing.assert_array_equal(images.numpy(), np.broadcast_to(expected[:, None, None, None], images.shape))
            seen.update(labels.numpy().tolist())
    assert set(seen) == set(range(21))


@pytest.fixture(scope="module")
def short_test_split(tmp_path_factory):
    """3 row groups of 5 rows in the test split (15 rows), 4 of 2 in train: more ranks than
    row groups in both."""
    root = str(tmp_path_factory.mktemp("short") / "etl")
    write_dataset(root, train_groups=[4], test_groups=[2, 1], rows_per_group=5)
    return root


@pytest.mark.parametrize("world_size", [4, 5, 7, 15, 16, 40])
def test_more_ranks_than_row_groups_shard_the_test_split_by_rows(short_test_split, world_size):
    """Rows ``[r * N // n, (r + 1) * N // n)`` of the split in file order: disjoint, covering,
    sizes differing by one at most, each image with its own row (pixels = row id)."""
    data = load_dataset(short_test_split, world_size=1)
    seen, sizes = [], []
    for rank in range(world_size):
        shard = OnePassShard(data, "test", rank, world_size)
        labels = []
        for images, batch in shard.batches():
            assert [int(i[0, 0, 0]) for i in images] == [int(x) % 256 for x in batch]
            labels += batch.tolist()
        shard.verify(len(labels))
        sizes.append(len(labels))
        seen += labels
    assert seen == list(range(20, 35))  # in file order, each row once
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 15
    verify_total(len(seen), data, "test")


def test_the_train_split_refuses_more_ranks_than_row_groups_naming_the_etl_flags(short_test_split):
    from pipelines.training.data import DataError

    assert load_dataset(short_test_split, world_size=4).test_rows == 15  # 3 test row groups: not refused
    with pytest.raises(DataError, match=r"the train split has 4 row groups but 5 ranks need one each \(a rank reads "
                                        r"whole row groups\): use at most 4 ranks, or rerun the ETL with "
                                        r"--min-row-groups 5 \(or a smaller --row-group-mb\)"):
        load_dataset(short_test_split, world_size=5)


@pytest.mark.parametrize("reader", READERS)
def test_every_dataset_the_training_reads_ends_without_tf_datas_autotuning(data, tmp_path, reader):
    """Training's stream (each reader), a one-pass shard, and the feature datasets (endless and one
    pass) all have autotuning off: with it on, dropping an iterator read slowly waits for tf.data's
    model thread, seconds to a minute (benchmarks/iterator_end_bench.py)."""
    from pipelines.training.data import make_dataset, open_reader
    from pipelines.training.data.features import feature_dataset

    features, labels = np.zeros((6, 2), np.float32), np.arange(6, dtype=np.int32)
    with open_reader(data, "train", 0, 1, str(tmp_path / "cache"), reader=reader) as opened:
        datasets = [make_dataset(opened, 4, batch_size=5, shuffle_buffer=8, seed=1),
                    OnePassShard(data, "test", 0, 2).dataset(3),
                    feature_dataset(features, labels, 2, shuffle=True, seed=0, repeat=True),
                    feature_dataset(features, labels, 2, shuffle=False, seed=0, repeat=False)]
        assert [ds.options().autotune.enabled for ds in datasets] == [False] * 4
