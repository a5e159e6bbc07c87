"""`make image-test` (scripts/image_test.sh): its refusals, its stack table, and the checker of what
the main job leaves in an image's output folder (scripts/image_check.py). No image is built here."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from pipelines import stack
from tests.support.env import REPO

SCRIPT = os.path.join(REPO, "scripts", "image_test.sh")
sys.path.insert(0, os.path.join(REPO, "scripts"))
import image_check  # noqa: E402

NOBODY = 65534


def run_script(path_dir: str, as_nobody: bool) -> subprocess.CompletedProcess:
    """The script with PATH holding only ``path_dir``; as uid/gid 65534 when asked and we are root
    (a user that is not root either way). It runs from a copy in ``path_dir/scripts/``: a checkout
    may lie where that user cannot read (a clone under ``mktemp -d`` is 0700), and the refusals
    come before the script reads anything beside itself."""
    def drop():
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    script = os.path.join(path_dir, "scripts", os.path.basename(SCRIPT))
    os.makedirs(os.path.dirname(script), exist_ok=True)
    shutil.copy(SCRIPT, script)
    os.chmod(os.path.dirname(script), 0o755)
    os.chmod(script, 0o644)
    return subprocess.run([shutil.which("bash"), script], capture_output=True, text=True, timeout=60, cwd="/",
                          env={"PATH": path_dir}, preexec_fn=drop if as_nobody and os.geteuid() == 0 else None)


def world_readable_dir() -> str:
    folder = tempfile.mkdtemp(prefix="image-test-")
    os.chmod(folder, 0o755)
    return folder


def test_without_its_tools_or_apt_get_it_says_in_one_line_what_to_install():
    """As root (the suite's usual user here), no tool and no apt-get: what to install; as another
    user, the not-root line below, naming all three."""
    folder = world_readable_dir()
    try:
        out = run_script(folder, as_nobody=False)
    finally:
        shutil.rmtree(folder)
    assert out.returncode == 2 and out.stdout == "", out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    if os.geteuid() == 0:
        assert lines[0].startswith("[image-test] podman buildah mmdebstrap missing") and \
            "apt-get install podman buildah mmdebstrap" in lines[0], lines
    else:
        assert lines[0].startswith("[image-test] needs root and podman buildah mmdebstrap:"), lines


@pytest.mark.parametrize("tools", [(), ("podman", "buildah", "mmdebstrap"), ("podman", "mmdebstrap")])
def test_as_a_user_that_is_not_root_it_refuses_in_one_line_before_running_anything(tools):
    """With all, some or none of the tools on PATH (stubs that would fail loudly if run), a user
    that is not root gets one line: root is needed, and the tools missing are named."""
    folder = world_readable_dir()
    try:
        for tool in tools:
            stub = os.path.join(folder, tool)
            with open(stub, "w") as f:
                f.write("#!/bin/sh\necho STUB-RAN >&2\nexit 99\n")
            os.chmod(stub, 0o755)
        out = run_script(folder, as_nobody=True)
    finally:
        shutil.rmtree(folder)
    assert out.returncode == 2 and out.stdout == "" and "STUB-RAN" not in out.stderr, out
    lines = out.stderr.strip().splitlines()
    missing = [tool for tool in ("podman", "buildah", "mmdebstrap") if tool not in tools]
    assert len(lines) == 1 and lines[0].startswith("[image-test] needs root"), lines
    assert "sudo make image-test" in lines[0]
    assert (f"and {' '.join(missing)}:" in lines[0]) == bool(missing), lines


def test_each_stack_gets_a_debian_suite_whose_python_the_stack_supports():
    """The script's table: every stack, and each suite's own python3 (bookworm 3.11, trixie 3.13)
    one that requirements/<stack>.in names."""
    with open(SCRIPT) as f:
        text = f.read()
    tables = {name: dict(re.findall(r"\[(\w+)\]=([^\s)]+)", body))
              for name, body in re.findall(r"^declare -A (\w+)=\((.*)\)$", text, re.M)}
    assert set(tables) == {"SUITE", "PYTHON", "JAVA"}
    for table in tables.values():
        assert set(table) == set(stack.STACKS), table
    debian_python = {"bookworm": "3.11", "trixie": "3.13"}
    for name in stack.STACKS:
        assert tables["PYTHON"][name] == debian_python[tables["SUITE"][name]]
        assert tables["PYTHON"][name] in stack.pythons(name), name
    assert tables["SUITE"]["mission"] == "bookworm" and tables["JAVA"]["mission"] == "17"


def outputs(tmp_path, accuracy=0.7273, line=None, pictures=("confusion", "curves"), png=True):
    """An output folder as the main job leaves it in an image: main.log and out/train/."""
    train = tmp_path / "out" / "train"
    train.mkdir(parents=True)
    names = {name: f"/outputs/out/train/{name}.png" for name in pictures}
    for name in pictures:
        (train / f"{name}.png").write_bytes((image_check.PNG_MAGIC if png else b"GIF89a..") + b"rest")
    metrics = {"test": {"accuracy": accuracy, "count": 44, "loss": 0.9}, "num_classes": 8, "pictures": names}
    (train / "metrics.json").write_text(json.dumps(metrics))
    line = line or f"exact test accuracy: {accuracy:.4f} on 44 images (8 classes, chance 0.125); test loss 0.9000"
    (tmp_path / "main.log").write_text(f"== 4/4 training\n{line}\nexact validation accuracy of the best epoch: 0.7\n")
    return str(tmp_path)


def me() -> str:
    return f"{os.getuid()}:{os.getgid()}"


def test_the_checker_passes_the_main_jobs_outputs(tmp_path):
    assert image_check.problems(outputs(tmp_path), me()) == []
    assert image_check.main([str(tmp_path), me()]) == 0


@pytest.mark.parametrize("kind, wanted", [
    ({"line": "exact test accuracy: 0.7500 on 44 images (8 classes, chance 0.125)"}, "metrics.json says ('0.7273'"),
    ({"line": "exact test accuracy: 0.7273 on 43 images (8 classes, chance 0.125)"}, "metrics.json says"),
    ({"line": "training ended"}, "exact test accuracy lines []"),
    ({"accuracy": 0.125}, "not above chance"),
    ({"pictures": ()}, "no pictures"),
    ({"png": False}, "is not a PNG"),
])
def test_the_checker_names_what_differs(tmp_path, kind, wanted):
    found = image_check.problems(outputs(tmp_path, **kind), me())
    assert any(wanted in problem for problem in found), found
    assert image_check.main([str(tmp_path), me()]) == 1


def test_the_checker_names_a_missing_picture_and_a_file_not_the_callers(tmp_path):
    folder = outputs(tmp_path)
    os.remove(os.path.join(folder, "out", "train", "curves.png"))
    found = image_check.problems(folder, f"{os.getuid() + 1}:{os.getgid()}")
    assert any(problem.startswith("picture curves:") for problem in found), found
    assert any("not the caller" in problem for problem in found), found
