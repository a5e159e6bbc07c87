"""Input-pipeline throughput: Petastorm -> tf.data (cold and warm local-disk cache) against the
same images held in memory (``tf.data.Dataset.from_tensor_slices``), measured in one run.

All paths end in the same ``preprocess_input`` + ``batch`` + ``prefetch`` as training
(:func:`pipelines.training.data.make_dataset`), and each is timed over one epoch of the train
split (``train_rows // batch`` batches), consuming the tensors as training would. No model runs:
this is the ceiling the data path puts on training.

The batch size, shuffle buffer and reader workers are a ``TrainConfig``'s (``--batch-size`` is its
option); ``--etl-image-size`` is the size the ETL stores the images at.

``--storage s3`` also uploads the ETL output to an S3 API server (``moto_server`` on 127.0.0.1,
started here with tests/s3server.py) and reads it from there, by the two routes evaluated for
Petastorm on object storage: through the storage module's filesystem (what training does,
:mod:`pipelines.training.legacy_fs`), and by staging the rank's row groups on local disk first and
reading those with ``file://`` (the time to stage counted in its cold epoch).

Usage: python benchmarks/loader_bench.py [--per-class 200] [--etl-image-size 299] [--batch-size 32]
       [--storage local|s3]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time


def consume(dataset, batches: int) -> float:
    """Seconds to pull ``batches`` batches (each forced to materialise)."""
    iterator = iter(dataset)
    start = time.perf_counter()
    for _ in range(batches):
        images, _labels = next(iterator)
        images.numpy()
    return time.perf_counter() - start


def epochs(data, cache, config, labels, workers, results, batches) -> None:
    """Time two epochs of one looping reader (``cache`` None: no cache) into ``results[labels[i]]``."""
    from pipelines.training.data import make_dataset, open_reader

    with open_reader(data, "train", 0, 1, cache, workers=workers) as reader:
        # One iterator across both epochs, as Keras fit keeps it: epoch 2 reads from the cache.
        it = iter(make_dataset(reader, data.image_size, config.batch_size, shuffle_buffer=config.shuffle_buffer))
        for label in labels:
            start = time.perf_counter()
            for _ in range(batches):
                next(it)[0].numpy()
            if label:
                results[label] = batches * config.batch_size / (time.perf_counter() - start)


def stage_shard(data, split: str, rank: int, world_size: int, folder: str):
    """Route (b): copy this rank's row groups (``rank::world_size``, Petastorm's rule) from the store
    into one local Parquet file, a row group each. Returns a local Dataset of that shard alone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.contract import Manifest
    from pipelines.training.data import Dataset, split_row_groups

    os.makedirs(folder, exist_ok=True)
    groups = split_row_groups(data.parts(split))[rank::world_size]
    name = f"{split}-rank{rank}.parquet"
    writer = None
    for group in groups:
        with group.part.filesystem.open_input_file(group.part.path) as f:
            table = pq.ParquetFile(f).read_row_group(group.index)
        writer = writer or pq.ParquetWriter(os.path.join(folder, name), table.schema)
        writer.write_table(table, row_group_size=len(table))
    writer.close()
    splits = {s: dataclasses.replace(info, parts=[name] if s == split else info.parts, row_groups=len(groups))
              for s, info in data.manifest.splits.items()}
    return Dataset(folder, Manifest(**{**dataclasses.asdict(data.manifest), "splits": splits}))


