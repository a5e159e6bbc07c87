"""Data path of training: the ETL's manifest, looping readers sharded per rank, ``tf.data``.

A rank reads row groups ``r, r+n, ...`` of a split (rank ``r`` of ``n``), so shards can differ by
a row group; the step counts come from the manifest's global counts
(:func:`pipelines.training.schedule.plan_steps`), and training readers loop forever so that every
rank can always take its steps. Two readers keep that contract (:func:`open_reader`, chosen by
``--reader``): Petastorm's (:mod:`pipelines.training.petastorm_reader`, the mission stack's) and
our own (:mod:`pipelines.training.arrow_reader`, pyarrow only: the current stack's, where
Petastorm cannot run). One-pass reads (exact evaluation, the feature cache) read each row of a
rank's shard exactly once with :class:`OnePassShard` and check the count against the Parquet
metadata, whichever the reader.

Over our reader, training's stream is positioned (:mod:`pipelines.training.stream`): the shuffle
(in windows of row groups) and the flips are functions of the stream row, so
:func:`make_dataset` opens it at any ``start_row`` exactly (a resume in the middle of an epoch
sees the batches an uninterrupted run sees). Petastorm's thread pool reorders row groups, so over
its reader the stream is ``tf.data``'s shuffle as before and cannot be opened at a row
(:func:`exact_positions`).
"""
from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple

import numpy as np

from pipelines.contract import MANIFEST, MANIFEST_FORMAT, SPLITS, TEST, TRAIN, VALIDATION, Manifest
from pipelines.errors import Refused
from pipelines.logs import plural
from pipelines.paths import check_url_safe, local_url
from pipelines.training.sharding import shard
from pipelines.training.arrow_reader import (DataError, RowGroup, ShardCountError, read_group,  # noqa: F401
                                             split_row_groups)

if TYPE_CHECKING:
    from pipelines.storage import Location

READERS = ("petastorm", "own")


def default_reader() -> str:
    """The reader a run uses unless ``--reader`` says: ``petastorm`` where Petastorm 0.13.1 can run
    with the installed pyarrow (the mission stack), else ``own`` (the current stack). Decided
    without importing Petastorm."""
    return "petastorm" if petastorm_available() else "own"


def check_reader(reader: str) -> str:
    """``reader`` (``--reader``), or :func:`default_reader` when empty.

    Raises:
        ValueError: an unknown reader, or ``petastorm`` where Petastorm cannot run (naming why).
    """
    reader = reader or default_reader()
    if reader not in READERS:
        raise Refused(f"--reader {reader}: choose one of {', '.join(READERS)}")
    if reader == "petastorm" and not petastorm_available():
        import pyarrow

        raise Refused(f"--reader petastorm: Petastorm 0.13.1 does not run here (pyarrow {pyarrow.__version__}; it "
                      "needs pyarrow < 15, and must be installed): use --reader own")
    return reader


def petastorm_available() -> bool:
    """Whether Petastorm 0.13.1 can run here: installed, and pyarrow older than 15 (it fails in
    ``make_batch_reader`` on 15 and at import on 16+: ``pyarrow.filesystem`` is gone). Imports
    neither Petastorm nor anything of it."""
    import importlib.util

    import pyarrow

    return importlib.util.find_spec("petastorm") is not None and int(pyarrow.__version__.split(".")[0]) < 15


