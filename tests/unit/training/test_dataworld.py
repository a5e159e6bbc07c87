"""A run on another world size than its data world (pipelines/training/dataworld.py, resized.py,
records/segments.py; issue 38 item 3): which rows each physical rank computes, the loss weights that
keep the averaged gradient the exact mean over the global batch (checked in this stack's Keras),
the rank's batches joined from the virtual ranks' streams, and the run's segments. No Horovod but
the warmup's single-process check."""
import numpy as np
import pytest

from pipelines.runtime.errors import Refused
from pipelines.training.dataworld import DataWorld, Piece, loss_weight, rank_rows
from pipelines.training.records import segments as worldsegments

# (n0, b, n): shrink, grow, to one rank, uneven splits (G % n != 0), the data world itself
MEMBERS = [(2, 4, 1), (2, 4, 3), (4, 8, 2), (4, 8, 3), (4, 8, 5), (3, 5, 2), (3, 5, 7), (1, 6, 4), (8, 2, 3),
           (2, 4, 2), (5, 3, 15), (2, 16, 32)]


@pytest.mark.parametrize("n0, b, n", MEMBERS)
def test_every_row_of_every_global_step_is_taken_once_across_the_physical_ranks(n0, b, n):
    world = DataWorld(n0, b)
    G = n0 * b
    taken = []  # (virtual rank, row within its b rows), in the order the ranks' batches concatenate
    for j in range(n):
        share = world.share(j, n)
        lo, hi = rank_rows(G, j, n)
        assert share.rows == hi - lo == sum(p.stop - p.start for p in share.pieces)
        for piece in share.pieces:
            assert 0 <= piece.start < piece.stop <= b
            taken += [(piece.virtual_rank, row) for row in range(piece.start, piece.stop)]
    # the global batch is virtual rank 0's b rows, then 1's, ...: each once, in that order
    assert taken == [(v, row) for v in range(n0) for row in range(b)]
    batches = world.per_rank_batches(n)
    assert sum(batches) == G and max(batches) - min(batches) <= 1 and len(batches) == n


@pytest.mark.parametrize("n0, b, n", MEMBERS)
def test_the_weights_make_the_average_over_ranks_the_mean_over_the_global_batch(n0, b, n):
    """(1/n) sum_j w_j/b_j sum_{i in j} l_i == (1/G) sum_i l_i, for any losses l; no weights when G % n == 0."""
    world = DataWorld(n0, b)
    G = n0 * b
    losses = np.random.default_rng(n0 * 100 + b * 10 + n).random(G)
    averaged, at = 0.0, 0
    for j in range(n):
        share = world.share(j, n)
        weight = 1.0 if share.weight is None else share.weight
        averaged += weight * losses[at:at + share.rows].sum() / share.rows / n  # Keras' reduction, Horovod's average
        at += share.rows
    assert averaged == pytest.approx(losses.mean(), rel=1e-12)
    assert all(world.share(j, n).weight is None for j in range(n)) is (G % n == 0)


def test_the_data_world_itself_is_one_whole_piece_per_rank_without_weights():
    world = DataWorld(4, 8)
    for j in range(4):
        share = world.share(j, 4)
        assert share.pieces == (Piece(j, 0, 8),) and share.rows == 8 and share.weight is None
    assert world.same(4) and not world.same(3)


def test_a_rank_reads_only_the_virtual_streams_its_rows_overlap():
    world = DataWorld(2, 4)  # G = 8 over 3 ranks: rows [0, 2), [2, 5), [5, 8)
    assert [world.share(j, 3).pieces for j in range(3)] == [
        (Piece(0, 0, 2),), (Piece(0, 2, 4), Piece(1, 0, 1)), (Piece(1, 1, 4),)]
    assert world.per_rank_batches(3) == [2, 3, 3]
    assert [world.share(j, 3).weight for j in range(3)] == [0.75, 1.125, 1.125]
    assert world.share(0, 1).pieces == (Piece(0, 0, 4), Piece(1, 0, 4)) and world.share(0, 1).weight is None
    assert world.describe(3) == ("data world 2 x 4 rows (global batch 8) on world size 3: per-rank batches 2, 3, 3 "
                                 "(rows weighted 0.75, 1.125, 1.125)")


