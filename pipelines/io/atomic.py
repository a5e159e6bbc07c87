"""Files that appear whole or not at all: write to a temporary file beside the target, then rename.

``os.replace`` within one folder is atomic on POSIX file systems, so a reader (``--resume``, a
training run reading features, a later stage reading a manifest) sees the old file or the new
one, never half of one, even when the writer is killed mid-write.

The temporary file is made by :func:`tempfile.mkstemp` in the target's folder: an unpredictable
name, created with ``O_CREAT | O_EXCL`` (a symlink or file planted there by someone else is never
opened, let alone followed) and mode 0600. The file keeps that mode unless the writer asks for
another (``mode``): files holding run state (checkpoints, their markers, run records) stay
owner-only; published results that other accounts read (a model, its contract, pictures) pass
``mode=PUBLIC``.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Iterator

PRIVATE = 0o600  # run state: readable by the job's own account only
PUBLIC = 0o644  # published results (model.keras, model.json, pictures): readable by every account


@contextlib.contextmanager
def replacing(path: str, suffix: str = "", mode: int = PRIVATE) -> Iterator[str]:
    """Yield the path of a new, empty temporary file (mode 0600) in ``path``'s folder; on success it
    gets ``mode`` and replaces ``path``, on an error it is removed and the error propagates
    (``path`` is left as it was).

    Args:
        path: the file to write.
        suffix: ending of the temporary name, for writers that choose a format by it
            (Keras' ``.keras``, ``.h5``).
        mode: permission bits of the file once written (:data:`PRIVATE` or :data:`PUBLIC`).
    """
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=f".tmp{suffix}", dir=folder)
    os.close(fd)  # the writers below open the path themselves (Keras, matplotlib, numpy)
    try:
        yield tmp
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def write_json(path: str, value: Any, indent: int = 2, mode: int = PRIVATE) -> None:
    """Write ``value`` as UTF-8 JSON to ``path`` atomically (non-ASCII kept as is), with ``mode``."""
    with replacing(path, mode=mode) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=indent, ensure_ascii=False)
