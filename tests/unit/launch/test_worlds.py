"""Continuing with the ranks left (issue 38, item 4): the world's bounds (``--min-np``, ``--max-np``)
and their refusals, the size of a Spark relaunch for the slots the cluster offers, one machine's
slot names under horovodrun's elastic mode, and the record of an elastic attempt. Pure parts and
the command line; the runs themselves: tests/e2e/test_training_hvd.py (horovodrun) and
tests/e2e/test_hosts.py (Spark barrier tasks across hosts)."""
import logging
import os
import re
import subprocess
import sys
import time

import pytest

from pipelines.runtime.errors import Refused
from pipelines.launch import HorovodRunner
from pipelines.launch.config import LaunchConfig
from pipelines.launch.discovery import local_slot, slot_name, slot_of
from pipelines.launch.elastic import ended_attempt, peer_loss, under_elastic
from pipelines.launch.sparkcheck import attempt_world
from pipelines.launch.worlds import WorldBounds, relaunch_line
from tests.support.env import REPO, subprocess_env

DISCOVERY = os.path.join(REPO, "scripts", "host_discovery.sh")


@pytest.mark.parametrize("bounds, slots, size", [
    ((3, 2, 3), 2, 2),  # a host lost, no spare: on the 2 left
    ((3, 2, 3), 1, None),  # below --min-np: wait, or give up
    ((3, 2, 3), 5, 3),  # spares: capped at --max-np
    ((3, 1, 6), 5, 5),  # slots came back: up to --max-np
    ((3, 1, 6), 9, 6),
    ((3, 3, 3), 3, 3),  # a fixed world needs its np
    ((3, 3, 3), 2, None),
    ((4, 2, 4), 0, None),  # no executor at all
])
def test_a_relaunch_takes_the_slots_there_are_up_to_max_np_and_no_fewer_than_min_np(bounds, slots, size):
    assert WorldBounds(*bounds).relaunch_size(slots) == size


@pytest.mark.parametrize("np, min_np, max_np, message", [
    (3, 4, None, "--min-np 4 is above the world size 3 (--spark-np 3)"),
    (3, 0, None, "--min-np must be at least 1 (a run needs a rank), got 0"),
    (3, -2, None, "--min-np must be at least 1"),
    (3, 2, 1, "--max-np 1 is below --min-np 2"),
    (3, None, 2, "--max-np 2 is below the world size 3 (--spark-np 3)"),
    (3, 3, 2, "--max-np 2 is below the world size 3"),
    (3, 1.5, None, "--min-np must be an integer, got 1.5"),
])
def test_bounds_no_run_keeps_are_refused_wherever_they_are_given(np, min_np, max_np, message):
    with pytest.raises(Refused, match=re.escape(message)):
        WorldBounds.of(np, min_np, max_np)
    with pytest.raises(Refused, match=re.escape(message)):
        LaunchConfig(np=np, min_np=min_np, max_np=max_np, max_failures=1)
    with pytest.raises(Refused, match=re.escape(message)):
        HorovodRunner(np=np, min_np=min_np, max_np=max_np, max_failures=1)


@pytest.mark.parametrize("args, message", [
    ({"np": 0, "min_np": 1}, "--min-np and --max-np apply to --spark-np runs; under horovodrun give horovodrun's own "
                             "--min-np, --max-np and --host-discovery-script"),
    ({"np": 0, "max_np": 4}, "under horovodrun give horovodrun's own"),
    ({"np": -3, "min_np": 2, "max_failures": 1}, "apply to Spark barrier tasks (--spark-np N > 0)"),
    ({"np": 3, "min_np": 2}, "--min-np and --max-np bound the relaunches after a lost rank: give --max-failures K"),
])
def test_bounds_are_refused_where_nothing_would_follow_them(args, message):
    with pytest.raises(Refused, match=re.escape(message)):
        LaunchConfig(**args)


def test_within_bounds_the_launch_settings_carry_them_to_the_runner():
    launch = LaunchConfig(np=3, min_np=2, max_failures=1)
    assert launch.bounds == WorldBounds(3, 2, 3) and not launch.bounds.fixed
    assert launch.runner().bounds == WorldBounds(3, 2, 3)
    assert LaunchConfig(np=3).bounds.fixed and LaunchConfig(np=-2).bounds == WorldBounds(2, 2, 2)
    with pytest.raises(Refused, match="min_np and max_np apply to Spark barrier tasks"):
        HorovodRunner(np=-3, min_np=2, max_failures=1)


