"""Input-pipeline throughput: Petastorm -> tf.data (cold and warm local-disk cache, no cache)
against the same images held in memory (``tf.data.Dataset.from_tensor_slices``), measured in one
run, for each ETL row-group size of a sweep (``--row-group-mb 1,4,16,64``).

Every path ends in training's own tail (:func:`pipelines.training.data.batched`: shuffle, batch,
preprocess each batch, prefetch), the in-memory ceiling too, and each is timed over one epoch of
the train split (``train_rows // batch`` batches), consuming the tensors as training would. No
model runs: this is the ceiling the data path puts on training. At every size the warm epoch is
also timed with Petastorm's own cache format (pickled row groups) next to training's flat one
(:mod:`pipelines.training.rowcache`). The ceiling is measured twice, after the first ETL and
after the sweep, and their mean divides: on a shared VM one figure can move by 20 %.

The sweep's ETL runs take ``--min-row-groups`` (default 2 here, 8 in the ETL) so that the
row-group size, not the split's length, sets the rows per row group on a benchmark-sized split;
the table prints the rows each size gave. ``--png`` draws the sweep.

The batch size, shuffle buffer and reader workers are a ``TrainConfig``'s (``--batch-size`` is its
option); ``--etl-image-size`` is the size the ETL stores the images at.

``--storage s3`` also uploads the first size's ETL output to an S3 API server (``moto_server`` on
127.0.0.1, started here with tests/s3server.py) and reads it from there, by the two routes
evaluated for Petastorm on object storage: through the storage module's filesystem (what
training does, :mod:`pipelines.training.legacy_fs`), and by staging the rank's row groups on local
disk first and reading those with ``file://`` (the time to stage counted in its cold epoch).

Usage: python benchmarks/loader_bench.py [--per-class 300] [--etl-image-size 299] [--batch-size 32]
       [--row-group-mb 1,4,16,64] [--min-row-groups 2] [--png FILE] [--storage local|s3]
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


def epochs(data, cache, config, labels, workers, results, batches, flat_cache=True) -> None:
    """Time two epochs of one looping reader (``cache`` None: no cache) into ``results[labels[i]]``
    through training's ``make_dataset``; ``flat_cache`` False: Petastorm's own cache format."""
    from pipelines.training.data import make_dataset, open_reader

    with open_reader(data, "train", 0, 1, cache, workers=workers, flat_cache=flat_cache) as reader:
        # One iterator across both epochs, as Keras fit keeps it: epoch 2 reads from the cache.
        it = iter(make_dataset(reader, data.image_size, config.batch_size, shuffle_buffer=config.shuffle_buffer))
        for label in labels:
            start = time.perf_counter()
            for _ in range(batches):
                next(it)[0].numpy()
            if label:
                results[label] = batches * config.batch_size / (time.perf_counter() - start)


def ceiling(data, config, batches) -> float:
    """images/s of the train split's images held in memory through training's own tail."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    from pipelines.training.data import batched

    table = pa.concat_tables([pq.read_table(part.path, columns=["image", "label"]) for part in data.parts("train")])
    images = np.frombuffer(b"".join(table.column("image").to_pylist()), np.uint8).reshape(
        -1, data.image_size, data.image_size, 3)
    labels = np.asarray(table.column("label").to_pylist(), np.int32)
    memory = batched(tf.data.Dataset.from_tensor_slices((images, labels)), config.batch_size, data.image_size,
                     shuffle_buffer=config.shuffle_buffer)
    consume(memory, batches)  # warm-up of the same graph
    return batches * config.batch_size / consume(memory, batches)


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


def parse(argv):
    from pipelines.config import add_arguments
    from pipelines.training.config import TrainConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--per-class", type=int, default=300, help="Fashion-MNIST images per class (10 classes)")
    parser.add_argument("--etl-image-size", type=int, default=299, help="image size the ETL stores the images at")
    parser.add_argument("--row-group-mb", default="1,4,16,64", help="comma-separated ETL row-group sizes, MiB")
    parser.add_argument("--min-row-groups", type=int, default=2, help="the sweep's ETL --min-row-groups")
    parser.add_argument("--png", default=None, help="draw the sweep into this PNG file")
    add_arguments(parser, TrainConfig, {"batch_size": 32})
    parser.add_argument("--workdir", default=None,
                        help="keep the sample, ETL outputs and caches here (default: a temporary folder, removed)")
    parser.add_argument("--storage", choices=["local", "s3"], default="local",
                        help="s3: also read the data from an S3 API server (moto_server on 127.0.0.1) by both routes")
    args = parser.parse_args(argv)
    try:
        args.sizes = [float(x) for x in args.row_group_mb.split(",")]
        # data and output stand in until the ETL has run
        args.config = TrainConfig(data=os.curdir, output=os.curdir, batch_size=args.batch_size)
    except ValueError as exc:
        parser.error(str(exc))
    return args


