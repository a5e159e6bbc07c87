"""The positioned train stream (pipelines/training/data/stream.py; issue 38): opened at any row it yields
exactly the rows the stream opened at 0 has there, flips included (keyed by position); every pass covers the shard
once; and training's datasets over our reader (cache, two threads) and over the feature cache
open at a row exactly, however often they are made or iterated."""
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from pipelines.training.data.stream import (ShardStream, epoch_order, feature_batches, keyed, stream_batches,
                                            window_visits)
from tests.support.readers import READERS
from tests.support.streams import ROWS_PER_GROUP, SIZE, TRAIN_GROUPS, image_of, inputs_of


class FakeShard:
    """Row groups held in memory (row ids in shard order), opened at a visit as the reader is;
    ``pulled`` counts the rows handed out, to check how much is re-read before a start row."""

    def __init__(self, rows):
        self.groups, first = [], 0
        for n in rows:
            ids = np.arange(first, first + n, dtype=np.int32)
            images = np.stack([image_of(i) for i in ids]) if n else np.zeros((0, SIZE, SIZE, 3), np.uint8)
            self.groups.append((images, ids))
            first += n
        self.pulled, self.opened_at = 0, []

    def opener(self, stream):
        def open_groups(visit):
            self.opened_at.append(visit)
            for index in stream.visits_from(visit):
                self.pulled += len(self.groups[index][1])
                yield self.groups[index]
        return open_groups


def rows_of(batches, count):
    """The first ``count`` rows of an iterator of ``(images, labels)`` batches, as two arrays."""
    images, labels = [], []
    while sum(map(len, labels)) < count:
        got = next(batches)
        images.append(np.asarray(got[0]))
        labels.append(np.asarray(got[1]))
    return np.concatenate(images)[:count], np.concatenate(labels)[:count]


# (row counts of the shard's row groups, seed, W)
MEMBERS = [
    ([2] * 21, 1, 1),
    ([2] * 21, 7, 3),
    ([3, 1, 4, 1, 5, 9, 2, 6], 0, 2),  # uneven row groups, a pass of 31 rows in windows of 2
    ([5, 5, 5, 2], 3, 8),  # W beyond the shard: one window a pass
    ([0, 4, 0, 3, 2], 11, 2),  # row groups of no rows (a window may have none)
]


@pytest.mark.parametrize("rows, seed, window", MEMBERS)
def test_opening_at_a_row_yields_the_stream_from_there(rows, seed, window):
    """For start rows inside a window, on its boundaries, at a pass's start and in later passes,
    with batches that do not divide them: rows R.. (labels and image bytes) are
    rows R.. of the stream opened at 0, and at most one window is read before R."""
    stream = ShardStream(rows, seed, window)
    total = stream.shard_rows
    ends = [0]
    for k in range(stream.windows_per_pass):
        ends.append(ends[-1] + stream.window_rows(0, k))
    starts = sorted({1, ends[1], ends[1] + 1, ends[-2], total - 1, total, total + 3, 2 * total + ends[1],
                     5 * total + 2})
    reference = rows_of(stream_batches(stream, FakeShard(rows).opener(stream), 0, 3), 7 * total)
    for start in starts:
        shard = FakeShard(rows)
        images, labels = rows_of(stream_batches(stream, shard.opener(stream), start, 4), total + 5)
        np.testing.assert_array_equal(labels, reference[1][start:start + total + 5], err_msg=f"start {start}")
        np.testing.assert_array_equal(images, reference[0][start:start + total + 5], err_msg=f"start {start}")
        position = stream.locate(start)  # reading starts at the row's window: no earlier one, no earlier pass
        assert shard.opened_at == [position.visit]
        assert position.visit == position.pass_index * len(rows) + position.window * window
        assert position.offset < stream.window_rows(position.pass_index, position.window)
        assert shard.pulled <= position.offset + total + 5 + 3 + max(rows) * window  # and one window beyond at most


@pytest.mark.parametrize("rows, seed, window", MEMBERS)
def test_every_pass_covers_each_shard_row_exactly_once(rows, seed, window):
    stream = ShardStream(rows, seed, window)
    _, labels = rows_of(stream_batches(stream, FakeShard(rows).opener(stream), 0, 5), 4 * stream.shard_rows)
    passes = labels.reshape(4, stream.shard_rows)
    for p in range(4):
        assert sorted(passes[p].tolist()) == list(range(stream.shard_rows))
    assert len({tuple(p) for p in passes.tolist()}) == 4  # and each pass in its own order


