"""Quiet logs by default, in the stack's real processes: TensorFlow loaded in a child, the
set-up's Horovod check on the installed build, a Spark start (set-up's refusals:
tests/unit/scripts/test_quiet_and_setup.py)."""
import os
import re
import subprocess
import sys

import pytest

from tests.support.env import BIN, REPO, subprocess_env

TF_NOISE = re.compile(r"oneDNN|cpu_feature_guard|This TensorFlow binary is optimized")


def run_python(code, *args, **env):
    clean = {k: v for k, v in subprocess_env().items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "PIPELINES_VERBOSE")}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**clean, **env}, timeout=300)


# an entry point's set-up: the noise from the environment's default of --verbose (pipelines.runtime.environment)
SETUP = ("from pipelines.runtime.environment import read_settings; from pipelines.runtime.quiet import quiet_by_default; "
         "quiet_by_default(read_settings().verbose); ")
IMPORT_TF = SETUP + "import tensorflow as tf; tf.constant(1.0) + 1; print('ok')"


@pytest.mark.slow
@pytest.mark.current  # starts processes that load TensorFlow: slow, and about the stack
def test_tensorflow_is_quiet_by_default_and_verbose_on_request():
    quiet = run_python(IMPORT_TF)
    assert quiet.returncode == 0 and not TF_NOISE.search(quiet.stderr), quiet.stderr
    verbose = run_python(IMPORT_TF, PIPELINES_VERBOSE="1")
    assert verbose.returncode == 0 and TF_NOISE.search(verbose.stderr), verbose.stderr


@pytest.mark.slow
@pytest.mark.current  # starts processes that load TensorFlow: slow, and about the stack
def test_horovod_check_build_shows_the_build_only():
    """Horovod was built with TensorFlow and Gloo, and the set-up's check says so without TensorFlow's
    noise (horovodrun's processes load TensorFlow without our import filter: the script keeps the table)."""
    script = os.path.join(REPO, "scripts", "horovod_check.sh")
    proc = subprocess.run(["bash", script, os.path.dirname(BIN)], capture_output=True, text=True,
                          env=subprocess_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Horovod v") and "[X] TensorFlow" in proc.stdout and "[X] Gloo" in proc.stdout
    assert not TF_NOISE.search(proc.stdout + proc.stderr) and "absl" not in proc.stdout + proc.stderr
    assert 'scripts/horovod_check.sh "$VENV"' in open(os.path.join(REPO, "scripts", "setup_env.sh")).read()


SPARK_START = (SETUP +
               "from pipelines.runtime.spark import spark_session; spark = spark_session('quiet-test', 'local[1]'); "
               "err = spark._jvm.java.lang.System.err; err.println('a line of the JVM'); err.flush(); "
               "spark.stop(); print('ok')")


@pytest.mark.slow
def test_a_spark_start_passes_the_jvms_stderr_straight_through():
    """No filter between the JVM and stderr (issue 27 item 5): every line the JVM writes is there,
    Java's incubator-module line too (one harmless line per JVM start), and no process of ours
    relays it."""
    quiet = run_python(SPARK_START)
    assert quiet.returncode == 0 and quiet.stdout.strip() == "ok", quiet.stderr[-3000:]
    assert "a line of the JVM" in quiet.stderr.splitlines(), quiet.stderr[-3000:]


