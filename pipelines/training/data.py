"""Data path of training: the ETL's manifest, Petastorm readers sharded per rank, ``tf.data``.

Petastorm shards by whole row groups (rank ``r`` of ``n`` reads row groups ``r, r+n, ...``), so
shards can differ by a row group; the step counts come from the manifest's global counts
(:func:`pipelines.training.schedule.plan_steps`), and training readers loop forever
(``num_epochs=None``) so that every rank can always take its steps. One-pass reads (exact
evaluation, the feature cache) read each row of a rank's shard exactly once with
:class:`OnePassShard` and check the count against the Parquet metadata.
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple

import numpy as np

from pipelines.contract import MANIFEST, SPLITS, TEST, TRAIN, Manifest
from pipelines.logs import plural
from pipelines.paths import check_url_safe, local_url

if TYPE_CHECKING:
    from pipelines.storage import Location

# petastorm 0.13 drives pyarrow 14 through APIs pyarrow deprecates, warning on every row group
# (from its reader threads too), and warns that ``schema_fields`` are now full-match patterns.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm(\..*)?$")
warnings.filterwarnings("ignore", message="schema_fields behavior has changed")


class DataError(ValueError):
    """The dataset cannot feed this training run; the message says why and what to change."""


@dataclass(frozen=True)
class Dataset:
    """An ETL output folder as training sees it: its ``root`` and its :class:`Manifest`.

    Images are uint8 RGB, HWC, ``image_size`` pixels square; the counts are global (all ranks).
    """

    root: str
    manifest: Manifest
    storage_options: Dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def location(self):
        """The root as a :class:`pipelines.storage.Location` (a local folder or a URI)."""
        from pipelines.storage import resolve

        return resolve(self.root, self.storage_options)

    @property
    def image_size(self) -> int:
        return self.manifest.image_size

    @property
    def num_classes(self) -> int:
        return self.manifest.num_classes

    @property
    def class_names(self) -> List[Optional[str]]:
        return self.manifest.class_names

    @property
    def rows_per_row_group(self) -> int:
        return self.manifest.rows_per_row_group

    @property
    def row_bytes(self) -> int:
        return self.manifest.row_bytes

    def rows(self, split: str) -> int:
        return self.manifest.splits[split].rows

    def row_groups(self, split: str) -> int:
        return self.manifest.splits[split].row_groups

    @property
    def train_rows(self) -> int:
        return self.rows(TRAIN)

    @property
    def test_rows(self) -> int:
        return self.rows(TEST)

    def parts(self, split: str) -> list:
        """The split's Parquet files as the manifest names them (:class:`pipelines.storage.Location`),
        in the manifest's order: a reader reads these and nothing else (a rerun of the ETL may be
        writing other files next to them)."""
        return self.manifest.part_locations(self.location, split)

    def split_urls(self, split: str) -> List[str]:
        """``file://`` URLs of the split's Parquet files, as Petastorm wants them (for a URI root,
        the URLs :class:`~pipelines.training.legacy_fs.LegacyFileSystem` maps back to the store)."""
        from pipelines.training.legacy_fs import petastorm_url

        return [local_url(part.path) if part.local else petastorm_url(part) for part in self.parts(split)]

    def petastorm_filesystem(self):
        """What Petastorm reads a URI root through (``None`` for local files: its own)."""
        from pipelines.training.legacy_fs import LegacyFileSystem

        location = self.location
        return None if location.local else LegacyFileSystem(location.filesystem)


def load_dataset(root: str, world_size: int, storage_options: Optional[Dict[str, str]] = None) -> Dataset:
    """Read and check the ETL's ``manifest.json`` for a run of ``world_size`` ranks.

    Args:
        root: a local folder, ``file://`` URL or URI (``s3://bucket/etl``).
        storage_options: ``--storage-option`` values for a URI's backend.

    Raises:
        DataError: no manifest (not an ETL output), an empty split, or fewer row groups in a split
            than ranks (Petastorm would give some rank no data).
        pipelines.storage.StorageError: an unknown scheme, a missing bucket, refused credentials.
        pipelines.paths.UnsafePathError: ``root`` holds a character a ``file://`` URL cannot carry.
    """
    from pipelines.storage import check_reachable, resolve

    location = resolve(root, storage_options)
    check_reachable(location, "--data")
    # Petastorm opens the parts by URL, a URI's too (Dataset.split_urls)
    check_url_safe(location.path if location.local else "/" + location.path, "--data")
    root = location.uri
    try:
        data = Dataset(root, Manifest.read(location), dict(storage_options or {}))
    except FileNotFoundError:
        raise DataError(f"no {MANIFEST} in {root}: --data must be the output folder of jobs/etl.py") from None
    for split in SPLITS:
        if data.rows(split) == 0:
            raise DataError(f"the {split} split of {root} is empty")
        if data.row_groups(split) < world_size:
            raise DataError(f"the {split} split has {plural(data.row_groups(split), 'row group')} but "
                            f"{plural(world_size, 'rank')} need one each (Petastorm shards by row group): use at "
                            f"most {plural(min(map(data.row_groups, SPLITS)), 'rank')}, or rerun the ETL with a "
                            "larger --min-row-groups")
    return data


def check_run(root: str, batch_size: int, world_size: int, storage_options: Optional[Dict[str, str]] = None) -> Dataset:
    """The data refusals every rank makes in ``plan_run``, made once by a process that launches
    the ranks (``--spark-np``, the notebooks), before any rank starts.

    Raises:
        DataError, pipelines.storage.StorageError: as :func:`load_dataset`.
        ValueError: a global batch larger than a split (:func:`~pipelines.training.schedule.plan_steps`).
    """
    from pipelines.training.schedule import plan_steps

    data = load_dataset(root, world_size, storage_options)
    plan_steps(data.train_rows, data.test_rows, batch_size, world_size)
    return data


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
                workers: int = 2, seed: int = 0, flat_cache: bool = True) -> Iterator:
    """A Petastorm batch reader of this rank's shard of ``split`` that loops forever (training).

    Petastorm 0.13.1's thread pool can finish a bounded read (``num_epochs=1``) while its
    ventilator still holds row groups, so one-pass reads never go through it: they use
    :class:`OnePassShard`. Looping readers lose nothing that matters: the step counts come from
    the manifest, not from the reader.

    Args:
        cache_root: when set, a local-disk cache in ``cache_root/rank<r>-<split>`` (one folder per
            rank and split: a closing reader deletes its whole cache folder, so readers must never
            share one). ``None``: no cache.

    Yields:
        the reader; it is stopped, joined and its cache removed on exit. Its batches are
        ``(image, label)`` named tuples, one per row group, converted to NumPy in the reader's
        workers (``convert_early_to_numpy``); read them with :func:`row_groups_of`.

    ``flat_cache`` (default): the cache stores row groups as flat files mapped back on a warm
    read (:class:`pipelines.training.rowcache.RowGroupDisk`); False: Petastorm's own pickling,
    for the loader benchmark's comparison.
    """
    from petastorm import make_batch_reader

    cache = {}
    if cache_root:
        location = os.path.join(cache_root, f"rank{rank}-{split}")
        shutil.rmtree(location, ignore_errors=True)  # a killed run's leftovers
        cache = dict(cache_type="local-disk", cache_location=location,
                     cache_size_limit=cache_size_bytes(data, split, world_size),
                     cache_row_size_estimate=data.rows_per_row_group * data.row_bytes)
        if flat_cache:
            from pipelines.training.rowcache import RowGroupDisk

            cache["cache_extra_settings"] = {"disk": RowGroupDisk}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # raised from pyarrow's own modules here
        reader = make_batch_reader(data.split_urls(split), filesystem=data.petastorm_filesystem(),
                                   schema_fields=["image", "label"],
                                   cur_shard=rank, shard_count=world_size, num_epochs=None,
                                   shuffle_row_groups=True, seed=seed,
                                   reader_pool_type="thread", workers_count=workers,
                                   convert_early_to_numpy=True, **cache)
    # The reader owns its lifetime: its __exit__ stops and joins it and deletes its cache. It also
    # prints "Cache cleanup complete.", so stdout is silenced for that exit only (``silence`` is
    # entered on the way out and left after the reader's __exit__).
    silence = contextlib.ExitStack()
    with silence, reader:
        try:
            yield reader
        finally:
            silence.enter_context(contextlib.redirect_stdout(io.StringIO()))


class ShardCountError(RuntimeError):
    """A one-pass read counted another number of rows than the Parquet metadata holds."""


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group: its file ``part`` (:class:`pipelines.storage.Location`), its ``index``
    in that file, its ``rows``."""

    part: "Location"
    index: int
    rows: int

    @property
    def path(self) -> str:
        return self.part.uri