LABELS = ("cold cache (epoch 1)", "warm cache (epoch 2)", "no cache (epoch 2)", "warm, pickled cache (epoch 2)")


def sweep_one(tree, work, mb, args, spark, first: bool) -> dict:
    """ETL at ``mb`` MiB row groups, then the four Petastorm paths of :data:`LABELS` (and, ``first``
    with ``--storage s3``, the S3 routes). Returns ``{"rows": rows per group, "groups": train
    groups, label: images/s}``."""
    from pipelines.etl.config import ETLConfig
    from pipelines.etl.job import run_etl
    from pipelines.training.data import load_dataset

    etl = os.path.join(work, f"etl-{mb:g}mb")
    run_etl(ETLConfig(input=tree, output=etl, image_size=args.etl_image_size, test_fraction=0.1,
                      row_group_mb=mb, min_row_groups=args.min_row_groups), spark)
    config = dataclasses.replace(args.config, data=etl, output=work)
    data = load_dataset(etl, 1)
    batches = data.train_rows // config.batch_size
    found = {"rows": data.rows_per_row_group, "groups": data.row_groups("train"), "data": data, "batches": batches}
    epochs(data, os.path.join(work, f"cache-{mb:g}"), config, LABELS[:2], config.reader_workers, found, batches)
    epochs(data, None, config, ["", LABELS[2]], config.reader_workers, found, batches)
    epochs(data, os.path.join(work, f"cache-{mb:g}-pickled"), config, ["", LABELS[3]], config.reader_workers,
           found, batches, flat_cache=False)
    if first and args.storage == "s3":
        s3_routes(etl, work, config, batches, found)
    return found


def report(sweep: dict, tops: list, args) -> None:
    """Print the sweep (images/s and fraction of the ceilings' mean) and draw it when ``--png``."""
    top = sum(tops) / len(tops)
    print(f"\nLoader benchmark: Fashion-MNIST at {args.etl_image_size} px, batch {args.config.batch_size}, "
          f"{args.config.reader_workers} reader threads, {os.cpu_count()} CPUs; ceiling (in memory, same tail) "
          f"{top:.0f} images/s, the mean of " + " and ".join(f"{x:.0f}" for x in tops) + " (before and after the sweep)")
    print(f"{'row-group MiB':>13s} {'rows/group':>10s} {'groups':>6s}  " + "  ".join(f"{x:>28s}" for x in LABELS))
    for mb, found in sweep.items():
        cells = "  ".join(f"{found[x]:8.0f} img/s {found[x] / top:5.2f}x ceil" for x in LABELS)
        print(f"{mb:13g} {found['rows']:10d} {found['groups']:6d}  {cells}")
    first = sweep[next(iter(sweep))]
    for label in [k for k in first if isinstance(first[k], float) and k not in LABELS]:
        print(f"  at {next(iter(sweep)):g} MiB: {label}: {first[label]:.0f} images/s, {first[label] / top:.2f}x")
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        sizes = list(sweep)
        for label in LABELS:
            ax.plot(sizes, [sweep[mb][label] for mb in sizes], marker="o", label=label)
        ax.axhline(top, color="k", linestyle="--", label="in memory (ceiling)")
        ax.set(xscale="log", xlabel="ETL row-group size, MiB", ylabel="images/s",
               title=f"Petastorm -> tf.data, {args.etl_image_size} px, 1 rank")
        ax.set_xticks(sizes, [f"{mb:g}" for mb in sizes])
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.png, dpi=100)
        print(f"  sweep drawn in {args.png}")


def main(argv=None) -> int:
    args = parse(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from pipelines.logs import setup_logging
    from pipelines.spark import spark_session
    from pipelines.tools import samples

    setup_logging("loader-bench", level=30)
    work = args.workdir or tempfile.mkdtemp(prefix="loader-bench-")
    tree = os.path.join(work, "fashion")
    samples.main(["fashion-mnist", "--dest", tree, "--per-class", str(args.per_class)])
    spark = spark_session("loader-bench", "local[2]")
    sweep, tops = {}, []
    try:
        for i, mb in enumerate(args.sizes):
            sweep[mb] = sweep_one(tree, work, mb, args, spark, i == 0)
            if i == 0:
                first = sweep[mb]
                tops.append(ceiling(first["data"], args.config, first["batches"]))
    finally:
        spark.stop()
    tops.append(ceiling(first["data"], args.config, first["batches"]))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    report(sweep, tops, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