def test_more_ranks_than_rows_in_the_global_batch_are_refused():
    world = DataWorld(2, 4)
    assert world.per_rank_batches(8) == [1] * 8
    for size in (0, 9, 100):
        with pytest.raises(Refused, match=r"a run of global batch 8 \(2 x 4 rows\) continues on 1 to 8 ranks"):
            world.share(0, size)
    with pytest.raises(ValueError, match="rank 3 is not one of 3 ranks"):
        world.share(3, 3)
    with pytest.raises(ValueError):
        DataWorld(0, 4)


def test_loss_weight_and_rank_rows():
    assert [rank_rows(10, j, 4) for j in range(4)] == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert loss_weight(2, 10, 4) == 0.8 and loss_weight(3, 10, 4) == pytest.approx(1.2)
    assert loss_weight(5, 10, 2) is None


def test_the_data_world_of_a_record():
    assert DataWorld.of_record({"world_size": 4, "batch_size": 8, "global_batch_size": 32}, 8, 2) == DataWorld(4, 8)
    assert DataWorld.of_record(None, 8, 2) == DataWorld(2, 8)  # a record before worlds were recorded


# --- in this stack's Keras: the weighted per-rank losses average to the global batch's gradient ---

def keras_gradient(model, x, y, weights=None):
    import tensorflow as tf

    x, y = tf.constant(x), tf.constant(y)
    weights = None if weights is None else tf.constant(weights)
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x, y, model(x, training=True), weights)
    return [g.numpy().astype(np.float64) for g in tape.gradient(loss, model.trainable_variables)]


@pytest.mark.parametrize("n0, b, n", [(2, 4, 3), (4, 8, 3), (3, 5, 2), (2, 4, 1)])
def test_keras_loss_reduction_with_the_weights_averages_to_the_global_batch_gradient(n0, b, n):
    """The model compiled as the job compiles it (sparse categorical cross-entropy, Keras' default
    reduction): the mean over physical ranks (Horovod's Average) of each rank's gradient on its rows
    with its weights equals the gradient on the whole global batch; without the weights it does not
    when per-rank batches differ (the check can fail)."""
    from pipelines.stack.kerasapi import keras

    world, G = DataWorld(n0, b), n0 * b
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(G, 5)).astype(np.float32), rng.integers(0, 3, G).astype(np.int32)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    expected = keras_gradient(model, x, y)
    weighted, plain, at = None, None, 0
    for j in range(n):
        share = world.share(j, n)
        rows = slice(at, at + share.rows)
        at += share.rows
        weights = None if share.weight is None else np.full(share.rows, share.weight, np.float32)
        got, alone = keras_gradient(model, x[rows], y[rows], weights), keras_gradient(model, x[rows], y[rows])
        weighted = got if weighted is None else [a + g for a, g in zip(weighted, got)]
        plain = alone if plain is None else [a + g for a, g in zip(plain, alone)]
    for got, want in zip(weighted, expected):
        np.testing.assert_allclose(got / n, want, rtol=1e-5, atol=1e-7)
    if G % n:
        assert not all(np.allclose(p / n, e, rtol=1e-5, atol=1e-7) for p, e in zip(plain, expected))


# --- the rank's batches joined from the virtual ranks' streams ---

def virtual_stream(v, b):
    """Virtual rank v's batches: rows (b, 2) holding (v, step * b + row), labels the same row ids."""
    step = 0
    while True:
        ids = np.arange(step * b, (step + 1) * b)
        yield np.stack([np.full(b, v), ids], axis=1).astype(np.uint8), (v * 1000 + ids).astype(np.int32)
        step += 1


