"""The ``tf.data`` tail of training's inputs: rows of a reader to uint8 batches on the device (our reader's
stream positioned, so a resume opens it at any row; Petastorm's a seeded ``tf.data`` shuffle)."""
from __future__ import annotations

from typing import Optional

from pipelines.training.data.readers import exact_positions, row_groups_of
from pipelines.training.data.stream import ShardStream, stream_batches, window_visits
from pipelines.training.devices import prefetch_device


def flipper(seed: int = 0):
    """``--augment`` over Petastorm's reader: ``flip(index, (images, labels))``, stateless from ``(seed, index)``."""
    import tensorflow as tf

    def flip(index, batch):
        images, labels = batch
        key = tf.stack([tf.constant(seed, tf.int64), tf.cast(index, tf.int64)])
        return tf.image.stateless_random_flip_left_right(images, seed=key), labels

    return flip


def batched(ds, batch_size: int, shuffle_buffer: int = 0, seed: int = 0, augment: bool = False,
            drop_remainder: bool = True, device: Optional[str] = None, weight: Optional[float] = None):
    """The tail every input path shares: shuffle buffer, batch, ``flipper``, ``weighted``, ``to_device``.

    Args:
        ds: a ``tf.data.Dataset`` of ``(uint8 (s, s, 3), int32 ())``.
        drop_remainder: full batches only (training: every rank takes the same steps).

    Returns:
        a ``tf.data.Dataset`` of ``(uint8 (b, s, s, 3), int32 (b,))``, with ``weight`` also ``float32 (b,)``."""
    import tensorflow as tf

    if shuffle_buffer > 1:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    if augment:
        ds = ds.enumerate().map(flipper(seed), num_parallel_calls=tf.data.AUTOTUNE)
    return to_device(weighted(ds, weight), device)


def weighted(ds, weight: Optional[float]):
    """``ds`` with ``weight`` as Keras' sample weights ``float32 (b,)`` (``ds`` when ``None``); before ``to_device``."""
    import tensorflow as tf

    if weight is None:
        return ds
    return ds.map(lambda rows, labels: (rows, labels, tf.fill(tf.shape(labels), tf.constant(weight, tf.float32))))


#: Batches held on the device ahead of the step that takes them: one being copied while the
#: model computes on the other.
DEVICE_BUFFER = 2


def to_device(ds, device: Optional[str] = None):
    """Last stage (must be): host prefetch, then copy to and prefetch on ``device`` (``None``: the GPU, if any)."""
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
    """``tf.data`` over a looping reader for training: ``(images uint8 (b, s, s, 3), labels int32 (b,))`` batches.

    ``start_row`` is ignored over Petastorm's reader; ``weight`` applies there only.

    Raises:
        ValueError: a negative ``start_row`` (over our reader)."""
    import tensorflow as tf

    if exact_positions(reader):
        return positioned_dataset(reader, stored_size, batch_size, shuffle_buffer, seed, augment, start_row, device)
    s = stored_size
    ds = tf.data.Dataset.from_generator(lambda: row_groups_of(reader, s), output_signature=(
        tf.TensorSpec((None, s, s, 3), tf.uint8), tf.TensorSpec((None,), tf.int32)))
    return batched(ds.unbatch(), batch_size, shuffle_buffer, seed, augment, device=device, weight=weight)


def shard_stream(reader, shuffle_buffer: int, seed: int):
    """The ``ShardStream`` of our ``reader``'s shard, windows sized by its largest row group."""
    rows = [group.rows for group in reader.groups]
    return ShardStream(rows, seed, window_visits(shuffle_buffer, max(rows)))


def positioned_dataset(reader, stored_size: int, batch_size: int, shuffle_buffer: int = 0, seed: int = 0,
                       augment: bool = False, start_row: int = 0, device: Optional[str] = None):
    """Endless ``tf.data`` of our ``reader``'s stream from ``start_row``; each ``iter()`` restarts it there.

    Raises:
        ValueError: a negative ``start_row``."""
    import tensorflow as tf

    s = stored_size
    stream = shard_stream(reader, shuffle_buffer, seed)
    stream.locate(start_row)  # refused here, not in a tf.data thread

    def open_groups(visit: int):
        return row_groups_of(reader.restart(stream.visits_from(visit)), s)

    def generate():
        return stream_batches(stream, open_groups, start_row, batch_size, augment)

    ds = tf.data.Dataset.from_generator(generate, output_signature=(
        tf.TensorSpec((batch_size, s, s, 3), tf.uint8), tf.TensorSpec((batch_size,), tf.int32)))
    return to_device(ds, device)