@pytest.mark.parametrize("argv, message", [
    (["--spark-np", "3", "--min-np", "4", "--max-failures", "1"], "--min-np 4 is above the world size 3"),
    (["--spark-np", "3", "--min-np", "0", "--max-failures", "1"], "--min-np must be at least 1"),
    (["--spark-np", "3", "--min-np", "2", "--max-np", "1", "--max-failures", "1"], "--max-np 1 is below --min-np 2"),
    (["--min-np", "1"], "under horovodrun give horovodrun's own --min-np"),  # a rank of `horovodrun -np 2`
    (["--max-np", "4"], "under horovodrun give horovodrun's own --min-np"),
])
def test_the_command_line_refuses_them_with_exit_2_and_one_line(argv, message, capsys):
    from pipelines.runtime.config import parse_configs
    from pipelines.training.config import TrainConfig

    with pytest.raises(SystemExit) as info:
        parse_configs((TrainConfig, LaunchConfig), ["--data", "d", "--output", "o", *argv])
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err and "Traceback" not in err, err


def test_the_training_job_refuses_them_before_spark_or_any_rank_starts(tmp_path):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, os.path.join(REPO, "jobs", "train.py"), "--data", str(tmp_path),
                           "--output", str(tmp_path / "out"), "--spark-np", "4", "--min-np", "5",
                           "--max-failures", "1"],
                          capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == \
        ["train.py: error: --min-np 5 is above the world size 4 (--spark-np 4): a run starts on --spark-np ranks "
         "and continues on no fewer than --min-np"]
    assert time.monotonic() - started < 60 and not os.path.exists(tmp_path / "out")


class _Slots:
    """The free task slots a cluster offers, one count per look, the last repeated (a Spark
    cluster's executors registering or lost, as ``task_slots`` would count them)."""

    def __init__(self, *counts):
        self.counts, self.looks = list(counts), 0

    def __call__(self):
        self.looks += 1
        return self.counts[min(self.looks, len(self.counts)) - 1]


def test_a_relaunch_after_a_loss_takes_the_slots_there_are_now_and_says_so(caplog):
    bounds = WorldBounds(3, 2, 3)
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        assert attempt_world(_Slots(2), "spark://m:7077", bounds, 3, 30.0) == 2  # no waiting: 2 >= --min-np
    assert caplog.messages == ["relaunching on 2 ranks (world size 3 -> 2): the cluster offers 2 task slots now "
                               "(--min-np 2, --max-np 3)"]
    assert attempt_world(_Slots(5), "spark://m:7077", WorldBounds(3, 1, 4), 2, 30.0) == 4  # back, up to --max-np
    assert attempt_world(_Slots(1, 1, 3), "spark://m:7077", bounds, 3, 30.0) == 3  # waited for a replacement
    started = time.monotonic()
    with pytest.raises(Refused, match=r"the cluster \(spark://m:7077\) offers 1 task slot after 1 s, fewer than "
                                      r"--min-np 2: add workers, or lower --min-np"):
        attempt_world(_Slots(1), "spark://m:7077", bounds, 3, 1.0)
    assert time.monotonic() - started < 5


def test_a_first_attempt_and_a_fixed_world_need_all_their_slots():
    with pytest.raises(Refused, match=r"np=3 Spark tasks requested but the cluster \(spark://m:7077\) offers 2 task "
                                      r"slots: lower np"):
        attempt_world(_Slots(2), "spark://m:7077", WorldBounds(3, 2, 3), None, 0.1)
    with pytest.raises(Refused, match="offers 2 task slots"):
        attempt_world(_Slots(2), "spark://m:7077", WorldBounds(3, 3, 3), 3, 0.1)
    assert attempt_world(_Slots(0, 3), "spark://m:7077", WorldBounds(3, 2, 3), None, 30.0) == 3


def test_relaunch_line_names_the_change_only_when_there_is_one():
    assert relaunch_line(WorldBounds(3, 2, 4), 3, 3, 5) == \
        "relaunching on 3 ranks (world size 3): the cluster offers 5 task slots now (--min-np 2, --max-np 4)"
    assert relaunch_line(WorldBounds(3, 1, 4), 2, 1, 1).startswith("relaunching on 1 rank (world size 2 -> 1): "
                                                                   "the cluster offers 1 task slot now")


# -- one machine under horovodrun's elastic mode: each slot a name of its own ------------------------

