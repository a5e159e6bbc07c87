"""Feature cache: the frozen backbone's pooled features, computed once and reused.

With a frozen backbone called with ``training=False`` and no per-epoch augmentation, the
backbone's output for an image never changes, yet the article's training recomputes it for every
image in every epoch. Here each rank computes the features of its shard of each split
once, writes them as Parquet under ``DATA/features/<key>/<split>/part-rank<r>.parquet`` (``key``
depends on the model, :func:`model_key`: the weights, the image size, the backbone, its compute
dtype and the model's input; and on the data, :func:`pipelines.manifest.data_identity`: the ETL
run id and its parts' footers; :func:`feature_key`), and training fits only the head
(dropout + dense) on them with the same Horovod machinery. A second run with the same key reuses
them; other weights, another size or another ETL run of the same output (a rerun, even of the same
counts) get another key. The set's marker records both halves, so a run that finds only sets of
its model computed from other data says why it recomputes (:func:`stale_sets`), and deletes those
whose ETL run is gone (:func:`prune`): no training can read them any more. (The head trained on
them is the model's: :func:`pipelines.training.model.build.build_head`.)

``DATA`` may be a URI: the set is written and read through :mod:`pipelines.io.storage` (each rank's
file in one write, whole or not at all), its completion marker last.
"""
from __future__ import annotations

import hashlib
import io
import logging
from typing import Mapping, Optional, Tuple

import numpy as np

from pipelines.contract import RUNS, plain_name
from pipelines.io.storage import Location, resolve
from pipelines.runtime.logs import plural
from pipelines.training.data.sharding import shard
from pipelines.training.data.stream import feature_batches

log = logging.getLogger("pipelines")
COMPLETE = "_COMPLETE.json"


