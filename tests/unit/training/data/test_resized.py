"""A physical rank's training datasets on another world size than the run's data world
(pipelines/training/resized.py), over real Parquet: with our reader and with the feature cache,
each step's rows on every physical rank are that rank's rows of the global batch the data world's
ranks read at that step (opened at a row too, flips included), with the loss weights when per-rank
batches differ; over Petastorm's reader, the rank's own shard in its per-rank batches."""
import numpy as np
import pytest

from pipelines.training.dataworld import DataWorld, rank_rows
from tests.support.readers import READERS
from tests.support.streams import SIZE, image_of, inputs_of, rank_of

N0, B = 2, 2  # the data world: 2 ranks of 2 rows (inputs_of's --batch-size), global batch 4


def steps_of(dataset, steps):
    """``steps`` batches of one iterator of ``dataset``, each as a tuple of NumPy arrays."""
    it = iter(dataset)
    return [tuple(np.asarray(part) for part in next(it)) for _ in range(steps)]


def global_batches(data, tmp_path, start_row, steps):  # noqa: F811
    """The data world's global batches from stream row ``start_row``: its ranks' batches joined."""
    from pipelines.training.inputs import ImageInputs

    per_rank = []
    for v in range(N0):
        inputs = ImageInputs(inputs_of(data, tmp_path).config, data, rank_of(v, N0), None, data.stored_size)
        with inputs.fit_datasets(str(tmp_path / f"ref{v}-{start_row}"), start_row=start_row) as (train, _):
            per_rank.append(steps_of(train, steps))
    return [tuple(np.concatenate([batches[k][i] for batches in per_rank]) for i in range(2)) for k in range(steps)]


@pytest.fixture(scope="module")
def references(data, tmp_path_factory):  # noqa: F811
    """The data world's first 12 global batches from stream rows 0 and 30."""
    return {start: global_batches(data, tmp_path_factory.mktemp("ref"), start, 12) for start in (0, 30)}


def resized(data, tmp_path, j, n, inner=None):  # noqa: F811
    from pipelines.training.inputs import ImageInputs
    from pipelines.training.resized import resized_inputs

    inner = inner or ImageInputs(inputs_of(data, tmp_path).config, data, rank_of(j, n), None, data.stored_size)
    return resized_inputs(inner, DataWorld(N0, B), rank_of(j, n))


@pytest.mark.parametrize("n", [1, 3, 4])
def test_own_reader_each_physical_rank_reads_its_rows_of_the_data_worlds_global_batches(data, references, tmp_path,
                                                                                       n):  # noqa: F811
    """From the start and from a step within a later pass (stream row 30 of the virtual ranks'
    passes of 22 and 20 rows); a stream opened 8 steps later continues it."""
    for start_row, expected in references.items():
        for j in range(n):
            inputs = resized(data, tmp_path, j, n)
            lo, hi = rank_rows(N0 * B, j, n)
            with inputs.fit_datasets(str(tmp_path / f"n{n}-{j}-{start_row}"), start_row=start_row) as (train, none):
                assert none is None and not train.options().autotune.enabled  # tfdata.without_autotune
                got = steps_of(train, 12)
            with inputs.fit_datasets(str(tmp_path / f"n{n}-{j}-{start_row}"), start_row=start_row + 8 * B) as (later, _):
                later = steps_of(later, 4)
            for k, batch in enumerate(got):
                np.testing.assert_array_equal(batch[1], expected[k][1][lo:hi], err_msg=f"rank {j} step {k}")
                np.testing.assert_array_equal(batch[0], expected[k][0][lo:hi], err_msg=f"rank {j} step {k}")
                if (N0 * B) % n:
                    np.testing.assert_array_equal(batch[2], np.full(hi - lo, n * (hi - lo) / (N0 * B), np.float32))
                else:
                    assert len(batch) == 2  # no weights when the global batch divides evenly
            assert [b[1].tolist() for b in later] == [e[1][lo:hi].tolist() for e in expected[8:12]]


