"""The benchmarks run end to end (real ETL, Horovod with Gloo, Petastorm) on a tiny sample.

Only that they run and report consistent figures is checked here: speed goals are read from the
benchmarks' own output on a real-sized run, never asserted by tests.
"""
import csv
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import subprocess_env

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script, *args, timeout=900):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args], cwd=ROOT,
                            capture_output=True, text=True, env=subprocess_env(), timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_scaling_benchmark_writes_rows_chart_and_allreduce_share(tmp_path):
    """With the tiny backbone's top block trained (--fine-tune-blocks 1), every point measured with
    float32 and float16 allreduce (--compare-fp16), and two lone world-size-1 jobs at once (--co-run).
    One batch size: a second repeats the same code path, and each point is a horovodrun of its own
    (the suite's time on 2 cores)."""
    out = tmp_path / "scaling"
    stdout = _run("scaling.py", "--np", "1,2", "--batch-sizes", "4", "--headline-batch", "4",
                  "--warmup-steps", "1", "--steps", "2", "--per-class", "4", "--etl-image-size", "71", "--backbone", "tiny",
                  "--fine-tune-blocks", "1", "--compare-fp16", "--co-run", "--out", str(out))
    co_run = re.findall(r"co-run, batch (\d)( \(fp16 variant\))?: 2 lone world-size-1 jobs at once ([\d.]+) images/s, "
                        r"([\d.]+) of 2 x world size 1 alone \(the machine's own bound\); Horovod at np=2: ([\d.]+)",
                        stdout)
    assert [(b, bool(fp16)) for b, fp16, *_ in co_run] == [("4", False), ("4", True)], stdout
    with open(out / "scaling.csv") as f:
        rows = list(csv.DictReader(f))
    # The co-run's share is its images/s over 2 x world size 1's, and its Horovod figure np=2's
    # efficiency: both checked against the CSV. Not a bound such as "below 2": each figure is timed
    # on its own, and on a loaded machine (the suite's other workers) one lone job may be timed in a
    # busier moment than the two at once.
    table = {(r["world_size"], r["fp16_allreduce"]): r for r in rows}
    for _, fp16, images, share, horovod in co_run:
        variant = str(bool(fp16))
        assert float(images) > 0
        assert float(share) == pytest.approx(float(images) / (2 * float(table["1", variant]["images_per_second"])),
                                             rel=0.03, abs=0.002)
        assert float(horovod) == pytest.approx(float(table["2", variant]["scaling_efficiency"]), abs=0.002)
    points = [("1", "4"), ("2", "4")]
    assert [(r["world_size"], r["batch_size_per_rank"], r["fp16_allreduce"]) for r in rows] == \
        [(*p, "False") for p in points] + [(*p, "True") for p in points]
    # hand-computed values (the formulas are tested on hand-made points in tests/test_measure.py)
    assert [int(r["global_batch_size"]) for r in rows] == [4, 8] * 2
    assert [int(r["steps"]) for r in rows] == [2] * 4
    # trainable: tiny_block2_conv (3x3x16x32 + 32), tiny_block2_bn (gamma, beta: 2x32), head (32x10 + 10)
    parameters = 9 * 16 * 32 + 32 + 2 * 32 + 32 * 10 + 10
    assert [int(r["allreduce_bytes_per_step"]) for r in rows] == [4 * parameters] * 2 + [2 * parameters] * 2
    assert all(float(r["images_per_second"]) > 0 and float(r["seconds"]) > 0 for r in rows)
    one = [r for r in rows if r["world_size"] == "1"]
    assert [(float(r["speed_up"]), float(r["scaling_efficiency"])) for r in one] == [(1.0, 1.0)] * 2
    two = [r for r in rows if r["world_size"] == "2"]
    assert all(float(r["allreduce_share"]) > 0 for r in two), "the timeline recorded no allreduce at np=2"
    assert (out / "scaling.png").stat().st_size > 10_000
    assert sorted(os.listdir(out / "timelines")) == sorted(f"np{n}-b4{s}.json" for n in (1, 2)
                                                           for s in ("", "-fp16"))
    assert "goal (scaling efficiency at np=2, batch 4 per rank, >= 0.9)" in stdout
    assert "goal (scaling efficiency at np=2, batch 4 per rank, fp16 allreduce, >= 0.9)" in stdout


def test_time_to_accuracy_benchmark_runs_both_paths(tmp_path):
    work, table = tmp_path / "work", tmp_path / "tta.csv"
    stdout = _run("time_to_accuracy.py", "--per-class", "4", "--etl-image-size", "71", "--repeats", "1",
                  "--epochs", "2", "--batch-size", "2", "--backbone", "tiny", "--workdir", str(work),
                  "--csv", str(table))
    with open(table) as f:
        rows = list(csv.DictReader(f))
    assert [(r["path"], r["seed"]) for r in rows] == [("article", "42"), ("feature cache", "42")]
    data = work / "data-fashion-mnist-4-71px" / "etl"
    with open(data / "manifest.json") as f:
        test_rows = json.load(f)["splits"]["test"]["rows"]
    for r in rows:
        assert int(r["test_images"]) == test_rows  # exact evaluation: every test image once
        assert 1 <= int(r["best_epoch"]) <= int(r["epochs"]) <= 2
        assert 0 < float(r["to_best_s"]) <= float(r["wall_s"])
    assert "speed-up of the feature cache:" in stdout and "goal (>= 5x less wall time" in stdout
    assert os.listdir(data / "features")  # the feature path computed its features next to the data
