"""The trainer benchmark's arithmetic (pure, no Horovod, no TensorFlow): the trainers' names, their
turns, a job's row and the medians, ratios and costs of being distributed."""
import pytest

from benchmarks.trainer_bench import TRAINERS, job_row, pick_trainers, summarize, turns
from pipelines.runtime.errors import Refused


def test_trainer_names_are_taken_once_each_in_the_order_named():
    assert pick_trainers("mwms,horovod") == ["mwms", "horovod"]
    assert pick_trainers(" horovod ,mwms,horovod") == ["horovod", "mwms"]


@pytest.mark.parametrize("flag, says", [("horovod,ray", "--trainers horovod,ray: unknown ray"),
                                        ("MWMS", "--trainers MWMS: unknown MWMS"),
                                        ("tf,hvd", "--trainers tf,hvd: unknown tf, hvd"),
                                        (" , ", "--trainers names no trainer")])
def test_an_unknown_trainer_is_refused_naming_the_trainers(flag, says):
    with pytest.raises(Refused) as error:
        pick_trainers(flag)
    assert str(error.value) == f"{says}; choose from {', '.join(TRAINERS)}"


def test_trainers_take_turns_going_first():
    assert turns(["horovod", "mwms"], 3) == [["horovod", "mwms"], ["mwms", "horovod"], ["horovod", "mwms"]]
    assert turns(["mwms"], 2) == [["mwms"], ["mwms"]]


def test_a_job_row_counts_every_rank_s_images_over_the_slowest_window():
    result = {"batch_size": 8, "steps": 20, "seconds": 4.0, "first_step_seconds": 12.3456}
    row = job_row("mwms", 2, 1, result, 61.234, 27.95)
    assert row["images_per_second"] == 80.0  # 20 steps x 8 images x 2 ranks / 4 s
    assert row["step_ms"] == 200.0 and row["global_batch"] == 16
    assert (row["first_step_s"], row["job_s"], row["allreduce_ms"]) == (12.346, 61.23, 27.95)
    assert job_row("horovod", 1, 1, result, 30.0, None)["images_per_second"] == 40.0


def _row(trainer, n, round_, seconds, allreduce_ms=None):
    return job_row(trainer, n, round_, {"batch_size": 4, "steps": 10, "seconds": seconds,
                                        "first_step_seconds": 1.0}, 20.0, allreduce_ms)


def test_medians_ratio_to_ours_and_the_cost_of_being_distributed():
    rows = [_row("horovod", 2, 1, 2.0, 1.0), _row("mwms", 2, 1, 4.0, 30.0), _row("horovod", 1, 1, 1.8),
            _row("mwms", 1, 1, 2.5), _row("mwms", 2, 2, 5.0, 20.0), _row("horovod", 2, 2, 2.2, 3.0),
            _row("mwms", 1, 2, 2.5), _row("horovod", 1, 2, 1.6), _row("horovod", 2, 3, 2.1, 2.0),
            _row("mwms", 2, 3, 8.0, 25.0), _row("horovod", 1, 3, 1.7), _row("mwms", 1, 3, 2.5)]
    summary = {(s["trainer"], s["np"]): s for s in summarize(rows)}
    assert list(summary) == [("horovod", 2), ("mwms", 2), ("horovod", 1), ("mwms", 1)]
    ours, peer = summary[("horovod", 2)], summary[("mwms", 2)]
    assert ours["step_ms"] == 210.0 and ours["images_per_second"] == round(80 / 2.1, 3)  # median of 3
    assert peer["runs"] == [20.0, 16.0, 10.0] and peer["images_per_second"] == 16.0
    assert peer["vs_horovod"] == round(80 / 2.1 / 16.0, 3) and ours["vs_horovod"] == 1.0
    assert (ours["allreduce_ms"], peer["allreduce_ms"]) == (2.0, 25.0)
    assert ours["distributed_ms"] == 210.0 - 170.0 and peer["distributed_ms"] == 500.0 - 250.0
    assert summary[("mwms", 1)]["distributed_ms"] is None and summary[("mwms", 1)]["allreduce_ms"] is None


def test_without_a_horovod_row_there_is_no_ratio():
    [only] = summarize([_row("mwms", 2, 1, 4.0, 30.0)])
    assert only["vs_horovod"] is None and only["distributed_ms"] is None
