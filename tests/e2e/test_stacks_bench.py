"""benchmarks/stacks_bench.py: both stacks' venvs train the same job on the same ETL output, taking
turns; the table names each stack's versions and the ratio; a stack's main job is read when it ran.

Needs both venvs (`make test` builds mission's, then current's before this part of the suite runs)."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.support.env import REPO as ROOT, subprocess_env

pytestmark = pytest.mark.slow  # once, on mission: the benchmark itself starts both stacks' venvs
BENCH = os.path.join(ROOT, "benchmarks", "stacks_bench.py")
VENVS = [os.path.join(ROOT, v, "bin", "python") for v in (".venv", ".venv-current")]


def run_bench(*args):
    return subprocess.run([sys.executable, BENCH, *args], cwd=ROOT, capture_output=True, text=True,
                          env=subprocess_env(), timeout=900)


def test_bad_arguments_exit_2_before_anything_runs(tmp_path):
    # whatever venvs exist: in a fresh clone the mission suite runs before current's venv is built
    no_data = run_bench("--data", str(tmp_path))
    assert no_data.returncode == 2 and "has no ETL manifest" in no_data.stderr
    zero = run_bench("--repeats", "0")
    assert zero.returncode == 2 and "must be >= 1" in zero.stderr
    one_folder = run_bench("--data", str(tmp_path), "--main-outputs", "out")
    assert one_folder.returncode == 2 and "takes two folders" in one_folder.stderr


@pytest.mark.skipif(not all(os.path.isfile(p) for p in VENVS),
                    reason="needs both stacks' venvs: make setup && make setup STACK=current")
def test_both_stacks_train_the_same_data_and_the_table_reports_each(tmp_path):
    code = ("import sys; from pipelines.tools.workspace import ensure_sample_etl; "
            "print(ensure_sample_etl(sys.argv[1], image_size=71, sample='fashion-mnist', per_class=4))")
    data = subprocess.run([sys.executable, "-c", code, str(tmp_path / "work")], capture_output=True, text=True,
                          env=subprocess_env(), timeout=600, check=True).stdout.strip().splitlines()[-1]
    mission_out = tmp_path / "mission-main"
    (mission_out / "train").mkdir(parents=True)
    metrics = {"test": {"accuracy": 0.6818, "count": 44}, "epochs_run": 9, "best_epoch": 6,
               "train_images_per_second": 7.25}
    (mission_out / "train" / "metrics.json").write_text(json.dumps(metrics))
    result = run_bench("--data", data, "--np", "1", "--batch-size", "4", "--steps", "1", "--warmup-steps", "1",
                       "--repeats", "2", "--backbone", "tiny", "--weights", "none",
                       "--main-outputs", f"{mission_out},{tmp_path / 'no-current-main'}", "--out", str(tmp_path / "b"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    # the stacks take turns going first
    order = re.findall(r"run (\d)/2, (\w+): ([\d.]+) images/s", out)
    assert [(r, s) for r, s, _ in order] == [("1", "mission"), ("1", "current"), ("2", "current"), ("2", "mission")]
    assert all(float(v) > 0 for *_, v in order)
    rows = {m.group(1): m.groups() for m in re.finditer(r"^(mission|current)\s+(3\.\d+\.\d+)\s+(2\.\d+\.\d+)\s+(0\.28\.1)"
                                                         r"\s+([\d.]+)\s+.*\s([\d.]+)$", out, re.M)}
    assert rows["mission"][1].startswith("3.11") and rows["mission"][2].startswith("2.15"), out
    assert rows["current"][1].startswith(("3.12", "3.13")) and rows["current"][2].startswith("2.21"), out
    assert rows["mission"][5] == "1.000"
    speeds = {s: sorted(float(v) for _, st, v in order if st == s) for s in ("mission", "current")}
    median = {s: sum(v) / 2 for s, v in speeds.items()}  # two runs: the median is their mean
    assert float(rows["current"][5]) == pytest.approx(median["current"] / median["mission"], abs=0.0015)
    assert "current / mission:" in out
    assert "mission  accuracy 0.6818 on 44 images, epochs 9 (best 6), 7.2 training images/s" in out
    assert "current  not run: make main STACK=current" in out
