"""Input-pipeline throughput of both readers side by side: Petastorm's and our own (pyarrow) ->
tf.data, with a cold and a warm local-disk cache and without one, against the same images held in
memory (``tf.data.Dataset.from_tensor_slices``), measured in one run, for each ETL row-group size
of a sweep (``--row-group-mb 1,4,16,32``).

Every path is training's own (:func:`pipelines.training.data.tfdata.make_dataset`: over Petastorm's
reader the tail :func:`pipelines.training.data.tfdata.batched`, shuffle, batch, prefetch; over ours the
positioned train stream, :mod:`pipelines.training.data.stream`, its windows shuffled and batched in
NumPy, then the same prefetch; uint8 batches, which the model casts and preprocesses on its
device), the in-memory ceiling through ``batched``, and each is timed over one epoch of
the train split (``train_rows // batch`` batches), consuming the tensors as training would. No
model runs: this is the ceiling the data path puts on training. Each reader is also timed alone
(no tf.data: its row groups pulled and copied once), cold and warm: the reader's own cost. Both readers cache row groups in
the same flat files (:mod:`pipelines.training.data.rowcache`). The ceiling is measured twice, after the
first ETL and after the sweep, and their mean divides: on a shared VM one figure can move by 20 %.
The readers take turns going first (the Parquet files are in the page cache for both: the ETL has
just written them); ``--repeats N`` times each path N times and reports the median.

``--readers own,petastorm,ray,plain`` (default: every one that runs here). Beside our reader and
Petastorm's, the peers a user would pick instead (:mod:`loader_peers`: Ray Data, and the plain
``pyarrow.dataset`` -> ``from_generator`` route) are timed on the same data, batch and tail, two
epochs of each of their routes; a peer not installed is one line naming how to install it
(``make bench-peers``) and the others go on (exit 2 when none is left); an unknown name exits 2
listing the names. After each size's table, a ``goal, ours, ...`` line per cached path checks our
reader against issue 28's goals (:data:`GOALS`: a fraction of the ceiling) and against each
other reader that ran (at least its images/s: a peer's best route of the same epoch).

The sweep's ETL runs take ``--min-row-groups`` (default 2 here, 8 in the ETL) so that the
row-group size, not the split's length, sets the rows per row group on a benchmark-sized split;
the table prints the rows each size gave. ``--png`` draws the sweep.

The batch size, shuffle buffer and reader workers are a ``TrainConfig``'s (``--batch-size`` is its
option); ``--etl-image-size`` is the size the ETL stores the images at.

``--storage s3`` also uploads the first size's ETL output to an S3 API server (``moto_server`` on
127.0.0.1, started here with tests/support/s3server.py) and reads it from there through the storage
module's filesystem with each reader (what training does).

Usage: python benchmarks/loader_bench.py [--per-class 300] [--etl-image-size 299] [--batch-size 32]
       [--row-group-mb 1,4,16,32] [--min-row-groups 2] [--readers own,petastorm,ray,plain]
       [--repeats 1] [--png FILE]
       [--tail uint8|float32] [--storage local|s3]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time

if __package__:  # imported as benchmarks.loader_bench (the tests)
    from . import loader_peers
else:
    import loader_peers

PEERS = loader_peers.PEERS


def consume(dataset, batches: int) -> float:
    """Seconds to pull ``batches`` batches (each forced to materialise)."""
    iterator = iter(dataset)
    start = time.perf_counter()
    for _ in range(batches):
        images, _labels = next(iterator)
        images.numpy()
    return time.perf_counter() - start


def host_float32(ds, on: bool):
    """``ds`` with, when ``on``, each batch cast to float32 and scaled as Xception's
    ``preprocess_input`` (its ``pipelines.backbones`` row's ``scale`` and ``offset``) in
    tf.data on the host: the tail before the model took uint8 (``--tail float32``), the tail of the
    ceiling issue 28's goals were set against."""
    if not on:
        return ds
    import tensorflow as tf

    from pipelines.backbones import backbone_spec

    xception = backbone_spec("xception")

    def preprocess(images, labels):
        return tf.cast(images, tf.float32) * xception.scale + xception.offset, labels

    return ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def epochs(data, cache, config, labels, results, batches, reader, float32: bool = False) -> None:
    """Time two epochs of one looping ``reader`` (``cache`` None: no cache) into
    ``results[labels[i]]`` (images/s; an empty label: not kept) through training's ``make_dataset``
    (and :func:`host_float32` with ``float32``)."""
    from pipelines.training.data import make_dataset, open_reader

    with open_reader(data, "train", 0, 1, cache, workers=config.loader.reader_workers, reader=reader) as opened:
        # One iterator across both epochs, as Keras fit keeps it: epoch 2 reads from the cache.
        it = iter(host_float32(make_dataset(opened, data.stored_size, config.fit.batch_size,
                                            shuffle_buffer=config.loader.shuffle_buffer), float32))
        for label in labels:
            start = time.perf_counter()
            for _ in range(batches):
                next(it)[0].numpy()
            if label:
                results[label] = batches * config.fit.batch_size / (time.perf_counter() - start)


def reader_only(data, cache, results, reader, labels) -> None:
    """Time two epochs of one looping ``reader`` alone, without tf.data (each row group's images
    copied once, as the tensor conversion does), into ``results[labels[i]]`` (images/s): the
    reader's own cost, which the tail's hides on a loaded machine."""
    from pipelines.training.data.rowgroups import split_row_groups
    from pipelines.training.data import open_reader, row_groups_of

    groups = len(split_row_groups(data.parts("train")))
    with open_reader(data, "train", 0, 1, cache, reader=reader) as opened:
        for label in labels:
            start, rows = time.perf_counter(), 0
            for images, _labels in row_groups_of((next(opened) for _ in range(groups)), data.stored_size):
                rows += len(images.copy())
            results[label] = rows / (time.perf_counter() - start)


def ceiling(data, config, batches, float32: bool = False) -> float:
    """images/s of the train split's images held in memory through training's own tail (and
    :func:`host_float32` with ``float32``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    from pipelines.training.data import batched

    table = pa.concat_tables([pq.read_table(part.location.path, columns=["image", "label"]) for part in data.parts("train")])
    images = np.frombuffer(b"".join(table.column("image").to_pylist()), np.uint8).reshape(
        -1, data.stored_size, data.stored_size, 3)
    labels = np.asarray(table.column("label").to_pylist(), np.int32)
    memory = host_float32(batched(tf.data.Dataset.from_tensor_slices((images, labels)), config.fit.batch_size,
                                  shuffle_buffer=config.loader.shuffle_buffer), float32)
    consume(memory, batches)  # warm-up of the same graph
    return batches * config.fit.batch_size / consume(memory, batches)


def s3_routes(etl, work, config, batches, results, readers, float32: bool = False) -> None:
    """Upload ``etl`` to a moto_server of our own and time each reader reading it from there."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.support import s3server

    from pipelines.io.storage import resolve
    from pipelines.training.data import load_dataset

    port = s3server.free_port()
    os.environ.update(s3server.standard_environment(f"http://127.0.0.1:{port}"))
    server = s3server.start(port, os.path.join(work, "moto.log"))
    try:
        uri = f"s3://{server.bucket('bench')}/etl"
        resolve(uri).upload(etl)
        remote = load_dataset(uri, 1)
        for reader in readers:
            epochs(remote, os.path.join(work, f"cache-s3-{reader}"), config,
                   [f"s3, {reader}, cold cache (epoch 1)", f"s3, {reader}, warm cache (epoch 2)"],
                   results, batches, reader, float32)
            epochs(remote, None, config, ["", f"s3, {reader}, no cache (epoch 2)"], results, batches, reader, float32)
    finally:
        server.stop()


def parse(argv):
    from pipelines.runtime.config import add_arguments
    from pipelines.training.config import TrainConfig
    from pipelines.runtime.errors import Refused
    from pipelines.training.data import petastorm_available

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--per-class", type=int, default=300, help="Fashion-MNIST images per class (10 classes)")
    parser.add_argument("--etl-image-size", type=int, default=299, help="image size the ETL stores the images at")
    parser.add_argument("--row-group-mb", default="1,4,16,32", help="comma-separated ETL row-group sizes, MiB")
    parser.add_argument("--readers", default="", help="comma-separated readers to time (own, petastorm, and the "
                                                       "peers ray, plain); default: every one that runs here")
    parser.add_argument("--min-row-groups", type=int, default=2, help="the sweep's ETL --min-row-groups")
    parser.add_argument("--repeats", type=int, default=1, help="time each reader's paths this many times, the "
                                                                 "readers taking turns to go first; the median counts")
    parser.add_argument("--png", default=None, help="draw the sweep into this PNG file")
    add_arguments(parser, TrainConfig, {"batch_size": 32})
    parser.add_argument("--workdir", default=None,
                        help="keep the sample, ETL outputs and caches here (default: a temporary folder, removed)")
    parser.add_argument("--tail", choices=["uint8", "float32"], default="uint8",
                        help="uint8: training's tail (the model casts on its device); float32: each batch cast "
                             "and scaled on the host as before, the ceiling issue 28's goals were set against")
    parser.add_argument("--storage", choices=["local", "s3"], default="local",
                        help="s3: also read the data from an S3 API server (moto_server on 127.0.0.1) with each reader")
    args = parser.parse_args(argv)
    try:
        args.sizes = [float(x) for x in args.row_group_mb.split(",")]
        args.float32 = args.tail == "float32"
        args.readers = pick_readers(args.readers, petastorm_available())
        # data and output stand in until the ETL has run
        args.config = TrainConfig(data=os.curdir, output=os.curdir, batch_size=args.batch_size)
    except Refused as exc:
        print(f"loader_bench.py: {exc}", file=sys.stderr)
        sys.exit(2)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def pick_readers(flag: str, petastorm_runs: bool) -> list:
    """The readers ``--readers`` names (comma-separated), or every one that runs here when empty;
    a peer that is not installed is left out with one line naming how to install it.

    Raises:
        Refused: an unknown name (the message lists the names), ``petastorm`` where it cannot run
            (:func:`pipelines.training.data.readers.check_reader`), or only peers that are not installed.
    """
    from pipelines.runtime.errors import Refused
    from pipelines.stack import active
    from pipelines.training.data import READERS, check_reader

    names = ("own", "petastorm") + PEERS
    wanted = [x.strip() for x in flag.split(",") if x.strip()] if flag else \
        ["own"] + (["petastorm"] if petastorm_runs else []) + list(PEERS)
    unknown = [x for x in wanted if x not in names]
    if unknown or not wanted:
        raise Refused(f"--readers {flag}: unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(names)}")
    readers = []
    for reader in dict.fromkeys(wanted):
        line = None if reader in READERS else loader_peers.missing(reader, active().name)
        if line:
            print(line)
        else:
            readers.append(check_reader(reader) if reader in READERS else reader)
    if not readers:
        raise Refused(f"--readers {flag}: none of them is installed here (above)")
    return readers


KINDS = ("cold cache (epoch 1)", "warm cache (epoch 2)", "no cache (epoch 2)")


def labels(readers) -> list:
    """The table's columns: each reader's paths (a peer's: :func:`loader_peers.kinds`)."""
    return [f"{reader}, {kind}" for reader in readers for kind in (loader_peers.kinds(reader) if reader in PEERS
                                                                    else KINDS)]


def sweep_one(tree, work, mb, args, spark, index: int) -> dict:
    """ETL at ``mb`` MiB row groups, then each reader's paths (:func:`labels`; and, for the first
    size with ``--storage s3``, from the bucket). Returns ``{"rows": rows per group, "groups":
    train groups, label: images/s}``."""
    from pipelines.etl.config import ETLConfig
    from pipelines.etl.job import run_etl
    from pipelines.training.data import load_dataset

    etl = os.path.join(work, f"etl-{mb:g}mb")
    run_etl(ETLConfig(input=tree, output=etl, image_size=args.etl_image_size, test_fraction=0.1,
                      row_group_mb=mb, min_row_groups=args.min_row_groups), spark)
    config = dataclasses.replace(args.config, data=etl, output=work)
    data = load_dataset(etl, 1)
    batches = data.train_rows // config.fit.batch_size
    found = {"rows": data.rows_per_row_group, "groups": data.row_groups("train"), "data": data, "batches": batches}
    runs = {}
    for repeat in range(args.repeats):  # the readers take turns going first
        for reader in (args.readers if (index + repeat) % 2 == 0 else args.readers[::-1]):
            cold, warm, none = (f"{reader}, {kind}" for kind in KINDS)
            once = {}
            if reader in PEERS:
                loader_peers.time_peer(reader, data, config, once, batches, lambda ds: host_float32(ds, args.float32))
                for label, rate in once.items():
                    runs.setdefault(label, []).append(rate)
                continue
            epochs(data, os.path.join(work, f"cache-{mb:g}-{reader}"), config, [cold, warm], once, batches, reader,
                   args.float32)
            epochs(data, None, config, ["", none], once, batches, reader, args.float32)
            reader_only(data, os.path.join(work, f"cache-{mb:g}-{reader}-alone"), once, reader,
                        [f"{reader}, reader alone, {kind}" for kind in KINDS[:2]])
            for label, rate in once.items():
                runs.setdefault(label, []).append(rate)
    found.update({label: statistics.median(rates) for label, rates in runs.items()})
    if index == 0 and args.storage == "s3":
        s3_routes(etl, work, config, batches, found, [r for r in args.readers if r not in PEERS], args.float32)
    return found


#: Issue 28's goals for our reader, per path: at least this fraction of the in-memory ceiling, and at
#: least Petastorm's images/s where both ran.
GOALS = {"cold cache (epoch 1)": 0.6, "warm cache (epoch 2)": 0.9}


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def rival(found: dict, reader: str, path: str):
    """``reader``'s images/s to hold ours against on ``path`` (a :data:`GOALS` path): Petastorm's
    same path; a peer's best route of the same epoch (:data:`loader_peers.ROUTES`). None: not run."""
    if reader not in PEERS:
        return found.get(f"{reader}, {path}")
    epoch = 0 if path == KINDS[0] else 1
    rates = [found[f"{reader}, {route[epoch]}"] for route in loader_peers.ROUTES[reader]
             if f"{reader}, {route[epoch]}" in found]
    return max(rates) if rates else None


def goal_lines(found: dict, top: float) -> list:
    """One line per path of :data:`GOALS` that ours ran: its fraction of the ceiling ``top``
    (images/s) and, for Petastorm and each peer that ran too, ours ÷ theirs (:func:`rival`), each
    against its goal."""
    lines = []
    for path, fraction in GOALS.items():
        ours = found.get(f"own, {path}")
        if ours is None:
            continue
        checks = [f"{ours / top:.3f} of the ceiling (goal >= {fraction}: {_met(ours / top >= fraction)})"]
        for reader in ("petastorm",) + PEERS:
            theirs = rival(found, reader, path)
            if theirs:
                checks.append(f"{ours / theirs:.3f}x {loader_peers.TITLES[reader]} (goal >= 1: {_met(ours >= theirs)})")
        lines.append(f"goal, ours, {path}: " + "; ".join(checks))
    return lines


def report(sweep: dict, tops: list, args) -> None:
    """Print the sweep (images/s and fraction of the ceilings' mean; ours against Petastorm's when
    both ran) and draw it when ``--png``."""
    top = sum(tops) / len(tops)
    columns = labels(args.readers)
    print(f"\nLoader benchmark: Fashion-MNIST at {args.etl_image_size} px, batch {args.config.fit.batch_size}, "
          f"{args.config.loader.reader_workers} reader threads, {os.cpu_count()} CPUs, {args.tail} tail, median of "
          f"{args.repeats}; ceiling "
          f"(in memory, same tail) {top:.0f} images/s, the mean of " + " and ".join(f"{x:.0f}" for x in tops) +
          " (before and after the sweep)")
    for mb, found in sweep.items():
        print(f"\n{mb:g} MiB row groups: {found['rows']} rows each, {found['groups']} in train")
        for label in columns + [k for k in found if isinstance(found[k], float) and k not in columns]:
            ratio = ""
            if label.startswith("own, ") and label.replace("own, ", "petastorm, ") in found:
                ratio = f"  own / petastorm {found[label] / found[label.replace('own, ', 'petastorm, ')]:.2f}"
            print(f"  {label:40s} {found[label]:8.0f} images/s {found[label] / top:5.2f}x ceiling{ratio}")
        for line in goal_lines(found, top):
            print(line)
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        sizes = list(sweep)
        for label in columns:
            ax.plot(sizes, [sweep[mb][label] for mb in sizes], marker="o" if label.startswith("own") else "x",
                    linestyle="-" if label.startswith("own") else ":", label=label)
        ax.axhline(top, color="k", linestyle="--", label="in memory (ceiling)")
        ax.set(xscale="log", xlabel="ETL row-group size, MiB", ylabel="images/s",
               title=f"readers -> tf.data, {args.etl_image_size} px, 1 rank")
        ax.set_xticks(sizes, [f"{mb:g}" for mb in sizes])
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.png, dpi=100)
        print(f"  sweep drawn in {args.png}")


def main(argv=None) -> int:
    args = parse(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from pipelines.runtime.logs import setup_logging
    from pipelines.runtime.spark import spark_session
    from pipelines.tools import samples

    setup_logging("loader-bench", level=30)
    work = args.workdir or tempfile.mkdtemp(prefix="loader-bench-")
    tree = os.path.join(work, "fashion")
    samples.main(["fashion-mnist", "--dest", tree, "--per-class", str(args.per_class)])
    spark = spark_session("loader-bench", "local[2]")
    sweep, tops = {}, []
    try:
        for i, mb in enumerate(args.sizes):
            sweep[mb] = sweep_one(tree, work, mb, args, spark, i)
            if i == 0:
                first = sweep[mb]
                tops.append(ceiling(first["data"], args.config, first["batches"], args.float32))
    finally:
        spark.stop()
        loader_peers.stop_ray()
    tops.append(ceiling(first["data"], args.config, first["batches"], args.float32))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    report(sweep, tops, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
