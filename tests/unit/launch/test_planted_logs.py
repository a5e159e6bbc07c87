"""Rank logs are never appended through a planted link, nor is a link's target chmodded: the lines
still reach the console, the target keeps its bytes and mode (pipelines/launch/ranklogs.py,
pipelines/launch/local.py)."""
import io
import os
import subprocess
import sys

import pytest

from pipelines.io.nofollow import LinkRefused
from pipelines.launch import local
from pipelines.launch.ranklogs import LogSink, forward, owner_only_append
from tests.unit.io.test_nofollow import KINDS, assert_untouched, plant, victim


@pytest.mark.parametrize("kind", KINDS)
def test_the_sink_keeps_no_log_through_a_planted_name_and_still_shows_the_lines(tmp_path, capfd, kind):
    target, before = victim(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    plant(kind, str(logs / "rank-3.log"), target)
    sink = LogSink("127.0.0.1", str(logs), world_size=4)
    try:
        child = subprocess.Popen([sys.executable, "-c", "print('a line')"], stdout=subprocess.PIPE)
        with child.stdout:
            assert forward(child.stdout, sink.address, sink.token, 3, "hostA") == 1
        child.wait()
        assert sink.wait_for({3: 1})
    finally:
        sink.close()
    assert_untouched(target, before)
    assert "[rank 3 on hostA] a line" in capfd.readouterr().err


def test_a_log_folder_that_is_a_link_is_refused_before_any_rank(tmp_path):
    os.symlink(tmp_path, tmp_path / "logs")
    with pytest.raises(LinkRefused, match="logs is a symbolic link"):
        LogSink("127.0.0.1", str(tmp_path / "logs"))


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_a_local_ranks_stream_is_drained_to_the_console_past_a_planted_log(tmp_path, capsys, kind):
    target, before = victim(tmp_path)
    keep = str(tmp_path / "stdout")
    plant(kind, keep, target)
    local._pump(io.BytesIO(b"one\ntwo\n"), "[0]<stdout>:", "stdout", keep)
    assert capsys.readouterr().out == "[0]<stdout>:one\n[0]<stdout>:two\n"
    assert_untouched(target, before)


def test_a_local_ranks_log_folder_that_is_a_link_is_refused_before_its_process_starts(tmp_path):
    os.symlink(tmp_path, tmp_path / "logs")
    with pytest.raises(LinkRefused, match="logs is a symbolic link"):
        local._start_rank("job", "result", {}, 0, 2, str(tmp_path / "logs"))


def test_owner_only_append_keeps_its_own_log_owner_only(tmp_path):
    path = str(tmp_path / "rank-0.log")
    for line in (b"1\n", b"2\n"):
        with owner_only_append(path) as f:
            f.write(line)
    assert open(path, "rb").read() == b"1\n2\n" and os.stat(path).st_mode & 0o777 == 0o600
