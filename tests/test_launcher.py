"""HorovodRunner's pure parts and its local mode (Horovod's own launcher, Gloo)."""
import os

import pytest

from pipelines.launcher import HorovodJobFailed, HorovodRunner, RankFailure, rank_plan


@pytest.mark.parametrize("np", [0, 1.5, "2"])
def test_bad_np_is_refused(np):
    with pytest.raises(ValueError, match="np must be a non-zero integer"):
        HorovodRunner(np=np)


def test_rank_plan_numbers_ranks_host_by_host():
    plan = rank_plan(["b", "a", "b", "a", "c"])
    assert [p["rank"] for p in plan] == [0, 2, 1, 3, 4]
    assert [p["local_rank"] for p in plan] == [0, 0, 1, 1, 0]
    assert [p["local_size"] for p in plan] == [2, 2, 2, 2, 1]
    assert [p["cross_rank"] for p in plan] == [0, 1, 0, 1, 2] and plan[0]["cross_size"] == 3


def test_failure_message_puts_the_root_cause_first():
    exc = HorovodJobFailed([RankFailure(0, "HorovodInternalError: peer gone", secondary=True),
                            RankFailure(1, "RuntimeError: boom")])
    assert str(exc).startswith("rank 1 failed: RuntimeError: boom")


def _rank_sum(offset):
    import horovod.tensorflow as hvd
    hvd.init()
    import numpy as np
    return float(hvd.allreduce(np.array([hvd.rank() + offset], np.float64), op=hvd.Sum).numpy()[0]), hvd.rank()


def _raise_on_rank_1():
    import horovod.tensorflow as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank one is broken")
    import numpy as np
    hvd.allreduce(np.array([1.0]))
    return "unreachable"


@pytest.mark.slow
def test_local_run_returns_rank_0s_value():
    total, rank = HorovodRunner(np=-2).run(_rank_sum, offset=10)
    assert (total, rank) == (21.0, 0)


def _tuning_env():
    import os
    return {name: os.environ.get(name) for name in ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")}


@pytest.mark.slow
def test_local_ranks_get_the_users_tuning_or_horovods_defaults_not_none_tuples(monkeypatch):
    """horovod.runner.run passes HOROVOD_CYCLE_TIME="(None,)" (read as 0 ms: a spinning background
    thread) whatever the launching process had; the ranks must get that process's value, or none."""
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "7")
    monkeypatch.delenv("HOROVOD_CACHE_CAPACITY", raising=False)
    assert HorovodRunner(np=-1).run(_tuning_env) == {"HOROVOD_CYCLE_TIME": "7", "HOROVOD_CACHE_CAPACITY": None}
    assert "PIPELINES_KEEP_HOROVOD_CYCLE_TIME" not in os.environ  # handed over, then cleaned up


def test_repair_keeps_values_that_are_not_none_tuples(monkeypatch):
    from pipelines.launcher import repair_horovod_env
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "(None,)")
    monkeypatch.delenv("PIPELINES_KEEP_HOROVOD_CACHE_CAPACITY", raising=False)
    repair_horovod_env()
    assert _tuning_env() == {"HOROVOD_CYCLE_TIME": "5", "HOROVOD_CACHE_CAPACITY": None}


@pytest.mark.slow
def test_local_failure_names_the_rank_and_the_cause():
    with pytest.raises(HorovodJobFailed, match=r"rank 1 failed: ValueError: rank one is broken"):
        HorovodRunner(np=-2).run(_raise_on_rank_1)


def test_a_peer_error_never_hides_the_root_cause(tmp_path):
    """Horovod may see the innocent rank exit first; the ranks' own error texts decide."""
    import json
    from pipelines.launcher import _collect_failures
    (tmp_path / "rank-0.json").write_text(json.dumps({"rank": 0, "cause": "UnknownError: Horovod has been shut down",
                                                      "traceback": "", "secondary": True}))
    (tmp_path / "rank-1.json").write_text(json.dumps({"rank": 1, "cause": "ValueError: broken", "traceback": "",
                                                      "secondary": False}))
    message = "The first process to do so was:\nProcess name: 0\nExit code: 1\n"
    assert str(HorovodJobFailed(_collect_failures(str(tmp_path), message))).startswith("rank 1 failed: ValueError")
