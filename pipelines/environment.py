"""Environment variables set for a block of code, then restored."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Dict, Iterable, Iterator


@contextmanager
def environment(values: Dict[str, str], keep: Iterable[str] = ()) -> Iterator[None]:
    """Set the environment variables ``values`` for the block (for a child process started in it,
    or a library that reads its settings from there); afterwards each of them, and each variable
    named in ``keep`` (one the block may change), has its former value again, or is unset if it was."""
    saved = {key: os.environ.get(key) for key in (*values, *keep)}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
