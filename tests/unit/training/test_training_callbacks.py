"""Training callbacks in one process (TensorFlow, no Horovod)."""
import hashlib
import os

import numpy as np
import pytest

from pipelines.stack.kerasapi import keras
from pipelines.training.callbacks import BestWeightsEarlyStopping
from pipelines.training.checkpoints.writer import CheckpointMarker
from pipelines.training.faults import FaultInjection
from pipelines.training.checkpoints.choose import newest_complete_checkpoint


def tiny_model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def run_epochs(callback, model, accuracies, first_epoch=0):
    callback.set_model(model)
    callback.on_train_begin()
    for epoch, acc in enumerate(accuracies, start=first_epoch):
        model.set_weights([np.full((2, 1), epoch, np.float32), np.full((1,), epoch, np.float32)])
        callback.on_epoch_end(epoch, {"val_accuracy": acc})
        if model.stop_training:
            break
    callback.on_train_end()


def test_best_weights_are_restored_when_the_epochs_run_out():
    model = tiny_model()
    stopper = BestWeightsEarlyStopping(monitor="val_accuracy", patience=5, min_delta=0.001)
    run_epochs(stopper, model, [0.5, 0.9, 0.6, 0.7])
    assert not model.stop_training
    assert model.get_weights()[1][0] == 1  # epoch index 1 (the 2nd epoch) was best
    assert stopper.state()["best_epoch"] == 2


def test_best_weights_are_restored_when_stopping_early():
    model = tiny_model()
    stopper = BestWeightsEarlyStopping(monitor="val_accuracy", patience=1, min_delta=0.001)
    run_epochs(stopper, model, [0.5, 0.9, 0.9005, 0.95])
    assert model.stop_training and model.get_weights()[1][0] == 1
    assert stopper.state() == {"best": 0.9, "wait": 1, "best_epoch": 2, "stopped": True, "monitor": "val_accuracy"}


def test_resumed_state_continues_patience():
    model = tiny_model()
    best = [np.full((2, 1), 7, np.float32), np.full((1,), 7, np.float32)]
    stopper = BestWeightsEarlyStopping(state={"best": 0.8, "wait": 1, "best_epoch": 3, "stopped": False},
                                       best_weights=best, monitor="val_accuracy", patience=2, min_delta=0.001)
    run_epochs(stopper, model, [0.7], first_epoch=3)  # no gain: wait reaches 2 = patience
    assert model.stop_training and model.get_weights()[1][0] == 7


def run_losses(callback, model, losses):
    callback.set_model(model)
    callback.on_train_begin()
    for epoch, loss in enumerate(losses):
        model.set_weights([np.full((2, 1), epoch, np.float32), np.full((1,), epoch, np.float32)])
        callback.on_epoch_end(epoch, {"val_loss": loss, "val_accuracy": 0.5})
        if model.stop_training:
            break
    callback.on_train_end()


@pytest.mark.parametrize("steps_per_epoch, losses, best, epochs_run", [
    # converge: val_loss, lower is better; 100 steps at 50 a epoch: 2 epochs, below the floor of 3
    (50, [1.0, 0.8, 0.81, 0.79, 0.9, 0.9, 0.9, 0.7], 4, 7),
    # 25 steps an epoch: 4 epochs without a gain before it stops
    (25, [1.0, 0.8, 0.81, 0.82, 0.83, 0.7, 0.9, 0.9, 0.9, 0.9, 0.1], 6, 10),
    # 5 steps an epoch (74 images): 20 epochs of patience; the gain at epoch 20 counts
    (5, [1.0] + [1.1] * 18 + [0.5] + [0.6] * 20 + [0.1], 20, 40),
])
def test_the_rule_stops_on_the_loss_after_its_patience_and_restores_the_best(steps_per_epoch, losses, best,
                                                                              epochs_run):
    from pipelines.training.stopping import RULES, StoppingRule

    rule = StoppingRule("val_loss", 100, 3, 0.0)
    assert RULES["converge"].monitor == rule.monitor
    model = tiny_model()
    stopper = BestWeightsEarlyStopping.of_rule(rule, steps_per_epoch)
    run_losses(stopper, model, losses)
    assert model.stop_training and stopper.stopped_epoch + 1 == epochs_run
    assert model.get_weights()[1][0] == best - 1  # the weights of the best (lowest loss) epoch
    assert stopper.state() == {"best": min(losses[:epochs_run]), "wait": epochs_run - best, "best_epoch": best,
                               "stopped": True, "monitor": "val_loss"}


