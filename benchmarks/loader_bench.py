"""Input-pipeline throughput: Petastorm -> tf.data (cold and warm local-disk cache) against the
same images held in memory (``tf.data.Dataset.from_tensor_slices``), measured in one run.

All paths end in the same ``preprocess_input`` + ``batch`` + ``prefetch`` as training
(:func:`pipelines.training.data.make_dataset`), and each is timed over one epoch of the train
split (``train_rows // batch`` batches), consuming the tensors as training would. No model runs:
this is the ceiling the data path puts on training.

The batch size, shuffle buffer and reader workers are a ``TrainConfig``'s (``--batch-size`` is its
option); ``--etl-image-size`` is the size the ETL stores the images at.

Usage: python benchmarks/loader_bench.py [--per-class 200] [--etl-image-size 299] [--batch-size 32]
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


def main(argv=None) -> int:
    from pipelines.config import add_arguments
    from pipelines.training.config import TrainConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-class", type=int, default=200, help="Fashion-MNIST images per class (10 classes)")
    parser.add_argument("--etl-image-size", type=int, default=299, help="image size the ETL stores the images at")
    add_arguments(parser, TrainConfig, {"batch_size": 32})
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    try:  # data and output stand in until the ETL has run
        base = TrainConfig(data=os.curdir, output=os.curdir, batch_size=args.batch_size)
    except ValueError as exc:
        parser.error(str(exc))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import numpy as np
    import pyarrow.parquet as pq
    import tensorflow as tf

    from pipelines.etl.config import ETLConfig
    from pipelines.etl.job import run_etl
    from pipelines.logs import setup_logging
    from pipelines.spark import spark_session
    from pipelines.tools import samples
    from pipelines.training.data import load_dataset, make_dataset, open_reader

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

    cache = os.path.join(work, "cache")
    with open_reader(data, "train", 0, 1, cache, workers=config.reader_workers) as reader:
        # One iterator across both epochs, as Keras fit keeps it: epoch 2 reads from the cache.
        it = iter(make_dataset(reader, data.image_size, config.batch_size, shuffle_buffer=config.shuffle_buffer))
        for label in ("petastorm, cold cache (epoch 1)", "petastorm, warm cache (epoch 2)"):
            start = time.perf_counter()
            for _ in range(batches):
                next(it)[0].numpy()
            results[label] = images_per_epoch / (time.perf_counter() - start)
    with open_reader(data, "train", 0, 1, None, workers=config.reader_workers) as reader:
        it = iter(make_dataset(reader, data.image_size, config.batch_size, shuffle_buffer=config.shuffle_buffer))
        for _ in range(batches):
            next(it)[0].numpy()
        start = time.perf_counter()
        for _ in range(batches):
            next(it)[0].numpy()
        results["petastorm, no cache (epoch 2)"] = images_per_epoch / (time.perf_counter() - start)

    table = pq.read_table(os.path.join(etl, "train"), columns=["image", "label"])
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