def test_each_slot_of_this_machine_has_a_name_of_its_own_that_resolves_here():
    import socket

    names = [slot_name(i) for i in range(9)]
    assert names[:3] == ["127.0.0.1", "127.0.0.01", "127.0.0.001"] and len(set(names)) == 9
    assert [slot_of(n) for n in names] == list(range(9))
    assert {socket.gethostbyname(n) for n in names} == {"127.0.0.1"}  # Horovod starts them here, without ssh
    for other in ("localhost", "127.0.0.2", "10.0.0.1", "127.0.0.10", "host-127.0.0.1", ""):
        assert slot_of(other) is None


@pytest.mark.parametrize("environ, placement", [
    ({"HOROVOD_HOSTNAME": "127.0.0.001", "HOROVOD_SIZE": "4"}, (2, 4)),
    ({"HOROVOD_HOSTNAME": "127.0.0.0001", "HOROVOD_SIZE": "2"}, (3, 4)),  # GPU 3 of a node that lost two
    ({"HOROVOD_HOSTNAME": "127.0.0.1"}, (0, 1)),
    ({"HOROVOD_HOSTNAME": "worker-3", "HOROVOD_SIZE": "8"}, None),  # a host of its own: Horovod's local rank
    ({}, None),
])
def test_a_rank_on_a_slot_name_takes_its_slot_as_its_local_rank(environ, placement):
    assert local_slot(environ) == placement


def _discover(*args, env=None):
    proc = subprocess.run(["bash", DISCOVERY, *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout.split(), proc.stderr


def test_the_discovery_script_lists_the_slots_it_is_given_under_their_names(tmp_path):
    assert _discover("3") == (0, ["127.0.0.1:1", "127.0.0.01:1", "127.0.0.001:1"], "")
    listed = tmp_path / "slots"
    listed.write_text("0 2\n")
    assert _discover(str(listed))[1] == ["127.0.0.1:1", "127.0.0.001:1"]
    listed.write_text("2\n")  # slot 0 taken away: read again at each call
    assert [slot_of(line.split(":")[0]) for line in _discover(str(listed))[1]] == [2]
    listed.write_text("1 x\n")
    code, _, err = _discover(str(listed))
    assert code == 2 and "not a slot index: x" in err
    # GPUs: CUDA_VISIBLE_DEVICES' list is 0..n-1, as scripts/gpu_discovery.sh numbers it for Spark
    assert _discover(env={"CUDA_VISIBLE_DEVICES": "5,7"})[1] == ["127.0.0.1:1", "127.0.0.01:1"]
    assert _discover(env={"CUDA_VISIBLE_DEVICES": ""})[:2] == (0, [])


def test_an_elastic_attempt_records_the_ranks_it_lost_and_their_hosts():
    hosts = ["127.0.0.1", "127.0.0.01", "127.0.0.001"]
    why = "UnknownError: Horovod has been shut down"
    # rank 1 of 3 lost: the survivors were ranks 0 and 2
    assert ended_attempt(1, [(0, 3, hosts[0]), (2, 3, hosts[2])], hosts, why) == \
        {"attempt": 1, "world_size": 3, "failure": f"rank 1 on 127.0.0.01 lost: {why}"}
    # rank 0 lost, a new worker joined meanwhile (no earlier place)
    assert ended_attempt(2, [(1, 2, hosts[1]), (None, 0, hosts[0])], hosts[:2], why)["failure"] == \
        f"rank 0 on 127.0.0.1 lost: {why}"
    # the slots changed (nobody lost): the reason alone; a worker that was not in it records nothing
    assert ended_attempt(3, [(0, 1, "a"), (None, 0, "b")], ["a"], "the host discovery script changed the slots") == \
        {"attempt": 3, "world_size": 1, "failure": "the host discovery script changed the slots"}
    assert ended_attempt(1, [(None, 0, "a")], [], None) is None


class UnknownError(RuntimeError):
    """What TensorFlow raises in a rank whose peer was lost (``tf.errors.UnknownError``), by name."""


def test_a_peers_loss_is_said_in_one_line_and_the_elastic_mode_is_horovodruns():
    error = UnknownError("Graph execution error:\n\nDetected at node 'x' defined at:\n"
                                   "{{function_node __wrapped__HorovodAllreduce_device_/job:localhost}} Horovod has "
                                   "been shut down. This was caused by an exception on one of the ranks")
    assert peer_loss(error) == "UnknownError: Horovod has been shut down"
    assert under_elastic({"HOROVOD_ELASTIC": "1"}) and not under_elastic({}) and not under_elastic(
        {"HOROVOD_ELASTIC": "0"})
