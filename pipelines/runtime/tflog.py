"""``TF_CPP_MIN_LOG_LEVEL`` for the lines TensorFlow logs while it loads, on every stack.

``install`` filters stderr during the first ``import tensorflow`` (TF 2.21 logs before absl honours it)."""
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
    """``text`` without absl lines of severity below ``level`` and, for ``level`` >= 1, absl's notice."""
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
    """Capture fd 2 in a temporary file within the block; write its ``kept_lines`` to the real stderr at the end."""
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
    """Loads the ``tensorflow`` package with its real loader, inside ``filtered_stderr``."""

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