def test_the_windows_are_the_visit_order_cut_in_w_and_permuted_by_their_own_generator():
    """The definition, by hand: pass p visits epoch_order(n, seed, p); window k holds visits
    kW..(k+1)W-1, its rows emitted in default_rng((seed, p, k)).permutation(rows)."""
    rows, seed = [2, 3, 1, 4], 5
    stream = ShardStream(rows, seed, 3)
    firsts = np.cumsum([0] + rows)
    expected = []
    for p in range(2):
        order = epoch_order(4, seed, p)
        for k, visits in enumerate([order[:3], order[3:]]):
            ids = np.concatenate([np.arange(firsts[g], firsts[g] + rows[g]) for g in visits])
            expected += ids[np.random.default_rng((seed, p, k)).permutation(len(ids))].tolist()
    _, labels = rows_of(stream_batches(stream, FakeShard(rows).opener(stream), 0, 2), 20)
    assert labels.tolist() == expected


def test_locate_walks_the_pass_of_the_row():
    stream = ShardStream([2, 2, 2], 0, 2)  # windows of 4 and 2 rows a pass of 6
    assert stream.locate(0) == (0, 0, 0, 0) and stream.locate(3) == (0, 0, 3, 0)
    assert stream.locate(4) == (0, 1, 0, 2) and stream.locate(5) == (0, 1, 1, 2)
    assert stream.locate(6) == (1, 0, 0, 3) and stream.locate(6 * 1000 + 5) == (1000, 1, 1, 3002)
    empty_first = ShardStream([0, 0, 3], 0, 1)  # the windows of no rows are stepped over
    order = epoch_order(3, 0, 0).tolist()
    assert empty_first.locate(0).window == order.index(2)
    with pytest.raises(ValueError, match=">= 0"):
        stream.locate(-1)
    with pytest.raises(ValueError, match="no rows"):
        ShardStream([0, 0], 0, 1)


@pytest.mark.parametrize("buffer, rows, window", [(256, 4, 64), (256, 16, 16), (256, 300, 1), (0, 8, 1),
                                                  (1, 8, 1), (17, 8, 3), (8, 8, 1)])
def test_the_window_holds_about_the_shuffle_buffer(buffer, rows, window):
    assert window_visits(buffer, rows) == window


def augmented(batches):
    """Keyed batches ``(images, labels, keys)`` through training's tail with ``--augment``, as NumPy."""
    import tensorflow as tf

    from pipelines.training.data.tfdata import tail

    batches = list(batches)
    ds = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=(
        tf.TensorSpec((None, SIZE, SIZE, 3), tf.uint8), tf.TensorSpec((None,), tf.int32),
        tf.TensorSpec((None, 2), tf.int64)))
    return iter([(images.numpy(), labels.numpy()) for images, labels in tail(ds, augment=("flip",), device="/cpu:0")])


def test_flips_are_positional_and_leave_the_order_alone():
    """With augment, each row is its image or that image mirrored left to right (the width axis),
    both occur, the order is the one without augment, and a stream opened at R (its keys from R)
    flips the same rows, in batches of another size too."""
    rows = [3, 5, 2, 6, 4]
    stream = ShardStream(rows, 9, 2)
    plain = rows_of(stream_batches(stream, FakeShard(rows).opener(stream), 0, 4), 60)
    opened = keyed(stream_batches(stream, FakeShard(rows).opener(stream), 0, 4), 9)
    flipped = rows_of(augmented(next(opened) for _ in range(15)), 60)
    np.testing.assert_array_equal(plain[1], flipped[1])
    mirrored = [not np.array_equal(a, b) for a, b in zip(plain[0], flipped[0])]
    for original, got, flip in zip(plain[0], flipped[0], mirrored):
        np.testing.assert_array_equal(got, original[:, ::-1] if flip else original)
    assert 10 < sum(mirrored) < 50
    opened = keyed(stream_batches(stream, FakeShard(rows).opener(stream), 23, 3), 9, 23)
    later = rows_of(augmented(next(opened) for _ in range(13)), 37)
    np.testing.assert_array_equal(later[0], flipped[0][23:])


