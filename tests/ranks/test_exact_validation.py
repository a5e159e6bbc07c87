"""Each epoch's validation is the exact evaluation of the whole validation split (every image once,
summed over ranks), never of the test split, which is read once, after training; and no world size
is refused for an evaluated split: 5 ranks under horovodrun on the CPU, the tiny backbone, a test
split of 2 row groups and 4 rows, a validation split of 1 row group and 2 rows (both sharded by rows,
a row group's rows on several ranks; fewer rows than ranks: some ranks evaluate nothing)."""
import json
import os
import subprocess
import sys

import pytest

from tests.support.datagen import write_dataset
from tests.support.env import BIN, REPO, subprocess_env
from tests.support.outputs import assert_exact_test_count
from tests.support.readers import READERS

pytestmark = pytest.mark.slow
RANKS = 5


def horovodrun(np_, data, output, *args, timeout=900):
    job = [sys.executable, os.path.join(REPO, "jobs", "train.py"), "--data", data, "--output", output,
           "--weights", "none", "--backbone", "tiny", "--no-tensorboard", "--no-tracking", "--no-pictures", *args]
    cmd = [os.path.join(BIN, "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", *job]
    return subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=timeout)


@pytest.fixture(scope="module")
def five_ranks(tmp_path_factory):
    """One run: 5 ranks, 2 epochs, train 16 row groups of 2 rows (32 rows, uneven shards, a global
    batch of 10), test 4 rows in 2 row groups, validation 2 rows in 1; the default reader (the other
    is test_two_ranks_... below)."""
    base = tmp_path_factory.mktemp("five")
    data = str(base / "etl")
    write_dataset(data, train_groups=[16], test_groups=[1, 1], size=32, rows_per_group=2, validation_groups=[1])
    splits = json.load(open(os.path.join(data, "manifest.json")))["splits"]
    assert (splits["test"]["row_groups"], splits["test"]["rows"]) == (2, 4)
    assert (splits["validation"]["row_groups"], splits["validation"]["rows"]) == (1, 2)
    proc = horovodrun(RANKS, data, str(base / "out"), "--batch-size", "2", "--epochs", "2", "--patience", "5",
                      "--cache-dir", str(base / "cache"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    with open(base / "out" / "metrics.json") as f:
        return json.load(f), data, proc.stdout + proc.stderr


def test_five_ranks_train_on_evaluated_splits_of_fewer_row_groups_and_rows(five_ranks):
    report, data, _ = five_ranks
    assert report["world_size"] == RANKS and report["epochs_run_per_rank"] == [2] * RANKS
    assert_exact_test_count(report, data)


def test_each_epochs_validation_is_the_exact_validation_evaluation_never_the_test_split(five_ranks):
    """Every epoch's val_* figures count the 2 validation rows, each once (never the 4 test rows);
    the report gives the best epoch's validation figures, says which split chose it, and its test
    figures count the 4 test rows."""
    report, _, log = five_ranks
    assert report["selected_on"] == "validation"
    best = report["history"][report["best_epoch"] - 1]
    assert report["validation"] == {"epoch": report["best_epoch"], "loss": best["val_loss"],
                                    "accuracy": best["val_accuracy"], "count": 2, "expected_count": 2}
    assert report["test"]["count"] == report["test"]["expected_count"] == 4
    for epoch in report["history"]:  # a fraction of all validation rows, not of full global batches
        assert epoch["val_count"] == 2
        assert abs(epoch["val_accuracy"] * 2 - round(epoch["val_accuracy"] * 2)) < 1e-9
    assert "val_accuracy" in log  # rank 0's epoch line carries it


@pytest.mark.parametrize("reader", READERS)
def test_two_ranks_each_reader_validate_exactly_on_a_one_row_group_split(tmp_path, reader):
    data = str(tmp_path / "etl")
    write_dataset(data, train_groups=[4], test_groups=[1], size=32, rows_per_group=4)  # 1 test row group, 2 ranks
    proc = horovodrun(2, data, str(tmp_path / "out"), "--batch-size", "2", "--epochs", "2", "--reader", reader,
                      "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = json.load(open(tmp_path / "out" / "metrics.json"))
    assert_exact_test_count(report, data)
    assert [epoch["val_count"] for epoch in report["history"]] == [4, 4]  # the validation split's one row group
    assert report["validation"]["count"] == report["validation"]["expected_count"] == 4
    assert report["config"]["reader"] == reader


def test_totals_summed_over_ranks_by_either_route_are_the_sum_of_each_ranks(tmp_path):
    """allreduce_totals under horovodrun -np 2: the label pairs allgathered (50 classes, a few
    rows, one rank with none) or the matrix allreduced (3 classes), each the local sum of both
    ranks' totals; ranks of different numbers of classes are refused on both."""
    from pipelines.training.evaluate import gathers_pairs, sum_totals
    from tests.support.totals_ranks import CASES, rank_totals

    command = [os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
               sys.executable, os.path.join(REPO, "tests", "support", "totals_ranks.py"), str(tmp_path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=subprocess_env(PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert gathers_pairs(sum(CASES["gathered"][2:]), 50) and not gathers_pairs(sum(CASES["reduced"][2:]), 3)
    for rank in range(2):
        result = json.load(open(tmp_path / f"rank-{rank}.json"))
        for case in ("gathered", "gathered_one_empty", "reduced", "uncounted"):
            expected = sum_totals([rank_totals(case, 0), rank_totals(case, 1)])
            got = result[case]
            assert (got["correct"], got["count"], got["num_classes"]) == \
                (expected.correct, expected.count, expected.num_classes), (case, got)
            assert got["loss_sum"] == pytest.approx(expected.loss_sum, rel=1e-12), case
            assert got["confusion"] == expected.confusion_matrix().tolist(), case
        assert result["mismatched"] == {"error": "every rank must count the confusion of the same number of "
                                                 f"classes ({CASES['mismatched'][rank]} here)"}