def model_key(weights: str, input_size: int, seed: int, backbone: str, compute_dtype: str,
              model_input: str) -> str:
    """The model half of a feature set's key: the backbone's weights (file content hash for a path; the
    seed for random weights), the backbone's input side (``input_size``), the backbone, the dtype it
    computes in (``float16`` under ``mixed_float16``: other features than float32's) and what the
    model takes (``model_input``, :func:`pipelines.training.model.build.input_tag`: ``uint8-299``, the
    stored image's dtype and side; the preprocessing inside the model follows from it), hashed to
    16 hex digits. Features computed before models took uint8 (float32 images preprocessed on the
    CPU, keyed without ``model_input``) get other keys: never mixed with these."""
    model = f"{backbone}-avg" + ("" if compute_dtype == "float32" else f"-{compute_dtype}")
    if weights == "imagenet":
        source = "imagenet"
    elif weights == "none":
        source = f"random-{seed}"
    else:
        digest = hashlib.sha256()
        with open(weights, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        source = digest.hexdigest()
    return hashlib.sha256(f"{model}:{source}:{input_size}:{model_input}".encode()).hexdigest()[:16]


def feature_key(model: str, data) -> str:
    """Identifier of a feature set: the model (:func:`model_key`) and the data it was computed
    from (a :class:`pipelines.manifest.DataIdentity`), hashed to 16 hex digits. (Sets computed
    before the data was in the key were keyed by the model alone: :func:`stale_sets` finds them.)"""
    return hashlib.sha256(f"{model}:data-{data.sha256}".encode()).hexdigest()[:16]


def _location(directory):
    """A path, URI or :class:`pipelines.io.storage.Location` as a Location."""
    return directory if isinstance(directory, Location) else resolve(directory)


def feature_dir(data_root: str, key: str, storage_options: Optional[Mapping[str, str]] = None):
    """``DATA/features/<key>`` (a :class:`pipelines.io.storage.Location`): next to the ETL output it
    was computed from."""
    return resolve(data_root, storage_options).join("features", key)


def is_complete(directory, rows: dict, key: str) -> bool:
    """Whether every rank finished writing the feature set ``key`` (rank 0 writes the marker last)
    and it holds ``rows`` (``{split: n}``, the manifest's counts): a set of another key (a folder
    renamed or copied), or short, is not reused."""
    marker = read_marker(directory)
    return marker.get("rows") == rows and marker.get("key") == key


def read_marker(directory) -> dict:
    """The set's completion marker (``{}`` when absent or unreadable)."""
    try:
        marker = _location(directory).join(COMPLETE).read_json()
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def write_shard(directory, split: str, rank: int, features: np.ndarray, labels: np.ndarray) -> str:
    """Write one rank's features of one split: ``features`` float32 ``(n, feature_dim)`` (2048 for
    Xception), ``labels`` int32 ``(n,)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = _location(directory).join(split, f"part-rank{rank}.parquet")
    flat = pa.array(features.astype(np.float32).reshape(-1))
    table = pa.table({"features": pa.FixedSizeListArray.from_arrays(flat, features.shape[1]),
                      "label": pa.array(labels.astype(np.int32))})
    buffer = io.BytesIO()  # a rank's features are small (2048 float32 per image for Xception)
    pq.write_table(table, buffer, compression="snappy")
    target.write_bytes(buffer.getvalue())
    return target.uri


def read_shard(directory, split: str, rank: int, world_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """This rank's share of a split's features: rows ``rank, rank + size, ...`` of all files in name
    order (whatever world size computed them). Returns float32 ``(n, feature_dim)`` and int32 ``(n,)``."""
    import pyarrow.parquet as pq

    parts = _location(directory).join(split).files(".parquet")
    tables = [pq.read_table(io.BytesIO(part.read_bytes())) for part in parts]
    features = np.concatenate([np.stack(t.column("features").to_numpy(zero_copy_only=False)) for t in tables])
    labels = np.concatenate([t.column("label").to_numpy() for t in tables]).astype(np.int32)
    return shard(features, rank, world_size).astype(np.float32), shard(labels, rank, world_size)


def compute_shard(extractor, dataset) -> Tuple[np.ndarray, np.ndarray]:
    """Run the frozen feature extractor (``training=False``;
    :func:`pipelines.training.model.build.feature_extractor`: uint8 images in, preprocessing and
    backbone inside) over a finite dataset of (images, labels). Returns float32
    ``(n, feature_dim)`` and int32 ``(n,)``."""
    features, labels = [], []
    for images, batch_labels in dataset:
        features.append(extractor(images, training=False).numpy())
        labels.append(batch_labels.numpy())
    if not features:
        return np.zeros((0, extractor.output_shape[-1]), np.float32), np.zeros((0,), np.int32)
    return np.concatenate(features), np.concatenate(labels)


def mark_complete(directory, counts: dict, key: str, model: str, data) -> None:
    """Rank 0, after every rank has written: record the counts, the key and its halves (``model``,
    :func:`model_key`; ``data``, a :class:`pipelines.manifest.DataIdentity`), making the set reusable."""
    _location(directory).join(COMPLETE).write_json({"key": key, "rows": counts, "model_key": model,
                                                    "data": data.to_dict()})


def stale_sets(data_root, model: str, key: str, storage_options: Optional[Mapping[str, str]] = None):
    """The complete feature sets under ``DATA/features/`` of the model ``model`` (:func:`model_key`)
    but not of the key ``key``: computed from other data (another ETL run of this output). A set
    written before the data was keyed (its marker's ``key`` is the model key, and it records no
    ``data``) is one of them. Returns ``[(folder, marker)]``, newest ETL run first (the unknown last)."""
    found, features = [], resolve(data_root, storage_options).join("features")
    for info in features.list(recursive=False):
        folder = features.join(info.base_name)
        marker = read_marker(folder)
        if marker and marker.get("key") != key and model in (marker.get("model_key"), marker.get("key")):
            found.append((folder, marker))
    return sorted(found, key=lambda pair: str((pair[1].get("data") or {}).get("run_id") or ""), reverse=True)


def prune(data_root, stale, storage_options: Optional[Mapping[str, str]] = None) -> list:
    """Delete those of ``stale`` (:func:`stale_sets`) that no training can read any more: their
    ETL run's folder ``DATA/runs/<run id>`` is gone (the ETL deletes a run only when no lease on
    it is live, :mod:`pipelines.io.leases`), or they record no ETL run (keyed before the data was).
    Returns the folders deleted (URIs)."""
    root, deleted = resolve(data_root, storage_options), []
    for folder, marker in stale:
        run_id = (marker.get("data") or {}).get("run_id")
        try:
            if run_id and root.join(RUNS, plain_name(run_id, f"{folder.uri}'s ETL run")).exists():
                continue
        except ValueError:  # a marker is read, not obeyed: a set naming no plain run id stays
            continue
        folder.delete()
        deleted.append(folder.uri)
    if deleted:
        log.info("feature cache: deleted %s of ETL runs gone from %s: %s", plural(len(deleted), "stale set"),
                 root.uri, ", ".join(deleted))
    return deleted


def say_why(data_root, model: str, key: str, data, directory,
            storage_options: Optional[Mapping[str, str]] = None) -> None:
    """Rank 0, before computing the set ``key`` into ``directory``: log once why, naming the ETL
    runs when the newest set of this model (:func:`stale_sets`) was computed from other data
    (``data``: this run's :class:`pipelines.manifest.DataIdentity`)."""
    stale = stale_sets(data_root, model, key, storage_options)
    if not stale:
        log.info("feature cache: computing backbone features into %s", directory)
        return
    folder, marker = stale[0]
    before = (marker.get("data") or {}).get("run_id") or "unrecorded"
    change = f"its parts of ETL run {before} changed" if before == data.run_id else f"ETL run {before} -> {data.run_id}"
    log.info("feature cache: the data changed since %s was computed (%s): recomputing into %s",
             folder.uri, change, directory)


def feature_dataset(features: np.ndarray, labels: np.ndarray, batch_size: int, shuffle: bool, seed: int,
                    repeat: bool, drop_remainder: bool = True, start_row: int = 0):
    """``tf.data`` over in-memory features (a shard of 2048 float32 per image, for Xception, is small):
    ``(features (b, feature_dim) float32, labels int32 (b,))``.

    ``repeat``: the positioned stream (:func:`pipelines.training.data.stream.feature_batches`: pass
    ``p`` in the order ``default_rng((seed, p)).permutation(n)`` with ``shuffle``, the stored one
    without), full batches, endless, from stream row ``start_row`` (training; each ``iter()``
    starts there; no ``tf.data`` shuffle, whose state could not be restored mid-pass). Otherwise
    one pass in stored order (evaluation), or shuffled once by ``tf.data`` with ``shuffle``; the
    last batch smaller unless ``drop_remainder``.

    Raises:
        ValueError: ``start_row`` without ``repeat``, or negative; ``repeat`` over no rows.
    """
    import tensorflow as tf

    if repeat:
        features, labels = np.asarray(features), np.asarray(labels)
        if start_row < 0 or not len(labels):
            raise ValueError(f"a feature stream needs rows ({len(labels)}) and start_row >= 0 ({start_row})")
        ds = tf.data.Dataset.from_generator(
            lambda: feature_batches(features, labels, seed, start_row, batch_size, shuffle), output_signature=(
                tf.TensorSpec((batch_size,) + features.shape[1:], tf.as_dtype(features.dtype)),
                tf.TensorSpec((batch_size,), tf.as_dtype(labels.dtype))))
        return ds.prefetch(2)
    if start_row:
        raise ValueError(f"start_row {start_row} needs repeat=True (the positioned stream)")
    ds = tf.data.Dataset.from_tensor_slices((features, labels))
    if shuffle:
        ds = ds.shuffle(len(features), seed=seed)
    return ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(2)


def inapplicable_reason(loader) -> Optional[str]:
    """Why ``--feature-cache`` cannot apply to a run read as ``loader`` says (its
    :class:`~pipelines.training.config.LoaderOptions`), or ``None`` when it can."""
    if loader.augment:
        return "augmentation changes every image every epoch, so features cannot be computed once"
    return None
