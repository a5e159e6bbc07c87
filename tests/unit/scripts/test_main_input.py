"""``make main INPUT=ROOT``: a missing or empty ROOT is one line and exit 2, before the venv's set-up,
the sample's download or Spark (the run on a real tree: the README's "Your own images")."""
import os
import subprocess

import pytest

from tests.support.env import REPO

OUTER = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")  # an outer make's variables would win


def run(command, tmp_path, **env):
    base = {k: v for k, v in os.environ.items() if k not in OUTER}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**base, "OUT": str(tmp_path / "out"), **env})


def trees(tmp_path):
    """Three bad INPUTs: a missing path, an empty folder, class folders without a file, and a file."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "hollow" / "birds").mkdir(parents=True)
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "a.jpg").write_bytes(b"\xff\xd8")  # a loose file is no class folder
    (tmp_path / "file.jpg").write_bytes(b"\xff\xd8")
    return {"missing": ("missing", "is not a folder"), "empty": ("empty", "holds no file in a class folder"),
            "hollow": ("hollow", "holds no file in a class folder"),
            "loose": ("loose", "holds no file in a class folder"), "file": ("file.jpg", "is not a folder")}


@pytest.mark.parametrize("case", ["missing", "empty", "hollow", "loose", "file"])
def test_main_script_refuses_a_bad_input_in_one_line_before_any_stage(tmp_path, case):
    name, said = trees(tmp_path)[case]
    proc = run(["bash", os.path.join(REPO, "scripts", "main.sh")], tmp_path, INPUT=name, VENV=str(tmp_path / "venv"))
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    lines = proc.stderr.strip().splitlines()
    # a relative INPUT is the caller's folder's, said as the absolute path
    assert lines == [f"make main: INPUT={tmp_path / name} {said} (expected ROOT/CLASS/*.jpg)"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["missing", "hollow"])
def test_make_main_refuses_a_bad_input_before_setting_up_the_venv(tmp_path, case):
    name, said = trees(tmp_path)[case]
    venv = tmp_path / "venv"
    proc = run(["make", "-C", REPO, "main", f"INPUT={tmp_path / name}", f"VENV={venv}"], tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"make main: INPUT={tmp_path / name} {said}" in lines[0], proc.stderr
    assert not venv.exists() and not (tmp_path / "out").exists()


def test_a_tree_with_a_class_folder_passes_the_check_and_a_uri_is_left_to_the_etl(tmp_path):
    (tmp_path / "photos" / "birds").mkdir(parents=True)
    (tmp_path / "photos" / "birds" / "a.jpg").write_bytes(b"\xff\xd8")
    script = os.path.join(REPO, "scripts", "main.sh")
    for given in ("photos", str(tmp_path / "photos"), "s3://bucket/photos"):
        proc = run(["bash", script, "--check-input"], tmp_path, INPUT=given)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", ""), given