@dataclass(frozen=True)
class Dataset:
    """An ETL output folder as training sees it: its ``root`` and its :class:`Manifest`.

    Images are uint8 RGB, HWC, ``image_size`` pixels square; the counts are global (all ranks).
    """

    root: str
    manifest: Manifest
    storage_options: Dict[str, str] = field(default_factory=dict, compare=False)
    _footers_checked: list = field(default_factory=list, compare=False, repr=False)  # [True] once checked

    def check_footers(self) -> None:
        """:meth:`pipelines.contract.Manifest.check_footers`, once per Dataset: before any reader
        opens a part or sizes a cache by the manifest's counts (:meth:`parts` and
        :func:`open_reader` call it).

        Raises:
            pipelines.contract.ManifestError: a part that is not a file, footers that disagree.
        """
        if not self._footers_checked:
            self.manifest.check_footers(self.location)
            self._footers_checked.append(True)

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
    def validation_rows(self) -> int:
        return self.rows(VALIDATION)

    @property
    def test_rows(self) -> int:
        return self.rows(TEST)

    @property
    def run_id(self) -> Optional[str]:
        """The ETL run the manifest commits (``None``: a format-1 manifest)."""
        return self.manifest.extra.get("run_id")

    def identity(self):
        """The data's :class:`pipelines.contract.DataIdentity`: the run id and every part's path,
        size and Parquet footer (one footer read per part), what results kept beyond a run are
        keyed by (the feature cache)."""
        from pipelines.contract import data_identity

        return data_identity(self.location, self.manifest)

    def parts(self, split: str) -> list:
        """The split's Parquet files as the manifest names them (:class:`pipelines.storage.Location`),
        in the manifest's order: a reader reads these and nothing else (a rerun of the ETL may be
        writing other files next to them); their footers checked first (:meth:`check_footers`)."""
        self.check_footers()
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
        DataError: no manifest (not an ETL output), a manifest without a validation split
            (:func:`check_validation_split`), an empty split, or fewer row groups in the train split
            than ranks (:func:`check_train_row_groups`).
        pipelines.storage.StorageError: an unknown scheme, a missing bucket, refused credentials.
        pipelines.paths.UnsafePathError: ``root`` holds a character a ``file://`` URL cannot carry.
        pipelines.contract.ManifestError: a manifest out of bounds or naming a part outside its
            run's split folder (:func:`pipelines.contract.check_manifest`); its footers are checked
            before the first reader opens (:meth:`Dataset.check_footers`).
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
    check_validation_split(data.manifest, root)
    for split in SPLITS:
        if data.rows(split) == 0:
            raise DataError(f"the {split} split of {root} is empty")
    check_train_row_groups(data, world_size)
    return data


def check_validation_split(manifest: Manifest, root: str) -> None:
    """Refuse a manifest of an older format, with train and test splits only.

    Training chooses its epoch (early stopping, best weights, fine-tuning's start) on the
    validation split and reads the test split once, for the figure it reports; a two-split
    output could only choose on test, which makes that figure optimistic. The rule is a refusal,
    not a hold-out carved from train here: the ETL's split is the one place a split is decided
    (stratified, seeded, recorded in the manifest), and rerunning it is cheap next to training.

    Raises:
        DataError: naming the manifest's format and the command that writes three splits.
    """
    if VALIDATION not in manifest.splits:
        raise DataError(f"{root} was written by an older ETL (manifest format {manifest.format_version}: "
                        f"{' and '.join(manifest.splits)} splits only): training chooses its epoch on a "
                        f"validation split, never on the test split it reports; rerun jobs/etl.py on the "
                        f"images to write train, validation and test (manifest format {MANIFEST_FORMAT})")


def check_train_row_groups(data: Dataset, world_size: int) -> None:
    """Refuse a train split of fewer row groups than ranks: its looping readers give each rank
    whole row groups (:func:`~pipelines.training.sharding.shard`), so a rank would have none. (The
    test split is read by one-pass shards, by rows where ranks outnumber its row groups: never
    refused.)

    Raises:
        DataError: naming both numbers and the ETL flags that give more row groups
            (``--min-row-groups``: the fewest per split; ``--row-group-mb``: their size).
    """
    groups = data.row_groups(TRAIN)
    if groups < world_size:
        raise DataError(f"the train split has {plural(groups, 'row group')} but {plural(world_size, 'rank')} need "
                        f"one each (a rank reads whole row groups): use at most {plural(groups, 'rank')}, or rerun "
                        f"the ETL with --min-row-groups {world_size} (or a smaller --row-group-mb)")


