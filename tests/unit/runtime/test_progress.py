"""Progress of long work without Spark: the progress line's arithmetic and words, the task sizes
the ETL and batch inference choose, and the file-split settings of an ETL split's batch inference."""
import pytest

from pipelines.etl.layout import TASK_IMAGES, task_count
from pipelines.runtime.progress import format_duration, progress_line, rate_and_left


@pytest.mark.parametrize("seconds, text", [
    (0, "0 s"), (0.4, "0 s"), (44.6, "45 s"), (59.5, "1 min 0 s"), (60, "1 min 0 s"), (125, "2 min 5 s"),
    (3599, "59 min 59 s"), (3600, "1 h 0 min"), (3725, "1 h 2 min"), (90061, "25 h 1 min"),
])
def test_durations_read_in_seconds_minutes_then_hours(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf")])
def test_a_duration_that_is_no_duration_is_refused(seconds):
    with pytest.raises(ValueError, match="finite number of seconds"):
        format_duration(seconds)


@pytest.mark.parametrize("done, total, elapsed, rate, left", [
    (100, 1000, 10.0, 10.0, 90.0),    # 10 a second, 900 to go
    (250, 1000, 2.0, 125.0, 6.0),
    (1000, 1000, 40.0, 25.0, 0.0),    # all done: nothing left
    (1200, 1000, 12.0, 100.0, 0.0),   # more counted than planned: never a negative time
    (0, 1000, 5.0, None, None),       # nothing done yet: no rate to read
    (10, 1000, 0.0, None, None),
])
def test_rate_is_the_mean_since_the_start_and_time_left_the_rest_at_that_rate(done, total, elapsed, rate, left):
    assert rate_and_left(done, total, elapsed) == (rate, left)


def test_the_line_says_done_of_total_percent_rate_and_time_left():
    assert progress_line("decode and write", 12345, 30607, 81.6) == \
        "decode and write: 12,345/30,607 images (40 %), 151.3 images/s, 2 min 1 s left"
    assert progress_line("predict", 3, 4, 1.5) == "predict: 3/4 images (75 %), 2.0 images/s, 0 s left"


def test_the_percentage_is_floored_so_it_never_says_100_before_the_end():
    assert "(99 %)" in progress_line("x", 999, 1000, 10.0)


def test_before_anything_is_done_the_line_says_the_rate_is_not_known():
    assert progress_line("duplicate check", 0, 30607, 12.2) == \
        "duplicate check: 0/30,607 images (0 %), rate not known yet (12 s elapsed)"


def test_the_last_line_says_how_long_it_took():
    assert progress_line("predict", 30607, 30607, 202.5, finished=True) == \
        "predict: 30,607/30,607 images (100 %), 151.1 images/s, done in 3 min 22 s"
    assert progress_line("predict", 0, 0, 0.2, finished=True) == "predict: 0/0 images, done in 0 s"


def test_one_item_and_another_unit_are_said_with_their_own_noun():
    assert progress_line("x", 0, 1, 1.0) == "x: 0/1 image (0 %), rate not known yet (1 s elapsed)"
    assert progress_line("epoch 1", 5, 10, 5.0, unit="step") == "epoch 1: 5/10 steps (50 %), 1.0 steps/s, 5 s left"
    assert progress_line("x", 2, 3, 1.0, unit="batch", units="batches") == "x: 2/3 batches (66 %), 2.0 batches/s, 0 s left"


@pytest.mark.parametrize("items, parallelism, per_task, requested, tasks", [
    (30607, 2, 500, 0, 62),     # the Caltech-256 tree: 62 tasks of 493-494 images, not 4 of 7,652
    (30607, 8, 500, 0, 62),
    (30607, 64, 500, 0, 128),   # many cores: two tasks each, 240 images a task
    (10000, 2, 500, 0, 20),
    (10001, 2, 500, 0, 21),     # never more than per_task a task
    (40, 2, 500, 0, 4),         # small inputs: two tasks a core, as before
    (3, 2, 500, 0, 3),          # never more tasks than items
    (0, 2, 500, 0, 1),
    (30607, 2, 256, 0, 120),    # batch inference's bound
    (1000, 2, 500, 2, 2),       # --num-partitions wins
    (10, 2, 500, 50, 10),
])
def test_tasks_hold_a_bounded_number_of_items_and_at_least_two_per_core(items, parallelism, per_task, requested,
                                                                      tasks):
    assert task_count(items, parallelism, per_task, requested) == tasks
    if not requested and items:
        assert -(-items // tasks) <= per_task


def test_the_etl_bounds_its_tasks_at_500_images_and_a_per_task_bound_below_1_is_refused():
    assert TASK_IMAGES == 500
    with pytest.raises(ValueError, match="per_task must be >= 1"):
        task_count(10, 2, 0)


def test_an_etl_split_is_cut_into_splits_of_about_256_rows(tmp_path):
    from pipelines.predict.config import PredictConfig
    from pipelines.predict.inputs import InputPlan
    from pipelines.predict.job import MAX_PARTITION_BYTES, OPEN_COST, TASK_IMAGES as PREDICT_TASK_IMAGES, \
        split_partitioning

    parts = []
    for i, size in enumerate((3 * 2**20, 1 * 2**20)):  # 4 MiB over 100 rows: 41,943 bytes a row
        parts.append(str(tmp_path / f"part-{i}.parquet"))
        with open(parts[-1], "wb") as f:
            f.write(b"\0" * size)
    config = PredictConfig(model=str(tmp_path / "m"), input=str(tmp_path / "etl" / "test"), output=str(tmp_path / "o"))
    split = InputPlan("etl", "etl/test", 100, 100, parts=parts)
    wanted = 4 * 2**20 * PREDICT_TASK_IMAGES // 100
    assert PREDICT_TASK_IMAGES == 256
    assert split_partitioning(config, split) == {MAX_PARTITION_BYTES: str(wanted), OPEN_COST: str(wanted // 8)}
    small = InputPlan("etl", "etl/test", 10000, 10000, parts=parts)  # 419 bytes a row: the 1 MiB floor
    assert split_partitioning(config, small) == {MAX_PARTITION_BYTES: str(2**20), OPEN_COST: str(2**17)}
    assert split_partitioning(config, InputPlan("tree", "t", 100, 100)) == {}
    config.num_partitions = 3
    assert split_partitioning(config, split) == {}


def test_a_slow_rate_keeps_two_significant_digits_never_reading_zero():
    assert progress_line("predict", 1, 18, 17.2) == "predict: 1/18 images (5 %), 0.058 images/s, 4 min 52 s left"
    assert progress_line("predict", 14, 18, 160.0) == "predict: 14/18 images (77 %), 0.087 images/s, 46 s left"
