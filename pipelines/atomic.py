"""Files that appear whole or not at all: write to a temporary name beside the target, then rename.

``os.replace`` within one folder is atomic on POSIX file systems, so a reader (``--resume``, a
training run reading features, a later stage reading a manifest) sees the old file or the new
one, never half of one, even when the writer is killed mid-write.
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator


@contextlib.contextmanager
def replacing(path: str, suffix: str = "") -> Iterator[str]:
    """Yield a temporary path in ``path``'s folder; on success it replaces ``path``, on an error
    it is removed and the error propagates (``path`` is left as it was).

    Args:
        path: the file to write.
        suffix: ending of the temporary name, for writers that choose a format by it
            (Keras' ``.keras``, ``.h5``).
    """
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def write_json(path: str, value: Any, indent: int = 2) -> None:
    """Write ``value`` as UTF-8 JSON to ``path`` atomically (non-ASCII kept as is)."""
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=indent, ensure_ascii=False)
