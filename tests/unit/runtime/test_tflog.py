"""pipelines.runtime.tflog: TF_CPP_MIN_LOG_LEVEL for the absl lines TensorFlow 2.21 writes while it loads."""
import subprocess
import sys

import pytest

from pipelines.runtime import tflog

NOTICE = tflog.ABSL_NOTICE + "\n"
ONEDNN = "I0000 00:00:1796154813.400722    5000 port.cc:153] oneDNN custom operations are on.\n"
WARN = "W0000 00:00:1796154813.5    5000 gpu_device.cc:2344] Cannot dlopen some GPU libraries.\n"
ERROR = "E1201 19:53:48.394198    5000 cuda_dnn.cc:8579] Unable to register cuDNN factory\n"
FATAL = "F1201 19:53:48.394198    5000 check.cc:1] Check failed\n"
OURS = "Traceback (most recent call last):\n  ImportError: no\n"
TF215 = "2026-12-01 19:53:48.394198: I tensorflow/core/util/port.cc:113] oneDNN custom operations are on.\n"
TEXT = NOTICE + ONEDNN + WARN + OURS + ERROR + FATAL + TF215


@pytest.mark.parametrize("level, wanted", [
    (0, TEXT),
    (1, WARN + OURS + ERROR + FATAL + TF215),
    (2, OURS + ERROR + FATAL + TF215),
    (3, OURS + FATAL + TF215),
    (9, OURS + FATAL + TF215),
])
def test_absl_lines_below_the_level_are_dropped_and_everything_else_kept_in_order(level, wanted):
    assert tflog.kept_lines(TEXT, level) == wanted


def test_a_line_that_only_mentions_absl_or_looks_alike_stays():
    lines = ("I told absl::InitializeLog() nothing\n" "I0000 no time here port.cc:1] x\n"
             "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR, twice\n")
    assert tflog.kept_lines(lines, 3) == lines


@pytest.mark.parametrize("value, wanted", [("", 0), ("2", 2), (" 3 ", 3), ("x", 0), ("-1", 0)])
def test_the_level_is_read_as_tensorflow_reads_it(monkeypatch, value, wanted):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", value)
    assert tflog.min_log_level() == wanted


CHILD = r"""
import os, sys
from pipelines.runtime import tflog
try:
    with tflog.filtered_stderr(int(sys.argv[1])):
        os.write(2, b"I0000 00:00:1.5    7 port.cc:153] dropped at 1\n")
        print("python's own stderr line", file=sys.stderr)
        os.write(2, b"E0000 00:00:1.5    7 x.cc:1] an error\n")
        if sys.argv[2] == "raise":
            raise RuntimeError("the import failed")
except RuntimeError as err:
    print("caught", err, file=sys.stderr)
print("stdout untouched")
"""


@pytest.mark.parametrize("ending", ["return", "raise"])
def test_the_capture_passes_on_what_it_keeps_in_order_also_when_the_block_raises(ending):
    proc = subprocess.run([sys.executable, "-c", CHILD, "1", ending], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "stdout untouched\n"
    expected = "python's own stderr line\nE0000 00:00:1.5    7 x.cc:1] an error\n"
    if ending == "raise":
        expected += "caught the import failed\n"
    assert proc.stderr == expected


def test_level_zero_captures_nothing():
    proc = subprocess.run([sys.executable, "-c", CHILD, "0", "return"], capture_output=True, text=True, timeout=60)
    assert proc.stderr.startswith("I0000 00:00:1.5    7 port.cc:153] dropped at 1\n")


@pytest.mark.current  # the stack's variables, set as pipelines is imported
def test_import_pipelines_installs_the_finder_once_and_keeps_tensorflow_unimported():
    code = ("import sys, pipelines; from pipelines.runtime import tflog; tflog.install(); "
            "print(sum(f is tflog._FINDER for f in sys.meta_path), 'tensorflow' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["1", "False"], proc.stderr