@pytest.mark.parametrize("n0, b, n", [(2, 4, 1), (2, 4, 3), (4, 8, 3), (3, 5, 7), (2, 4, 2)])
def test_joined_batches_are_the_rows_of_each_global_batch_the_rank_computes(n0, b, n):
    from pipelines.training.resized import joined_batches

    world = DataWorld(n0, b)
    for j in range(n):
        share = world.share(j, n)
        joined = joined_batches([virtual_stream(v, b) for v in share.virtual_ranks], share)
        lo, hi = rank_rows(n0 * b, j, n)
        for step in range(3):
            rows, labels = next(joined)
            assert rows.shape == (share.rows, 2) and labels.shape == (share.rows,)
            expected = [(g // b, step * b + g % b) for g in range(lo, hi)]  # (virtual rank, its stream row)
            assert [tuple(r) for r in rows.tolist()] == expected
            assert labels.tolist() == [v * 1000 + r for v, r in expected]


def test_joined_batches_end_with_a_stream_and_need_one_per_piece():
    from pipelines.training.resized import joined_batches

    share = DataWorld(2, 4).share(1, 3)
    assert list(joined_batches([iter([(np.zeros((4, 1)), np.zeros(4))]), iter([])], share)) == []
    with pytest.raises(ValueError, match="1 streams for the 2 pieces"):
        next(joined_batches([iter([])], share))


# --- the run's segments ---

def test_segments_of_a_run_started_resumed_elsewhere_and_relaunched():
    world = DataWorld(2, 4)
    first = worldsegments.run_segments(None, world, 2, "start")
    assert first == [{"world_size": 2, "per_rank_batches": [4, 4], "from_epoch": 1, "from_step": 1,
                      "reason": "start"}]
    marker = {"epoch": 1, "step": 3, "segments": first}  # a step checkpoint after step 3 of epoch 2
    second = worldsegments.run_segments(marker, world, 1, "resume", redone=2)
    assert second[-1] == {"world_size": 1, "per_rank_batches": [8], "from_epoch": 2, "from_step": 4,
                          "reason": "resume", "steps_redone": 2}
    third = worldsegments.run_segments({"epoch": 2, "segments": second}, world, 3, "relaunch")
    assert third[:2] == second and third[-1]["from_epoch"] == 3 and third[-1]["from_step"] == 1
    assert third[-1]["per_rank_batches"] == [2, 3, 3] and worldsegments.interruptions(third) == 2
    assert worldsegments.segment_params(third) == {
        "segment.1": "world size 2 (per-rank batches 4, 4) from epoch 1, step 1 (start)",
        "segment.2": "world size 1 (per-rank batches 8) from epoch 2, step 4 (resume, 2 steps redone)",
        "segment.3": "world size 3 (per-rank batches 2, 3, 3) from epoch 3, step 1 (relaunch, steps redone not known)"}
    assert worldsegments.steps_redone(third) == 2 and worldsegments.steps_redone(first) == 0
    # a marker written before segments were recorded: its run began on the data world
    assert worldsegments.run_segments({"epoch": 2}, world, 1, "resume")[0] == first[0]
    assert [worldsegments.reason_of(r, l) for r, l in ((False, False), (True, False), (False, True))] == \
        ["start", "resume", "relaunch"]


def test_the_data_world_warmup_ramps_with_n0_and_is_horovods_on_the_data_world():
    """DataWorldWarmup on the data world's size is Horovod's LearningRateWarmupCallback bit for
    bit (here, a world of 1); with n0 = 4 it ramps from base_lr to 4 x base_lr per step."""
    import horovod.tensorflow.keras as hvd

    from pipelines.stack.kerasapi import keras
    from pipelines.training.schedule import warmup_lr
    from pipelines.training.warmup import DataWorldWarmup

    hvd.init()

    def rates(callback, lr, steps=3, epochs=3):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Nadam(lr), loss="mse")
        callback.set_model(model)
        callback.set_params({"steps": steps, "epochs": epochs})
        callback.on_train_begin()
        got = []
        for epoch in range(epochs):
            callback.on_epoch_begin(epoch)
            for batch in range(steps):
                callback.on_batch_begin(batch)
                got.append(float(keras.backend.get_value(model.optimizer.lr)))
                callback.on_batch_end(batch)
        return got

    assert rates(DataWorldWarmup(0.01, 2, 3, hvd.size()), 0.01) == \
        rates(hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.01, warmup_epochs=2, steps_per_epoch=3), 0.01)
    got = rates(DataWorldWarmup(0.04, 2, 3, 4), 0.04)
    expected = [warmup_lr(e + (k + 1) / 3, 0.01, 4, 2) for e in range(2) for k in range(3)]
    assert got[:6] == pytest.approx(expected, rel=1e-6)
    assert got[6:] == pytest.approx([got[5]] * 3)  # after the warmup, untouched
    assert got[0] == pytest.approx(0.01 * (1 + 3 / 2 / 3), rel=1e-6)