def check_run(root: str, batch_size: int, world_size: int, storage_options: Optional[Dict[str, str]] = None) -> Dataset:
    """The data refusals every rank makes in ``plan_run``, made once by a process that launches
    the ranks (``--spark-np``, the notebooks), before any rank starts.

    Raises:
        DataError, pipelines.storage.StorageError: as :func:`load_dataset`.
        ValueError: a global batch larger than a split (:func:`~pipelines.training.schedule.plan_steps`).
    """
    from pipelines.training.schedule import plan_steps

    data = load_dataset(root, world_size, storage_options)
    plan_steps(data.train_rows, data.validation_rows, batch_size, world_size)
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
                workers: int = 2, seed: int = 0, reader: str = "", cache_name: str = "") -> Iterator:
    """A reader of this rank's shard of ``split`` (its row groups by
    :func:`~pipelines.training.sharding.shard`) that loops forever, a seeded shuffle of the row
    groups each epoch (training).

    Petastorm 0.13.1's thread pool can finish a bounded read (``num_epochs=1``) while its
    ventilator still holds row groups, so one-pass reads never go through a looping reader: they
    use :class:`OnePassShard`. Looping readers lose nothing that matters: the step counts come
    from the manifest, not from the reader.

    Args:
        cache_root: when set, a local-disk cache of flat row-group files in
            ``cache_root/rank<r>-<split>`` (:func:`pipelines.training.rowcache.rank_cache_folder`:
            one fresh owner-only folder per rank and split, deleted when the reader closes;
            ``cache_name`` names it otherwise: a rank reading several shards,
            :mod:`pipelines.training.resized`). ``None``: no cache.
        workers: reader threads.
        reader: ``petastorm`` or ``own`` (:data:`READERS`); empty: :func:`default_reader`.

    Yields:
        the reader, an iterator of one ``(image, label)`` named tuple per row group, NumPy
        arrays (read them with :func:`row_groups_of`; ours also restarts at any visit,
        :meth:`~pipelines.training.arrow_reader.ArrowShardReader.restart`); stopped, joined and its
        cache removed on exit.

    Raises:
        pipelines.training.rowcache.CacheFolderError: the cache folder is not this user's own or
            cannot be cleared.
        ValueError: an unknown ``reader``.
    """
    from pipelines.training import rowcache

    reader = check_reader(reader)
    data.check_footers()  # the counts below size its cache
    folder = rowcache.rank_cache_folder(cache_root, cache_name or f"rank{rank}-{split}") if cache_root else None
    limit, row_size = cache_size_bytes(data, split, world_size), data.rows_per_row_group * data.row_bytes
    try:
        if reader == "petastorm":
            from pipelines.training.petastorm_reader import open_petastorm_reader

            with open_petastorm_reader(data.split_urls(split), data.petastorm_filesystem(), rank, world_size,
                                       folder, limit, row_size, workers, seed) as opened:
                yield opened
        else:
            from pipelines.training.arrow_reader import ArrowShardReader

            cache = rowcache.RowGroupFiles(folder, limit) if folder else None
            groups = shard(split_row_groups(data.parts(split)), rank, world_size)
            with ArrowShardReader(groups, data.row_bytes, seed, workers, cache=cache) as opened:
                yield opened
    finally:
        if folder:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)  # Petastorm removes its own; ours here


