"""Environment variables (issue 27 item 3): each read once, at a boundary, and passed down.

The user's ``PIPELINES_*`` variables are read by ``pipelines.runtime.environment.read_settings`` alone, in
the launching process (entry points, the stages' configs); the variables a launcher hands its ranks
by ``pipelines.launch.rankenv.read_rank_environment`` alone, at the rank's start. ``--verbose`` is
a field of each stage's config, never scanned from ``sys.argv``.
"""
import os
import re

import pytest

from pipelines.runtime import environment
from pipelines.runtime.config import parse_config
from pipelines.runtime.environment import read_settings
from pipelines.etl.config import ETLConfig
from pipelines.launch import rankenv
from pipelines.predict.config import PredictConfig
from pipelines.training.config import TrainConfig
from tests.support.env import REPO

BOUNDARIES = {"pipelines/runtime/environment.py", "pipelines/launch/rankenv.py"}
NAME = re.compile(r"PIPELINES_[A-Z][A-Z_]*")


def sources():
    for top in ("pipelines", "jobs"):
        for folder, _, names in os.walk(os.path.join(REPO, top)):
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    yield os.path.relpath(path, REPO), open(path, encoding="utf-8").read()


def test_every_pipelines_variable_is_named_only_in_a_boundary_module():
    """The rule stays kept: a ``PIPELINES_`` string anywhere else in pipelines/ or jobs/ is a
    variable read (or documented) deep inside; each boundary documents every name it defines."""
    found = {path: set(NAME.findall(text)) for path, text in sources() if NAME.search(text)}
    assert set(found) == BOUNDARIES, sorted(set(found) - BOUNDARIES)
    user = {environment.WORKDIR_ENV, environment.CACHE_ENV, environment.TRACKING_ENV, environment.VERBOSE_ENV,
            environment.SPARK_LOG_LEVEL_ENV, environment.STORAGE_OPTIONS_ENV}
    handed = {rankenv.ATTEMPTS_ENV, rankenv.ASSIGNED_ENV, rankenv.FAULT_ENV, rankenv.FAULT_TOKEN_ENV, rankenv.STALL_ENV}
    assert found["pipelines/runtime/environment.py"] == user and found["pipelines/launch/rankenv.py"] == handed
    for module, names in ((environment, user), (rankenv, handed)):  # each in the module's table
        assert set(NAME.findall(module.__doc__)) == names


def test_no_module_scans_the_command_line_for_verbose():
    """``--verbose`` is a field of each stage's config, parsed with the other options."""
    assert [path for path, text in sources() if re.search(r"""["']--verbose["']\s+(not\s+)?in\b""", text)] == []


def test_the_settings_of_an_empty_environment_are_the_documented_defaults(tmp_path):
    home = os.path.expanduser("~")
    assert read_settings({}) == environment.Settings(
        workdir=os.path.join(home, "pipelines-work"), cache=os.path.join(home, ".cache", "pipelines"),
        tracking=True, verbose=False, spark_log_level="")


@pytest.mark.parametrize("value, tracking", [("0", False), ("false", False), ("Off", False), (" no ", False),
                                             ("1", True), ("yes", True), ("", True)])
def test_tracking_is_off_only_for_the_documented_values(value, tracking):
    assert read_settings({"PIPELINES_TRACKING": value}).tracking is tracking


@pytest.mark.parametrize("value, verbose", [("", False), ("0", False), ("1", True), ("yes", True)])
def test_verbose_is_on_for_anything_but_empty_or_zero(value, verbose):
    assert read_settings({"PIPELINES_VERBOSE": value}).verbose is verbose


def test_folders_are_absolute_and_expanded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = read_settings({"PIPELINES_WORKDIR": "work", "PIPELINES_CACHE": "~/c", "PIPELINES_SPARK_LOG_LEVEL": "ERROR"})
    assert settings.workdir == str(tmp_path / "work") and settings.cache == os.path.expanduser("~/c")
    assert settings.spark_log_level == "ERROR"


