"""Divergence in one process: the finite checks, the checkpoint a resume may take, and the guard
(Keras' real fit; the other rank's answers stand in for Horovod's collectives)."""
import json
import math
import os
import socket

import numpy as np
import pytest

from pipelines.io.storage import resolve
from pipelines.training.checkpoints.files import non_finite_checkpoint
from pipelines.training.divergence import (TrainingDiverged, diverged_message, epoch_end_place, non_finite_arrays,
                                           non_finite_logs, step_place)
from pipelines.training.checkpoints.choose import newest_complete_checkpoint, non_finite_state
from pipelines.training.checkpoints.names import checkpoint_path, marker_path

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("value, shown", [(NAN, "nan"), (INF, "inf"), (-INF, "-inf"), (np.float32("nan"), "nan"),
                                          (np.float64("-inf"), "-inf"), (np.array(INF, np.float32), "inf")])
def test_every_kind_of_non_finite_log_is_named_with_its_value(value, shown):
    logs = {"accuracy": 0.5, "loss": value, "lr": np.float32(1e-3), "note": "text", "stopped": True}
    assert non_finite_logs(logs) == [f"loss ({shown})"]


def test_finite_and_absent_logs_have_nothing_non_finite():
    assert non_finite_logs({"loss": 0.0, "val_loss": 1e30, "accuracy": np.float32(1)}) == []
    assert non_finite_logs(None) == [] and non_finite_logs({}) == []
    assert non_finite_logs({"loss": NAN, "val_loss": INF}) == ["loss (nan)", "val_loss (inf)"]  # in order


def test_non_finite_arrays_are_named_whatever_their_shape_or_dtype():
    arrays = {"a": np.zeros((2, 3), np.float32), "b": np.array([1.0, NAN]), "c": np.array(7, np.int64),
              "d": np.full((2, 2), -INF, np.float16), "e": np.array(np.float32(3.0)), "f": np.array([1 + 1j, INF])}
    assert non_finite_arrays(arrays) == ["b", "d", "f"]
    assert non_finite_arrays({}) == []


def test_the_message_names_epoch_step_and_each_rank_with_its_host():
    place = step_place(2, 3, 5)
    assert place == "epoch 2, step 3 of 5"
    assert diverged_message(place, [None, "loss (nan)"], ["h0", "h1"]) == \
        "training diverged: non-finite loss (nan) at epoch 2, step 3 of 5 on rank 1 (host h1)"
    both = diverged_message(epoch_end_place(4, 5), ["val_loss (inf)", "val_loss (inf)"], ["h0", "h1"])
    assert both == ("training diverged: non-finite val_loss (inf) at epoch 4, step 5 of 5 (the epoch's end) on rank 0 "
                    "(host h0); non-finite val_loss (inf) at epoch 4, step 5 of 5 (the epoch's end) on rank 1 (host h1)")


def test_a_divergence_is_a_failure_not_a_refusal():
    from pipelines.runtime.errors import Refused
    assert not issubclass(TrainingDiverged, ValueError) and not issubclass(TrainingDiverged, Refused)


# --- which checkpoint --resume takes ---------------------------------------------------------------------------


def write_checkpoint(directory, epoch, arrays=None, logs=None, best=None):
    """A complete checkpoint of ``epoch`` (its ``.npz`` then its marker), finite unless told."""
    arrays = arrays if arrays is not None else {"trainable_0000": np.ones((2, 1), np.float32),
                                                "optimizer_0000": np.array(3, np.int64)}
    with open(checkpoint_path(directory, epoch), "wb") as f:
        np.savez(f, **arrays)
    marker = {"epoch": epoch, "weights": os.path.basename(checkpoint_path(directory, epoch)),
              "weights_bytes": os.path.getsize(checkpoint_path(directory, epoch)),
              "logs": {"epoch": epoch, "loss": 0.5, "val_loss": 0.6, **(logs or {})},
              "early_stopping": {"best_epoch": best or epoch}}
    with open(marker_path(directory, epoch), "w") as f:
        json.dump(marker, f)  # json writes NaN and Infinity, as an older version's marker held them


@pytest.mark.parametrize("poison", [
    {"arrays": {"trainable_0000": np.array([[1.0], [NAN]], np.float32)}},
    {"arrays": {"trainable_0000": np.ones((2, 1), np.float32), "optimizer_0001": np.array([INF], np.float32)}},
    {"arrays": {"trainable_0000": np.full((2, 1), -INF, np.float32)}},
    {"logs": {"loss": NAN}},
    {"logs": {"val_loss": INF}},
], ids=["nan weight", "inf optimizer state", "-inf weight", "nan loss logged", "inf val_loss logged"])
def test_resume_takes_the_newest_complete_and_finite_checkpoint(tmp_path, poison, caplog):
    d = str(tmp_path)
    write_checkpoint(d, 1)
    write_checkpoint(d, 2)
    write_checkpoint(d, 3, **poison)
    found = newest_complete_checkpoint(d)
    assert found["epoch"] == 2
    assert "ignored: checkpoint checkpoint-3.json" in caplog.text and "a diverged state is never resumed" in caplog.text


def test_a_checkpoint_whose_best_weights_are_not_finite_is_not_taken(tmp_path):
    d = str(tmp_path)
    write_checkpoint(d, 1)
    write_checkpoint(d, 2, arrays={"trainable_0000": np.array([NAN], np.float32)})
    write_checkpoint(d, 3, best=2)  # finite itself, but its best (what the model would end with) is not
    assert non_finite_state(resolve(d), json.load(open(marker_path(d, 3))) | {"_name": "checkpoint-3.json"}) == \
        ["checkpoint-2.npz: trainable_0000"]
    assert newest_complete_checkpoint(d)["epoch"] == 1


