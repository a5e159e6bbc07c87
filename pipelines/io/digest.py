"""The sha256 of a local file, read in 1 MiB blocks: how checkpoints, models and weights files are identified."""
from __future__ import annotations

import hashlib
import os
from typing import Union


def file_sha256(path: Union[str, os.PathLike]) -> str:
    """Hex sha256 of the bytes of the local file ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