def split_row_groups(parts: list) -> List[RowGroup]:
    """Every row group of a split's ``parts`` (:meth:`Dataset.parts`), files in the given order and
    groups in file order (footers only)."""
    import pyarrow.parquet as pq

    groups: List[RowGroup] = []
    for part in parts:
        meta = pq.read_metadata(part.path, filesystem=part.filesystem)
        groups += [RowGroup(part, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    return groups


class OnePassShard:
    """Every row of one rank's shard of a split, exactly once, read with pyarrow.

    The shard is row groups ``rank, rank + world_size, ...`` of :func:`split_row_groups`
    (Petastorm's rule, so shards differ by at most one row group); the ranks' shards are disjoint
    and cover the split. Reading is sequential, so no row can be lost to a worker pool, and every
    consumer checks what it counted with :meth:`verify`: for evaluation and the feature cache.
    """

    def __init__(self, data: Dataset, split: str, rank: int, world_size: int):
        self.data, self.split, self.rank, self.world_size = data, split, rank, world_size
        self.groups = split_row_groups(data.parts(split))[rank::world_size]
        self.expected_rows = sum(g.rows for g in self.groups)

    def batches(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """One ``(images uint8 (n, s, s, 3), labels int32 (n,))`` per row group, in shard order.

        Raises:
            ShardCountError: a row group holds another number of rows than its footer says.
            DataError: an image that is not ``image_size ** 2 * 3`` bytes.
        """
        import pyarrow.parquet as pq

        s = self.data.image_size
        for group in self.groups:
            with group.part.filesystem.open_input_file(group.part.path) as f:
                table = pq.ParquetFile(f).read_row_group(group.index, columns=["image", "label"])
            if table.num_rows != group.rows:
                raise ShardCountError(f"{group.path} row group {group.index}: read {plural(table.num_rows, 'row')}, "
                                      f"its footer says {group.rows}")
            column = table.column("image").combine_chunks()
            offsets = np.frombuffer(column.buffers()[1], np.int32, len(column) + 1, column.offset * 4)
            if np.any(np.diff(offsets) != self.data.row_bytes):
                raise DataError(f"{group.path}: an image is not {s}x{s}x3 bytes as the manifest says")
            pixels = np.frombuffer(column.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
            yield pixels.reshape(-1, s, s, 3), table.column("label").to_numpy().astype(np.int32)

    def dataset(self, batch_size: int, model_size: int = 0):
        """``tf.data`` over :meth:`batches`: ``(float32 (b, m, m, 3), int32 (b,))``, the last batch
        possibly smaller, preprocessed exactly as :func:`make_dataset` does."""
        import tensorflow as tf

        s = self.data.image_size
        ds = tf.data.Dataset.from_generator(self.batches, output_signature=(
            tf.TensorSpec((None, s, s, 3), tf.uint8), tf.TensorSpec((None,), tf.int32)))
        return batched(ds.unbatch(), batch_size, s, model_size, drop_remainder=False)

    def verify(self, counted: int) -> None:
        """Raise :class:`ShardCountError` unless ``counted`` equals the shard's rows (metadata)."""
        if counted != self.expected_rows:
            raise ShardCountError(f"rank {self.rank} counted {plural(counted, 'row')} of its {self.split} shard, "
                                  f"whose Parquet metadata holds {self.expected_rows}")


def verify_total(counted: int, data: Dataset, split: str) -> None:
    """Raise :class:`ShardCountError` unless the rows counted over all ranks equal the manifest's."""
    expected = data.rows(split)
    if counted != expected:
        raise ShardCountError(f"all ranks counted {plural(counted, 'row')} of the {split} split; the manifest says "
                              f"{expected}")


def preprocessor(stored_size: int, model_size: int = 0, augment: bool = False, seed: int = 0):
    """The preprocessing of every input path: uint8 ``(s, s, 3)`` -> float32 ``(m, m, 3)``, or a
    whole batch at once, uint8 ``(b, s, s, 3)`` -> float32 ``(b, m, m, 3)`` (what :func:`batched`
    maps: every op below works per image in a batch, the flip drawn for each image).

    Resized (bilinear, as the exported model's ``Resizing`` layer) when ``model_size`` differs
    from ``stored_size``, then Xception's
    ``preprocess_input`` (``x / 127.5 - 1``, in [-1, 1]), then a random left-right flip when
    ``augment``.
    """
    import tensorflow as tf
    from pipelines.kerasapi import keras

    size = model_size or stored_size

    def preprocess(image, label):
        image = tf.cast(image, tf.float32)
        if size != stored_size:
            # bilinear as Keras' Resizing layer does, so that the exported model (which takes the
            # stored image and resizes inside the graph) computes exactly what training saw
            image = tf.image.resize(image, [size, size], method="bilinear")
        image = keras.applications.xception.preprocess_input(image)
        if augment:
            image = tf.image.random_flip_left_right(image, seed=seed)
        return image, label

    return preprocess


def row_groups_of(reader, stored_size: int) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """The rows of a Petastorm batch reader (:func:`open_reader`), one row group at a time:
    ``(images uint8 (n, s, s, 3), labels int32 (n,))``.

    A row group read from Parquet holds an object array of ``bytes``, joined here once into one
    array; one from the flat cache holds them already as ``uint8 (n, s * s * 3)`` over a memory
    map, only reshaped. Neither goes through a ``tf.string`` tensor of each image.

    Raises:
        DataError: an image that is not ``s * s * 3`` bytes as the manifest says (each checked), a
            missing one, or not one image per label.
    """
    row_bytes = stored_size * stored_size * 3
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


def batched(ds, batch_size: int, stored_size: int, model_size: int = 0, shuffle_buffer: int = 0, seed: int = 0,
            augment: bool = False, drop_remainder: bool = True):
    """The tail every input path shares: single uint8 images -> shuffled in a bounded buffer
    (4x smaller than float32: shuffle before converting) -> batched -> :func:`preprocessor`
    applied to each whole batch (one vectorised op per batch, not one per image) -> prefetched.

    Args:
        ds: a ``tf.data.Dataset`` of ``(uint8 (s, s, 3), int32 ())``.
        drop_remainder: full batches only (training: every rank takes the same steps); False for
            one-pass evaluation, whose last batch may be smaller.

    Returns:
        a ``tf.data.Dataset`` of ``(float32 (b, m, m, 3), int32 (b,))``.
    """
    import tensorflow as tf

    if shuffle_buffer > 1:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    ds = ds.map(preprocessor(stored_size, model_size, augment, seed), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def make_dataset(reader, stored_size: int, batch_size: int, model_size: int = 0,
                 shuffle_buffer: int = 0, seed: int = 0, augment: bool = False):
    """``tf.data`` pipeline over a looping Petastorm batch reader (training and validation).

    Row groups (:func:`row_groups_of`) are unbatched into single uint8 images and go through
    :func:`batched` (shuffle, full batches only, preprocessing per batch, prefetch).

    Returns:
        a ``tf.data.Dataset`` of ``(images float32 (batch, m, m, 3), labels int32 (batch,))``.
    """
    import tensorflow as tf

    s = stored_size
    ds = tf.data.Dataset.from_generator(lambda: row_groups_of(reader, s), output_signature=(
        tf.TensorSpec((None, s, s, 3), tf.uint8), tf.TensorSpec((None,), tf.int32)))
    return batched(ds.unbatch(), batch_size, s, model_size, shuffle_buffer, seed, augment)


def default_cache_root() -> str:
    """A fresh temporary folder for the Petastorm caches of this process."""
    return tempfile.mkdtemp(prefix="pipelines-cache-")
