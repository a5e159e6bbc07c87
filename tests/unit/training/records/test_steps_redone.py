"""The steps a continued run trains again (pipelines/training/records/progress.py, issue 38): rank 0's
mark of its newest step, read back when a run continues from a checkpoint, and the callback that
writes it inside ``fit`` (one process, TensorFlow, no Horovod)."""
import json
import os
import stat

import numpy as np
import pytest

from pipelines.contract import PROGRESS
from pipelines.training.records.progress import read_mark, steps_redone, write_mark

S = 5  # steps per epoch in the arithmetic below


@pytest.mark.parametrize("marker, mark, redone", [
    ({"epoch": 1, "step": 2}, {"epoch": 1, "step": 3}, 1),    # killed after step 3 of epoch 2, checkpoint at step 2
    ({"epoch": 1, "step": 0}, {"epoch": 2, "step": 3}, 8),    # epoch 1's checkpoint, killed at epoch 3's step 3
    ({"epoch": 2, "step": 0}, {"epoch": 1, "step": 5}, 0),    # killed right after epoch 2's checkpoint
    ({"epoch": 1, "step": 3}, {"epoch": 1, "step": 2}, 0),    # a notice: the checkpoint is the mark's next step
    ({"epoch": 0, "step": 4}, {"epoch": 0, "step": 4}, 0),    # within the first epoch, nothing after it
], ids=["step-checkpoint", "epochs-later", "at-epoch-end", "mark-behind", "first-epoch"])
def test_steps_redone_are_the_marks_global_step_minus_the_checkpoints(marker, mark, redone):
    assert steps_redone({"run": "r1", **mark}, marker, S, "r1") == redone


def test_steps_redone_are_not_known_without_a_checkpoint_a_mark_or_with_another_runs_mark():
    mark = {"run": "r1", "epoch": 1, "step": 3}
    assert steps_redone(mark, None, S, "r1") is None
    assert steps_redone(None, {"epoch": 1, "step": 2}, S, "r1") is None
    assert steps_redone(mark, {"epoch": 1, "step": 2}, S, "r2") is None  # an output replaced since


def test_the_mark_is_written_whole_owner_only_and_read_back(tmp_path):
    path = write_mark(str(tmp_path), "r1", 2, 7)
    assert os.path.basename(path) == PROGRESS and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_mark(str(tmp_path)) == {"run": "r1", "epoch": 2, "step": 7}
    assert [name for name in os.listdir(tmp_path) if name != PROGRESS] == []  # no temporary left


@pytest.mark.parametrize("content", ["", "{", "[]", json.dumps({"run": "r1", "epoch": -1, "step": 2}),
                                     json.dumps({"run": "r1", "epoch": "1", "step": 2}), json.dumps({"run": "r1"})])
def test_a_mark_that_is_no_such_record_reads_as_none(tmp_path, content):
    (tmp_path / PROGRESS).write_text(content)
    assert read_mark(str(tmp_path)) is None
    assert read_mark(str(tmp_path / "missing")) is None and read_mark(None) is None


def test_the_callback_marks_each_step_and_uploads_at_most_every_interval(tmp_path):
    """Two epochs of 3 steps: the mark ends at (1 epoch done, step 3); with a clock that moves 10 s
    a step and uploads every 25 s, the outputs get the mark at steps 3 and 6 only."""
    from pipelines.stack.kerasapi import keras
    from pipelines.training.callbacks import ProgressMark

    class Uploads:
        names = []

        def upload(self, name):
            self.names.append((name, read_mark(str(tmp_path))["step"]))

    ticks = iter(range(0, 1000, 10))
    model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    uploads = Uploads()
    mark = ProgressMark(str(tmp_path), "r1", uploads, every_s=25, clock=lambda: next(ticks))
    model.fit(np.zeros((6, 2), np.float32), np.zeros(6, np.float32), batch_size=2, epochs=2, verbose=0,
              callbacks=[mark])
    assert read_mark(str(tmp_path)) == {"run": "r1", "epoch": 1, "step": 3}
    assert uploads.names == [(PROGRESS, 3), (PROGRESS, 3)]


@pytest.mark.parametrize("mark", [
    {"run": "r1", "epoch": 10 ** 400, "step": 1},   # a count no run reaches (and no float holds)
    {"run": "r1", "epoch": 1, "step": True},        # a bool is not a count
    {"run": "r1", "epoch": 1.0, "step": 2},
    {"run": 7, "epoch": 1, "step": 2},              # a run id is a string
    {"epoch": 1, "step": 2},
], ids=["huge", "bool", "float", "run-a-number", "no-run"])
def test_a_mark_of_another_shape_is_no_mark(mark, tmp_path):
    (tmp_path / PROGRESS).write_text(json.dumps(mark))
    assert read_mark(str(tmp_path)) is None
    assert steps_redone(read_mark(str(tmp_path)), {"epoch": 1}, S, "r1") is None


def test_a_mark_longer_than_a_mark_is_not_read_whole(tmp_path):
    (tmp_path / PROGRESS).write_text(json.dumps({"run": "r1", "epoch": 1, "step": 2, "pad": "x" * 10 ** 6}))
    assert read_mark(str(tmp_path)) is None
    write_mark(str(tmp_path), "r1", 1, 2)
    assert read_mark(str(tmp_path)) == {"run": "r1", "epoch": 1, "step": 2}
