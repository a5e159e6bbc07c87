"""The ``tf.data`` tail of training's inputs: rows of a reader to uint8 batches on the device.

:func:`make_dataset` is training's dataset over a looping reader
(:func:`pipelines.training.data.readers.open_reader`). Over our reader the stream is positioned
(:mod:`pipelines.training.data.stream`): the shuffle (in windows of row groups) and the flips are
functions of the stream row, so it opens at any ``start_row`` exactly (a resume in the middle of an
epoch sees the batches an uninterrupted run sees: :func:`positioned_dataset`). Petastorm's reader
gives its rows in a seeded order (:mod:`pipelines.training.data.petastorm.reader`) but cannot start
at a row, so over it the stream is ``tf.data``'s seeded shuffle and flips seeded by batch
(:func:`batched`): the same on every run of the same seed, not openable at a row
(:func:`pipelines.training.data.readers.exact_positions`). Every path ends in :func:`to_device`.

TensorFlow is imported inside the functions: the rest of the data layer is pure.
"""
from __future__ import annotations

from typing import Optional

from pipelines.training.data.readers import exact_positions, row_groups_of
from pipelines.training.data.stream import ShardStream, stream_batches, window_visits
from pipelines.training.devices import prefetch_device


def flipper(seed: int = 0):
    """``--augment`` over Petastorm's reader: a random left-right flip of each uint8 image of the
    ``index``-th batch ``(b, s, s, 3)`` of a stream, drawn statelessly from ``(seed, index)`` (each
    image its own draw), so the flips are the same on every run of the same seed, however
    ``tf.data`` schedules its parallel calls (a stateful op's draws would follow that schedule);
    over our reader the flips are the positioned stream's
    (:func:`pipelines.training.data.stream.stream_batches`). Labels unchanged. It moves bytes only,
    so it runs on the host before the copy; a flip commutes with the model's bilinear ``Resizing``,
    so flipping the stored image is flipping what the backbone sees.

    Returns:
        ``flip(index int64 (), (images, labels)) -> (images, labels)``, for ``Dataset.enumerate().map``.
    """
    import tensorflow as tf

    def flip(index, batch):
        images, labels = batch
        key = tf.stack([tf.constant(seed, tf.int64), tf.cast(index, tf.int64)])
        return tf.image.stateless_random_flip_left_right(images, seed=key), labels

    return flip


def batched(ds, batch_size: int, shuffle_buffer: int = 0, seed: int = 0, augment: bool = False,
            drop_remainder: bool = True, device: Optional[str] = None, weight: Optional[float] = None):
    """The tail every input path shares: single uint8 images -> shuffled in a bounded buffer ->
    batched -> flipped with ``augment`` (:func:`flipper`) -> prefetched on the host, then to the
    device (:func:`to_device`). The batches stay uint8: the model casts and preprocesses them
    itself, where it runs (:func:`pipelines.training.model.build.preprocessing`). At 299 px an image is
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
        ds = ds.enumerate().map(flipper(seed), num_parallel_calls=tf.data.AUTOTUNE)
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
    """``tf.data`` pipeline over a looping reader (:func:`~pipelines.training.data.readers.open_reader`; training).

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


def shard_stream(reader, shuffle_buffer: int, seed: int):
    """The :class:`pipelines.training.data.stream.ShardStream` of our ``reader``'s shard: its row
    groups' rows (footers), ``seed``, and windows of
    :func:`~pipelines.training.data.stream.window_visits` ``(shuffle_buffer, rows)`` row groups, rows
    being the shard's largest row group (the manifest's ``rows_per_row_group`` but for a shard of
    files' last row groups only)."""
    rows = [group.rows for group in reader.groups]
    return ShardStream(rows, seed, window_visits(shuffle_buffer, max(rows)))


def positioned_dataset(reader, stored_size: int, batch_size: int, shuffle_buffer: int = 0, seed: int = 0,
                       augment: bool = False, start_row: int = 0, device: Optional[str] = None):
    """``tf.data`` over the positioned stream of our ``reader``'s shard (:func:`shard_stream`,
    :func:`pipelines.training.data.stream.stream_batches`) from stream row ``start_row`` (this rank's
    rows consumed so far: global steps x ``batch_size``), then :func:`to_device`. The batches are
    built in NumPy (a window's row groups, permuted, flipped by position), so nothing in
    ``tf.data`` holds a random state.

    Each ``iter()`` restarts ``reader`` at the window of ``start_row``
    (:meth:`~pipelines.training.data.arrow_reader.ArrowShardReader.restart`): at most one window is read
    for rows before it, an earlier dataset's iterator stops, whatever it had prefetched.

    Returns:
        a ``tf.data.Dataset`` of ``(images uint8 (batch, s, s, 3), labels int32 (batch,))``, endless.

    Raises:
        ValueError: a negative ``start_row`` or ``batch_size < 1`` (at once, not on iteration).
    """
    import tensorflow as tf

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
