"""The search end to end: its runners on local Spark with a real MLflow store (SQLite), and
jobs/tune.py through spark-submit on a real feature cache of a tiny ETL output."""
import json
import os
import subprocess

import pytest

from pipelines.etl.config import ETLConfig
from pipelines.etl.job import run_etl
from pipelines.tune.config import TuneConfig
from pipelines.tune.runners import PARENT_TAG, has_mlflow_spark_study, log_trial_metrics, run_ask_tell, run_mlflow_spark
from pipelines.tune.space import significant
from tests.support.env import BIN, REPO, subprocess_env
from tests.support.imagegen import make_tree
from tests.support.training import train
from tests.support.tune_trials import DIVERGES_ABOVE, settled_trial

pytestmark = [pytest.mark.slow, pytest.mark.current]
#: The runners this stack's MLflow has: ask-tell everywhere, MlflowSparkStudy from MLflow 3.
RUNNERS = ["ask-tell"] + (["mlflow-spark"] if has_mlflow_spark_study() else [])


def _store(tmp_path):
    from pipelines import tracking as trk

    uri = f"sqlite:///{tmp_path}/mlruns.db"
    client = trk.open_store(uri, create=True)
    return uri, client, client.create_experiment("tune-runners")


def _children(client, experiment_id, parent):
    return client.search_runs([experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent}'")


@pytest.mark.parametrize("runner", RUNNERS)
def test_each_trial_is_a_child_run_and_a_diverging_one_fails_while_the_search_goes_on(runner, spark, tmp_path):
    uri, client, experiment_id = _store(tmp_path)
    space = TuneConfig(data=str(tmp_path), output=str(tmp_path), backbone="tiny", weights="none").space()
    if runner == "ask-tell":
        parent, records = run_ask_tell(space, settled_trial, 6, 2, 5, client, experiment_id, "search", spark)
    else:  # one task: the sampler keeps its seed (parallel tasks reseed their copies)
        parent, records = run_mlflow_spark(space, settled_trial, 6, 1, 5, uri, experiment_id, "search")
    log_trial_metrics(client, records)
    assert [r.number for r in records] == list(range(6))
    diverged = [r.settings.base_lr > DIVERGES_ABOVE for r in records]
    assert any(diverged) and not all(diverged)  # this seed draws both kinds
    runs = {run.info.run_id: run for run in _children(client, experiment_id, parent)}
    assert sorted(runs) == sorted(r.run_id for r in records)
    for record, failed in zip(records, diverged):
        run = runs[record.run_id]
        assert run.info.status == ("FAILED" if failed else "FINISHED")
        assert (record.result is None) == failed and (record.error is not None) == failed
        # the run's param is the drawn value (MLflow's Spark study logs Optuna's own); the settings keep it
        # to DIGITS significant digits
        assert significant(float(run.data.params["base_lr"])) == record.settings.base_lr
        if not failed:
            assert run.data.metrics["val_loss"] == record.result["val_loss"] == record.settings.dropout + 1.0


@pytest.fixture(scope="module")
def feature_cache(tmp_path_factory, spark):
    """A tiny real ETL output and the feature cache of the tiny backbone with random weights on it."""
    base = tmp_path_factory.mktemp("tune-data")
    make_tree(str(base / "tree"), classes=3, per_class=16, bad=False)
    data = str(base / "etl")
    run_etl(ETLConfig(input=str(base / "tree"), output=data, image_size=32, test_fraction=0.3,
                      validation_fraction=0.25, min_row_groups=2), spark)
    made = train(data, str(base / "train"), "--epochs", "1", "--feature-cache", np_=0)
    assert made.returncode == 0, made.stderr[-3000:]
    return data


def test_the_job_searches_through_spark_chooses_on_validation_and_reads_test_once(feature_cache, tmp_path):
    from mlflow import MlflowClient

    out = str(tmp_path / "tune")
    cmd = [os.path.join(BIN, "spark-submit"), "--master", "local[2]", os.path.join(REPO, "jobs", "tune.py"),
           "--data", feature_cache, "--output", out, "--backbone", "tiny", "--weights", "none",
           "--trials", "3", "--parallel", "2", "--epochs", "8", "--batch-size", "4", "--run-name", "tiny-search"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(out, "tune.json")) as f:
        record = json.load(f)
    client = MlflowClient(f"sqlite:///{out}/mlruns.db")
    parent = client.get_run(record["run_id"])
    children = _children(client, parent.info.experiment_id, parent.info.run_id)
    assert len(children) == 3 and all(run.info.status == "FINISHED" for run in children)
    # chosen on validation: the child run of the lowest val_loss, as MLflow holds them
    best = min(children, key=lambda run: run.data.metrics["val_loss"])
    chosen = record["chosen"]
    assert best.info.run_id == record["trials"][chosen["number"]]["run_id"]
    # the test split read once, by the refit of the chosen settings, and logged on the search's run only
    assert all(not any(name.startswith("test") for name in run.data.metrics) for run in children)
    assert all(trial["result"]["test_accuracy"] is None for trial in record["trials"])
    assert len(client.get_metric_history(parent.info.run_id, "best.test_accuracy")) == 1
    assert parent.data.metrics["best.test_accuracy"] == chosen["refit"]["test_accuracy"]
    # the refit with the same seed is the chosen trial's head again
    assert chosen["refit"]["val_loss"] == best.data.metrics["val_loss"] == chosen["trial"]["val_loss"]
    flags = chosen["train_flags"]
    assert parent.data.tags["best.train_flags"] == flags and f"jobs/train.py flags: {flags}" in proc.stdout
    assert flags.split()[::2] == ["--base-lr", "--dropout", "--weight-decay", "--patience-steps"]
    assert record["runner"] == RUNNERS[-1] and parent.data.tags["mlflow.runName"] == "tiny-search"
