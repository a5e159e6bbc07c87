"""Recovery (``--max-failures``) with real local ranks: a killed rank relaunched, and checkpoints
that carry the optimizer's state (which failures are relaunched, the loop:
tests/unit/launch/test_recovery.py; the training job end to end: tests/e2e/test_training_hvd.py)."""
import os
import signal
import socket

import numpy as np
import pytest

from pipelines.launch import HorovodRunner
from pipelines.launch.rankenv import read_rank_environment

pytestmark = pytest.mark.current  # on the current stack too (make test's current share)


def _killed_once():
    """Rank 1 of the first attempt kills itself; every rank of a relaunch returns its attempts."""
    import horovod.tensorflow as hvd
    hvd.init()
    handed = read_rank_environment()  # at the rank's start, as run_training reads it
    if hvd.rank() == 1 and not handed.relaunched:
        os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(np.array([1.0]))
    return handed.attempts


@pytest.mark.slow
def test_local_runner_relaunches_after_a_killed_rank():
    assert HorovodRunner(np=-2, max_failures=1).run(_killed_once) == [
        {"attempt": 1, "world_size": 2,
         "failure": f"rank 1 on {socket.gethostname()} failed: process killed by signal SIGKILL"},
        {"attempt": 2, "world_size": 2, "failure": None}]


def _train_save_restore_continue(directory):
    """In a Horovod rank (world of 1): the job's model and DistributedOptimizer(Nadam) train 2 steps,
    are checkpointed, train a 3rd step; a fresh model restores the checkpoint before its first step
    and trains the same 3rd step. Returns the saved optimizer arrays, the restored ones, and both
    models' weights after the 3rd step."""
    import horovod.tensorflow.keras as hvd
    from pipelines.stack.kerasapi import keras
    from pipelines.training.checkpoints.files import load_checkpoint, optimizer_state, save_checkpoint
    from pipelines.training.model.build import build_model, compile_distributed
    hvd.init()
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8), np.arange(8) % 3  # the model's uint8 input

    def model():
        keras.utils.set_random_seed(1)
        m = build_model(3, 32, dropout=0.0, weights="none", seed=1, backbone="tiny")
        compile_distributed(m, 0.01)
        return m

    first = model()
    first.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    path = os.path.join(directory, "checkpoint-2.npz")
    save_checkpoint(first, path)
    saved = [v.numpy() for v in optimizer_state(first.optimizer)]
    first.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    second = model()
    load_checkpoint(second, path)  # before any step: the optimizer has no slots yet
    restored = [v.numpy() for v in optimizer_state(second.optimizer)]
    second.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return saved, restored, first.get_weights(), second.get_weights()


@pytest.mark.slow
def test_a_restored_optimizer_continues_the_same_optimisation(tmp_path):
    saved, restored, continued, resumed = HorovodRunner(np=-1).run(_train_save_restore_continue,
                                                                    directory=str(tmp_path))
    assert int(saved[0]) == 2 and len(saved) == 6  # iterations, m and v of the head's 2 weights, u_product
    assert len(restored) == len(saved)
    for a, b in zip(restored, saved):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(resumed, continued):  # the same 3rd step: Nadam's moments and step count carried over
        np.testing.assert_array_equal(a, b)
