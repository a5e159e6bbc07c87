"""Driver side of the ETL: list, plan, run the Spark job, lay out the splits, reconcile, report.

Steps, each a function below:

1. :func:`check_paths` - clear errors before Spark starts (missing input, overlapping output).
2. :func:`plan` - the job's own listing, classification and row-group plan.
3. :func:`run_spark` - ``binaryFile`` -> shuffle by a seeded hash -> ``mapInArrow`` that resizes
   and writes each task's Parquet file per split -> one outcome row per input file.
4. :func:`finish` - move the splits into place, read the real Parquet metadata, reconcile every
   listed file with an outcome, write ``rejected.jsonl`` and ``manifest.json``.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import platform
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Dict, List, Optional, Tuple

from pipelines import __version__
from pipelines.config import to_dict
from pipelines.etl.config import ETLConfig
from pipelines.etl.labels import ClassFolder, is_test
from pipelines.etl.layout import rows_per_row_group
from pipelines.etl.listing import REJECTED, SKIPPED, Excluded, ListedFile, class_folders, classify, list_files
from pipelines.etl.transform import OUTCOME_DDL, TEST, TRAIN, WRITTEN, process_batches

log = logging.getLogger("pipelines")

MANIFEST = "manifest.json"
REJECTED_LIST = "rejected.jsonl"
STAGING = "_staging"
SPLITS = (TRAIN, TEST)
MANIFEST_FORMAT = 1
IMAGE_GLOB = "*.{[jJ][pP][gG],[jJ][pP][eE][gG],[pP][nN][gG]}"


@dataclass
class Plan:
    """What the driver knows before Spark runs."""

    files: List[ListedFile]
    outcomes: Dict[str, object]  # path -> ClassFolder (candidate) or Excluded
    classes: Dict[int, str]
    expected_rows: Dict[str, int]
    rows_per_row_group: int
    partitions: int = 0


@dataclass
class SplitStats:
    """Read back from the written Parquet footers, not assumed."""

    rows: int = 0
    files: int = 0
    row_groups: int = 0
    bytes_uncompressed: int = 0
    bytes_compressed: int = 0
    per_class: Dict[int, int] = field(default_factory=dict)
    paths: List[str] = field(default_factory=list)


def _inside(child: str, parent: str) -> bool:
    return os.path.commonpath([child, parent]) == parent


def check_paths(config: ETLConfig) -> None:
    """Refuse, before Spark starts, input/output combinations that cannot work.

    Raises:
        FileNotFoundError: the input folder is missing. NotADirectoryError: it is a file.
        ValueError: output equal to, inside, or containing the input (a rerun would read its own
            output as input, or overwrite the input).
    """
    src, dst = os.path.realpath(config.input), os.path.realpath(config.output)
    if not os.path.exists(src):
        raise FileNotFoundError(f"input folder does not exist: {config.input}")
    if not os.path.isdir(src):
        raise NotADirectoryError(f"input is not a folder: {config.input}")
    if _inside(dst, src):
        raise ValueError(f"output {config.output} is the input or inside it: its files would be "
                         "read as input by the next run")
    if _inside(src, dst):
        raise ValueError(f"input {config.input} is inside output {config.output}: overwriting the "
                         "output could destroy the input")
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise NotADirectoryError(f"output exists and is not a folder: {config.output}")
    if (os.path.isdir(os.path.join(dst, TRAIN)) or os.path.isdir(os.path.join(dst, TEST))) and \
            not os.path.isfile(os.path.join(dst, MANIFEST)):
        raise ValueError(f"output {config.output} has train/ or test/ but no {MANIFEST}: not an output of "
                         "this job, refusing to overwrite it")


def plan(config: ETLConfig) -> Plan:
    """List and classify every file under the input; choose rows per row group.

    Raises:
        ValueError: no class folder, or two folders with the same number.
    """
    files = list_files(config.input)
    classes = class_folders(config.input)
    if not classes:
        raise ValueError(f"no class folder of the form NNN.name under {config.input}")
    max_bytes = int(config.max_file_mb * 2**20)
    outcomes = {f.path: classify(f.relative_path, f.size_bytes, max_bytes) for f in files}
    expected = Counter(TEST if is_test(f.relative_path, config.seed, config.test_fraction) else TRAIN
                       for f in files if isinstance(outcomes[f.path], ClassFolder))
    rpg = rows_per_row_group(config.row_bytes, config.row_group_mb * 2**20, dict(expected),
                             config.min_row_groups)
    return Plan(files, outcomes, classes, {s: expected.get(s, 0) for s in SPLITS}, rpg)


def run_spark(spark, config: ETLConfig, the_plan: Plan) -> Dict[str, dict]:
    """Decode, resize and write both splits in one Spark job.

    Each task writes ``OUTPUT/_staging/<split>/part-<partition>-<attempt>.parquet`` itself (see
    :mod:`pipelines.etl.transform`), in row groups of ``rows_per_row_group`` rows, columns
    ``path, label (int32), label_name, image (binary, size*size*3 uint8 HWC), height, width
    (int32)``.

    Returns:
        ``{path: outcome}`` for every file Spark read, ``outcome`` a dict with ``status``,
        ``split``, ``label``, ``file`` and ``reason`` (:data:`OUTCOME_SCHEMA`).
    """
    from pyspark.sql import functions as F

    sc = spark.sparkContext
    candidates = sum(1 for o in the_plan.outcomes.values() if isinstance(o, ClassFolder))
    partitions = config.num_partitions or ETLConfig.default_partitions(sc.defaultParallelism)
    the_plan.partitions = max(1, min(partitions, candidates))
    # Input batches hold encoded files; keep them small so a worker's memory stays bounded.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "16")
    staging = os.path.join(config.output, STAGING)
    shutil.rmtree(staging, ignore_errors=True)
    mapper = partial(process_batches, root=config.input, staging=staging, image_size=config.image_size,
                     seed=config.seed, test_fraction=config.test_fraction, max_pixels=config.max_pixels,
                     max_file_bytes=int(config.max_file_mb * 2**20),
                     rows_per_row_group=the_plan.rows_per_row_group)
    order = F.xxhash64("path", F.lit(config.seed))
    files = (spark.read.format("binaryFile")
             .option("recursiveFileLookup", "true")
             # Spark never lists, so never reads, what is not an image by name (any case); the
             # job's own listing reports those files as skipped.
             .option("pathGlobFilter", IMAGE_GLOB)
             # A file deleted or unreadable after the listing is reported by the driver, not fatal.
             .option("ignoreMissingFiles", "true").option("ignoreCorruptFiles", "true")
             # The raw local file system reads without looking for Hadoop's .crc side files
             # (whose names break on a ':' in a file name) and without verifying them.
             .option("fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem")
             .option("fs.file.impl.disable.cache", "true")
             .load(config.input)
             # Pushed down: oversized files are never read (binaryFile refuses > 2 GiB anyway).
             .where(F.col("length") <= int(config.max_file_mb * 2**20))
             .select("path", "content")
             # Shuffle the small encoded files, not the decoded images, so that row groups mix
             # classes and decoding is spread evenly over all partitions.
             .repartition(the_plan.partitions, order)
             .sortWithinPartitions(order))
    outcomes = files.mapInArrow(mapper, OUTCOME_DDL).toArrow().to_pylist()
    return {o["path"]: o for o in outcomes}


def read_split(path: str) -> SplitStats:
    """Rows, files, row groups, bytes and per-class counts of one written split (pyarrow footers)."""
    import pyarrow.parquet as pq

    stats = SplitStats()
    names = sorted(n for n in os.listdir(path) if n.endswith(".parquet") and not n.startswith((".", "_")))
    for name in names:
        meta = pq.ParquetFile(os.path.join(path, name)).metadata
        stats.files += 1
        stats.rows += meta.num_rows
        stats.row_groups += meta.num_row_groups
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            stats.bytes_uncompressed += group.total_byte_size
            stats.bytes_compressed += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
    if names:
        table = pq.read_table(path, columns=["path", "label"])
        stats.paths = table.column("path").to_pylist()
        stats.per_class = dict(Counter(table.column("label").to_pylist()))
    return stats


def _reason_kind(reason: str) -> str:
    return reason.split(":")[0].split(" (")[0]


def finish(config: ETLConfig, the_plan: Plan, spark_outcomes: Dict[str, dict],
           spark_version: str, seconds: float) -> dict:
    """Reconcile, write ``rejected.jsonl`` and ``manifest.json``, and swap the new output in.

    Everything is prepared in ``OUTPUT/_staging`` first; the previous output is replaced only at
    the end, so a failure here leaves it as it was.

    Returns:
        the manifest (dict).

    Raises:
        RuntimeError: the counts do not reconcile (a file with no outcome or two outcomes).
    """
    staging = os.path.join(config.output, STAGING)
    committed = {o["file"] for o in spark_outcomes.values() if o["status"] == WRITTEN}
    stats: Dict[str, SplitStats] = {}
    for split in SPLITS:
        source = os.path.join(staging, split)
        os.makedirs(source, exist_ok=True)
        # Keep only files named by a successful task's outcomes; drop a failed attempt's.
        for name in os.listdir(source):
            if f"{split}/{name}" not in committed:
                os.remove(os.path.join(source, name))
        stats[split] = read_split(source)

    written: Dict[str, str] = {}
    for split in SPLITS:
        for path in stats[split].paths:
            if path in written:
                raise RuntimeError(f"{path} was written twice ({written[path]} and {split})")
            written[path] = split
    reported = {p for p, o in spark_outcomes.items() if o["status"] == WRITTEN}
    if reported != set(written):
        raise RuntimeError(f"the Parquet files hold {len(written)} rows but tasks reported {len(reported)}")
    listed = {f.path for f in the_plan.files}
    excluded: Dict[str, Tuple[str, str]] = {}
    for path in sorted(listed | set(spark_outcomes)):
        if path in written:
            continue
        if path in spark_outcomes:
            excluded[path] = (spark_outcomes[path]["status"], spark_outcomes[path]["reason"])
            continue
        outcome = the_plan.outcomes.get(path)
        if isinstance(outcome, Excluded):
            excluded[path] = (outcome.status, outcome.reason)
        else:  # a candidate Spark never returned: report it, never drop it
            excluded[path] = (REJECTED, "listed by the job but not returned by Spark's binaryFile listing")
    found = len(listed | set(spark_outcomes))
    counts = Counter(status for status, _ in excluded.values())
    if found != len(written) + counts[REJECTED] + counts[SKIPPED]:
        raise RuntimeError(f"counts do not reconcile: found {found} != written {len(written)} + "
                           f"rejected {counts[REJECTED]} + skipped {counts[SKIPPED]}")

    with open(os.path.join(staging, REJECTED_LIST), "w", encoding="utf-8") as out:
        for path, (status, reason) in excluded.items():
            out.write(json.dumps({"path": path, "status": status, "reason": reason}, ensure_ascii=False) + "\n")

    num_classes = max(the_plan.classes) + 1
    manifest = {
        "format_version": MANIFEST_FORMAT,
        "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "input": config.input,
        "image": {"height": config.image_size, "width": config.image_size, "channels": 3,
                  "dtype": "uint8", "layout": "HWC", "column": "image"},
        "columns": ["path", "label", "label_name", "image", "height", "width"],
        "seed": config.seed,
        "test_fraction": config.test_fraction,
        "num_classes": num_classes,
        "class_names": [the_plan.classes.get(label) for label in range(num_classes)],
        "rows_per_row_group": the_plan.rows_per_row_group,
        "min_row_groups": config.min_row_groups,
        "max_world_size": min(stats[s].row_groups for s in SPLITS),
        "splits": {
            split: {
                "path": split,
                "rows": s.rows,
                "files": s.files,
                "row_groups": s.row_groups,
                "mean_row_group_bytes": round(s.bytes_uncompressed / s.row_groups) if s.row_groups else 0,
                "mean_row_group_bytes_compressed": round(s.bytes_compressed / s.row_groups) if s.row_groups else 0,
                "per_class": [s.per_class.get(label, 0) for label in range(num_classes)],
            } for split, s in stats.items()
        },
        "files": {
            "found": found,
            "written": len(written),
            "rejected": counts[REJECTED],
            "skipped": counts[SKIPPED],
            "reasons": dict(Counter(f"{status}: {_reason_kind(reason)}" for status, reason in excluded.values())),
            "list": REJECTED_LIST,
        },
        "seconds": round(seconds, 2),
        "images_per_second": round(len(written) / seconds, 2) if seconds > 0 else None,
        "versions": _versions(spark_version),
        "config": to_dict(config),
    }
    with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as out:
        json.dump(manifest, out, indent=2, ensure_ascii=False)

    # The swap: the manifest goes last, so a manifest always describes the splits next to it.
    if os.path.exists(os.path.join(config.output, MANIFEST)):
        os.remove(os.path.join(config.output, MANIFEST))
    for name in (*SPLITS, REJECTED_LIST):
        target = os.path.join(config.output, name)
        if os.path.isdir(target):
            shutil.rmtree(target)
        os.replace(os.path.join(staging, name), target)
    os.replace(os.path.join(staging, MANIFEST), os.path.join(config.output, MANIFEST))
    shutil.rmtree(staging, ignore_errors=True)
    return manifest


def _versions(spark_version: str) -> Dict[str, str]:
    import numpy
    import PIL
    import pyarrow

    return {"pipelines": __version__, "python": platform.python_version(), "spark": spark_version,
            "pyarrow": pyarrow.__version__, "pillow": PIL.__version__, "numpy": numpy.__version__}


def run_etl(config: ETLConfig, spark=None) -> dict:
    """Run the whole ETL stage and return its manifest.

    Args:
        config: the stage's configuration.
        spark: a SparkSession to use (a notebook's); by default the active one or a new
            ``local[*]`` one (``config.master`` overrides).

    Returns:
        the manifest written to ``OUTPUT/manifest.json`` (dict).

    Raises:
        FileNotFoundError, NotADirectoryError, ValueError: bad input or output paths, no class
            folders (before Spark starts). RuntimeError: counts do not reconcile.
    """
    from pipelines.spark import log_progress, spark_session

    check_paths(config)
    the_plan = plan(config)
    log.info("listed %d files in %d class folders; %d candidate images (train ~%d, test ~%d); "
             "%d rows per row group", len(the_plan.files), len(the_plan.classes),
             sum(the_plan.expected_rows.values()), the_plan.expected_rows[TRAIN],
             the_plan.expected_rows[TEST], the_plan.rows_per_row_group)
    os.makedirs(config.output, exist_ok=True)
    spark = spark or spark_session("pipelines-etl", config.master)
    start = time.perf_counter()
    with log_progress(spark):
        spark_outcomes = run_spark(spark, config, the_plan)
    seconds = time.perf_counter() - start
    manifest = finish(config, the_plan, spark_outcomes, spark.version, seconds)
    log.info("wrote %s", os.path.join(config.output, MANIFEST))
    return manifest


def format_summary(manifest: dict) -> str:
    """A short human summary of a manifest: counts, reconciliation, rejections, speed."""
    files, splits = manifest["files"], manifest["splits"]
    lines = [
        f"ETL summary ({manifest['image']['height']} px, {manifest['num_classes']} classes)",
        f"  found {files['found']} = written {files['written']} + rejected {files['rejected']} "
        f"+ skipped {files['skipped']}",
    ]
    for split in SPLITS:
        s = splits[split]
        lines.append(f"  {split:5s}: {s['rows']} rows in {s['row_groups']} row groups "
                     f"(~{s['mean_row_group_bytes'] / 2**20:.2f} MiB each, "
                     f"{s['mean_row_group_bytes_compressed'] / 2**20:.2f} MiB compressed)")
    lines.append(f"  max world size (row groups of the smallest split): {manifest['max_world_size']}")
    for reason, n in sorted(files["reasons"].items()):
        lines.append(f"  {n:6d} {reason}")
    if files["rejected"] + files["skipped"]:
        lines.append(f"  details: {files['list']}")
    lines.append(f"  {manifest['images_per_second']} images/s ({manifest['seconds']} s in Spark)")
    if manifest["max_world_size"] < manifest["min_row_groups"]:
        lines.append(f"  WARNING: a split has fewer than --min-row-groups={manifest['min_row_groups']} "
                     "row groups: too few rows for that many ranks")
    return "\n".join(lines)
