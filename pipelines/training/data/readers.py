"""The readers of a rank's shard behind one interface: which reader (``--reader``), and opening it.

A rank reads row groups ``r, r+n, ...`` of a split (rank ``r`` of ``n``:
:func:`pipelines.training.data.sharding.shard`), so shards can differ by a row group; the step
counts come from the manifest's global counts (:func:`pipelines.training.schedule.plan_steps`),
and training readers loop forever so that every rank can always take its steps. Two readers keep
that contract, one entry each in :data:`READERS`: Petastorm's (:mod:`pipelines.training.data.petastorm`,
the mission stack's) and our own (:mod:`pipelines.training.data.arrow_reader`, pyarrow only: the
current stack's, where Petastorm cannot run). Both cache row groups on the rank's local disk
(:mod:`pipelines.training.data.rowcache`) and yield one ``(image, label)`` named tuple per row
group, which :func:`row_groups_of` turns into arrays alike.

One-pass reads (exact evaluation, the feature cache) never go through a looping reader:
:class:`pipelines.training.data.onepass.OnePassShard`.
"""
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
    """One ``--reader``: ``open_shard(data, split, rank, world_size, cache_folder, cache_limit,
    workers, seed)``, a context manager yielding the looping reader of the rank's shard (its cache
    in ``cache_folder``, at most ``cache_limit`` bytes, or none), and ``why_not()``: why it cannot
    run here (a sentence), ``None`` when it can."""

    open_shard: Callable
    why_not: Callable[[], Optional[str]]


#: ``--reader``'s choices. Retiring one is deleting its entry (and its module).
READERS = {
    "petastorm": Reader(petastorm.open_shard, petastorm.why_not),
    "own": Reader(arrow_reader.open_shard, lambda: None),
}


def default_reader() -> str:
    """The reader a run uses unless ``--reader`` says: the installed stack's, as the stack table says
    (:attr:`pipelines.stack.Stack.reader`: ``petastorm`` on the mission stack, ``own`` on the current
    one), the stack known from the installed TensorFlow's version (package metadata: neither
    TensorFlow nor Petastorm is imported).

    Raises:
        pipelines.runtime.errors.Refused: the installed TensorFlow is on no stack (naming the stacks' and
            the readers to choose from).
    """
    try:
        return stack.active().reader
    except stack.UnknownStack as exc:
        raise Refused(f"--reader: no default here ({exc}): give --reader {' or '.join(READERS)}") from None


def check_reader(reader: str) -> str:
    """``reader`` (``--reader``), or :func:`default_reader` when empty.

    Raises:
        pipelines.runtime.errors.Refused: an unknown reader, or one that cannot run here (naming why).
    """
    reader = reader or default_reader()
    if reader not in READERS:
        raise Refused(f"--reader {reader}: choose one of {', '.join(READERS)}")
    why_not = READERS[reader].why_not()
    if why_not:
        raise Refused(f"--reader {reader}: {why_not}")
    return reader


def cache_size_bytes(data: Dataset, split: str, world_size: int) -> int:
    """Local-disk cache limit for one rank's shard of ``split``.

    A shard holds at most ``ceil(row_groups / world_size)`` row groups; the limit is 1.5 times that,
    and at least what Petastorm's ``LocalDiskCache`` demands (30 entries of one row group: its 6
    shards must each hold 5 entries of ``expected_row_size_bytes``, and an entry is a row group).
    """
    groups = data.row_groups(split)
    group_bytes = data.rows_per_row_group * data.row_bytes
    shard_groups = -(-groups // world_size)
    return int(max(1.5 * shard_groups * group_bytes, 31 * group_bytes)) + (1 << 20)


@contextlib.contextmanager
def open_reader(data: Dataset, split: str, rank: int, world_size: int, cache_root: Optional[str],
                workers: int = 2, seed: int = 0, reader: str = "", cache_name: str = "") -> Iterator:
    """A reader of this rank's shard of ``split`` (its row groups by
    :func:`~pipelines.training.data.sharding.shard`) that loops forever, a seeded shuffle of the row
    groups each epoch (training).

    Petastorm 0.13.1's thread pool can finish a bounded read (``num_epochs=1``) while its
    ventilator still holds row groups, so one-pass reads never go through a looping reader: they
    use :class:`~pipelines.training.data.onepass.OnePassShard`. Looping readers lose nothing that
    matters: the step counts come from the manifest, not from the reader.

    Args:
        cache_root: when set, a local-disk cache of flat row-group files in
            ``cache_root/rank<r>-<split>`` (:func:`pipelines.training.data.rowcache.rank_cache_folder`:
            one fresh owner-only folder per rank and split, deleted when the reader closes;
            ``cache_name`` names it otherwise: a rank reading several shards,
            :mod:`pipelines.training.resized`). ``None``: no cache.
        workers: reader threads.
        reader: a name in :data:`READERS`; empty: :func:`default_reader`.

    Yields:
        the reader, an iterator of one ``(image, label)`` named tuple per row group, NumPy
        arrays (read them with :func:`row_groups_of`; ours also restarts at any visit,
        :meth:`~pipelines.training.data.arrow_reader.ArrowShardReader.restart`); stopped, joined and its
        cache removed on exit.

    Raises:
        pipelines.training.data.rowcache.CacheFolderError: the cache folder is not this user's own or
            cannot be cleared.
        pipelines.runtime.errors.Refused: an unknown ``reader``, or one that cannot run here.
    """
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
    """Whether ``reader`` (:func:`open_reader`) can open the train stream at any row exactly: ours
    (it restarts at any visit), not Petastorm's (seeded, but it cannot start at a row)."""
    return isinstance(reader, arrow_reader.ArrowShardReader)


def row_groups_of(reader, stored_size: int) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """The rows of a reader (:func:`open_reader`, either), one row group at a time:
    ``(images uint8 (n, s, s, 3), labels int32 (n,))``.

    A row group Petastorm read from Parquet holds an object array of ``bytes``, joined here once
    into one array; ours, and one from the flat cache, hold them already as ``uint8 (n,
    row_bytes)`` (over Arrow's buffer or a memory map), only reshaped. None goes through a ``tf.string``
    tensor of each image.

    Raises:
        DataError: an image that is not :func:`pipelines.contract.row_bytes` ``(s)`` bytes as the
            manifest says (each checked), a missing one, or not one image per label.
    """
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
