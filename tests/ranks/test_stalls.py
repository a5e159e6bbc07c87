"""Gloo's rendezvous window with real local ranks, one of them late: named with the option to
raise when it misses the window, joined when it is inside (the watchdog, the records and the
windows' arithmetic: tests/unit/launch/test_stalls.py)."""
import os
import socket
import time

import pytest

from pipelines.launch import HorovodJobFailed, HorovodRunner
from pipelines.launch.config import LaunchConfig


def _late_rank(late_s: float) -> int:
    """A rank function whose rank 1 starts ``late_s`` seconds after the others, then one allreduce."""
    if os.environ["HOROVOD_RANK"] == "1":
        time.sleep(late_s)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    return int(hvd.allreduce(tf.constant(1), op=hvd.Sum).numpy())


@pytest.mark.slow  # local ranks that load TensorFlow and wait out a window: 8-13 s
@pytest.mark.current
def test_a_rank_that_misses_the_rendezvous_window_is_named_with_the_option_to_raise():
    """Local ranks: rank 1 starts 12 s late into a 3 s window; rank 0's Gloo aborts, and the driver
    names rank 1, its host and --rendezvous-timeout (from its own rendezvous: rank 1 never joined)."""
    runner = HorovodRunner(np=-2, rank_timeouts=LaunchConfig(rendezvous_timeout=3).timeouts_env({}))
    start = time.monotonic()
    with pytest.raises(HorovodJobFailed) as failed:
        runner.run(_late_rank, late_s=12)
    assert str(failed.value).startswith(
        f"rank 1 on {socket.gethostname()} failed: did not join Gloo's rendezvous within 3 s (started late or "
        "not at all): raise --rendezvous-timeout (then also: rank 0)"), str(failed.value)
    assert failed.value.failures[0].lost and time.monotonic() - start < 30


@pytest.mark.slow  # local ranks that load TensorFlow and wait out a window: 8-13 s
@pytest.mark.current
def test_a_rank_inside_the_window_joins_late_and_the_job_runs():
    """Rank 1 starts 8 s late into a 40 s window (Horovod's own 30 s would pass too: the 60 s case is
    the horovodrun test's); both ranks sum to 2."""
    runner = HorovodRunner(np=-2, rank_timeouts=LaunchConfig(rendezvous_timeout=40).timeouts_env({}))
    assert runner.run(_late_rank, late_s=8) == 2
