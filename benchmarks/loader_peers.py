"""The loader benchmark's peers: what a user feeds TensorFlow from the ETL's Parquet with instead of
our reader, timed by ``benchmarks/loader_bench.py`` on the same data, batch and uint8 tail.

- ``ray``: Ray Data. ``ray.data.read_parquet`` over the split's parts, the image bytes turned into
  uint8 arrays in ``map_batches`` (Ray's workers), each rank's shard taken as Ray Train takes it
  (``streaming_split(world_size, equal=True)``, its ``DataConfig``'s default), and fed to Keras by
  the shard's ``to_tf`` (Ray's own batching and local shuffle buffer). Two routes: cached, the
  decoded dataset ``materialize()``-d in Ray's object store in epoch 1 (Ray Train's documented
  cache: epoch 2 reads from the store), and streaming, read and decoded again each epoch (the
  default).
- ``plain``: the route a user writes first: ``pyarrow.dataset`` record batches of the rank's row
  groups (our readers' rule) through ``tf.data.Dataset.from_generator``, then training's own tail
  (:func:`pipelines.training.data.tfdata.batched`); no cache, no reader threads.

Benchmarks only: installed by ``make bench-peers`` (``requirements/<stack>-peers.lock``), never
imported by the product (``tests/unit/runtime/test_env_boundary.py`` checks that ``pipelines/`` does not).
"""
from __future__ import annotations

import importlib.util
import os
import time
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

#: The peers, in the order the benchmark times them.
PEERS = ("ray", "plain")

#: How a goal line names each peer (and Petastorm, the other reader).
TITLES = {"petastorm": "Petastorm's", "ray": "Ray Data's", "plain": "the plain route's"}

#: Per peer, the routes it is timed on, each the labels of its epoch 1 and its epoch 2.
ROUTES = {"ray": (("cold cache (epoch 1)", "warm cache (epoch 2)"), ("no cache (epoch 1)", "no cache (epoch 2)")),
          "plain": (("no cache (epoch 1)", "no cache (epoch 2)"),)}

#: The module each peer needs, and how to install it.
NEEDS = {"ray": ("ray", "make bench-peers STACK={stack} (requirements/{stack}-peers.lock)")}


def kinds(peer: str) -> List[str]:
    """The paths (``cold cache (epoch 1)``, ...) the benchmark's table shows for ``peer``."""
    return [label for route in ROUTES[peer] for label in route]


def missing(peer: str, stack: str) -> Optional[str]:
    """One line naming how to install ``peer`` when its module is not importable here, else None.
    Imports nothing of it."""
    if peer not in NEEDS or importlib.util.find_spec(NEEDS[peer][0]) is not None:
        return None
    module, how = NEEDS[peer]
    return f"{peer}: skipped, {module} is not installed here: {how.format(stack=stack)} installs it"


def shard_fragments(data, split: str, rank: int, world_size: int) -> list:
    """The ``pyarrow.dataset`` fragments of rank ``rank``'s row groups of ``split`` (row groups
    of :func:`pipelines.training.data.rowgroups.split_row_groups` by our readers' rule,
    :func:`pipelines.training.data.sharding.shard`), one fragment per row group, in file and group order."""
    import pyarrow.dataset as pads

    dataset = pads.dataset([part.location.path for part in data.parts(split)], format="parquet")
    groups = [group for fragment in dataset.get_fragments() for group in fragment.split_by_row_group()]
    from pipelines.training.data.sharding import shard

    return list(shard(groups, rank, world_size))


def plain_batches(data, split: str, rank: int, world_size: int) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """One pass over rank ``rank``'s shard as the plain route reads it: per record batch
    ``(images uint8 (n, s, s, 3), labels int32 (n,))``, the binary column's images joined once
    (``b"".join`` of its Python ``bytes``, the idiom a user reaches for)."""
    s = data.stored_size
    for fragment in shard_fragments(data, split, rank, world_size):
        for batch in fragment.to_batches(columns=["image", "label"]):
            images = np.frombuffer(b"".join(batch.column("image").to_pylist()), np.uint8).reshape(-1, s, s, 3)
            yield images, batch.column("label").to_numpy().astype(np.int32)