def s3_routes(etl, work, config, batches, results) -> None:
    """Upload ``etl`` to a moto_server of our own and time both routes of reading it from there."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests import s3server

    from pipelines.storage import resolve
    from pipelines.training.data import load_dataset

    port = s3server.free_port()
    os.environ.update(s3server.standard_environment(f"http://127.0.0.1:{port}"))
    server = s3server.start(port, os.path.join(work, "moto.log"))
    try:
        uri = f"s3://{server.bucket('bench')}/etl"
        resolve(uri).upload(etl)
        remote = load_dataset(uri, 1)
        epochs(remote, os.path.join(work, "cache-s3"), config,
               ["s3, filesystem, cold cache (epoch 1)", "s3, filesystem, warm cache (epoch 2)"],
               config.reader_workers, results, batches)
        epochs(remote, None, config, ["", "s3, filesystem, no cache (epoch 2)"], config.reader_workers, results,
               batches)
        start = time.perf_counter()
        staged = stage_shard(remote, "train", 0, 1, os.path.join(work, "staged"))
        stage_seconds = time.perf_counter() - start
        epochs(staged, os.path.join(work, "cache-staged"), config,
               ["s3, staged, cold cache (epoch 1)", "s3, staged, warm cache (epoch 2)"],
               config.reader_workers, results, batches)
        cold = results["s3, staged, cold cache (epoch 1)"]
        results["s3, staged, cold cache (epoch 1)"] = batches * config.batch_size / (
            stage_seconds + batches * config.batch_size / cold)
    finally:
        server.stop()


def main(argv=None) -> int:
    from pipelines.config import add_arguments
    from pipelines.training.config import TrainConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-class", type=int, default=200, help="Fashion-MNIST images per class (10 classes)")
    parser.add_argument("--etl-image-size", type=int, default=299, help="image size the ETL stores the images at")
    add_arguments(parser, TrainConfig, {"batch_size": 32})
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--storage", choices=["local", "s3"], default="local",
                        help="s3: also read the data from an S3 API server (moto_server on 127.0.0.1) by both routes")
    args = parser.parse_args(argv)
    try:  # data and output stand in until the ETL has run
        base = TrainConfig(data=os.curdir, output=os.curdir, batch_size=args.batch_size)
    except ValueError as exc:
        parser.error(str(exc))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    from pipelines.etl.config import ETLConfig
    from pipelines.etl.job import run_etl
    from pipelines.logs import setup_logging
    from pipelines.spark import spark_session
    from pipelines.tools import samples
    from pipelines.training.data import load_dataset

    setup_logging("loader-bench", level=30)
    work = args.workdir or tempfile.mkdtemp(prefix="loader-bench-")
    tree, etl = os.path.join(work, "fashion"), os.path.join(work, "etl")
    samples.main(["fashion-mnist", "--dest", tree, "--per-class", str(args.per_class)])
    spark = spark_session("loader-bench", "local[2]")
    run_etl(ETLConfig(input=tree, output=etl, image_size=args.etl_image_size, test_fraction=0.1), spark)
    spark.stop()

    config = dataclasses.replace(base, data=etl, output=work)
    data = load_dataset(config.data, 1)
    batches = data.train_rows // config.batch_size
    images_per_epoch = batches * config.batch_size
    results = {}

    epochs(data, os.path.join(work, "cache"), config,
           ["petastorm, cold cache (epoch 1)", "petastorm, warm cache (epoch 2)"], config.reader_workers, results,
           batches)
    epochs(data, None, config, ["", "petastorm, no cache (epoch 2)"], config.reader_workers, results, batches)
    if args.storage == "s3":
        s3_routes(etl, work, config, batches, results)

    table = pa.concat_tables([pq.read_table(part.path, columns=["image", "label"]) for part in data.parts("train")])
    images = np.frombuffer(b"".join(table.column("image").to_pylist()), np.uint8).reshape(
        -1, data.image_size, data.image_size, 3)
    labels = np.asarray(table.column("label").to_pylist(), np.int32)
    memory = (tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(config.shuffle_buffer)
              .map(lambda x, y: (tf.keras.applications.xception.preprocess_input(tf.cast(x, tf.float32)), y),
                   num_parallel_calls=tf.data.AUTOTUNE)
              .batch(config.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    consume(memory, batches)  # warm-up of the same graph
    results["in memory (from_tensor_slices), ceiling"] = images_per_epoch / consume(memory, batches)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)

    ceiling = results["in memory (from_tensor_slices), ceiling"]
    print(f"\nLoader benchmark: {data.train_rows} train images of {data.image_size} px "
          f"({data.rows_per_row_group} rows per row group), batch {config.batch_size}, {os.cpu_count()} CPUs")
    print(f"{'path':42s} {'images/s':>10s} {'of ceiling':>11s}")
    for label, rate in results.items():
        print(f"{label:42s} {rate:10.1f} {rate / ceiling:10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
