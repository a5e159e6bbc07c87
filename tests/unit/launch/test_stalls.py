"""Bounded waits: a live rank that stops (the progress watchdog) and a rank that starts late (Gloo's
rendezvous window), on both launch paths: HorovodRunner's ranks and horovodrun's."""
import threading
import time

import pytest

from pipelines.runtime.errors import Refused
from pipelines.launch import HorovodJobFailed, RankFailure
from pipelines.launch.config import DEFAULT_RENDEZVOUS_TIMEOUT_S, LaunchConfig
from pipelines.launch.failures import with_late_ranks
from pipelines.launch.rankenv import (GLOO_TIMEOUT_ENV, STALL_ENV, gloo_timeout, own_timeouts, read_rank_environment,
                                     timeouts_env)
from pipelines.launch.recovery import is_lost
from pipelines.launch.watchdog import DEFAULT_STALL_TIMEOUT_S, Watchdog, grace_s, stall_record


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def watched(timeout_s=10.0):
    clock, stalls = Clock(), []
    return Watchdog(timeout_s, stalls.append, clock), clock, stalls


def test_a_rank_stalls_after_its_own_work_at_the_timeout_and_is_told_once():
    dog, clock, stalls = watched(10)
    dog.tick("the rank's own work after epoch 1")
    clock.now += 10
    assert not dog.check() and stalls == []  # at the timeout itself: not yet
    clock.now += 0.5
    assert dog.check() and dog.check()
    assert stalls == ["no progress for 10 s in the rank's own work after epoch 1 (--stall-timeout 10 s)"]


@pytest.mark.parametrize("timeout_s, grace", [(10, 15.0), (60, 30.0), (600, 300.0)])
def test_a_rank_that_may_wait_on_its_peers_gets_the_grace_beyond_the_timeout(timeout_s, grace):
    """A peer that stopped on its own work ends first, and is the one named."""
    assert grace_s(timeout_s) == grace
    dog, clock, stalls = watched(timeout_s)
    dog.tick("step 1 of epoch 2", waits=True)
    clock.now += timeout_s + grace - 0.1
    assert not dog.check()
    clock.now += 0.2
    assert dog.check() and "in step 1 of epoch 2" in stalls[0]


def test_each_tick_restarts_the_wait():
    dog, clock, stalls = watched(10)
    for step in range(5):
        clock.now += 9
        dog.tick(f"step {step}")
        assert not dog.check()
    assert stalls == []


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_a_watchdog_needs_a_positive_timeout(timeout):
    with pytest.raises(ValueError, match="a stall timeout must be positive"):
        Watchdog(timeout)


def test_the_watchdog_thread_reports_a_stall_while_the_main_thread_sleeps():
    stalls = []
    dog = Watchdog(0.3, stalls.append).start()
    try:
        time.sleep(1.5)
    finally:
        dog.stop()
    assert len(stalls) == 1 and stalls[0].startswith("no progress for ")


def test_a_stall_record_is_a_lost_rank_with_its_host_and_every_threads_stack(monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "3")
    monkeypatch.setenv("HOROVOD_HOSTNAME", "worker-7")
    records = []  # made on another thread, as the watchdog's: the main thread's stack is in it
    thread = threading.Thread(target=lambda: records.append(
        stall_record("no progress for 12 s in step 2 of epoch 1 (--stall-timeout 10 s)")))
    thread.start()
    thread.join()
    record = records[0]
    assert record["rank"] == 3 and record["host"] == "worker-7" and record["lost"] and not record["secondary"]
    assert record["cause"] == "RankStalled: no progress for 12 s in step 2 of epoch 1 (--stall-timeout 10 s)"
    assert "Thread MainThread:" in record["traceback"] and "test_stalls.py" in record["traceback"]
    failure = RankFailure(record["rank"], record["cause"], host=record["host"], lost=record["lost"])
    assert is_lost(HorovodJobFailed([failure]))


def test_late_ranks_are_the_root_cause_and_the_ranks_that_waited_for_them_secondary():
    aborted = RankFailure(0, "process killed by signal SIGABRT", host="a")
    failures = with_late_ranks([aborted], [2], "5", {0: "a", 1: "a", 2: "b"})
    exc = HorovodJobFailed(failures)
    assert str(exc) == ("rank 2 on b failed: did not join Gloo's rendezvous within 5 s (started late or not at all): "
                        "raise --rendezvous-timeout (then also: rank 0)")
    assert is_lost(exc) and exc.failures[1].secondary


def test_a_rank_missing_from_the_rendezvous_with_a_failure_of_its_own_keeps_it():
    own = RankFailure(1, "ImportError: no module named x", host="a")
    assert with_late_ranks([own], [1], "300", {1: "a"}) == [own]
    assert with_late_ranks([], [1], "300", {1: "a"}) == []  # a job that did not fail


def test_the_launcher_hands_every_rank_its_waits_and_keeps_horovodruns_own():
    assert timeouts_env(300, 600, {}) == {GLOO_TIMEOUT_ENV: "300", STALL_ENV: "600"}
    assert timeouts_env(0.4, 12.5, {}) == {GLOO_TIMEOUT_ENV: "1", STALL_ENV: "12.5"}
    assert timeouts_env(300, 600, {GLOO_TIMEOUT_ENV: "900"})[GLOO_TIMEOUT_ENV] == "900"
    assert read_rank_environment({STALL_ENV: "12.5"}).stall_timeout_s == 12.5
    assert read_rank_environment({}).stall_timeout_s == 0.0  # not launched by us: nothing watched
    assert LaunchConfig().timeouts_env({}) == {GLOO_TIMEOUT_ENV: f"{DEFAULT_RENDEZVOUS_TIMEOUT_S:g}",
                                               STALL_ENV: f"{DEFAULT_STALL_TIMEOUT_S:g}"}