def test_on_the_data_world_itself_the_input_path_is_unchanged(data, tmp_path):  # noqa: F811
    from pipelines.training.inputs import ImageInputs
    from pipelines.training.resized import ResizedInputs, resized_inputs

    inner = ImageInputs(inputs_of(data, tmp_path).config, data, rank_of(1, N0), None, data.stored_size)
    assert resized_inputs(inner, DataWorld(N0, B), rank_of(1, N0)) is inner
    wrapped = resized_inputs(inner, DataWorld(N0, B), rank_of(0, 1))
    assert isinstance(wrapped, ResizedInputs) and wrapped.name == "images" and wrapped.exact_positions


@pytest.mark.parametrize("reader", [r for r in READERS if r.values[0] == "petastorm"])
def test_petastorm_falls_back_to_the_physical_shard_in_per_rank_batches_with_the_weights(data, tmp_path, reader):  # noqa: F811
    from pipelines.training.data import OnePassShard

    n = 3
    for j in range(n):
        inner_config = inputs_of(data, tmp_path, reader=reader).config
        from pipelines.training.inputs import ImageInputs
        inputs = resized(data, tmp_path, j, n, ImageInputs(inner_config, data, rank_of(j, n), None, data.stored_size))
        assert not inputs.exact_positions
        lo, hi = rank_rows(N0 * B, j, n)
        shard_labels = set(np.concatenate([labels for _, labels in OnePassShard(data, "train", j, n).batches()]))
        with inputs.fit_datasets(str(tmp_path / f"p{j}"), start_row=6) as (train, _):
            for images, labels, weights in steps_of(train, 10):
                assert images.shape == (hi - lo, SIZE, SIZE, 3) and set(labels) <= shard_labels
                np.testing.assert_array_equal(weights, np.full(hi - lo, n * (hi - lo) / (N0 * B), np.float32))
                for image, label in zip(images, labels):
                    assert np.array_equal(image, image_of(label)) or np.array_equal(image, image_of(label)[:, ::-1])


def test_the_feature_cache_each_physical_rank_reads_its_rows_of_the_virtual_ranks_features(tmp_path):
    """Features written by 2 computing ranks; the data world 2 x 2; physical worlds of 1 and 3."""
    from pipelines.io.storage import resolve
    from pipelines.training.data import features as feat
    from pipelines.training.config import TrainConfig
    from pipelines.training.resized import ResizedInputs

    directory = resolve(str(tmp_path / "features"))
    rows = np.arange(23)
    for r in range(2):  # as a 2-rank computation writes them: one file each
        mine = rows[r::2]
        feat.write_shard(directory, "train", r, np.stack([mine, -mine], axis=1).astype(np.float32), mine)

    class Features:  # what ResizedInputs asks of a FeatureInputs
        features, exact_positions, name = directory, True, "features"
        config = TrainConfig(data=str(tmp_path), output=str(tmp_path / "out"), batch_size=B, seed=5)

    def reference(v, start_row):
        shard = feat.read_shard(directory, "train", v, N0)
        return steps_of(feat.feature_dataset(*shard, B, shuffle=True, seed=5 + v, repeat=True, start_row=start_row), 9)

    for start_row in (0, 14):
        per_rank = [reference(v, start_row) for v in range(N0)]
        expected = [np.concatenate([batches[k][1] for batches in per_rank]) for k in range(9)]
        for n in (1, 3):
            for j in range(n):
                inputs = ResizedInputs(Features(), DataWorld(N0, B), rank_of(j, n))
                lo, hi = rank_rows(N0 * B, j, n)
                with inputs.fit_datasets(str(tmp_path / "unused"), start_row=start_row) as (train, _):
                    assert not train.options().autotune.enabled  # tfdata.without_autotune
                    for k, batch in enumerate(steps_of(train, 9)):
                        assert batch[1].tolist() == expected[k][lo:hi].tolist()
                        np.testing.assert_array_equal(batch[0][:, 0], batch[1].astype(np.float32))
                        assert len(batch) == (3 if n == 3 else 2)
