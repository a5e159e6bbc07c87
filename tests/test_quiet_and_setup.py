"""Set-up's Python choice, quiet logs by default, live progress through pipes (no training)."""
import os
import re
import stat
import subprocess
import sys

import pytest

from tests.conftest import BIN, subprocess_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TF_NOISE = re.compile(r"oneDNN|cpu_feature_guard|This TensorFlow binary is optimized")


def fake_python(folder, version: str):
    """An executable that answers the set-up's version question as Python ``version`` would."""
    fake = folder / f"python{version}"
    fake.write_text(f"#!/bin/sh\necho {version}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return fake


@pytest.mark.parametrize("stack, fake, wanted", [
    ("mission", "3.10", "3.11"),
    ("mission", "3.12", "3.11"),
    ("current", "3.11", "3.12 or 3.13"),
])
def test_setup_refuses_a_python_the_stack_does_not_support_in_one_line(tmp_path, stack, fake, wanted):
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "setup_env.sh"), str(tmp_path / "venv")],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "STACK": stack, "PYTHON": str(fake_python(tmp_path, fake))})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"the {stack} stack needs Python {wanted}" in lines[0], lines
    assert f"is {fake}" in lines[0] and "PYTHON=" in lines[0] and not (tmp_path / "venv").exists()


@pytest.mark.parametrize("command", [["make", "setup"], ["make", "test"], ["make", "main"], ["bash", "scripts/setup_env.sh"]])
def test_an_unknown_stack_is_one_line_naming_the_stacks_with_exit_2(tmp_path, command):
    # Without the outer make's variables: under `make test-stack STACK=mission` MAKEFLAGS carries
    # STACK=mission, which a child make takes over the environment's STACK (and then builds a venv).
    outer = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
    env = {**{k: v for k, v in os.environ.items() if k not in outer}, "STACK": "future", "VENV": str(tmp_path / "venv")}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown stack 'future': the stacks are mission, current" in lines[0], proc.stderr
    assert not (tmp_path / "venv").exists()


def test_main_script_passes_progress_on_line_by_line():
    text = open(os.path.join(REPO, "scripts", "main.sh")).read()
    assert "PYTHONUNBUFFERED=1" in text
    pipes = [line for line in text.splitlines() if re.search(r"\|\s*grep", line)]
    assert pipes and all("--line-buffered" in line for line in pipes)


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


def test_horovod_check_fails_without_the_build_table(tmp_path):
    """A horovodrun that prints no build table fails the check, showing what it printed."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "horovodrun"
    fake.write_text("#!/bin/sh\necho 'Traceback: horovod is broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "horovod_check.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "horovod is broken" in proc.stderr and "printed no build table" in proc.stderr


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