@pytest.mark.parametrize("executor_env, gloo", [
    ({}, "300"),  # nothing of the executor's own: the driver's
    ({GLOO_TIMEOUT_ENV: ""}, "300"),  # set but empty (Horovod's strtol would read 0 s): the driver's
    ({GLOO_TIMEOUT_ENV: "10"}, "10"),  # spark.executorEnv.HOROVOD_GLOO_TIMEOUT_SECONDS=10: kept
    ({GLOO_TIMEOUT_ENV: "900", STALL_ENV: "5"}, "900"),  # only Gloo's is the host's own to keep
])
def test_an_executors_own_gloo_timeout_outranks_the_drivers_default(executor_env, gloo):
    """The driver's default (--rendezvous-timeout) never overrides a Gloo timeout set for the
    executors: a host cut off past that timeout must fail its collectives, not wait 300 s."""
    driver = LaunchConfig().timeouts_env({})
    assert own_timeouts(driver, executor_env) == {GLOO_TIMEOUT_ENV: gloo, STALL_ENV: driver[STALL_ENV]}
    assert own_timeouts({}, executor_env) == {}  # a runner given no waits adds none


@pytest.mark.parametrize("env, seconds", [({}, "30"), ({GLOO_TIMEOUT_ENV: "10"}, "10"), ({STALL_ENV: "5"}, "30")])
def test_the_window_a_late_rank_is_told_is_the_one_its_environment_gives_gloo(env, seconds):
    """What a rank started with ``env`` waits at the rendezvous: its own value, else Horovod's 30 s
    (GetIntEnvOrDefault(HOROVOD_GLOO_TIMEOUT_SECONDS, 30) in gloo_context.cc)."""
    assert gloo_timeout(env) == seconds


@pytest.mark.parametrize("field, flag", [("rendezvous_timeout", "--rendezvous-timeout"),
                                         ("stall_timeout", "--stall-timeout"), ("slots_timeout", "--slots-timeout")])
@pytest.mark.parametrize("value", [0, -5, float("nan"), float("inf"), "60", True])
def test_waits_that_are_not_positive_seconds_are_refused_by_flag(field, flag, value):
    with pytest.raises(Refused, match=f"^{flag} must be a positive number of seconds"):
        LaunchConfig(np=-2, **{field: value})


def validation_of(batches, clock, seconds_per_batch, stop_at=None, stop_s=0.0, monkeypatch=None):
    """The exact validation's callback over ``batches`` batches of a shard, each taking
    ``seconds_per_batch`` of ``clock`` (batch ``stop_at``: ``stop_s``), the sums over ranks this rank's."""
    import numpy as np

    from pipelines.training import evaluate

    monkeypatch.setattr(evaluate, "allreduce_totals", lambda totals: totals)
    monkeypatch.setattr(evaluate, "verify_total", lambda count, data, split: None)

    class Inputs:
        def evaluate_shard(self, model, split, after_batch=None):
            for batch in range(1, batches + 1):
                clock.now += stop_s if batch == stop_at else seconds_per_batch
                running.check()  # the watchdog's thread looks, once per batch here
                after_batch(batch)
            return evaluate.Totals(0.0, 0, 0, 3, np.zeros(0, np.int64), np.zeros(0, np.int64))

    return evaluate.exact_validation(Inputs(), None)


running = None


@pytest.mark.parametrize("stop_at", [None, 5])
def test_a_long_validation_of_steady_batches_is_progress_and_a_rank_stopped_inside_it_is_ended(stop_at, monkeypatch):
    """12 validation batches of 8 s each (96 s, beyond the 10 s timeout and its 15 s grace): each
    batch ticks the rank's watchdog, so the rank is not ended; a batch that takes 30 s is a rank
    that stopped, ended and named where."""
    global running
    clock, stalls = Clock(), []
    running = Watchdog(10, stalls.append, clock).start()  # the running watchdog: the one progress() ticks
    try:
        callback = validation_of(12, clock, 8.0, stop_at, 30.0, monkeypatch)
        running.tick("the validation and checkpoint of epoch 2", waits=True)  # WatchdogTicks' epoch-end tick
        callback.on_epoch_end(1, {})
    finally:
        running.stop()
    if stop_at is None:
        assert stalls == []
    else:
        assert stalls == ["no progress for 30 s in validation batch 5 of epoch 2 (--stall-timeout 10 s)"]


def test_the_test_evaluation_runs_under_its_own_watchdog_that_each_batch_ticks():
    from pipelines.launch import watchdog

    with watchdog.watching(None, "test batch 1"):
        assert watchdog._running is None  # no --stall-timeout: none
    with watchdog.watching(30, "test batch 1"):
        dog = watchdog._running
        assert dog is not None and dog._where == "test batch 1"
        watchdog.progress("test batch 2")
        assert dog._where == "test batch 2" and not dog.fired
    assert watchdog._running is None
