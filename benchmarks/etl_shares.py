"""The parts of ``benchmarks/etl_bench.py`` that measure a share of the ETL rather than a whole
ETL: the duplicate check's share (the whole run with and without it, its hash pass), Spark's share of each design (the ``binaryFile`` scan and shuffle the article paid, our tasks
reading their files' bytes, from a folder or through the storage module), and the table of an ETL
from S3 next to one from local files. Pure timing helpers; ``etl_bench.py`` prints the tables."""
from __future__ import annotations

import os
import shutil
import time


def binaryfile_scan(spark, input_dir: str, partitions: int) -> int:
    """The previous design's Spark share: ``binaryFile`` scan and a seeded shuffle of the encoded
    files into a no-op Python mapper (no decode, no write); returns rows seen."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    def count_rows(batches):
        yield pa.RecordBatch.from_pydict({"n": [sum(b.num_rows for b in batches)]})

    order = F.xxhash64("path", F.lit(0))
    files = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(input_dir)
             .select("path", "content").repartition(partitions, order).sortWithinPartitions(order))
    return sum(r.n for r in files.mapInArrow(count_rows, "n LONG").collect())


def image_paths(input_dir: str) -> list:
    """The image files below ``input_dir`` (``.jpg``, ``.jpeg``, ``.png``), sorted."""
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(input_dir) for f in fs
                  if f.lower().endswith((".jpg", ".jpeg", ".png")))


def read_in_task_scan(spark, input_dir: str, partitions: int) -> int:
    """Our design's Spark share: ``spark.range`` tasks that read their files' bytes in Python
    (the driver's list shipped with the function, no shuffle), no decode, no write; returns files read."""
    return _scan_in_tasks(spark, image_paths(input_dir), partitions, lambda path: open(path, "rb"))


def read_in_task_scan_store(spark, root, partitions: int) -> int:
    """:func:`read_in_task_scan` through the storage module: the driver lists the
    :class:`pipelines.io.storage.Location` ``root`` (an ``s3://`` prefix), the tasks read each
    object's bytes through its ``pyarrow.fs`` filesystem (no decode, no write); returns files read."""
    import pyarrow.fs as pafs

    paths = [i.path for i in root.list() if i.type == pafs.FileType.File
             and i.path.lower().endswith((".jpg", ".jpeg", ".png"))]
    return _scan_in_tasks(spark, paths, partitions, root.filesystem.open_input_file)


def _scan_in_tasks(spark, paths, partitions: int, opener) -> int:
    """Task ``i`` of ``partitions`` reads chunk ``i`` of ``paths`` whole with ``opener(path)`` (a
    context manager with ``read()``); returns the files read over all tasks."""
    import pyarrow as pa

    chunk = -(-len(paths) // partitions)

    def read_chunk(batches):
        n = 0
        for batch in batches:
            for task in batch.column(0).to_pylist():
                for path in paths[task * chunk:(task + 1) * chunk]:
                    with opener(path) as f:
                        f.read()
                    n += 1
        yield pa.RecordBatch.from_pydict({"n": [n]})

    return sum(r.n for r in spark.range(partitions, numPartitions=partitions).mapInArrow(read_chunk, "n LONG")
               .collect())


def binaryfile_error(spark, uri: str) -> str:
    """What Spark's ``binaryFile`` source says when asked to read ``uri`` (an ``s3://`` prefix):
    the first line of its error, or ``"read N files"`` if it could."""
    try:
        return f"read {spark.read.format('binaryFile').load(uri).count()} files"
    except Exception as exc:  # Py4J / AnalysisException: whatever Spark raises is the finding
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        return next((line.strip() for line in lines if "Exception:" in line), lines[0])[:200]


def s3_rows(spark, inputs: dict, work: str, args, partitions: int) -> list:
    """ETL images/s local -> local and S3 -> S3 (inputs uploaded to the server first; the best of
    ``args.repeats`` runs after a warm-up), the read-in-task share from each, and binaryFile on S3."""
    from pipelines.io import storage
    from pipelines.etl.config import ETLConfig
    from pipelines.etl.job import run_etl
    from tests.support import s3server

    server = s3server.Server(os.environ["AWS_ENDPOINT_URL"], None, "")
    rows = []
    for name, src in inputs.items():
        bucket = server.bucket("bench")
        remote = storage.resolve(f"s3://{bucket}/input")
        remote.upload(src)
        local_cfg = ETLConfig(input=src, output=os.path.join(work, "out-local"), image_size=args.image_size,
                              num_partitions=partitions, tracking=False, dedupe=False)
        s3_cfg = ETLConfig(input=remote.uri, output=f"s3://{bucket}/etl", image_size=args.image_size,
                           num_partitions=partitions, tracking=False, dedupe=False)
        run_etl(local_cfg, spark)  # warm-up: JVM, Python workers, file cache
        run_etl(s3_cfg, spark)
        local_m, local_s = best_of(args.repeats, lambda: run_etl(local_cfg, spark))
        s3_m, s3_s = best_of(args.repeats, lambda: run_etl(s3_cfg, spark))
        read_local, read_local_s = best_of(args.repeats, lambda: read_in_task_scan(spark, src, partitions))
        read_s3, read_s3_s = best_of(args.repeats, lambda: read_in_task_scan_store(spark, remote, partitions))
        rows.append(dict(name=name, local=local_m["files"]["written"] / local_s, s3=s3_m["files"]["written"] / s3_s,
                         read_local=read_local / read_local_s, read_s3=read_s3 / read_s3_s,
                         same=all(local_m["files"][k] == s3_m["files"][k] for k in ("found", "written", "rejected")),
                         binaryfile=binaryfile_error(spark, remote.uri)))
        shutil.rmtree(local_cfg.output, ignore_errors=True)
    return rows


def print_s3(rows: list, args) -> None:
    print(f"\nETL from S3 (moto_server on 127.0.0.1): {args.master}, {os.cpu_count()} CPUs, {args.image_size} px, "
          f"best of {args.repeats}; images/s")
    print(f"{'input':44s} {'local->local':>12s} {'S3->S3':>8s} {'ratio':>6s} {'read in task, local':>19s} "
          f"{'read in task, S3':>16s}")
    for r in rows:
        print(f"{r['name']:44s} {r['local']:12.1f} {r['s3']:8.1f} {r['s3'] / r['local']:5.2f}x "
              f"{r['read_local']:19.1f} {r['read_s3']:16.1f}" + ("" if r["same"] else "  (counts differ!)"))
        print(f"  binaryFile on s3://: {r['binaryfile']}")


def best_of(repeats: int, fn):
    """``(the last result, the shortest wall time in s)`` of ``repeats`` calls of ``fn()``."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, min(times)

def dedupe_rows(spark, inputs: dict, work: str, args, partitions: int) -> list:
    """Per input, the ETL's run without the duplicate check and with it (best of ``--repeats``,
    seconds), the hash pass's own seconds (the manifest's ``hash_seconds``) and rows written by each."""
    from dataclasses import replace

    from pipelines.etl.config import ETLConfig
    from pipelines.etl.job import run_etl

    rows = []
    for i, (name, src) in enumerate(inputs.items()):
        without = ETLConfig(input=src, output=os.path.join(work, f"out-dedupe-{i}"), image_size=args.image_size,
                            num_partitions=partitions, tracking=False, dedupe=False)
        with_check = replace(without, dedupe=True)
        run_etl(without, spark)  # warm-up: JVM, Python workers, file cache
        plain, plain_s = best_of(args.repeats, lambda: run_etl(without, spark))
        checked, checked_s = best_of(args.repeats, lambda: run_etl(with_check, spark))
        rows.append(dict(name=name, without_s=plain_s, with_s=checked_s, hash_s=checked["hash_seconds"],
                         n_without=plain["files"]["written"], n_with=checked["files"]["written"],
                         copies=checked["files"]["reasons"].get("rejected: duplicate", 0)))
        shutil.rmtree(without.output, ignore_errors=True)
    return rows


def print_dedupe(rows: list, args) -> None:
    print(f"\nDuplicate check (--dedupe): {args.master}, {os.cpu_count()} CPUs, {args.image_size} px, "
          f"best of {args.repeats}; seconds of the whole run (plan, Spark, finish) without and with it, and its "
          "hash pass alone")
    print(f"{'input':44s} {'without':>8s} {'with':>8s} {'ratio':>6s} {'hash pass':>9s} {'written without':>15s} "
          f"{'with':>6s} {'copies rejected':>15s}")
    for r in rows:
        print(f"{r['name']:44s} {r['without_s']:8.2f} {r['with_s']:8.2f} {r['with_s'] / r['without_s']:5.2f}x "
              f"{r['hash_s']:9.2f} {r['n_without']:15d} {r['n_with']:6d} {r['copies']:15d}")
