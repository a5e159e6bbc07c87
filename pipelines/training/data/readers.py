"""The readers of a rank's shard behind one interface (``--reader``); they loop forever."""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from typing import Callable, Iterator, NamedTuple, Optional, Tuple

import numpy as np

from pipelines import contract, stack
from pipelines.runtime.errors import Refused
from pipelines.training.data import arrow_reader, petastorm
from pipelines.training.data.dataset import Dataset
from pipelines.training.data.errors import DataError
from pipelines.training.data.rowcache import rank_cache_folder


class Reader(NamedTuple):
    """One ``--reader``: ``open_shard(...)``, a context manager yielding the looping reader, and ``why_not()``."""

    open_shard: Callable
    why_not: Callable[[], Optional[str]]


#: ``--reader``'s choices. Retiring one is deleting its entry (and its module).
READERS = {
    "petastorm": Reader(petastorm.open_shard, petastorm.why_not),
    "own": Reader(arrow_reader.open_shard, lambda: None),
}


def default_reader() -> str:
    """The reader of the installed stack (known from TensorFlow's package metadata); ``Refused`` on no stack."""
    try:
        return stack.active().reader
    except stack.UnknownStack as exc:
        raise Refused(f"--reader: no default here ({exc}): give --reader {' or '.join(READERS)}") from None


def check_reader(reader: str) -> str:
    """``reader`` (``--reader``), or ``default_reader()`` when empty; ``Refused`` if unknown or unable to run here."""
    reader = reader or default_reader()
    if reader not in READERS:
        raise Refused(f"--reader {reader}: choose one of {', '.join(READERS)}")
    why_not = READERS[reader].why_not()
    if why_not:
        raise Refused(f"--reader {reader}: {why_not}")
    return reader


def cache_size_bytes(data: Dataset, split: str, world_size: int) -> int:
    """Local-disk cache limit for one rank's shard: 1.5 shards, at least 31 row groups (Petastorm's cache wants 30)."""
    groups = data.row_groups(split)
    group_bytes = data.rows_per_row_group * data.row_bytes
    shard_groups = -(-groups // world_size)
    return int(max(1.5 * shard_groups * group_bytes, 31 * group_bytes)) + (1 << 20)


@contextlib.contextmanager
def open_reader(data: Dataset, split: str, rank: int, world_size: int, cache_root: Optional[str],
                workers: int = 2, seed: int = 0, reader: str = "", cache_name: str = "") -> Iterator:
    """A reader of this rank's shard of ``split`` that loops forever, row groups reshuffled (seeded) each epoch.

    Args:
        cache_root: cache the row groups in a fresh folder ``cache_root/rank<r>-<split>``; ``None``: no cache.

    Yields:
        an iterator of one ``(image, label)`` named tuple per row group (read it with ``row_groups_of``).

    Raises:
        CacheFolderError: the cache folder is not this user's own or cannot be cleared.
        Refused: an unknown ``reader``, or one that cannot run here."""
    chosen = READERS[check_reader(reader)]
    data.check_footers()  # the counts below size its cache
    folder = rank_cache_folder(cache_root, cache_name or f"rank{rank}-{split}") if cache_root else None
    try:
        with chosen.open_shard(data, split, rank, world_size, folder, cache_size_bytes(data, split, world_size),
                               workers, seed) as opened:
            yield opened
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)  # Petastorm removes its own; ours here


def exact_positions(reader) -> bool:
    """Whether ``reader`` can open the train stream at any row: ours yes, Petastorm's not."""
    return isinstance(reader, arrow_reader.ArrowShardReader)


def row_groups_of(reader, stored_size: int) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Either reader's rows, a row group at a time: ``(images uint8 (n, s, s, 3), labels int32 (n,))``.

    Raises:
        DataError: an image not ``contract.row_bytes(s)`` bytes, a missing one, or not one image per label."""
    row_bytes = contract.row_bytes(stored_size)
    for group in reader:
        images = group.image
        if images.dtype == object:  # each image checked: sizes that only add up would shift rows
            size_ok = all(image is not None and len(image) == row_bytes for image in images)
        else:  # a row group of no rows is stored 0 bytes wide
            size_ok = images.ndim == 2 and (images.shape[1] == row_bytes or images.shape[0] == 0)
        if not size_ok or len(images) != len(group.label):
            raise DataError(f"a row group holds an image that is not {stored_size}x{stored_size}x3 bytes as the "
                            "manifest says, or a missing image")
        if images.dtype == object:
            images = np.frombuffer(b"".join(images), np.uint8)
        yield images.reshape(-1, stored_size, stored_size, 3), np.asarray(group.label, np.int32)


def default_cache_root() -> str:
    """A fresh temporary folder (0700, ours) for the readers' caches of this process."""
    return tempfile.mkdtemp(prefix="pipelines-cache-")
