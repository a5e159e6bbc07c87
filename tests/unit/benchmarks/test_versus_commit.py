"""benchmarks/versus_commit.py's parts that run without training: its refusals, the loader lines it
reads, and a commit's tree exported without touching the repository."""
import os
import subprocess

import pytest

from benchmarks import versus_commit
from tests.support.env import REPO

LOADER_TABLE = """32 MiB row groups: 20 rows each, 18 in train
  own, cold cache (epoch 1)                    5984 images/s  0.12x ceiling  own / petastorm 2.67
  own, warm cache (epoch 2)                   22388 images/s  0.44x ceiling  own / petastorm 3.79
  petastorm, no cache (epoch 2)                5234 images/s  0.10x ceiling
  own, reader alone, warm cache (epoch 2)     50374 images/s  0.99x ceiling  own / petastorm 10.66
  petastorm, reader alone, cold cache (epoch 1)     4949 images/s  0.10x ceiling
goal, ours, cold cache (epoch 1): 0.118 of the ceiling (goal >= 0.6: NOT met); 2.670x Petastorm's (goal >= 1: met)
"""


@pytest.mark.parametrize("argv", [["--epochs", "2"], ["--repeats", "0"]])
def test_settings_it_cannot_measure_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        versus_commit.main(argv)
    assert stop.value.code == 2 and "--repeats must be >= 1 and --epochs >= 3" in capsys.readouterr().err


def test_each_loader_path_is_read_with_its_reader_and_the_goal_lines_are_not():
    assert [(reader, path, int(rate)) for reader, path, rate in versus_commit.LOADER_LINE.findall(LOADER_TABLE)] == [
        ("own", "cold cache (epoch 1)", 5984), ("own", "warm cache (epoch 2)", 22388),
        ("petastorm", "no cache (epoch 2)", 5234), ("own", "reader alone, warm cache (epoch 2)", 50374),
        ("petastorm", "reader alone, cold cache (epoch 1)", 4949)]


def test_a_commit_is_exported_as_its_tree_and_the_repository_is_left_as_it_was(tmp_path):
    before = subprocess.run(["git", "-C", REPO, "worktree", "list"], capture_output=True, text=True).stdout
    versus_commit.export("HEAD", str(tmp_path / "ref"))
    committed = subprocess.run(["git", "-C", REPO, "show", "HEAD:benchmarks/versus_commit.py"], capture_output=True).stdout
    with open(tmp_path / "ref" / "benchmarks" / "versus_commit.py", "rb") as f:
        assert f.read() == committed
    assert not os.path.exists(tmp_path / "ref" / ".git")
    assert subprocess.run(["git", "-C", REPO, "worktree", "list"], capture_output=True, text=True).stdout == before