def test_the_articles_rule_watches_accuracy_higher_is_better():
    from pipelines.training.stopping import RULES

    model = tiny_model()
    stopper = BestWeightsEarlyStopping.of_rule(RULES["article"], 5)
    run_epochs(stopper, model, [0.5, 0.6, 0.6005, 0.55, 0.59, 0.8])
    assert model.stop_training and stopper.state()["best_epoch"] == 2 and model.get_weights()[1][0] == 1


def test_checkpoint_marker_is_written_after_the_weights(tmp_path):
    model = tiny_model()
    stopper = BestWeightsEarlyStopping(monitor="val_accuracy", patience=2)
    stopper.set_model(model)
    stopper.on_train_begin()
    history = []
    marker = CheckpointMarker(str(tmp_path), stopper, history)
    marker.set_model(model)
    stopper.on_epoch_end(0, {"val_accuracy": 0.5})
    marker.on_epoch_end(0, {"val_accuracy": 0.5, "loss": 1.0})
    found = newest_complete_checkpoint(str(tmp_path))
    assert found["epoch"] == 1 and found["history"] == [{"epoch": 1, "val_accuracy": 0.5, "loss": 1.0}]
    assert found["early_stopping"]["best_epoch"] == 1
    assert found["weights"] == "checkpoint-1.npz"
    assert found["weights_bytes"] == os.path.getsize(tmp_path / "checkpoint-1.npz")
    assert found["weights_sha256"] == hashlib.sha256((tmp_path / "checkpoint-1.npz").read_bytes()).hexdigest()
    assert found["early_stopping"]["monitor"] == "val_accuracy"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def fault_spec(environ):
    """The hook's spec as a rank of the suite reads it at its start (pipelines.launch.rankenv),
    armed by the suite's token file (tests/conftest.py)."""
    from pipelines.launch.rankenv import FAULT_TOKEN_ENV, read_rank_environment
    return read_rank_environment({FAULT_TOKEN_ENV: os.environ[FAULT_TOKEN_ENV], **environ}).fault


def test_the_fault_hook_does_nothing_without_the_suites_token(tmp_path):
    """A production process given the hook's variable alone injects nothing; so does one whose
    token file is a link, another user's to read (0644), or holds other text. Only the suite's
    (owner-only, the exact text) arms it."""
    from pipelines.launch.rankenv import FAULT_TOKEN_ENV, FAULT_TOKEN_TEXT, fault_armed, read_rank_environment

    spec = {"PIPELINES_FAULT_INJECT": "rank=0,epoch=1,mode=raise"}
    alone = read_rank_environment(spec)
    assert alone.fault == "" and alone.fault_ignored and FaultInjection.requested(alone.fault, 0) is None
    good = tmp_path / "token"
    good.write_text(FAULT_TOKEN_TEXT)
    good.chmod(0o600)
    loose, other, link = tmp_path / "loose", tmp_path / "other", tmp_path / "link"
    loose.write_text(FAULT_TOKEN_TEXT)
    loose.chmod(0o644)
    other.write_text("armed\n")
    other.chmod(0o600)
    link.symlink_to(good)
    for path in (loose, other, link, tmp_path / "missing", tmp_path):
        assert not fault_armed(str(path)), path
        assert read_rank_environment({**spec, FAULT_TOKEN_ENV: str(path)}).fault == ""
    assert fault_armed(str(good))
    armed = read_rank_environment({**spec, FAULT_TOKEN_ENV: str(good)})
    assert (armed.fault, armed.fault_ignored) == ("rank=0,epoch=1,mode=raise", False)
    with pytest.raises(RuntimeError, match="injected fault"):
        FaultInjection.requested(armed.fault, 0).on_epoch_end(0)