class OnePassShard:
    """Every row of one rank's shard of a split, exactly once, read with pyarrow.

    The shard is row groups ``rank, rank + world_size, ...`` of :func:`split_row_groups` (the
    readers' rule, so shards differ by at most one row group) while the split has at least as many
    row groups as ranks; beyond that it is rows ``[rank * N // world_size, (rank + 1) * N //
    world_size)`` of the split's ``N`` rows in file order (:func:`row_ranges`), so that no world
    size is refused for a short split and shards differ by at most one row. Either way the
    ranks' shards are disjoint and cover the split. Reading is sequential, so no row can be lost
    to a worker pool, and every consumer checks what it counted with :meth:`verify`: for
    evaluation and the feature cache.
    """

    def __init__(self, data: Dataset, split: str, rank: int, world_size: int):
        self.data, self.split, self.rank, self.world_size = data, split, rank, world_size
        groups = split_row_groups(data.parts(split))
        if len(groups) >= world_size:
            self.pieces = [(group, 0, group.rows) for group in shard(groups, rank, world_size)]
        else:
            self.pieces = row_ranges(groups, rank, world_size)
        self.expected_rows = sum(stop - start for _, start, stop in self.pieces)

    def batches(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """One ``(images uint8 (n, s, s, 3), labels int32 (n,))`` per row group (or the shard's
        slice of one), in shard order.

        Raises:
            ShardCountError: a row group holds another number of rows than its footer says.
            DataError: an image that is not ``image_size ** 2 * 3`` bytes (each checked).
        """
        s = self.data.image_size
        for group, start, stop in self.pieces:
            images, labels = read_group(group, self.data.row_bytes)
            yield images[start:stop].reshape(-1, s, s, 3), labels[start:stop]

    def dataset(self, batch_size: int):
        """``tf.data`` over :meth:`batches`: ``(uint8 (b, s, s, 3), int32 (b,))``, the last batch
        possibly smaller, through the tail :func:`make_dataset` uses (:func:`batched`)."""
        import tensorflow as tf

        s = self.data.image_size
        ds = tf.data.Dataset.from_generator(self.batches, output_signature=(
            tf.TensorSpec((None, s, s, 3), tf.uint8), tf.TensorSpec((None,), tf.int32)))
        return batched(ds.unbatch(), batch_size, drop_remainder=False)

    def verify(self, counted: int) -> None:
        """Raise :class:`ShardCountError` unless ``counted`` equals the shard's rows (metadata)."""
        if counted != self.expected_rows:
            raise ShardCountError(f"rank {self.rank} counted {plural(counted, 'row')} of its {self.split} shard, "
                                  f"whose Parquet metadata holds {self.expected_rows}")


def row_ranges(groups: List[RowGroup], rank: int, world_size: int) -> List[Tuple[RowGroup, int, int]]:
    """Rank ``rank``'s rows ``[rank * N // world_size, (rank + 1) * N // world_size)`` of the
    ``N`` rows of ``groups`` (in order), as ``(row group, first row, end row)`` slices of the row
    groups they lie in (a rank may get none when ``N < world_size``)."""
    total = sum(group.rows for group in groups)
    first, end = rank * total // world_size, (rank + 1) * total // world_size
    pieces, offset = [], 0
    for group in groups:
        start, stop = max(first - offset, 0), min(end - offset, group.rows)
        if start < stop:
            pieces.append((group, start, stop))
        offset += group.rows
    return pieces


def verify_total(counted: int, data: Dataset, split: str) -> None:
    """Raise :class:`ShardCountError` unless the rows counted over all ranks equal the manifest's."""
    expected = data.rows(split)
    if counted != expected:
        raise ShardCountError(f"all ranks counted {plural(counted, 'row')} of the {split} split; the manifest says "
                              f"{expected}")


def flipper(seed: int = 0):
    """``--augment`` over Petastorm's reader: a random left-right flip of each uint8 image of a
    batch ``(b, s, s, 3)`` (each image's own draw, a stateful op: not positional; over our reader
    the flips are the positioned stream's, :func:`pipelines.training.stream.stream_batches`),
    labels unchanged. It moves bytes only, so it runs on the host before
    the copy; a flip commutes with the model's bilinear ``Resizing``, so flipping the stored image
    is flipping what the backbone sees."""
    import tensorflow as tf

    def flip(images, labels):
        return tf.image.random_flip_left_right(images, seed=seed), labels

    return flip


def row_groups_of(reader, stored_size: int) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """The rows of a reader (:func:`open_reader`, either), one row group at a time:
    ``(images uint8 (n, s, s, 3), labels int32 (n,))``.

    A row group Petastorm read from Parquet holds an object array of ``bytes``, joined here once
    into one array; ours, and one from the flat cache, hold them already as ``uint8 (n, s * s *
    3)`` (over Arrow's buffer or a memory map), only reshaped. None goes through a ``tf.string``
    tensor of each image.

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


def batched(ds, batch_size: int, shuffle_buffer: int = 0, seed: int = 0, augment: bool = False,
            drop_remainder: bool = True, device: Optional[str] = None, weight: Optional[float] = None):
    """The tail every input path shares: single uint8 images -> shuffled in a bounded buffer ->
    batched -> flipped with ``augment`` (:func:`flipper`) -> prefetched on the host, then to the
    device (:func:`to_device`). The batches stay uint8: the model casts and preprocesses them
    itself, where it runs (:func:`pipelines.training.model.preprocessing`). At 299 px an image is
    268,203 bytes as uint8 (:func:`pipelines.contract.row_bytes`) and would be 1,072,812 bytes as
    float32, so the host's shuffle buffer, its prefetched batches and each batch's copy over PCIe
    to a GPU are 4 times smaller than after a cast on the CPU (a batch of 16: 4.3 MB, not 17.2 MB).

    Args:
        ds: a ``tf.data.Dataset`` of ``(uint8 (s, s, 3), int32 ())``.
        drop_remainder: full batches only (training: every rank takes the same steps); False for
            one-pass evaluation, whose last batch may be smaller.
        device: the device to prefetch to (:func:`to_device`); ``None``: as
            :func:`pipelines.training.devices.prefetch_device` chooses from TensorFlow's GPUs.
        weight: each row's loss weight (:func:`weighted`), or ``None``.

    Returns:
        a ``tf.data.Dataset`` of ``(uint8 (b, s, s, 3), int32 (b,))`` (with ``weight``, and
        ``float32 (b,)``).
    """
    import tensorflow as tf

    if shuffle_buffer > 1:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    if augment:
        ds = ds.map(flipper(seed), num_parallel_calls=tf.data.AUTOTUNE)
    return to_device(weighted(ds, weight), device)


def weighted(ds, weight: Optional[float]):
    """``ds`` of ``(rows, labels int32 (b,))`` with each row's loss ``weight`` as Keras' sample
    weights, ``(rows, labels, float32 (b,))``; ``ds`` itself when ``weight`` is ``None``. A rank's
    rows weighted ``n b_j / G`` when per-rank batches differ (:mod:`pipelines.training.dataworld`).
    Before :func:`to_device`, which must stay the last stage."""
    import tensorflow as tf

    if weight is None:
        return ds
    return ds.map(lambda rows, labels: (rows, labels, tf.fill(tf.shape(labels), tf.constant(weight, tf.float32))))


#: Batches held on the device ahead of the step that takes them: one being copied while the
#: model computes on the other.
DEVICE_BUFFER = 2


def to_device(ds, device: Optional[str] = None):
    """The last stage of an input pipeline: a host prefetch (the readers and batching run ahead),
    then, when ``device`` is set, a copy to it and a prefetch there of :data:`DEVICE_BUFFER`
    batches (``tf.data.experimental.copy_to_device`` and a ``prefetch`` placed on the device, as
    ``prefetch_to_device`` is documented to do; it must be the last stage), so that a GPU's step
    never waits for a host-to-device copy. ``device`` ``None``: chosen by
    :func:`pipelines.training.devices.prefetch_device` from the GPUs TensorFlow sees (a rank sees
    its own only, :func:`pipelines.training.devices.apply_device`); the host only when there is none.
    """
    import tensorflow as tf

    from pipelines.training.devices import prefetch_device

    ds = ds.prefetch(tf.data.AUTOTUNE)
    device = device or prefetch_device([d.name for d in tf.config.list_logical_devices("GPU")])
    if device is None:
        return ds
    ds = ds.apply(tf.data.experimental.copy_to_device(device))
    with tf.device(device):
        return ds.prefetch(DEVICE_BUFFER)


def make_dataset(reader, stored_size: int, batch_size: int, shuffle_buffer: int = 0, seed: int = 0,
                 augment: bool = False, start_row: int = 0, device: Optional[str] = None,
                 weight: Optional[float] = None):
    """``tf.data`` pipeline over a looping reader (:func:`open_reader`; training).

    Over our reader (:func:`exact_positions`): the positioned stream
    (:func:`positioned_dataset`) from ``start_row``, shuffled in windows of about
    ``shuffle_buffer`` images and flipped with ``augment`` by position, then prefetched (no
    ``tf.data`` shuffle). Over Petastorm's: row groups (:func:`row_groups_of`) unbatched into
    single uint8 images through :func:`batched` (a shuffle buffer of ``shuffle_buffer``, full
    batches only, :func:`flipper` with ``augment``, prefetch to the device); its reader cannot
    start mid-stream, so ``start_row`` is not honoured: the dataset takes the reader's rows from
    where it is (not exact). ``weight``: each row's loss weight over Petastorm's reader (a rank of
    another world than the run's data world, :mod:`pipelines.training.resized`; :func:`weighted`).

    Each ``iter()`` of the dataset starts again at ``start_row`` (and, over our reader, stops the
    iterators over it made before).

    Returns:
        a ``tf.data.Dataset`` of ``(images uint8 (batch, s, s, 3), labels int32 (batch,))``.

    Raises:
        ValueError: a negative ``start_row`` (over our reader).
    """
    import tensorflow as tf

    if exact_positions(reader):
        return positioned_dataset(reader, stored_size, batch_size, shuffle_buffer, seed, augment, start_row, device)
    s = stored_size
    ds = tf.data.Dataset.from_generator(lambda: row_groups_of(reader, s), output_signature=(
        tf.TensorSpec((None, s, s, 3), tf.uint8), tf.TensorSpec((None,), tf.int32)))
    return batched(ds.unbatch(), batch_size, shuffle_buffer, seed, augment, device=device, weight=weight)


def exact_positions(reader) -> bool:
    """Whether ``reader`` (:func:`open_reader`) can open the train stream at any row exactly: ours
    (it restarts at any visit), not Petastorm's (its thread pool reorders row groups)."""
    from pipelines.training.arrow_reader import ArrowShardReader

    return isinstance(reader, ArrowShardReader)


def shard_stream(reader, shuffle_buffer: int, seed: int):
    """The :class:`pipelines.training.stream.ShardStream` of our ``reader``'s shard: its row
    groups' rows (footers), ``seed``, and windows of
    :func:`~pipelines.training.stream.window_visits` ``(shuffle_buffer, rows)`` row groups, rows
    being the shard's largest row group (the manifest's ``rows_per_row_group`` but for a shard of
    files' last row groups only)."""
    from pipelines.training.stream import ShardStream, window_visits

    rows = [group.rows for group in reader.groups]
    return ShardStream(rows, seed, window_visits(shuffle_buffer, max(rows)))


def positioned_dataset(reader, stored_size: int, batch_size: int, shuffle_buffer: int = 0, seed: int = 0,
                       augment: bool = False, start_row: int = 0, device: Optional[str] = None):
    """``tf.data`` over the positioned stream of our ``reader``'s shard (:func:`shard_stream`,
    :func:`pipelines.training.stream.stream_batches`) from stream row ``start_row`` (this rank's
    rows consumed so far: global steps x ``batch_size``), then :func:`to_device`. The batches are
    built in NumPy (a window's row groups, permuted, flipped by position), so nothing in
    ``tf.data`` holds a random state.

    Each ``iter()`` restarts ``reader`` at the window of ``start_row``
    (:meth:`~pipelines.training.arrow_reader.ArrowShardReader.restart`): at most one window is read
    for rows before it, an earlier dataset's iterator stops, whatever it had prefetched.

    Returns:
        a ``tf.data.Dataset`` of ``(images uint8 (batch, s, s, 3), labels int32 (batch,))``, endless.

    Raises:
        ValueError: a negative ``start_row`` or ``batch_size < 1`` (at once, not on iteration).
    """
    import tensorflow as tf

    from pipelines.training.stream import stream_batches

    s = stored_size
    stream = shard_stream(reader, shuffle_buffer, seed)
    stream.locate(start_row)  # refused here, not in a tf.data thread
    if batch_size < 1:
        raise ValueError(f"a batch holds >= 1 row, got {batch_size}")

    def open_groups(visit: int):
        return row_groups_of(reader.restart(stream.visits_from(visit)), s)

    def generate():
        return stream_batches(stream, open_groups, start_row, batch_size, augment)

    ds = tf.data.Dataset.from_generator(generate, output_signature=(
        tf.TensorSpec((batch_size, s, s, 3), tf.uint8), tf.TensorSpec((batch_size,), tf.int32)))
    return to_device(ds, device)


def default_cache_root() -> str:
    """A fresh temporary folder (0700, ours) for the readers' caches of this process."""
    return tempfile.mkdtemp(prefix="pipelines-cache-")