def test_a_stream_ends_when_its_row_groups_stop_and_refuses_a_wrong_count():
    stream = ShardStream([2, 2], 0, 1)
    assert list(stream_batches(stream, lambda visit: iter([]), 0, 2)) == []
    short = FakeShard([2, 1])
    with pytest.raises(ValueError, match="its footer says 2 rows"):
        rows_of(stream_batches(ShardStream([2, 2], 0, 1), short.opener(ShardStream([2, 2], 0, 1)), 0, 2), 8)


@pytest.mark.parametrize("n, seed, start, batch", [(10, 0, 0, 3), (10, 4, 7, 3), (10, 4, 10, 4), (7, 2, 23, 5),
                                                   (5, 1, 4, 8)])
def test_the_feature_stream_opens_at_a_row(n, seed, start, batch):
    features = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    labels = np.arange(n, dtype=np.int32)
    reference = rows_of(feature_batches(features, labels, seed, 0, 2), start + 3 * n + 6 * n)
    for p in range(6):
        assert reference[1][p * n:(p + 1) * n].tolist() == epoch_order(n, seed, p).tolist()
    got = rows_of(feature_batches(features, labels, seed, start, batch), 3 * n)
    np.testing.assert_array_equal(got[1], reference[1][start:start + 3 * n])
    np.testing.assert_array_equal(got[0], reference[0][start:start + 3 * n])
    assert got[0].dtype == np.float32
    in_order = rows_of(feature_batches(features, labels, seed, start, batch, shuffle=False), n)
    assert in_order[1].tolist() == [(start + i) % n for i in range(n)]


