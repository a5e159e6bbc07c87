"""MLflow tracking options (no MLflow import) and the tracker on a local SQLite store (no training).

The end-to-end checks ride on training and ETL runs the suite makes anyway: the Horovod run and
the kill-and-resume run of ``test_training_hvd.py``, a run against a real ``mlflow server`` there,
and the ``spark-submit`` run of ``test_etl_job.py``.
"""
import json
import os

import pytest

from pipelines import tracking
from pipelines.config import parse_config
from pipelines.etl.config import ETLConfig
from pipelines.training.config import TrainConfig

TRAIN_ARGS = ["--data", "d", "--output", "out"]


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("PIPELINES_TRACKING", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return monkeypatch


def test_on_by_default_in_a_sqlite_store_of_the_output(no_env, tmp_path):
    no_env.chdir(tmp_path)
    config = parse_config(TrainConfig, TRAIN_ARGS)
    assert config.tracking and config.tracking_uri == f"sqlite:///{tmp_path}/out/mlruns.db"
    assert config.experiment == "pipelines-train" and config.register_model == ""
    assert tracking.artifact_root(config.tracking_uri) == str(tmp_path / "out" / "mlruns")
    relative = parse_config(TrainConfig, TRAIN_ARGS + ["--tracking-uri", "sqlite:///runs/x.db"]).tracking_uri
    assert relative == f"sqlite:///{tmp_path}/runs/x.db"  # ranks may start elsewhere
    etl = parse_config(ETLConfig, ["--input", "in", "--output", "etl"])
    assert etl.tracking and etl.tracking_uri == f"sqlite:///{tmp_path}/etl/mlruns.db"
    assert etl.experiment == "pipelines-etl"


def test_the_flag_beats_the_environment_which_beats_the_default(no_env):
    no_env.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert parse_config(TrainConfig, TRAIN_ARGS).tracking_uri == "http://tracking.example:5000"
    given = parse_config(TrainConfig, TRAIN_ARGS + ["--tracking-uri", "http://127.0.0.1:1"])
    assert given.tracking_uri == "http://127.0.0.1:1"
    no_env.setenv("PIPELINES_TRACKING", "0")
    assert not parse_config(TrainConfig, TRAIN_ARGS).tracking
    assert parse_config(TrainConfig, TRAIN_ARGS + ["--tracking"]).tracking
    no_env.delenv("PIPELINES_TRACKING")
    assert not parse_config(TrainConfig, TRAIN_ARGS + ["--no-tracking"]).tracking
    assert not parse_config(ETLConfig, ["--input", "i", "--output", "o", "--no-tracking"]).tracking


@pytest.mark.parametrize("args, message", [
    (["--no-tracking", "--register-model", "m"], "--register-model needs tracking"),
    (["--experiment", ""], "--experiment must not be empty"),
])
def test_refused_on_the_command_line_with_exit_2(no_env, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        parse_config(TrainConfig, TRAIN_ARGS + args)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_a_recorded_run_counts_only_for_its_store(tmp_path):
    uri = tracking.default_uri(str(tmp_path))
    assert tracking.recorded_run(str(tmp_path), uri) is None
    (tmp_path / tracking.RUN_FILE).write_text(json.dumps({"run_id": "abc", "tracking_uri": uri}))
    assert tracking.recorded_run(str(tmp_path), uri) == "abc"
    assert tracking.recorded_run(str(tmp_path), "http://127.0.0.1:5000") is None
    assert tracking.artifact_root("http://127.0.0.1:5000") is None


@pytest.mark.slow  # imports MLflow and creates a SQLite store: about 10 s here
def test_a_run_continues_with_immutable_params_and_tracking_failures_never_stop_training(tmp_path, monkeypatch):
    """In one process: start, log epochs, continue the recorded run (a changed param becomes a
    tag), then an epoch that cannot be logged is reported and skipped, and the results that cannot
    be logged raise TrackingFailed saying the output is complete. MLflow writes nothing where the
    job was started (the store's experiments, its default one too, keep their artifacts beside
    it) and leaves neither MLFLOW_TRACKING_URI nor its store as the process's tracking URI behind."""
    import mlflow
    out, uri = str(tmp_path / "out"), tracking.default_uri(str(tmp_path / "out"))
    os.makedirs(out)
    (tmp_path / "started-here").mkdir()
    monkeypatch.chdir(tmp_path / "started-here")
    with tracking.start(uri, "unit", out, "first", {"epochs": 2, "seed": 1}) as first:
        first.log_epoch(1, {"loss": 1.0})
    with tracking.start(uri, "unit", out, params={"epochs": 3, "seed": 1, "new": "x"}, continue_run=True) as again:
        assert again.run_id == first.run_id
        history = [{"epoch": 1, "loss": 1.0}, {"epoch": 2, "loss": 0.5}]
        with monkeypatch.context() as broken:
            broken.setattr(mlflow, "log_metrics", _refuse)
            again.log_epoch(2, {"loss": 0.5})  # reported, not raised
            again.log_epoch(3, {"loss": 0.25})  # skipped after the first failure
            assert "store went away" in again.epoch_error
            with pytest.raises(tracking.TrackingFailed, match=f"the output in {out} is complete"):
                again.log_results({"test_accuracy": 1.0}, history=history)
        again.log_results({"test_accuracy": 1.0}, history=history)  # the epoch that failed, logged now
    client = mlflow.MlflowClient(uri)
    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "first"
    assert run.data.params == {"epochs": "2", "seed": "1", "new": "x"} and run.data.tags["resumed_with.epochs"] == "3"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [(1, 1.0), (2, 0.5)]
    assert run.info.artifact_uri == os.path.join(out, "mlruns", run.info.experiment_id, run.info.run_id, "artifacts")
    assert client.get_experiment("0").artifact_location == os.path.join(out, "mlruns", "0")
    assert len(client.search_runs([run.info.experiment_id])) == 1
    assert os.listdir(tmp_path / "started-here") == [] and os.getcwd() == str(tmp_path / "started-here")
    # the store was the jobs' only, never exported: a later job here, or a child, resolves its own
    assert tracking._process_tracking_uri() is None and "MLFLOW_TRACKING_URI" not in os.environ
    users = "sqlite:///" + str(tmp_path / "users.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", users)
    with tracking.using_store(uri):
        assert mlflow.get_tracking_uri() == uri
    assert mlflow.get_tracking_uri() == users  # the user's choice again (a notebook's models:/ after its ETL)


def _refuse(*args, **kwargs):
    raise ConnectionError("store went away")


@pytest.mark.slow  # imports MLflow and creates a SQLite store twice: about 15 s here
def test_an_output_deleted_and_made_again_gets_a_store_again_in_the_same_process(tmp_path):
    """A notebook deletes a job's output and runs the job to the same folder again, in one kernel:
    the second run gets a new store in the new folder (MLflow's cached store of the deleted file
    failed with "attempt to write a readonly database"), and holds that run alone."""
    import shutil

    out = tmp_path / "out"
    uri = tracking.default_uri(str(out))
    for attempt in (1, 2, 3):
        out.mkdir()
        with tracking.start(uri, "unit", str(out), f"attempt-{attempt}", {"attempt": attempt}) as tracker:
            tracker.log_epoch(1, {"loss": 1.0 / attempt})
        with tracking.using_store(uri) as client:
            runs = client.search_runs([client.get_experiment_by_name("unit").experiment_id])
        assert [(r.info.run_name, r.data.params, r.info.status) for r in runs] == \
            [(f"attempt-{attempt}", {"attempt": str(attempt)}, "FINISHED")]
        assert os.path.exists(out / tracking.STORE_FILE)
        shutil.rmtree(out)


def test_opening_a_store_prints_nothing_unless_verbose(tmp_path):
    """Opening a SQLite store imports alembic, which logs its plugins and migrations at INFO: none
    of it shows, for a new store, a deleted one made again (the path that drops MLflow's caches
    first) and an existing one, even where the root logger shows INFO (a notebook or benchmark
    that ran ``pipelines.tools.samples`` in-process); ``PIPELINES_VERBOSE=1`` shows it."""
    import subprocess
    import sys

    script = ("import logging, os, sys; logging.basicConfig(level=logging.INFO)\n"
              "from pipelines.tracking import open_store\n"
              "uri = 'sqlite:///' + sys.argv[1]\n"
              "open_store(uri); os.remove(sys.argv[1]); open_store(uri); print('opened')\n")
    db = str(tmp_path / "mlflow.db")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for verbose in ("", "", "1"):  # the second run finds the store of the first
        env = {**os.environ, "PIPELINES_VERBOSE": verbose, "PYTHONPATH": repo}
        done = subprocess.run([sys.executable, "-c", script, db], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert done.returncode == 0 and "opened" in done.stdout, done.stderr
        noise = [line for line in (done.stdout + done.stderr).splitlines() if line != "opened"]
        assert bool(verbose) == any("alembic" in line for line in noise), noise
        if not verbose:
            assert noise == []
