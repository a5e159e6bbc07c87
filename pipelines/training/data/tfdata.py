"""The ``tf.data`` tail of training's inputs: a reader's rows, keyed by stream position, to augmented uint8 batches."""
from __future__ import annotations

from typing import Optional, Sequence

from pipelines.training.data.augment import augment_rows
from pipelines.training.data.readers import exact_positions, row_groups_of
from pipelines.training.data.stream import ShardStream, keyed, stream_batches, window_visits
from pipelines.training.devices import prefetch_device


def batched(ds, batch_size: int, shuffle_buffer: int = 0, seed: int = 0, augment: Sequence[str] = (),
            drop_remainder: bool = True, device: Optional[str] = None, weight: Optional[float] = None):
    """Rows to batches: a shuffle buffer, ``batch``, then ``tail``.

    Args:
        ds: a ``tf.data.Dataset`` of ``(uint8 (s, s, 3), int32 ())`` rows, or with ``tail``'s key ``int64 (2,)``.
        drop_remainder: full batches only (training: every rank takes the same steps).

    Returns:
        ``tail``'s dataset of ``(uint8 (b, s, s, 3), int32 (b,))``, with ``weight`` also ``float32 (b,)``."""
    if shuffle_buffer > 1:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    return tail(ds.batch(batch_size, drop_remainder=drop_remainder), augment, device, weight)


def tail(ds, augment: Sequence[str] = (), device: Optional[str] = None, weight: Optional[float] = None):
    """The tail every input path shares: ``augment_rows`` (``--augment``), ``weighted``, ``to_device``.

    Args:
        ds: batches ``(uint8 (b, s, s, 3), int32 (b,))``, or keyed ``(..., int64 (b, 2))``: each row's
            ``(seed, stream position)``, the key its augmentations draw from (``stream.keyed``).
        augment: the names of ``augment.AUGMENTATIONS`` to apply, in order; empty: none.

    Raises:
        ValueError: ``augment`` over batches without keys."""
    import tensorflow as tf

    if len(ds.element_spec) == 3:
        if augment:
            ds = ds.map(lambda images, labels, keys: (augment_rows(images, keys, augment), labels),
                        num_parallel_calls=tf.data.AUTOTUNE)
        else:
            ds = ds.map(lambda images, labels, keys: (images, labels))
    elif augment:
        raise ValueError("--augment needs each row's key (seed, stream position): stream.keyed's batches")
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
        return without_autotune(ds)
    ds = ds.apply(tf.data.experimental.copy_to_device(device))
    with tf.device(device):
        return without_autotune(ds.prefetch(DEVICE_BUFFER))


def without_autotune(ds):
    """``ds`` with autotuning off (every training dataset ends so): else dropping an iterator waits up to a minute."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def make_dataset(reader, stored_size: int, batch_size: int, shuffle_buffer: int = 0, seed: int = 0,
                 augment: Sequence[str] = (), start_row: int = 0, device: Optional[str] = None,
                 weight: Optional[float] = None):
    """``tf.data`` over a looping reader: its keyed batches, then ``tail``; ``start_row`` ignored over Petastorm's.

    Raises:
        ValueError: a negative ``start_row`` (over our reader)."""
    batches = positioned_batches if exact_positions(reader) else shuffled_batches
    return tail(batches(reader, stored_size, batch_size, shuffle_buffer, seed, start_row), augment, device, weight)


def shuffled_batches(reader, stored_size: int, batch_size: int, shuffle_buffer: int = 0, seed: int = 0,
                     start_row: int = 0):
    """Keyed full batches of a reader that cannot open at a row (Petastorm's): its rows keyed in the order
    read, then a seeded ``tf.data`` shuffle buffer; ``start_row`` is ignored."""
    import tensorflow as tf

    s = stored_size
    ds = tf.data.Dataset.from_generator(lambda: keyed(row_groups_of(reader, s), seed), output_signature=(
        tf.TensorSpec((None, s, s, 3), tf.uint8), tf.TensorSpec((None,), tf.int32),
        tf.TensorSpec((None, 2), tf.int64)))
    ds = ds.unbatch()
    if shuffle_buffer > 1:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    return ds.batch(batch_size, drop_remainder=True)


def shard_stream(reader, shuffle_buffer: int, seed: int):
    """The ``ShardStream`` of our ``reader``'s shard, windows sized by its largest row group."""
    rows = [group.rows for group in reader.groups]
    return ShardStream(rows, seed, window_visits(shuffle_buffer, max(rows)))


def positioned_batches(reader, stored_size: int, batch_size: int, shuffle_buffer: int = 0, seed: int = 0,
                       start_row: int = 0):
    """Endless keyed batches of our ``reader``'s stream from ``start_row``; each ``iter()`` restarts it there.

    Raises:
        ValueError: a negative ``start_row``."""
    import tensorflow as tf

    s = stored_size
    stream = shard_stream(reader, shuffle_buffer, seed)
    stream.locate(start_row)  # refused here, not in a tf.data thread

    def open_groups(visit: int):
        return row_groups_of(reader.restart(stream.visits_from(visit)), s)

    def generate():
        return keyed(stream_batches(stream, open_groups, start_row, batch_size), seed, start_row)

    return tf.data.Dataset.from_generator(generate, output_signature=(
        tf.TensorSpec((batch_size, s, s, 3), tf.uint8), tf.TensorSpec((batch_size,), tf.int32),
        tf.TensorSpec((batch_size, 2), tf.int64)))