def plain_dataset(data, config, rank: int = 0, world_size: int = 1):
    """The plain route's ``tf.data`` over :func:`plain_batches` of the train split, through
    training's tail (:func:`pipelines.training.data.tfdata.batched`: the config's shuffle buffer, full
    batches of ``config.fit.batch_size``, prefetch): ``(uint8 (b, s, s, 3), int32 (b,))``; each
    iteration is one epoch."""
    import tensorflow as tf

    from pipelines.training.data import batched

    s = data.stored_size
    ds = tf.data.Dataset.from_generator(lambda: plain_batches(data, "train", rank, world_size), output_signature=(
        tf.TensorSpec((None, s, s, 3), tf.uint8), tf.TensorSpec((None,), tf.int32)))
    return batched(ds.unbatch(), config.fit.batch_size, shuffle_buffer=config.loader.shuffle_buffer)


def start_ray() -> None:
    """A local Ray of this machine's CPUs, quiet (no dashboard, no progress bars), started once;
    prints how long its start took (never inside a timed epoch)."""
    import logging

    import ray

    if not ray.is_initialized():
        start = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        logging.getLogger("ray.data").setLevel(logging.WARNING)  # one INFO line per dataset's execution
        print(f"ray {ray.__version__}: a local cluster of {os.cpu_count()} CPUs started in "
              f"{time.perf_counter() - start:.1f} s (not timed)")


def stop_ray() -> None:
    """Shut down the Ray :func:`start_ray` started, if any."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def ray_dataset(data, config, cached: bool, rank: int = 0, world_size: int = 1):
    """Ray Data's ``tf.data`` of rank ``rank``'s shard of the train split (see the module's
    docstring): ``(uint8 (b, s, s, 3), int32 (b,))``, full batches of ``config.fit.batch_size``, Ray's
    local shuffle buffer of ``config.loader.shuffle_buffer`` rows, then a host prefetch (training's last
    stage, :func:`pipelines.training.data.tfdata.to_device`); each iteration is one epoch. With
    ``cached`` the decoded dataset is materialised in Ray's object store here. Needs
    :func:`start_ray` first and at least one shard per rank (``world_size`` <= the files' blocks).
    """
    import ray

    from pipelines.training.data import to_device

    s = data.stored_size

    def decode(batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        # a nested function: Ray pickles it by value (this module is not on its workers' path)
        images = np.frombuffer(b"".join(batch["image"]), np.uint8).reshape(-1, s, s, 3)
        return {"image": images, "label": batch["label"].astype(np.int32)}

    ds = ray.data.read_parquet([part.location.path for part in data.parts("train")], columns=["image", "label"])
    ds = ds.map_batches(decode, batch_format="numpy")
    if cached:
        ds = ds.materialize()
    shard = ds.streaming_split(world_size, equal=True)[rank]
    tfds = shard.to_tf("image", "label", batch_size=config.fit.batch_size, drop_last=True,
                       local_shuffle_buffer_size=config.loader.shuffle_buffer)
    return to_device(tfds)


def time_peer(peer: str, data, config, results: Dict[str, float], batches: int, tail=lambda ds: ds) -> None:
    """Time two epochs of each of ``peer``'s routes (:data:`ROUTES`) into ``results["<peer>,
    <label>"]`` (images/s over ``batches`` batches of ``config.fit.batch_size``), one new iterator per
    epoch as Keras takes a finite dataset. Epoch 1 includes making the dataset (Ray's reading of
    the footers, its materialisation); ``tail`` (the benchmark's ``--tail float32``) wraps it.
    Ray is started once and left running (:func:`stop_ray`): on a loaded machine a second start
    timed out (2026-12-03, load average 26 on 2 cores), and its idle processes cost little."""
    if peer == "ray":
        start_ray()
    for i, route in enumerate(ROUTES[peer]):
        start, ds = time.perf_counter(), None
        for label in route:
            if ds is None:
                ds = tail(ray_dataset(data, config, cached=i == 0) if peer == "ray" else plain_dataset(data, config))
            it = iter(ds)
            for _ in range(batches):
                next(it)[0].numpy()
            results[f"{peer}, {label}"] = batches * config.fit.batch_size / (time.perf_counter() - start)
            start = time.perf_counter()
        del ds, it  # a materialised dataset leaves Ray's object store with its last reference