@pytest.mark.parametrize("env, flag, verbose", [("", [], False), ("1", [], True), ("1", ["--no-verbose"], False),
                                                ("", ["--verbose"], True), ("0", ["--verbose"], True)])
def test_each_stages_verbose_is_its_flag_else_the_environments(monkeypatch, tmp_path, env, flag, verbose):
    """The config is the single source of ``--verbose``; its default comes from the environment,
    settled where the config is made (the launching process), so the ranks get it in the config."""
    monkeypatch.setenv("PIPELINES_VERBOSE", env)
    (tmp_path / "in").mkdir()
    etl = parse_config(ETLConfig, ["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), *flag])
    train = parse_config(TrainConfig, ["--data", str(tmp_path / "etl"), "--output", str(tmp_path / "run"),
                                       "--weights", "none", "--backbone", "tiny", *flag])
    predict = parse_config(PredictConfig, ["--model", str(tmp_path / "m"), "--input", str(tmp_path / "in"),
                                           "--output", str(tmp_path / "p.parquet"), *flag])
    assert (etl.verbose, train.verbose, predict.verbose) == (verbose, verbose, verbose)


@pytest.mark.parametrize("env, flag, tracking", [("0", [], False), ("1", [], True), ("0", ["--tracking"], True),
                                                 ("1", ["--no-tracking"], False)])
def test_tracking_is_the_flag_else_the_environments(monkeypatch, tmp_path, env, flag, tracking):
    monkeypatch.setenv("PIPELINES_TRACKING", env)
    (tmp_path / "in").mkdir()
    etl = parse_config(ETLConfig, ["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), *flag])
    train = parse_config(TrainConfig, ["--data", str(tmp_path / "etl"), "--output", str(tmp_path / "run"),
                                       "--weights", "none", "--backbone", "tiny", *flag])
    assert (etl.tracking, train.outputs.tracking) == (tracking, tracking)


def test_an_object_store_outputs_default_tracking_store_is_in_the_environments_workdir(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINES_WORKDIR", str(tmp_path / "work"))
    train = TrainConfig(data=str(tmp_path / "etl"), output="s3://bucket/run", weights="none", backbone="tiny",
                        tracking=True)
    assert train.outputs.tracking_uri == f"sqlite:///{tmp_path}/work/mlflow/mlruns.db"
    local = TrainConfig(data=str(tmp_path / "etl"), output=str(tmp_path / "run"), weights="none", backbone="tiny",
                        tracking=True)
    assert local.outputs.tracking_uri == f"sqlite:///{tmp_path}/run/mlruns.db"  # a local output keeps its own


def test_the_tools_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    from pipelines.tools import samples, weights
    monkeypatch.setenv("PIPELINES_CACHE", str(tmp_path / "cache"))
    assert samples.cache_dir() == tmp_path / "cache" and weights.default_cache_dir() == tmp_path / "cache" / "weights"


def test_what_a_launcher_writes_a_rank_reads():
    """Each launcher→rank variable round-trips through the one writer and the one reader."""
    written = {**rankenv.attempts_env([{"attempt": 1, "world_size": 3, "failure": "lost"}]), "HOROVOD_SIZE": "2",
               **rankenv.assigned_gpus_env(["2", "3"]), "PIPELINES_FAULT_INJECT": "rank=1,epoch=2",
               **rankenv.fault_token_env(os.environ[rankenv.FAULT_TOKEN_ENV])}  # the suite's (tests/conftest.py)
    handed = rankenv.read_rank_environment(written)
    assert handed.attempts == [{"attempt": 1, "world_size": 3, "failure": "lost"},
                               {"attempt": 2, "world_size": 2, "failure": None}] and handed.relaunched
    assert (handed.assigned_gpus, handed.fault) == (["2", "3"], "rank=1,epoch=2")
    assert rankenv.read_rank_environment({}) == rankenv.RankEnvironment()