def test_no_finite_checkpoint_means_a_fresh_start(tmp_path):
    d = str(tmp_path)
    write_checkpoint(d, 1, logs={"loss": NAN})
    write_checkpoint(d, 2, arrays={"trainable_0000": np.array([INF], np.float32)})
    assert newest_complete_checkpoint(d) is None


def test_non_finite_checkpoint_reads_the_arrays_a_checkpoint_holds(tmp_path):
    path = str(tmp_path / "c.npz")
    np.savez(path, trainable_0001=np.array([NAN]), trainable_0000=np.zeros(2), optimizer_0000=np.array([INF]))
    assert non_finite_checkpoint(resolve(path)) == ["optimizer_0000", "trainable_0001"]
    np.savez(path, trainable_0000=np.zeros(2))
    assert non_finite_checkpoint(resolve(path)) == []
    with open(path, "wb") as f:
        f.write(b"x" * 100)  # not an npz: left to load_checkpoint to refuse
    assert non_finite_checkpoint(resolve(path)) == []


# --- the guard in Keras' fit -------------------------------------------------------------------------------------

STEPS = 4


def fit_with_guard(tmp_path, other_rank=None, before=(), after=(), epochs=3):
    """A real ``fit`` of a tiny model (this process is rank 0 of 2) with the guard, early stopping and the
    checkpoint writer in the job's order; ``other_rank(epoch, step)`` (step 0: the epoch's end) says what a
    stand-in rank 1 found. Returns ``(raised, early_stopping)``."""
    from pipelines.stack.kerasapi import keras
    from pipelines.training.callbacks import BestWeightsEarlyStopping, DivergenceGuard
    from pipelines.training.checkpoints.writer import CheckpointMarker

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax", name="head")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    where = {}

    class Place(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            where.update(epoch=epoch + 1, step=0)

        def on_train_batch_end(self, batch, logs=None):
            where["step"] = batch + 1

        def on_epoch_end(self, epoch, logs=None):
            where["step"] = 0
            logs["val_accuracy"] = 0.5 + epoch / 10

    def theirs():
        return (other_rank or (lambda e, s: None))(where["epoch"], where["step"]) if where else "rank1-host"

    guard = DivergenceGuard(STEPS, count=lambda flags: (float(flags[0]) + bool(theirs()), 0.0),
                            gather=lambda mine: [mine, theirs()])
    stopper = BestWeightsEarlyStopping(monitor="val_accuracy", patience=10)
    callbacks = [Place(), *before, guard, stopper, CheckpointMarker(str(tmp_path), stopper, []), *after]
    x, y = np.random.rand(16, 2).astype(np.float32), np.arange(16) % 2
    with pytest.raises(TrainingDiverged) as raised:
        model.fit(x, y, batch_size=4, epochs=epochs, callbacks=callbacks, verbose=0)
    return raised.value, stopper


def test_another_ranks_nan_stops_this_rank_at_that_step(tmp_path):
    raised, _ = fit_with_guard(tmp_path, other_rank=lambda e, s: "loss (nan)" if (e, s) >= (2, 3) else None)
    assert str(raised) == "training diverged: non-finite loss (nan) at epoch 2, step 3 of 4 on rank 1 (host rank1-host)"
    assert os.path.exists(marker_path(str(tmp_path), 1)) and not os.path.exists(checkpoint_path(str(tmp_path), 2))


def test_this_ranks_real_nan_loss_stops_at_the_poisoned_step(tmp_path):
    from pipelines.training.faults import FaultInjection

    fault = FaultInjection("rank=0,epoch=2,step=2,mode=nan", 0)
    raised, _ = fit_with_guard(tmp_path, before=[fault])
    assert str(raised) == ("training diverged: non-finite loss (nan) at epoch 2, step 2 of 4 on rank 0 "
                           f"(host {socket.gethostname()})")
    assert not os.path.exists(marker_path(str(tmp_path), 2))
    assert not FaultInjection("rank=1,epoch=2,step=2,mode=nan", 0).active  # another rank's hook does nothing here


def test_weights_gone_infinite_at_an_epochs_end_are_never_best_nor_written(tmp_path):
    """Finite losses, but the last update left a weight infinite: the epoch's end stops the run before early
    stopping or the checkpoint writer see the epoch."""
    from pipelines.stack.kerasapi import keras

    class Overflow(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                kernel = self.model.trainable_weights[0]
                kernel.assign(np.full(kernel.shape, math.inf, np.float32))

    raised, stopper = fit_with_guard(tmp_path, before=[Overflow()])
    assert str(raised).startswith("training diverged: non-finite trainable_0000 (head/kernel:0) at epoch 2, "
                                  "step 4 of 4 (the epoch's end) on rank 0")
    assert stopper.best_epoch == 0 and np.isfinite(np.concatenate([w.ravel() for w in stopper.best_weights])).all()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1.json", "checkpoint-1.npz"]


def test_a_non_finite_val_loss_of_another_rank_at_the_epochs_end_stops_the_run(tmp_path):
    raised, _ = fit_with_guard(tmp_path, other_rank=lambda e, s: "val_loss (inf)" if (e, s) == (1, 0) else None)
    assert "non-finite val_loss (inf) at epoch 1, step 4 of 4 (the epoch's end) on rank 1" in str(raised)
    assert os.listdir(tmp_path) == []
