"""Petastorm's reader of a rank's shard (``--reader petastorm``): the mission stack's, and all of it.

Everything that only Petastorm needs lives in this folder: its reader and its cache's store
(:mod:`~pipelines.training.data.petastorm.reader`, the only module that imports Petastorm or
diskcache) and its view of the data's pinned parts with the URLs it is given
(:mod:`~pipelines.training.data.petastorm.legacy_fs`, over ``pyarrow.filesystem``, which pyarrow 16
removed). Retiring the mission stack is deleting this folder and its entry in
:data:`pipelines.training.data.readers.READERS`.

This module imports neither: the current stack, whose pyarrow Petastorm 0.13.1 cannot import,
loads it to learn :func:`why_not`.
"""
from __future__ import annotations

import importlib.util
from typing import Optional

import pyarrow


def petastorm_available() -> bool:
    """Whether Petastorm 0.13.1 can run here: installed, and pyarrow older than 15 (it fails in
    ``make_batch_reader`` on 15 and at import on 16+: ``pyarrow.filesystem`` is gone). Imports
    neither Petastorm nor anything of it."""
    return importlib.util.find_spec("petastorm") is not None and int(pyarrow.__version__.split(".")[0]) < 15


def why_not() -> Optional[str]:
    """Why ``--reader petastorm`` cannot run here (naming the pyarrow and what to use instead), or
    ``None`` when it can."""
    if petastorm_available():
        return None
    return (f"Petastorm 0.13.1 does not run here (pyarrow {pyarrow.__version__}; it needs pyarrow < 15, and must "
            "be installed): use --reader own")


def open_shard(data, split: str, rank: int, world_size: int, cache_folder: Optional[str], cache_limit: int,
               workers: int, seed: int):
    """``--reader petastorm`` (:data:`pipelines.training.data.readers.READERS`): Petastorm's looping
    reader of rank ``rank``'s row groups of ``split`` of ``data`` (a
    :class:`~pipelines.training.data.dataset.Dataset`; its pinned parts alone, local or in a bucket,
    through :func:`~pipelines.training.data.petastorm.legacy_fs.petastorm_filesystem`), its local-disk cache
    of flat files in ``cache_folder`` (None: none), at most ``cache_limit`` bytes. A context manager
    (:func:`~pipelines.training.data.petastorm.reader.open_petastorm_reader`)."""
    # here, not at the top: Petastorm, diskcache and pyarrow.filesystem do not import on the current stack
    from pipelines.training.data.petastorm.legacy_fs import petastorm_filesystem, split_urls
    from pipelines.training.data.petastorm.reader import open_petastorm_reader

    return open_petastorm_reader(split_urls(data, split), petastorm_filesystem(data), rank, world_size,
                                 cache_folder, cache_limit, data.rows_per_row_group * data.row_bytes, workers, seed)