def test_fault_injection_is_off_without_the_variable():
    FaultInjection(fault_spec({}), 0).on_epoch_end(1)
    spec = fault_spec({"PIPELINES_FAULT_INJECT": "rank=1,epoch=2,mode=raise"})
    FaultInjection(spec, 0).on_epoch_end(1)  # another rank
    try:
        FaultInjection(spec, 1).on_epoch_end(1)
    except RuntimeError as exc:
        assert "epoch 2" in str(exc)
    else:
        raise AssertionError("rank 1 should have raised at the end of epoch 2")


def test_only_the_newest_and_the_best_checkpoints_are_kept(tmp_path):
    model = tiny_model()
    stopper = BestWeightsEarlyStopping(monitor="val_accuracy", patience=10)
    stopper.set_model(model)
    stopper.on_train_begin()
    marker = CheckpointMarker(str(tmp_path), stopper, [])
    marker.set_model(model)
    for epoch, acc in enumerate([0.5, 0.9, 0.6, 0.7]):
        stopper.on_epoch_end(epoch, {"val_accuracy": acc})
        marker.on_epoch_end(epoch, {"val_accuracy": acc})
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2.json", "checkpoint-2.npz", "checkpoint-4.json",
                                           "checkpoint-4.npz"]


def test_a_production_run_carries_no_fault_hook_and_a_test_run_says_it_has_one():
    """The hook is built only where the test variable asks for it (issue 27: no test hook inside a
    production run), and rank 0 says once that one is set."""
    import logging

    class Records(logging.Handler):  # on the logger itself: setup_logging may have stopped propagation
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    assert FaultInjection.requested(fault_spec({}), 0) is None and FaultInjection.requested(fault_spec({}), 1) is None
    spec = fault_spec({"PIPELINES_FAULT_INJECT": "rank=1,epoch=2,mode=raise"})
    records, logger = Records(), logging.getLogger("pipelines")
    level = logger.level
    logger.addHandler(records)
    logger.setLevel(logging.WARNING)  # whatever an earlier test's logging set-up left there
    try:
        hooks = [FaultInjection.requested(spec, rank) for rank in (0, 1)]
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert [hook.active for hook in hooks] == [False, True]
    said = [m for m in records.messages if "PIPELINES_FAULT_INJECT" in m]
    assert len(said) == 1 and "rank=1,epoch=2,mode=raise" in said[0]


# -- history.csv: written by name, never through a planted link ---------------------------------

def fit_history(path, append, epochs=(0, 1)):
    """Two epochs of logs through the run's CSV logger, as ``fit`` calls it."""
    from pipelines.training.callbacks import EpochCSVLogger
    logger = EpochCSVLogger(path, append=append)
    logger.on_train_begin()
    for epoch in epochs:
        logger.on_epoch_end(epoch, {"loss": 0.5 + epoch})
    logger.on_train_end()


def test_history_counts_epochs_from_1_and_a_resumed_run_appends_without_a_header(tmp_path):
    path = str(tmp_path / "history.csv")
    fit_history(path, append=False)
    fit_history(path, append=True, epochs=(2,))
    assert open(path).read().splitlines() == ["epoch,loss,val_loss", "1,0.5,NA", "2,1.5,NA", "3,2.5,NA"]
    assert os.stat(path).st_mode & 0o777 == 0o644


@pytest.mark.parametrize("append", [False, True])
@pytest.mark.parametrize("kind", ["symlink", "dangling", "hardlink", "fifo", "folder"])
def test_a_planted_history_csv_is_refused_and_its_target_unchanged(tmp_path, kind, append):
    from pipelines.io.nofollow import LinkRefused
    from tests.unit.io.test_nofollow import assert_untouched, plant, victim
    target, before = victim(tmp_path)
    (tmp_path / "out").mkdir()
    path = str(tmp_path / "out" / "history.csv")
    plant(kind, path, target)
    with pytest.raises(LinkRefused, match="history.csv"):
        fit_history(path, append=append)
    assert_untouched(target, before)
