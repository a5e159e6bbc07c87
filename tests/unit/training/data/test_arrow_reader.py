"""Our own reader (pipelines/training/data/arrow_reader.py) keeps Petastorm's contract as training uses
it: shards ``rank::world_size`` of the manifest's row groups, a seeded shuffle of row-group order
per epoch, every row group once per epoch, bounded threads and read-ahead; and both readers read
a bucket through the storage module's filesystem (the suite's real moto_server)."""
import hashlib
import os
import threading
import time
from collections import Counter

import numpy as np
import pytest

from pipelines.training.data import (OnePassShard, arrow_reader, check_reader, load_dataset, open_reader,
                                     petastorm_available, row_groups_of)
from pipelines.training.data.arrow_reader import ArrowShardReader
from pipelines.training.data.errors import DataError, ImageSizeError, ShardCountError
from pipelines.training.data.readers import default_reader
from pipelines.training.data.rowgroups import split_row_groups
from pipelines.training.data.stream import epoch_order
from tests.support.datagen import write_dataset
from tests.support.readers import READERS


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("arrow-reader") / "etl")
    write_dataset(root, train_groups=[8, 7, 6], test_groups=[3], rows_per_group=2)  # 21 row groups of 2 rows
    return load_dataset(root, world_size=1)


def epoch_rows(reader, groups):
    """The labels of the next ``groups`` row groups, one tuple per row group."""
    return [tuple(next(reader).label.tolist()) for _ in range(groups)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_each_epoch_reads_the_ranks_row_groups_each_once(data, world_size):
    groups = split_row_groups(data.parts("train"))
    covered = Counter()
    for rank in range(world_size):
        mine = groups[rank::world_size]
        expected = sorted(tuple(labels.tolist()) for _, labels in OnePassShard(data, "train", rank, world_size)
                          .batches())
        with ArrowShardReader(mine, data.row_bytes, seed=7, workers=2) as reader:
            for _ in range(3):
                got = epoch_rows(reader, len(mine))
                assert sorted(got) == expected  # exactly the shard, each row group once
        covered.update(label for group in expected for label in group)
    assert covered == Counter(range(42))  # the ranks' shards are disjoint and cover the split


def test_the_order_is_shuffled_per_epoch_and_repeats_with_the_seed(data):
    groups = split_row_groups(data.parts("train"))

    def orders(seed):
        with ArrowShardReader(groups, data.row_bytes, seed=seed, workers=3) as reader:
            return [epoch_rows(reader, len(groups)) for _ in range(3)]

    first, again, other = orders(1), orders(1), orders(2)
    assert first == again  # the same seed: the same order, epoch by epoch, whatever the threads did
    assert first[0] != first[1] != first[2] and first != other
    assert [[g[0] // 2 for g in epoch] for epoch in first] == [epoch_order(21, 1, e).tolist() for e in range(3)]


def test_threads_and_read_ahead_are_bounded(data, monkeypatch):
    groups = split_row_groups(data.parts("train"))
    loads, lock = [], threading.Lock()
    real = arrow_reader.read_group

    def counted(group, row_bytes):
        with lock:
            loads.append(group)
        return real(group, row_bytes)

    monkeypatch.setattr(arrow_reader, "read_group", counted)
    with ArrowShardReader(groups, data.row_bytes, workers=3, depth=4) as reader:
        for consumed in range(1, 30):
            next(reader)
            assert len(loads) <= consumed + 3  # at most depth row groups ahead of the consumer
        threads = [t for t in threading.enumerate() if t.name.startswith("arrow-reader")]
        assert 1 <= len(threads) <= 3
    assert not [t for t in threading.enumerate() if t.name.startswith("arrow-reader")]  # joined on exit


def test_reading_starts_when_the_reader_is_made_and_stays_within_depth(data, monkeypatch):
    """Like Petastorm's, our reader reads ahead from the start (tf.data's set-up overlaps it), never
    more than ``depth`` row groups before anyone asks."""
    loads = []
    real = arrow_reader.read_group

    def counted(group, row_bytes):
        loads.append(group)
        return real(group, row_bytes)

    monkeypatch.setattr(arrow_reader, "read_group", counted)
    with ArrowShardReader(split_row_groups(data.parts("train")), data.row_bytes, workers=2, depth=3):
        deadline = time.monotonic() + 20
        while len(loads) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert len(loads) == 3


def test_a_read_error_reaches_the_consumer(data, monkeypatch):
    def broken(group, row_bytes):
        raise ShardCountError("read 1 row, its footer says 2")

    monkeypatch.setattr(arrow_reader, "read_group", broken)
    with ArrowShardReader(split_row_groups(data.parts("train")), data.row_bytes) as reader:
        with pytest.raises(ShardCountError, match="its footer says 2"):
            next(reader)


def test_an_image_of_another_size_is_refused(tmp_path):
    root = str(tmp_path / "etl")
    write_dataset(root, train_groups=[2], test_groups=[1])
    data = load_dataset(root, world_size=1)
    with ArrowShardReader(split_row_groups(data.parts("train")), data.row_bytes + 1) as reader:
        with pytest.raises(DataError, match="an image is not 49 bytes"):
            next(reader)


def test_the_reader_setting_and_its_default():
    """The default is the stack table's (pipelines/stack/__init__.py), and it is the reader that runs here:
    Petastorm's where it can, ours elsewhere."""
    from pipelines import stack

    assert default_reader() == stack.active().reader == ("petastorm" if petastorm_available() else "own")
    assert check_reader("") == default_reader() and check_reader("own") == "own"
    with pytest.raises(ValueError, match="--reader fast: choose one of petastorm, own"):
        check_reader("fast")
    if not petastorm_available():
        with pytest.raises(ValueError, match="--reader petastorm: Petastorm 0.13.1 does not run here"):
            check_reader("petastorm")


def test_no_default_reader_where_the_tensorflow_is_on_no_stack(monkeypatch):
    """A TensorFlow of no stack has no default reader: a refusal naming the readers, not a guess."""
    from pipelines import stack

    monkeypatch.setattr(stack, "installed_tensorflow", lambda: "2.99.0")
    with pytest.raises(ValueError, match=r"--reader: no default here \(TensorFlow 2.99.0 is on no stack .*\): "
                                         r"give --reader petastorm or own"):
        check_reader("")
    assert check_reader("own") == "own"


def test_the_own_reader_never_imports_petastorm(data, tmp_path):
    """The current stack's path: a process that reads with ``own`` has no Petastorm module loaded."""
    import subprocess
    import sys

    code = ("import sys\nfrom pipelines.training.data import load_dataset, open_reader, row_groups_of\n"
            f"data = load_dataset({data.root!r}, 1)\n"
            f"with open_reader(data, 'train', 0, 1, {str(tmp_path / 'c')!r}, reader='own') as r:\n"
            "    next(r)\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('petastorm', 'diskcache')]\n"
            "assert not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("reader", READERS)
def test_each_reader_reads_a_bucket_rank_by_rank_as_the_local_rule(data, s3_bucket, tmp_path, reader):
    """Through the storage module's pyarrow filesystem: per rank, one epoch of the looping reader
    over the bucket gives the images OnePassShard reads locally (row groups ``rank::world_size``)."""
    from pipelines.io.storage import resolve

    resolve(f"s3://{s3_bucket}/etl").upload(data.root)
    remote = load_dataset(f"s3://{s3_bucket}/etl", 2)
    assert all(not p.local for p in remote.parts("train"))
    for rank in range(2):
        shard = OnePassShard(data, "train", rank, 2)
        expected = sorted(hashlib.sha1(image.tobytes()).hexdigest() for images, _ in shard.batches()
                          for image in images)
        with open_reader(remote, "train", rank, 2, str(tmp_path / "cache"), reader=reader) as opened:
            got = []
            while len(got) < len(expected):
                (images, _), = row_groups_of([next(opened)], data.stored_size)
                got += [hashlib.sha1(image.tobytes()).hexdigest() for image in images]
        if reader == "own":
            assert sorted(got) == expected
        else:  # Petastorm's looping epochs may overlap at their edges: the same shard, not one exact pass
            assert set(got) <= set(expected) and len(got) == len(expected)


def test_a_closed_reader_ends_instead_of_failing(data):
    """tf.data's prefetch may ask once more after the reader's block ended: iteration stops."""
    reader = ArrowShardReader(split_row_groups(data.parts("train")), data.row_bytes)
    with reader:
        next(reader)
    with pytest.raises(StopIteration):
        next(reader)


# --- the cold epoch with a cache: each row group decoded a few images at a time into its flat file ---

@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Row groups of 5 rows of 8 px (192 bytes each): enough rows to stream in several pieces."""
    root = str(tmp_path_factory.mktemp("arrow-reader-wide") / "etl")
    write_dataset(root, train_groups=[3, 2], test_groups=[1], size=8, rows_per_group=5)
    return load_dataset(root, world_size=1)


@pytest.mark.parametrize("rows_per_piece", [1, 2, 5, 100])
def test_a_row_group_streamed_into_its_flat_file_maps_back_as_read_group_reads_it(wide, tmp_path, monkeypatch,
                                                                                 rows_per_piece):
    from pipelines.training.data.rowcache import RowGroupFiles

    monkeypatch.setattr(arrow_reader, "STREAM_BYTES", rows_per_piece * wide.row_bytes)
    cache = RowGroupFiles(str(tmp_path), 1 << 30)
    for i, group in enumerate(split_row_groups(wide.parts("train"))):
        pieces = list(arrow_reader.stream_group(group, wide.row_bytes))
        assert len(pieces) == -(-5 // rows_per_piece) + 1  # the images in ceil(5 / k) pieces, then the labels
        assert cache.put_pieces(str(i), arrow_reader.flat_layout(group, wide.row_bytes), pieces)
        got, (images, labels) = cache.get(str(i)), arrow_reader.read_group(group, wide.row_bytes)
        assert got["image"].dtype == np.uint8 and got["image"].shape == images.shape == (5, 192)
        assert np.array_equal(got["image"], images) and got["label"].dtype == labels.dtype == np.int32
        assert got["label"].tolist() == labels.tolist() == list(range(5 * i, 5 * i + 5))


@pytest.mark.parametrize("fault, error, message", [
    (dict(row_bytes=191), ImageSizeError, "an image is not 191 bytes"),
    (dict(rows=6), ShardCountError, "read 5 rows, its footer says 6"),
    (dict(rows=4), ShardCountError, "read 5 rows, its footer says 4"),
    (dict(rows=1), ShardCountError, "read 2 rows, its footer says 1"),
])
def test_a_row_group_that_breaks_the_stream_reaches_the_consumer_and_leaves_no_file(wide, tmp_path, monkeypatch,
                                                                                   fault, error, message):
    """A fault found while a row group is decoded into the cache is the consumer's error, as without
    a cache; the file being written is removed and its bytes no longer count against the limit."""
    import dataclasses

    from pipelines.training.data.rowcache import RowGroupFiles

    monkeypatch.setattr(arrow_reader, "STREAM_BYTES", 2 * wide.row_bytes)
    fault = dict(fault)
    row_bytes = fault.pop("row_bytes", wide.row_bytes)
    groups = [dataclasses.replace(g, **fault) for g in split_row_groups(wide.parts("train"))]
    cache = RowGroupFiles(str(tmp_path / "cache"), 1 << 30)
    os.mkdir(cache.folder)
    with ArrowShardReader(groups, row_bytes, workers=1, depth=1, cache=cache) as reader:
        with pytest.raises(error, match=message):
            next(reader)
    assert os.listdir(cache.folder) == [] and cache.stored == 0
