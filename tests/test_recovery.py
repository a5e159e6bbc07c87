"""Recovery (``--max-failures``): which failures are relaunched, the relaunch loop, and checkpoints
that carry the optimizer's state (the training job end to end: tests/test_training_hvd.py)."""
import logging
import os
import signal
import socket

import numpy as np
import pytest

from pipelines.launch import HorovodJobFailed, HorovodRunner, RankFailure, RelaunchImpossible
from pipelines.launch.failures import signal_is_loss
from pipelines.launch.rankenv import ATTEMPTS_ENV, attempts_env, read_rank_environment
from pipelines.launch.recovery import is_lost, run_with_retries
from pipelines.launch.config import LaunchConfig

pytestmark = pytest.mark.current  # on the current stack too (make test's current share)


def test_only_a_lost_process_or_host_is_worth_a_relaunch():
    assert signal_is_loss(-signal.SIGKILL) and signal_is_loss(-signal.SIGTERM) and signal_is_loss(-signal.SIGHUP)
    assert not signal_is_loss(-signal.SIGSEGV) and not signal_is_loss(-signal.SIGABRT) and not signal_is_loss(2)
    killed = RankFailure(1, "process killed by signal SIGKILL", host="h1", lost=True)
    peer = RankFailure(0, "HorovodInternalError: Gloo connection closed by peer", secondary=True)
    own = RankFailure(0, "ValueError: a refused input")
    assert is_lost(HorovodJobFailed([peer, killed]))  # the killed rank is the root cause
    assert is_lost(HorovodJobFailed([peer]))  # nobody failed of its own: a peer's host went away
    assert not is_lost(HorovodJobFailed([peer, own]))  # an error of the job itself decides
    assert str(HorovodJobFailed([peer, killed])) == "rank 1 on h1 failed: process killed by signal SIGKILL " \
                                                    "(then also: rank 0)"


def _launcher(outcomes, calls):
    """A launch function that records the attempts it was given and plays ``outcomes`` in turn
    (an exception to raise, or a value to return)."""
    def launch(main):
        calls.append(list(main.history))
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
    return launch


LOST = HorovodJobFailed([RankFailure(1, "process killed by signal SIGKILL", host="h1", lost=True)], world_size=2)
OWN = HorovodJobFailed([RankFailure(1, "RuntimeError: a bug")])


@pytest.fixture
def pipelines_log(caplog):
    """``caplog`` holding the "pipelines" logger's records at WARNING and above, even after a test in
    this process ran ``setup_logging`` (which stops that logger propagating to the root, where
    caplog listens)."""
    logger = logging.getLogger("pipelines")
    propagate = logger.propagate
    logger.propagate = False  # each record reaches caplog once, through the handler added here
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="pipelines"):
            yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate


def test_a_lost_rank_is_relaunched_with_the_earlier_attempts_and_logged(pipelines_log):
    calls = []
    assert run_with_retries(_launcher([LOST, "done"], calls), print, max_failures=2) == "done"
    failure = "rank 1 on h1 failed: process killed by signal SIGKILL"
    assert calls == [[], [{"attempt": 1, "world_size": 2, "failure": failure}]]
    assert [r.getMessage() for r in pipelines_log.records] == [
        "attempt 1 of 3", f"attempt 2 of 3: relaunching from the newest complete checkpoint after {failure}"]


def test_relaunches_stop_after_max_failures_and_zero_is_fail_fast(pipelines_log):
    calls = []
    with pytest.raises(HorovodJobFailed, match="rank 1 on h1"):
        run_with_retries(_launcher([LOST, LOST, "never"], calls), print, max_failures=1)
    assert len(calls) == 2
    calls = []
    pipelines_log.clear()
    with pytest.raises(HorovodJobFailed):
        run_with_retries(_launcher([LOST, "never"], calls), print, max_failures=0)
    assert len(calls) == 1 and not pipelines_log.records  # today's behaviour, today's log


def test_an_error_of_the_job_itself_is_never_retried():
    calls = []
    with pytest.raises(HorovodJobFailed, match="RuntimeError: a bug"):
        run_with_retries(_launcher([OWN, "never"], calls), print, max_failures=3)
    assert len(calls) == 1


def test_a_relaunch_without_the_slots_is_a_clear_error_and_a_first_refusal_stays_one():
    calls = []
    shrunk = ValueError("np=2 Spark tasks requested but the cluster (spark://m:7077) offers 1 task slot")
    with pytest.raises(RelaunchImpossible, match=r"^rank 1 on h1 failed: process killed by signal SIGKILL; "
                                                 r"attempt 2 could not start: np=2 Spark tasks requested"):
        run_with_retries(_launcher([LOST, shrunk], calls), print, max_failures=1)
    with pytest.raises(ValueError, match="offers 1 task slot"):
        run_with_retries(_launcher([shrunk], []), print, max_failures=1)


def test_outside_a_relaunch_a_rank_is_its_jobs_first_attempt(monkeypatch):
    monkeypatch.delenv(ATTEMPTS_ENV, raising=False)
    monkeypatch.delenv("HOROVOD_SIZE", raising=False)
    handed = read_rank_environment()
    assert handed.attempts == [{"attempt": 1, "world_size": 1, "failure": None}] and not handed.relaunched


def test_a_rank_reads_the_attempts_its_relauncher_wrote():
    earlier = [{"attempt": 1, "world_size": 3, "failure": "rank 1 on h failed: process killed by signal SIGKILL"}]
    handed = read_rank_environment({**attempts_env(earlier), "HOROVOD_SIZE": "2"})
    assert handed.attempts == earlier + [{"attempt": 2, "world_size": 2, "failure": None}] and handed.relaunched


@pytest.mark.parametrize("args, message", [
    ({"max_failures": 1}, "--max-failures applies to --spark-np runs"),
    ({"max_failures": -1, "np": -2}, "--max-failures must be >= 0"),
])
def test_max_failures_is_refused_where_nothing_can_relaunch(args, message):
    with pytest.raises(ValueError, match=message):
        LaunchConfig(**args)
    with pytest.raises(ValueError, match="max_failures must be an integer >= 0"):
        HorovodRunner(np=-2, max_failures=-1)


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
    from pipelines.training.model.checkpoints import load_checkpoint, optimizer_state, save_checkpoint
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


@pytest.mark.parametrize("message, secondary", [
    ("When reading information for key 'etl/train/part-0.parquet' in bucket 'b': AWS Error NETWORK_CONNECTION "
     "during HeadObject operation: curlCode: 7, Couldn't connect to server", True),
    ("[Errno 101] Network is unreachable", True),
    ("[Errno 113] No route to host", True),
    ("When reading information for key 'x' in bucket 'b': AWS Error ACCESS_DENIED during HeadObject", False),
    ("[Errno 2] No such file or directory: 'x.parquet'", False),
])
def test_a_rank_whose_host_lost_its_network_link_is_a_loss_not_an_error_of_the_job(message, secondary):
    """Seen on the test hosts: the host whose link was cut failed reading its shard from S3 before
    Gloo's timeout; that is the host's loss (relaunched under --max-failures), while a refused
    access or a missing file is the job's own error."""
    from pipelines.launch.failures import is_secondary
    assert is_secondary(OSError(message)) is secondary