def test_the_data_layer_needs_no_tensorflow_until_a_dataset_is_made():
    """Its pure parts (the stream, the readers, the sharding, the one-pass reads, the feature cache)
    import without TensorFlow; only the tf.data tail loads it, when it is called."""
    code = ("import sys\nimport pipelines.training.data, pipelines.training.data.features\n"
            "import pipelines.training.data.stream, pipelines.training.data.arrow_reader\n"
            "assert 'tensorflow' not in sys.modules, 'tensorflow'\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('petastorm', 'diskcache')]\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


# --- training's datasets over real Parquet ---


def take(dataset, batches):
    """``batches`` batches of one iterator of ``dataset``, as two arrays of rows."""
    it = iter(dataset)
    return rows_of((next(it) for _ in range(batches)), 2 * batches)


def test_a_stream_opened_at_a_row_of_the_own_reader_is_the_stream_from_there(data, tmp_path):
    """Through fit_datasets with a cache and two reader threads (windows of 3 row groups, 6 rows;
    passes of 42): a stream opened at a row inside a window, on a window's boundary and in a
    later pass gives the batches of the stream from 0 there; a second iter() of a dataset starts
    at its row again."""
    from pipelines.training.data.tfdata import shard_stream

    inputs = inputs_of(data, tmp_path)
    assert inputs.exact_positions
    with inputs.fit_datasets(str(tmp_path / "cache")) as (train, none):
        assert none is None
        reference = take(train, 120)  # 240 rows: over 5 passes
        assert sorted(reference[1][:42].tolist()) == list(range(42))
        # the definition itself (labels are row ids in shard order, and images image_of's)
        defined = ShardStream([ROWS_PER_GROUP] * sum(TRAIN_GROUPS), 3, 3)
        opened = keyed(stream_batches(defined, FakeShard(defined.rows.tolist()).opener(defined), 0, 2), 3)
        expected = rows_of(augmented(next(opened) for _ in range(120)), 240)
        np.testing.assert_array_equal(reference[1], expected[1])
        np.testing.assert_array_equal(reference[0], expected[0])
        assert os.listdir(str(tmp_path / "cache"))  # the cache is filled
        stream = shard_stream(inputs._train_reader, 5, 3)
        assert stream.window == 3 and stream.shard_rows == 42
    for start in (2, 4, 6, 12, 40, 42, 46, 90, 130):  # inside, boundary, pass end, later passes
        with inputs.fit_datasets(str(tmp_path / "cache"), start_row=start) as (train, _):
            images, labels = take(train, 25)
            np.testing.assert_array_equal(labels, reference[1][start:start + 50], err_msg=f"start {start}")
            np.testing.assert_array_equal(images, reference[0][start:start + 50], err_msg=f"start {start}")
            if start == 130:
                np.testing.assert_array_equal(take(train, 5)[1], labels[:10])  # a second iter() starts again


def test_fit_datasets_opens_at_its_start_row_with_a_fresh_reader(data, tmp_path):
    """A resumed run's fit_datasets(start_row), a reader of its own, gives the rows an
    uninterrupted run's stream has there (the same seed), its flips too: each row its image or
    that image mirrored left to right, about half of them mirrored."""
    inputs = inputs_of(data, tmp_path)
    with inputs.fit_datasets(str(tmp_path / "a")) as (train, _):
        reference = take(train, 60)
    for start in (8, 50):
        with inputs.fit_datasets(str(tmp_path / f"b{start}"), start_row=start) as (train, _):
            images, labels = take(train, 20)
        np.testing.assert_array_equal(labels, reference[1][start:start + 40])
        np.testing.assert_array_equal(images, reference[0][start:start + 40])
    flips = np.array([not np.array_equal(image, image_of(label)) for image, label in zip(*reference)])
    for image, label, flip in zip(*reference, flips):
        np.testing.assert_array_equal(image, image_of(label)[:, ::-1] if flip else image_of(label))
    assert 20 < flips.sum() < 100  # --augment flips by position, about half


def test_make_dataset_over_the_reader_itself_after_it_was_read(data, tmp_path):
    """make_dataset over an open reader already read from (the benchmark's, the notebooks') is the
    stream from its start_row, not from where the reader's own iteration had got to."""
    from pipelines.training.data import make_dataset, open_reader

    with open_reader(data, "train", 0, 1, None, workers=2, seed=3, reader="own") as reader:
        next(reader), next(reader)
        ds = make_dataset(reader, SIZE, 2, shuffle_buffer=5, seed=3)
        reference = take(ds, 40)
        np.testing.assert_array_equal(take(make_dataset(reader, SIZE, 2, shuffle_buffer=5, seed=3, start_row=30),
                                           10)[1], reference[1][30:50])
        with pytest.raises(StopIteration):  # its own iteration was superseded
            next(reader)
        with pytest.raises(ValueError, match=">= 0"):
            make_dataset(reader, SIZE, 2, start_row=-2)


@pytest.mark.parametrize("reader", READERS)
def test_exact_positions_says_which_reader_opens_at_a_row(data, tmp_path, reader):
    """Ours is exact; Petastorm's is not, and its fit_datasets at a row still trains (its stream
    from where the reader is: each row of the shard still comes with its own image)."""
    from pipelines.training.data.readers import exact_positions
    from pipelines.training.data import open_reader

    inputs = inputs_of(data, tmp_path, reader=reader)
    assert inputs.exact_positions is (reader == "own")
    with open_reader(data, "train", 0, 1, None, reader=reader) as opened:
        assert exact_positions(opened) is (reader == "own")
    with inputs.fit_datasets(str(tmp_path / "c"), start_row=6) as (train, _):
        images, labels = take(train, 30)
        assert images.shape == (60, SIZE, SIZE, 3) and images.dtype == np.uint8 and labels.dtype == np.int32
        for image, label in zip(images, labels):
            assert np.array_equal(image, image_of(label)) or np.array_equal(image, image_of(label)[:, ::-1])


@pytest.mark.parametrize("start", [0, 5, 12, 30])
def test_the_feature_dataset_opens_at_a_row(start):
    """feature_dataset(repeat=True): the positioned feature stream in full batches, opened at a
    row; each iter() from there; no tf.data shuffle."""
    from pipelines.training.data.features import feature_dataset

    features = np.random.default_rng(0).random((11, 6)).astype(np.float32)
    labels = np.arange(11, dtype=np.int32)
    reference = rows_of(feature_batches(features, labels, 8, 0, 1), 80)
    ds = feature_dataset(features, labels, 2, shuffle=True, seed=8, repeat=True, start_row=start)
    for _ in range(2):
        got = take(ds, 20)
        np.testing.assert_array_equal(got[1], reference[1][start:start + 40])
        np.testing.assert_array_equal(got[0], reference[0][start:start + 40])
    assert Counter(reference[1][:33].tolist()) == Counter({i: 3 for i in range(11)})
    with pytest.raises(ValueError, match="needs repeat=True"):
        feature_dataset(features, labels, 2, shuffle=False, seed=0, repeat=False, start_row=3)
    one_pass = list(feature_dataset(features, labels, 4, shuffle=False, seed=0, repeat=False, drop_remainder=False))
    assert [len(b[1]) for b in one_pass] == [4, 4, 3]
