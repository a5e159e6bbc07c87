"""MLflow tracking options (no MLflow import) and the tracker on a local SQLite store (no training).

The end-to-end checks ride on training and ETL runs the suite makes anyway: the Horovod run and
the kill-and-resume run of ``test_training_hvd.py``, a run against a real ``mlflow server`` there
(with credentials in its URI and in ``--storage-option``: none reaches a file, the store or a log),
the ``spark-submit`` run of ``test_etl_job.py``, the S3 ETL of ``test_etl_s3.py`` (secrets, a fresh
HOME's default store) and the ``models:/`` runs of ``test_predict_job.py`` (a relative store URI).
"""
import json
import os
import stat
import subprocess
import sys
import time

import pytest

from pipelines import tracking
from pipelines.runtime.config import parse_config
from pipelines.runtime.environment import read_settings
from pipelines.etl.config import ETLConfig
from pipelines.training.config import TrainConfig
from tests.support.env import REPO

TRAIN_ARGS = ["--data", "d", "--output", "out"]


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("PIPELINES_TRACKING", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return monkeypatch


def test_on_by_default_in_a_sqlite_store_of_the_output(no_env, tmp_path):
    no_env.chdir(tmp_path)
    config = parse_config(TrainConfig, TRAIN_ARGS)
    assert config.outputs.tracking and config.outputs.tracking_uri == f"sqlite:///{tmp_path}/out/mlruns.db"
    assert config.outputs.experiment == "pipelines-train" and config.outputs.register_model == ""
    assert tracking.artifact_root(config.outputs.tracking_uri) == str(tmp_path / "out" / "mlruns")
    relative = parse_config(TrainConfig, TRAIN_ARGS + ["--tracking-uri", "sqlite:///runs/x.db"]).outputs.tracking_uri
    assert relative == f"sqlite:///{tmp_path}/runs/x.db"  # ranks may start elsewhere
    etl = parse_config(ETLConfig, ["--input", "in", "--output", "etl"])
    assert etl.tracking and etl.tracking_uri == f"sqlite:///{tmp_path}/etl/mlruns.db"
    assert etl.experiment == "pipelines-etl"


def test_the_flag_beats_the_environment_which_beats_the_default(no_env):
    no_env.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert parse_config(TrainConfig, TRAIN_ARGS).outputs.tracking_uri == "http://tracking.example:5000"
    given = parse_config(TrainConfig, TRAIN_ARGS + ["--tracking-uri", "http://127.0.0.1:1"])
    assert given.outputs.tracking_uri == "http://127.0.0.1:1"
    no_env.setenv("PIPELINES_TRACKING", "0")
    assert not parse_config(TrainConfig, TRAIN_ARGS).outputs.tracking
    assert parse_config(TrainConfig, TRAIN_ARGS + ["--tracking"]).outputs.tracking
    no_env.delenv("PIPELINES_TRACKING")
    assert not parse_config(TrainConfig, TRAIN_ARGS + ["--no-tracking"]).outputs.tracking
    assert not parse_config(ETLConfig, ["--input", "i", "--output", "o", "--no-tracking"]).tracking


@pytest.mark.parametrize("args, message", [
    (["--no-tracking", "--register-model", "m"], "--register-model needs tracking"),
    (["--experiment", ""], "--experiment must not be empty"),
    (["--experiment", "e" * 501], "--experiment is 501 characters long: MLflow takes at most 500"),
])
def test_refused_on_the_command_line_with_exit_2(no_env, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        parse_config(TrainConfig, TRAIN_ARGS + args)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_the_longest_experiment_name_is_the_installed_mlflows():
    from mlflow.utils.validation import MAX_EXPERIMENT_NAME_LENGTH

    assert tracking.MAX_EXPERIMENT_NAME == MAX_EXPERIMENT_NAME_LENGTH
    assert parse_config(TrainConfig, TRAIN_ARGS + ["--experiment", "e" * 500]).outputs.experiment == "e" * 500


# Whether MLflow 2.22 and MLflow 3 refuse a registered model name: on a database store (their
# utils.validation._validate_model_name), and on a file store (model_registry.file_store's).
MODEL_NAMES = {  # name: ((2.22 database, 2.22 file), (3 database, 3 file))
    "xception-caltech_2": ((False, False), (False, False)),
    "team/xception": ((False, True), (True, True)),
    "xception:v2": ((False, False), (True, True)),
    "   ": ((False, False), (True, True)),
    "..x": ((False, False), (True, True)),  # not a normalised relative path to MLflow 3
    "100%": ((False, True), (False, True)),
}


@pytest.mark.parametrize("store", ["database", "file"])
@pytest.mark.parametrize("name", list(MODEL_NAMES))
def test_a_registered_model_name_is_judged_by_the_installed_mlflow_before_any_rank(no_env, capsys, tmp_path,
                                                                                   name, store):
    """Exit 2 on the command line, before the training, where the registry would refuse the name
    after it (MLflow 3 forbids ``/`` and ``:``, 2.22 takes them)."""
    from importlib.metadata import version

    refused = MODEL_NAMES[name][int(version("mlflow").split(".")[0]) >= 3][store == "file"]
    uri = f"sqlite:///{tmp_path}/m.db" if store == "database" else str(tmp_path / "mlruns")
    no_env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses a file store without it
    args = TRAIN_ARGS + ["--tracking-uri", uri, "--register-model", name]
    if not refused:
        assert parse_config(TrainConfig, args).outputs.register_model == name
        return
    with pytest.raises(SystemExit) as info:
        parse_config(TrainConfig, args)
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"--register-model {name!r}: MLflow {version('mlflow')}'s registry refuses" in err


def test_a_file_store_is_refused_before_any_rank_where_the_installed_mlflow_refuses_it(no_env, capsys, tmp_path):
    """MLflow 3.17 refuses a file store when the job starts logging unless MLFLOW_ALLOW_FILE_STORE
    is true; 2.22 takes it. (The mission stack pins 2.22, the current one 3.17.)"""
    from importlib.metadata import version

    no_env.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    args = TRAIN_ARGS + ["--tracking-uri", str(tmp_path / "mlruns")]
    if version("mlflow").startswith("2."):
        assert parse_config(TrainConfig, args).outputs.tracking_uri == str(tmp_path / "mlruns")
        return
    with pytest.raises(SystemExit) as info:
        parse_config(TrainConfig, args)
    assert info.value.code == 2 and "refuses a file store" in capsys.readouterr().err
    no_env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert parse_config(TrainConfig, args).outputs.tracking_uri == str(tmp_path / "mlruns")


def test_a_recorded_run_counts_only_for_its_store(tmp_path):
    uri = tracking.default_uri(str(tmp_path), "/unused")
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
    out, uri = str(tmp_path / "out"), tracking.default_uri(str(tmp_path / "out"), "/unused")
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
    assert tracking.store._process_tracking_uri() is None and "MLFLOW_TRACKING_URI" not in os.environ
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
    uri = tracking.default_uri(str(out), "/unused")
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


@pytest.mark.slow  # three interpreters, each importing MLflow twice (the store made again in a child)
def test_opening_a_store_prints_nothing_unless_verbose(tmp_path):
    """Opening a SQLite store imports alembic, which logs its plugins and migrations at INFO, and
    MLflow logs its set-up: none of it shows, for a new store, a deleted one made again (in a child
    process) and an existing one, even where the root logger shows INFO (a notebook or benchmark
    that ran ``pipelines.tools.samples`` in-process); ``PIPELINES_VERBOSE=1`` shows it."""
    import subprocess
    import sys

    script = ("import logging, os, sys; logging.basicConfig(level=logging.INFO)\n"
              "from pipelines.runtime.environment import read_settings; from pipelines.runtime.quiet import quiet_by_default\n"
              "quiet_by_default(read_settings().verbose)  # an entry point's set-up\n"
              "from pipelines.tracking import open_store\n"
              "uri = 'sqlite:///' + sys.argv[1]\n"
              "open_store(uri, create=True); os.remove(sys.argv[1]); open_store(uri, create=True); print('opened')\n")
    db = str(tmp_path / "mlflow.db")
    repo = REPO
    for verbose in ("", "", "1"):  # the second run finds the store of the first
        env = {**os.environ, "PIPELINES_VERBOSE": verbose, "PYTHONPATH": repo}
        done = subprocess.run([sys.executable, "-c", script, db], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert done.returncode == 0 and "opened" in done.stdout, done.stderr
        noise = [line for line in (done.stdout + done.stderr).splitlines() if line != "opened"]
        # the set-up's lines: alembic's (MLflow 2.22), MLflow's own "... database tables" (both)
        assert bool(verbose) == any("alembic" in line or "database tables" in line for line in noise), noise
        if not verbose:
            assert noise == []


def test_relative_sqlite_uris_are_made_absolute_once(no_env, tmp_path):
    """Where a URI enters (a config; ``$MLFLOW_TRACKING_URI``), against the directory the job was
    started in; other URIs as they are."""
    no_env.chdir(tmp_path)
    assert tracking.absolute("sqlite:///out/train/mlruns.db") == f"sqlite:///{tmp_path}/out/train/mlruns.db"
    assert tracking.absolute("sqlite:///./x.db") == f"sqlite:///{tmp_path}/x.db"
    for uri in (f"sqlite:///{tmp_path}/a.db", "sqlite:///:memory:", "http://h:5000", "databricks", "file:///x"):
        assert tracking.absolute(uri) == uri
    no_env.setenv("MLFLOW_TRACKING_URI", "sqlite:///out/train/mlruns.db")
    assert parse_config(TrainConfig, TRAIN_ARGS).outputs.tracking_uri == f"sqlite:///{tmp_path}/out/train/mlruns.db"


def test_a_sqlite_store_that_cannot_be_made_is_refused_before_any_work_without_mlflow(tmp_path):
    """check_store (the drivers call it before Spark or any rank starts): a folder that cannot be
    made, a folder where the file should be, a file that is no database; one line, exit code 2's
    exception, without MLflow (which would retry such a store for about 100 s)."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder.db").mkdir()
    (tmp_path / "notes.db").write_text("not a database " * 100)
    cases = [(f"sqlite:///{tmp_path}/file/sub/mlruns.db", f"{tmp_path}/file is not a folder"),
             (f"sqlite:///{tmp_path}/folder.db", f"{tmp_path}/folder.db is a folder"),
             (f"sqlite:///{tmp_path}/notes.db", "is not a SQLite database")]
    for uri, message in cases:
        with pytest.raises(tracking.TrackingUnavailable) as refused:
            tracking.check_store(uri)
        assert isinstance(refused.value, ValueError) and message in str(refused.value), str(refused.value)
        assert "\n" not in str(refused.value)
    tracking.check_store(f"sqlite:///{tmp_path}/new/deeper/mlruns.db")  # can be made: made later, by the job
    assert not (tmp_path / "new").exists()


def test_mlflow_event_lines_are_written_on_masked_or_dropped_when_quiet(capsys, monkeypatch):
    """Ending a run on a server prints "View run ... at: URL" with the URI's credentials (seen on a
    real server: test_training_hvd.py); the lines MLflow prints in a tracking block are masked."""
    from pipelines.runtime import quiet
    monkeypatch.setattr(quiet, "_verbose", False)  # this process's set-up: quiet
    with tracking.runs._events():
        print("🏃 View run r at: http://alice:hunter2@127.0.0.1:5000/#/experiments/1/runs/x")  # MLflow 2.22, 3.17
        print("warning at https://bob:pw@h", file=sys.stderr)
    assert capsys.readouterr() == ("🏃 View run r at: http://***@127.0.0.1:5000/#/experiments/1/runs/x\n",
                                   "warning at https://***@h\n")
    with tracking.runs._events(quiet=True):
        print("Successfully registered model 'm'.", file=sys.stderr)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(quiet, "_verbose", True)  # set up verbose (quiet_by_default(True), a rank's quiet_libraries)
    with tracking.runs._events(quiet=True):
        print("Created version '1' at http://u:p@h", file=sys.stderr)
    assert capsys.readouterr().err == "Created version '1' at http://***@h\n"


def test_a_recorded_run_is_found_under_its_masked_uri(tmp_path):
    """mlflow_run.json keeps the store's URI with its credentials masked; a resumed run with the
    same credentials (or others for the same server) still finds its run."""
    (tmp_path / tracking.RUN_FILE).write_text(json.dumps({"run_id": "abc", "tracking_uri": "http://***@h:5000"}))
    assert tracking.recorded_run(str(tmp_path), "http://alice:hunter2@h:5000") == "abc"
    assert tracking.recorded_run(str(tmp_path), "http://h:5000") is None


SECRETS = {"access_key": "AKIDSECRETID", "secret_key": "S3CR3T-KEY", "session_token": "T0K3N"}


def _files_holding(root, secrets):
    """``{path: [secret, ...]}`` for every file below ``root`` holding any of ``secrets`` (bytes)."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read()
            hits = [s for s in secrets if s.encode() in data]
            if hits:
                found[os.path.join(folder, name)] = hits
    return found


@pytest.mark.slow  # imports MLflow and creates a SQLite store: about 10 s here
def test_no_secret_reaches_the_store_the_run_file_or_the_log(tmp_path, monkeypatch, caplog):
    """Params with --storage-option secrets nested in the config, a tracking URI with credentials
    among them, tags and results quoting them, an artifact holding the redacted config, a refusal
    naming a server with credentials: the store (database and artifacts), mlflow_run.json and the
    log hold none of it, keys kept; the run file and the store are owner-only."""
    import logging

    from pipelines.runtime.redact import redact

    caplog.set_level(logging.INFO, logger="pipelines")
    out = tmp_path / "out"
    out.mkdir()
    uri = tracking.default_uri(str(out), "/unused")
    config = {"data": "s3://b/etl", "storage_options": dict(SECRETS), "tracking_uri": "http://alice:hunter2@h:5000",
              "nested": {"deeper": [{"session_token": SECRETS["session_token"]}]}}
    tags = {"cmd": f"--storage-option secret_key={SECRETS['secret_key']}"}
    with tracking.start(uri, "unit", str(out), "secrets", config, tags) as run:
        report = out / "metrics.json"
        report.write_text(json.dumps({"config": redact(config)}))
        run.log_results({"test_accuracy": 1.0}, {"store": "postgresql://u:hunter2@db/x"}, [(str(report), None)])
    with pytest.raises(tracking.TrackingUnavailable) as refused:
        tracking.check_store("http://alice:hunter2@127.0.0.1:1")
    secrets = [*SECRETS.values(), "hunter2", "alice"]
    assert not [s for s in secrets if s in str(refused.value)], str(refused.value)
    assert "http://***@127.0.0.1:1" in str(refused.value)
    assert _files_holding(tmp_path, secrets) == {}  # the SQLite store, its artifacts, the run file
    assert not [s for s in secrets if s in caplog.text], caplog.text
    client = tracking.open_store(uri)
    params = client.get_run(run.run_id).data.params
    assert json.loads(params["storage_options"].replace("'", '"')) == {key: "***" for key in SECRETS}
    assert params["tracking_uri"] == "http://***@h:5000"
    for path in (out / tracking.RUN_FILE, out / tracking.STORE_FILE):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path


@pytest.mark.slow  # imports MLflow: a few seconds
def test_a_fresh_home_gets_its_default_store_folder(tmp_path, monkeypatch):
    """An output on an object store keeps its run in ~/pipelines-work/mlflow/mlruns.db: on a machine
    where that folder does not exist yet it is made (owner-only), not refused with FileNotFoundError."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PIPELINES_WORKDIR", raising=False)
    uri = tracking.default_uri("s3://bucket/etl", read_settings().workdir)
    assert uri == f"sqlite:///{home}/pipelines-work/mlflow/mlruns.db"
    out = tmp_path / "out"  # stands for the bucket: the run file goes to the output
    out.mkdir()
    with tracking.start(uri, "unit", str(out), "fresh", {"a": 1}):
        pass
    assert (home / "pipelines-work" / "mlflow" / "mlruns.db").is_file()
    assert stat.S_IMODE(os.stat(home / "pipelines-work" / "mlflow").st_mode) == 0o700


@pytest.mark.slow  # imports MLflow
def test_a_store_that_cannot_be_opened_is_refused_at_once_by_name(tmp_path, monkeypatch):
    """No store at a (relative) path, a file that is no SQLite database, a half-made store: one
    line naming it, in seconds (MLflow itself retried for about 100 s, then printed a traceback)."""
    import sqlite3

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.db").write_text("not a database " * 100)
    with sqlite3.connect(tmp_path / "half.db") as db:  # tables but no schema version: a set-up cut short
        db.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT)")
    cases = [("sqlite:///missing/mlruns.db", False, f"no store file {tmp_path}/missing/mlruns.db"),
             ("sqlite:///notes.db", False, f"{tmp_path}/notes.db is not a SQLite database"),
             ("sqlite:///half.db", True, f"if {tmp_path}/half.db is a store whose first set-up was interrupted")]
    for uri, create, message in cases:
        began = time.monotonic()
        with pytest.raises(tracking.TrackingUnavailable) as refused:
            tracking.open_store(uri, create=create)
        assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
        assert time.monotonic() - began < 30, uri
    assert not (tmp_path / "missing").exists()  # reading makes nothing


RACER = """
import os, sys, time
from pipelines import tracking
tracking.options._mlflow()  # imported before the common start: the set-up itself races, not the imports
start_at, uri, out = float(sys.argv[1]), sys.argv[2], sys.argv[3]
os.makedirs(out)
time.sleep(max(0.0, start_at - time.time()))
with tracking.start(uri, "race", out, os.path.basename(out), {"job": os.path.basename(out)}) as run:
    run.log_epoch(1, {"loss": 1.0})
"""


@pytest.mark.slow  # six processes importing MLflow together: about a minute on 2 cores
def test_jobs_starting_together_on_a_new_store_all_succeed_and_leave_it_whole(tmp_path):
    """Six jobs start their runs at the same instant on one new SQLite store (the default store of
    URI outputs is shared by every such job): each one's run is there, and a later job works. Without
    the set-up lock, 5 of 6 failed here ("duplicate column name: step") and the store stayed broken."""
    store = tmp_path / "shared" / "mlruns.db"
    uri = "sqlite:///" + str(store)
    repo = REPO
    env = {**os.environ, "PYTHONPATH": repo}
    start_at = time.time() + 20  # after six interpreters have imported MLflow
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(start_at), uri, str(tmp_path / f"job{i}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(6)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    assert [code for code, _ in results] == [0] * 6, [err[-500:] for _, err in results]
    with tracking.start(uri, "race", str(tmp_path / "job0"), "later", {"job": "later"}):
        pass
    client = tracking.open_store(uri)
    runs = client.search_runs([client.get_experiment_by_name("race").experiment_id])
    assert sorted(r.info.run_name for r in runs) == sorted([f"job{i}" for i in range(6)] + ["later"])
    assert all(r.info.status == "FINISHED" for r in runs)
