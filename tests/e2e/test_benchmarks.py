"""The benchmarks run end to end (real ETL, Horovod with Gloo, Petastorm) on a tiny sample.

Only that they run and report consistent figures is checked here (their refusals of a bad
flag: tests/unit/benchmarks/test_benchmarks.py): speed goals are read from the
benchmarks' own output on a real-sized run, never asserted by tests. The scaling benchmark's outputs
are checked in tests/e2e/test_gpu_check.py, from the GPU check's dry run, which runs it.
"""
import csv
import json
import os
import subprocess
import sys

import pytest

from tests.support.env import REPO as ROOT, subprocess_env


def _run(script, *args, timeout=900):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args], cwd=ROOT,
                            capture_output=True, text=True, env=subprocess_env(), timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
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
        assert (1 if r["path"] == "article" else 0) <= int(r["best_epoch"]) <= int(r["epochs"]) <= 2
        assert 0 < float(r["to_best_s"]) <= float(r["wall_s"])
    assert "speed-up of the feature cache:" in stdout and "goal (>= 5x less wall time" in stdout
    assert os.listdir(data / "features")  # the feature path computed its features next to the data


@pytest.mark.slow
def test_eval_benchmark_times_the_evaluation_and_the_report_at_each_width():
    stdout = _run("eval_bench.py", "--classes", "10,40", "--images", "64", "--repeats", "1", "--report-rows", "200",
                  "--report-calls", "1", "--before", "1", timeout=300)
    rows = {line.split()[0]: line.split() for line in stdout.splitlines() if line.split()[:1] in (["10"], ["40"])}
    assert set(rows) == {"10", "40"} and rows["10"][3] == rows["10"][6] == rows["10"][9] == "1.00x"
    assert len(rows["40"]) == 12  # the three figures, each with its median and ratio, and the two of before
    assert "goal (totals" not in stdout  # the bookkeeping alone is shown, its goal is the whole evaluation's
    for what in ("evaluation", "report"):
        assert f"goal ({what} at 40 classes within 1.2x of 10): " in stdout
