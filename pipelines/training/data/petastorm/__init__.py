"""Petastorm's reader (``--reader petastorm``): the mission stack's, all of it in this folder. This module imports
neither Petastorm nor diskcache, so the current stack (whose pyarrow Petastorm cannot import) can ask ``why_not``."""
from __future__ import annotations

import importlib.util
from typing import Optional

import pyarrow


def petastorm_available() -> bool:
    """Whether Petastorm 0.13.1 can run here: installed, and pyarrow < 15 (nothing imported)."""
    return importlib.util.find_spec("petastorm") is not None and int(pyarrow.__version__.split(".")[0]) < 15


def why_not() -> Optional[str]:
    """Why ``--reader petastorm`` cannot run here (naming the pyarrow and what to use instead), or ``None``."""
    if petastorm_available():
        return None
    return (f"Petastorm 0.13.1 does not run here (pyarrow {pyarrow.__version__}; it needs pyarrow < 15, and must "
            "be installed): use --reader own")


def open_shard(data, split: str, rank: int, world_size: int, cache_folder: Optional[str], cache_limit: int,
               workers: int, seed: int):
    """``--reader petastorm``: Petastorm's looping reader of ``rank``'s row groups of ``data``'s pinned parts."""
    # here, not at the top: Petastorm, diskcache and pyarrow.filesystem do not import on the current stack
    from pipelines.training.data.petastorm.legacy_fs import petastorm_filesystem, split_urls
    from pipelines.training.data.petastorm.reader import open_petastorm_reader

    return open_petastorm_reader(split_urls(data, split), petastorm_filesystem(data), rank, world_size,
                                 cache_folder, cache_limit, data.rows_per_row_group * data.row_bytes, workers, seed)
