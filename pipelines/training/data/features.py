"""Feature cache: the frozen backbone's pooled features, computed once per rank shard, keyed by model and data."""
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
from pipelines.training.data.tfdata import without_autotune

log = logging.getLogger("pipelines")
COMPLETE = "_COMPLETE.json"


def model_key(weights: str, input_size: int, seed: int, backbone: str, compute_dtype: str,
              model_input: str) -> str:
    """The model half of a feature set's key, 16 hex digits, over every argument (a weights file by content)."""
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
    """A feature set's key: ``model`` (``model_key``) and ``data`` (a ``DataIdentity``), 16 hex digits."""
    return hashlib.sha256(f"{model}:data-{data.sha256}".encode()).hexdigest()[:16]


def _location(directory):
    """A path, URI or ``Location`` as a Location."""
    return directory if isinstance(directory, Location) else resolve(directory)


def feature_dir(data_root: str, key: str, storage_options: Optional[Mapping[str, str]] = None):
    """``DATA/features/<key>`` as a ``Location``, next to the ETL output it was computed from."""
    return resolve(data_root, storage_options).join("features", key)


def is_complete(directory, rows: dict, key: str) -> bool:
    """Whether the set's marker (written last) names ``key`` and ``rows`` (``{split: n}``, the manifest's)."""
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
    """Write one rank's ``features`` float32 ``(n, feature_dim)`` and ``labels`` int32 ``(n,)``; returns the URI."""
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
    """This rank's rows ``rank, rank + size, ...`` of the split's files (name order): float32 features, int32 labels."""
    import pyarrow.parquet as pq

    parts = _location(directory).join(split).files(".parquet")
    tables = [pq.read_table(io.BytesIO(part.read_bytes())) for part in parts]
    features = np.concatenate([np.stack(t.column("features").to_numpy(zero_copy_only=False)) for t in tables])
    labels = np.concatenate([t.column("label").to_numpy() for t in tables]).astype(np.int32)
    return shard(features, rank, world_size).astype(np.float32), shard(labels, rank, world_size)


def compute_shard(extractor, dataset) -> Tuple[np.ndarray, np.ndarray]:
    """Run the frozen ``extractor`` over a finite uint8 dataset: float32 features ``(n, dim)``, int32 labels."""
    features, labels = [], []
    for images, batch_labels in dataset:
        features.append(extractor(images, training=False).numpy())
        labels.append(batch_labels.numpy())
    if not features:
        return np.zeros((0, extractor.output_shape[-1]), np.float32), np.zeros((0,), np.int32)
    return np.concatenate(features), np.concatenate(labels)


def mark_complete(directory, counts: dict, key: str, model: str, data) -> None:
    """Rank 0, after every rank has written: record counts, key and its halves, making the set reusable."""
    _location(directory).join(COMPLETE).write_json({"key": key, "rows": counts, "model_key": model,
                                                    "data": data.to_dict()})


def stale_sets(data_root, model: str, key: str, storage_options: Optional[Mapping[str, str]] = None):
    """``[(folder, marker)]`` of ``model``'s complete sets of another key (other data), newest ETL run first."""
    found, features = [], resolve(data_root, storage_options).join("features")
    for info in features.list(recursive=False):
        folder = features.join(info.base_name)
        marker = read_marker(folder)
        if marker and marker.get("key") != key and model in (marker.get("model_key"), marker.get("key")):
            found.append((folder, marker))
    return sorted(found, key=lambda pair: str((pair[1].get("data") or {}).get("run_id") or ""), reverse=True)


def prune(data_root, stale, storage_options: Optional[Mapping[str, str]] = None) -> list:
    """Delete the ``stale`` sets whose ETL run is gone or unrecorded (no training can read them); their URIs."""
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
    """Rank 0, before computing set ``key``: log why, naming the ETL runs if the newest set of ``model`` is stale."""
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
    """``tf.data`` over in-memory features ``(float32 (b, feature_dim), int32 (b,))``; ``repeat``: endless from
    ``start_row``, else one pass.

    Raises:
        ValueError: ``start_row`` without ``repeat``, or negative; ``repeat`` over no rows."""
    import tensorflow as tf

    if repeat:
        features, labels = np.asarray(features), np.asarray(labels)
        if start_row < 0 or not len(labels):
            raise ValueError(f"a feature stream needs rows ({len(labels)}) and start_row >= 0 ({start_row})")
        ds = tf.data.Dataset.from_generator(
            lambda: feature_batches(features, labels, seed, start_row, batch_size, shuffle), output_signature=(
                tf.TensorSpec((batch_size,) + features.shape[1:], tf.as_dtype(features.dtype)),
                tf.TensorSpec((batch_size,), tf.as_dtype(labels.dtype))))
        return without_autotune(ds.prefetch(2))
    if start_row:
        raise ValueError(f"start_row {start_row} needs repeat=True (the positioned stream)")
    ds = tf.data.Dataset.from_tensor_slices((features, labels))
    if shuffle:
        ds = ds.shuffle(len(features), seed=seed)
    return without_autotune(ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(2))


def inapplicable_reason(loader) -> Optional[str]:
    """Why ``--feature-cache`` cannot apply to ``loader`` (``LoaderOptions``), or ``None`` when it can."""
    if loader.augment:
        return "augmentation changes every image every epoch, so features cannot be computed once"
    return None
