"""Recovery (``--max-failures``): which failures are relaunched and the relaunch loop, with a stand-in
launcher (real local ranks relaunched, and checkpoints that carry the optimizer's state:
tests/ranks/test_recovery.py; the training job end to end: tests/e2e/test_training_hvd.py)."""
import logging
import signal

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
