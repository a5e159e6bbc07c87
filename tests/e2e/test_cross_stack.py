"""What moves between the stacks (docs/stacks.md): an MLflow SQLite store, a checkpoint and a
``model.keras`` made on this stack and read on the other, and the other way round, with one
process of the other stack's venv (tests/support/cross_stack_side.py). Each works, or is refused in one
line naming the stack that made it and the way out; no store is migrated.

Needs both venvs: ``make test`` builds both before any test. One run makes and reads on both stacks, so it
runs on mission's share alone (not marked ``current``: the current share would repeat the same exchange);
only a file run by hand without the other stack's venv skips it, naming the command that builds it."""
import json
import os
import subprocess

import numpy as np
import pytest

from pipelines import stack
from tests.support import cross_stack_side as side
from tests.support.env import REPO as ROOT

pytestmark = pytest.mark.slow
HERE = stack.active().name
OTHER = next(name for name in stack.STACKS if name != HERE)
OTHER_PYTHON = os.path.join(ROOT, stack.venv(OTHER), "bin", "python")


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """``{stack: {"made": what it made of its own, "read": what it made of the other's}}``."""
    if not os.path.isfile(OTHER_PYTHON):
        pytest.skip(f"needs the {OTHER} stack's venv {stack.venv(OTHER)}: make setup STACK={OTHER}")
    root = tmp_path_factory.mktemp("stacks")
    mine, theirs, result = str(root / HERE), str(root / OTHER), str(root / "read.json")
    made_here = side.make(mine)
    env = {key: value for key, value in os.environ.items() if key not in ("PYSPARK_PYTHON", "VIRTUAL_ENV")}
    env.update(PATH=os.path.dirname(OTHER_PYTHON) + os.pathsep + env.get("PATH", ""), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([OTHER_PYTHON, "-m", "tests.support.cross_stack_side", mine, theirs, result], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(os.path.join(theirs, "made.json")) as f:
        made_there = json.load(f)
    with open(result) as f:
        read_there = json.load(f)
    assert made_there["stack"] == OTHER and made_here["stack"] == HERE
    return {HERE: {"made": made_here, "read": side.read(theirs)}, OTHER: {"made": made_there, "read": read_there}}


def test_each_stack_leaves_its_store_at_the_schema_the_stack_table_names(both):
    for name in stack.STACKS:
        assert both[name]["made"]["revision"] == stack.get(name).mlflow_schema


def test_a_store_of_the_other_stack_is_refused_by_name_and_never_migrated(both):
    for reader, maker in ((HERE, OTHER), (OTHER, HERE)):
        read = both[reader]["read"]
        schema = stack.get(maker).mlflow_schema
        for refusal in (read["check_store"], read["open_store"]):  # the driver's check, and opening it
            assert refusal is not None and "\n" not in refusal, (reader, maker)
            assert f"has schema {schema} of the {maker} stack's MLflow {stack.pins(maker)['mlflow']}" in refusal
            assert f"track this job on the {maker} stack ({stack.venv(maker)})" in refusal
            assert "give it its own store (--tracking-uri sqlite:///OTHER.db, or another --output)" in refusal
            # MLflow 3.17.2 would migrate a 2.22.5 store; 2.22.5 cannot read a 3.17.2 one
            if reader == "current":
                assert "would migrate it on opening" in refusal and "`mlflow db upgrade sqlite:///" in refusal
            else:
                assert "which the mission stack's MLflow 2.22.5 (schema 0584bdc529eb) cannot read" in refusal
        assert read["revision"] == schema  # the store is as its stack left it


def test_a_checkpoint_resumes_on_the_other_stack_as_on_its_own(both):
    for reader, maker in ((HERE, OTHER), (OTHER, HERE)):
        made, read = both[maker]["made"], both[reader]["read"]["resumed"]
        assert read["frozen_sha256"] == made["frozen_sha256"] == made["resumed"]["frozen_sha256"]
        np.testing.assert_allclose(read["predicted"], made["resumed"]["predicted"], rtol=0, atol=1e-5)


def test_model_keras_of_the_mission_stack_serves_on_current_and_currents_is_refused_on_mission(both):
    mission_model = both["current"]["read"]
    np.testing.assert_allclose(mission_model["predicted"], both["mission"]["made"]["predicted"], rtol=0, atol=1e-6)
    refusal = both["mission"]["read"]["model_refused"]
    assert "model.keras was saved on the current stack (TensorFlow 2.21.0: its model is " \
           "tf_keras.src.engine.functional), which the mission stack's Keras cannot load: serve it on the " \
           "current stack (.venv-current/bin/python -m pipelines.predict" in refusal and "\n" not in refusal
    assert "predicted" not in both["mission"]["read"]
