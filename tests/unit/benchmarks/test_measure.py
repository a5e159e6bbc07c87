"""Measurement arithmetic (pure): time to best epoch, interval unions, Horovod timelines, scaling rows."""
import json

import pytest

from benchmarks.measure import (ScalingPoint, load_timeline, point_from_result, scaling_rows,
                               time_to_best, timeline_phase_seconds, union_seconds)


def test_time_to_best_adds_setup_and_epochs_up_to_the_best():
    assert time_to_best(10.0, [5.0, 4.0, 3.0, 2.0], best_epoch=2) == 19.0
    assert time_to_best(0.0, [1.5], best_epoch=1) == 1.5
    assert time_to_best(10.0, [5.0, 4.0], best_epoch=0) == 10.0  # the start: the probe's head, before any epoch


@pytest.mark.parametrize("best", [-1, 4])
def test_time_to_best_refuses_an_epoch_that_was_not_run(best):
    with pytest.raises(ValueError, match="not one of the 3 epochs"):
        time_to_best(1.0, [1.0, 1.0, 1.0], best)


def test_union_counts_overlaps_once():
    assert union_seconds([]) == 0.0
    assert union_seconds([(0, 2), (1, 3), (5, 6)]) == 4.0
    assert union_seconds([(5, 6), (0, 10)]) == 10.0
    assert union_seconds([(0, 1), (1, 2)]) == 2.0


def _tensor(pid, negotiate, allreduce, nested):
    """Events of one tensor in Horovod's timeline format (as written by Horovod 0.28 with Gloo)."""
    return [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"HorovodAllreduce_{pid}"}},
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": negotiate[0], "pid": pid},
        {"ph": "X", "name": "0", "ts": negotiate[0] + 1, "pid": pid, "dur": 0},
        {"ph": "E", "ts": negotiate[1], "pid": pid},
        {"ph": "B", "name": "ALLREDUCE", "ts": allreduce[0], "pid": pid},
        {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": nested[0], "pid": pid},
        {"ph": "E", "ts": nested[1], "pid": pid},
        {"ph": "E", "ts": allreduce[1], "pid": pid, "args": {"dtype": "float32", "shape": "[10]"}},
    ]


def test_timeline_phases_are_top_level_and_merged_across_fused_tensors():
    events = _tensor(1, (0, 8_000), (8_300, 12_000), (8_400, 11_900)) + \
        _tensor(2, (5, 8_100), (8_310, 12_010), (8_400, 11_950))
    phases = timeline_phase_seconds(events)
    assert phases["ALLREDUCE"] == pytest.approx((12_010 - 8_300) / 1e6)
    assert phases["NEGOTIATE_ALLREDUCE"] == pytest.approx(8_100 / 1e6)
    assert "GLOO_ALLREDUCE" not in phases  # nested inside ALLREDUCE, not a phase of its own


def test_timeline_ignores_unmatched_events():
    events = [{"ph": "E", "ts": 5, "pid": 1}, {"ph": "B", "name": "ALLREDUCE", "ts": 10, "pid": 1}]
    assert timeline_phase_seconds(events) == {}


def test_a_timeline_cut_short_is_read_up_to_its_last_event(tmp_path):
    events = _tensor(1, (0, 10), (20, 40), (25, 35))
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(events))
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(events)[:-1] + ",\n")
    assert load_timeline(str(whole)) == events
    assert load_timeline(str(cut)) == events


def test_scaling_rows_compare_with_world_size_one_at_the_same_batch():
    points = [ScalingPoint(1, 16, steps=10, seconds=4.0), ScalingPoint(2, 16, 10, 4.4, allreduce_seconds=0.11,
                                                                         negotiation_seconds=0.44),
              ScalingPoint(2, 8, 10, 2.0)]
    rows = scaling_rows(points)
    assert [(r["batch_size_per_rank"], r["world_size"]) for r in rows] == [(8, 2), (16, 1), (16, 2)]
    no_base, single, double = rows
    assert no_base["speed_up"] is None and no_base["scaling_efficiency"] is None
    assert single["images_per_second"] == 40.0 and single["speed_up"] == 1.0
    assert double["global_batch_size"] == 32 and double["images_per_second"] == pytest.approx(72.73, abs=0.01)
    assert double["speed_up"] == pytest.approx(1.818, abs=1e-3)
    assert double["scaling_efficiency"] == pytest.approx(0.909, abs=1e-3)
    assert double["step_ms"] == 440.0
    assert double["allreduce_share"] == 0.025 and double["negotiation_share"] == 0.1


def test_point_from_result_reads_the_timeline(tmp_path):
    path = tmp_path / "np2-b16.json"
    path.write_text(json.dumps(_tensor(1, (0, 100_000), (100_000, 300_000), (100_000, 300_000))))
    point = point_from_result({"world_size": 2, "batch_size": 16, "steps": 5, "seconds": 2.0, "timeline": str(path)})
    assert point.allreduce_seconds == pytest.approx(0.2) and point.negotiation_seconds == pytest.approx(0.1)
    bare = point_from_result({"world_size": 1, "batch_size": 16, "steps": 5, "seconds": 2.0, "timeline": None})
    assert bare.allreduce_seconds == 0.0


def test_scaling_rows_compare_each_allreduce_precision_with_its_own_world_size_one():
    points = [ScalingPoint(1, 8, 10, 4.0, allreduce_bytes=400), ScalingPoint(2, 8, 10, 5.0, allreduce_bytes=400),
              ScalingPoint(1, 8, 10, 2.0, fp16=True, allreduce_bytes=200),
              ScalingPoint(2, 8, 10, 2.5, fp16=True, allreduce_bytes=200)]
    rows = scaling_rows(points)
    assert [(r["fp16_allreduce"], r["world_size"]) for r in rows] == [(False, 1), (False, 2), (True, 1), (True, 2)]
    assert [r["scaling_efficiency"] for r in rows] == [1.0, 0.8, 1.0, 0.8]  # 2 x 8 x 10 / 5 s = 32 = 0.8 x 2 x 20
    assert [r["allreduce_bytes_per_step"] for r in rows] == [400, 400, 200, 200]
