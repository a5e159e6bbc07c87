"""``--verbose`` reaches every rank from its config (issue 27 item 3): local ranks and Spark
barrier tasks on the suite's session (the boundary's rules themselves:
tests/unit/runtime/test_env_boundary.py)."""
import logging
import os

import pytest

from pipelines.runtime import quiet
from pipelines.training.config import TrainConfig


@pytest.fixture
def restored_noise(monkeypatch):
    """The test process's noise level as it was: quiet's state, TF's variable, TF's logger."""
    monkeypatch.setattr(quiet, "_verbose", quiet._verbose)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    level = logging.getLogger("tensorflow").level
    yield
    logging.getLogger("tensorflow").setLevel(level)


def _rank_noise(config):
    """A rank's start as the job's (setup_rank), then what it chose."""
    import logging
    import os

    from pipelines.runtime import quiet
    from pipelines.training.rank import setup_rank

    setup_rank(config)
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL"), logging.getLogger("tensorflow").level, quiet.is_verbose()


@pytest.mark.slow
@pytest.mark.parametrize("np_, env, flag", [(-1, "1", None), (-1, "", None), (1, "", True), (1, "1", False)])
def test_local_ranks_and_barrier_tasks_get_verbose(spark, monkeypatch, restored_noise, tmp_path, np_, env, flag):
    """From the environment (the launching process's) or the flag, as the training CLI does: the
    driver's set-up before any rank, then each rank's, from its config: local ranks (Horovod's
    launcher) and a Spark barrier task's child process alike (whose environment is its executor's,
    started before this driver's set-up: the rank sets its own from its config)."""
    from pipelines.launch import HorovodRunner

    monkeypatch.setenv("PIPELINES_VERBOSE", env)
    config = TrainConfig(data=str(tmp_path / "etl"), output=str(tmp_path / "run"), weights="none", backbone="tiny",
                         verbose=flag)
    quiet.quiet_by_default(config.verbose)  # the CLI's set-up (pipelines/training/cli.py main)
    monkeypatch.setenv("PIPELINES_VERBOSE", "")  # a rank must not need the variable: its config says it
    verbose = config.verbose
    assert verbose == (env == "1" if flag is None else flag)  # the flag wins
    expected = ("0", logging.NOTSET, True) if verbose else ("2", logging.ERROR, False)
    assert HorovodRunner(np=np_).run(_rank_noise, config=config) == expected
