"""The ETL's commit on a local output never follows a link: an output whose ``runs/`` or a run
folder is a link is refused before any work, and a link planted while a run works is deleted
itself (or refused), never what it names: another output's runs survive every case."""
import os

import pytest

from pipelines.etl import commit
from pipelines.io import storage
from pipelines.io.nofollow import LinkRefused


def two_outputs(tmp_path):
    """``(ours, theirs, old run, their run)``: two outputs, each with a committed-looking run."""
    ours, theirs = storage.resolve(str(tmp_path / "ours")), storage.resolve(str(tmp_path / "theirs"))
    old, new = commit.new_run_id(), commit.new_run_id()
    ours.join("runs", old, "train", "part-0.parquet").write_bytes(b"ours")
    theirs.join("runs", old, "train", "part-0.parquet").write_bytes(b"theirs")
    return ours, theirs, old, new


def their_files(theirs):
    return sorted(os.path.relpath(os.path.join(d, f), theirs.path) for d, _, fs in os.walk(theirs.path) for f in fs)


def test_a_linked_runs_folder_is_refused_before_work_and_never_cleaned_through(tmp_path):
    ours, theirs, old, new = two_outputs(tmp_path)
    before = their_files(theirs)
    os.rename(os.path.join(ours.path, "runs"), str(tmp_path / "moved"))
    os.symlink(os.path.join(theirs.path, "runs"), os.path.join(ours.path, "runs"))
    with pytest.raises(LinkRefused, match="runs is a symbolic link"):
        commit.check_output(ours)
    with pytest.raises(LinkRefused, match="is a symbolic link"):  # planted after the check
        commit.clean_up(ours, new)
    commit.remove_failed_run(ours, old)  # said as a warning, never raised
    with pytest.raises(LinkRefused):
        commit.delete_below(ours, f"runs/{old}")
    assert their_files(theirs) == before


def test_a_linked_run_folder_is_refused_and_a_clean_up_removes_the_link_alone(tmp_path):
    ours, theirs, old, new = two_outputs(tmp_path)
    before = their_files(theirs)
    other = commit.new_run_id()
    os.symlink(os.path.join(theirs.path, "runs", old), os.path.join(ours.path, "runs", other))
    with pytest.raises(LinkRefused, match=f"runs/{other} is a symbolic link"):
        commit.check_output(ours)
    newest = commit.new_run_id()
    assert commit.clean_up(ours, newest) == [f"runs/{old}", f"runs/{other}"]
    assert os.listdir(os.path.join(ours.path, "runs")) == [] and their_files(theirs) == before


def test_a_failed_run_whose_folder_became_a_link_removes_the_link_alone(tmp_path):
    ours, theirs, old, new = two_outputs(tmp_path)
    before = their_files(theirs)
    os.symlink(os.path.join(theirs.path, "runs", old), os.path.join(ours.path, "runs", new))
    commit.remove_failed_run(ours, new)
    assert not os.path.lexists(os.path.join(ours.path, "runs", new)) and their_files(theirs) == before


@pytest.mark.parametrize("name", ["train", "rejected.jsonl", "_staging", "manifest.json", "mlruns.db"])
def test_a_format_1_name_or_another_of_ours_that_is_a_link_is_refused(tmp_path, name):
    ours, theirs, old, new = two_outputs(tmp_path)
    os.symlink(os.path.join(theirs.path, "runs"), os.path.join(ours.path, name))
    with pytest.raises(LinkRefused, match=f"{name} is a symbolic link"):
        commit.check_output(ours)


def test_a_replaced_format_1_folder_that_became_a_link_is_unlinked_not_emptied(tmp_path):
    ours, theirs, old, new = two_outputs(tmp_path)
    before = their_files(theirs)
    os.symlink(os.path.join(theirs.path, "runs"), os.path.join(ours.path, "train"))
    assert commit.clean_up(ours, new, ["train"]) == [f"runs/{old}", "train"]
    assert not os.path.lexists(os.path.join(ours.path, "train")) and their_files(theirs) == before


def test_an_output_without_links_is_cleaned_as_before(tmp_path):
    """The control: the older run and a format-1 folder go, the newer run stays."""
    ours, _, old, new = two_outputs(tmp_path)
    ours.join("runs", new, "train", "part-0.parquet").write_bytes(b"new")
    commit.check_output(ours)
    ours.join("train", "a.parquet").write_bytes(b"x")
    assert commit.clean_up(ours, new, ["train"]) == [f"runs/{old}", "train"]
    assert os.listdir(os.path.join(ours.path, "runs")) == [new]


def test_the_etl_job_exits_2_before_spark_on_an_output_whose_runs_is_a_link(tmp_path):
    """``jobs/etl.py``: one line naming the link, exit 2, nothing written into the other output."""
    import subprocess
    import sys
    from tests.support.env import REPO, subprocess_env
    from tests.support.imagegen import make_tree
    ours, theirs, old, _ = two_outputs(tmp_path)
    before = their_files(theirs)
    make_tree(str(tmp_path / "tree"), classes=2, per_class=2, bad=False)
    os.rename(os.path.join(ours.path, "runs"), str(tmp_path / "moved"))
    os.symlink(os.path.join(theirs.path, "runs"), os.path.join(ours.path, "runs"))
    proc = subprocess.run([sys.executable, os.path.join(REPO, "jobs", "etl.py"), "--input", str(tmp_path / "tree"),
                           "--output", ours.path, "--no-tracking"], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "runs is a symbolic link" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr and "SparkContext" not in proc.stderr
    assert their_files(theirs) == before
