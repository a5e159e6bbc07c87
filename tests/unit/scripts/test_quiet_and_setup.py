"""Set-up's Python and stack choice, its Horovod check's refusal, live progress through pipes
(no training; the stack's real processes quiet by default: tests/e2e/test_quiet_and_setup.py)."""
import os
import re
import stat
import subprocess

import pytest

from tests.support.env import REPO


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


