"""``TF_CPP_MIN_LOG_LEVEL`` for the lines TensorFlow logs while it loads, on every stack.

TensorFlow 2.21 (the current stack) writes ``oneDNN custom operations are on ...`` (``port.cc``,
once per shared library: two lines) through absl before absl's logging is initialised; absl then
sends every line to stderr, whatever ``TF_CPP_MIN_LOG_LEVEL`` says (tensorflow/tensorflow#100442,
open; TensorFlow 2.15 honours the variable). :func:`install` (run by ``import pipelines``) makes
the first ``import tensorflow`` of a process write its stderr to a temporary file and, once loaded,
pass on every line except the absl lines below ``TF_CPP_MIN_LOG_LEVEL`` (0: all, the default;
1: no INFO; 2: no WARNING; 3: no ERROR; FATAL always shows) and absl's own "before InitializeLog" notice. Nothing is
lost otherwise: other lines are written back in order, also when the import fails. No thread, no
process: the capture lasts the import only (about 3 s).
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile
from typing import Iterator

# absl's line prefix: severity letter, MMDD, time, thread id, file:line]
ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [^\]\s]+:\d+\] ")
ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
SEVERITIES = "IWEF"  # absl's order; TF_CPP_MIN_LOG_LEVEL counts the same way


def min_log_level() -> int:
    """``TF_CPP_MIN_LOG_LEVEL`` as TensorFlow reads it (0 when unset or not a number)."""
    value = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0").strip()
    return int(value) if value.isdigit() else 0


def kept_lines(text: str, level: int) -> str:
    """``text`` (stderr written while TensorFlow loaded) without the absl lines of a severity below
    ``level`` and, where ``level`` >= 1, without absl's notice; every other line unchanged."""
    if level <= 0:
        return text
    kept = []
    for line in text.splitlines(keepends=True):
        match = ABSL_LINE.match(line)
        if match and SEVERITIES.index(match.group(1)) < min(level, 3):  # FATAL always shows
            continue
        if line.rstrip("\n") == ABSL_NOTICE:
            continue
        kept.append(line)
    return "".join(kept)


@contextlib.contextmanager
def filtered_stderr(level: int) -> Iterator[None]:
    """File descriptor 2 goes to a temporary file inside the block; :func:`kept_lines` of it is
    written to the real stderr at the end (exception or not)."""
    if level <= 0:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = kept_lines(captured.read().decode("utf-8", "replace"), level)
            if text:
                os.write(2, text.encode("utf-8"))


class _FilteringLoader(importlib.abc.Loader):
    """Loads the ``tensorflow`` package with its real loader, inside :func:`filtered_stderr`."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        with filtered_stderr(min_log_level()):
            self.loader.exec_module(module)


class _TensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` once, through the other finders, and wraps its loader."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        uninstall()
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and min_log_level() > 0:
            spec.loader = _FilteringLoader(spec.loader)
        return spec


_FINDER = _TensorFlowFinder()


def install() -> None:
    """Filter the first ``import tensorflow`` of this process (no-op once TensorFlow is loaded)."""
    if "tensorflow" not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    """Take the finder out (it works once)."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
