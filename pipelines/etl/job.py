"""Driver side of the ETL: list, plan, run the Spark job, lay out the splits, reconcile, report.

Steps, each a function below:

1. :func:`~pipelines.etl.plan.check_paths` and :func:`~pipelines.etl.plan.check_memory` - clear
   errors before Spark starts (missing input, a bucket that does not exist or refused
   credentials, overlapping output, an output holding foreign data, a
   ``--max-file-mb``/``--max-pixels`` the executors cannot hold).
2. :func:`~pipelines.etl.plan.plan` - the job's own listing, the tree's layout (``NNN.name`` or
   plain class folders), classification, the stratified train/validation/test assignment (per
   class, on the driver) and the row-group plan; the candidate images sorted by a seeded hash of
   their relative path. :func:`~pipelines.etl.plan.hash_candidates` and
   :func:`~pipelines.etl.plan.drop_duplicates` (``--dedupe``, the default) - a first Spark pass
   hashes every candidate's bytes and decoded pixels, one file per image is kept
   (:mod:`pipelines.etl.dedupe`), the other copies are recorded as rejections, look-alikes are
   reported, and the kept files are split again.
3. :func:`run_spark` - the candidates cut into one contiguous chunk per task, no shuffle:
   ``spark.range(P)`` -> ``mapInArrow`` whose tasks read their chunk's files in Python, resize
   them and write their own Parquet file per split below the run's prefix
   (``OUTPUT/runs/<run id>/``), and their outcome rows beside it -> one summary row per task
   (:mod:`pipelines.etl.outcomes`: no per-file row is ever collected).
4. :func:`finish` - keep the committed task files, read the real Parquet metadata, reconcile
   every listed file with an outcome, task file by task file, writing ``rejected.jsonl`` as it
   goes (:func:`pipelines.etl.outcomes.reconcile`), then commit: the manifest naming
   the run's files, written last, and the older runs deleted (:mod:`pipelines.etl.commit`) -
   unless no image at all was written from a non-empty candidate list (:class:`NothingWritten`:
   the previous output is kept).
5. :mod:`pipelines.etl.summary` - the summary a person reads and the job's MLflow run.

Input and output are local paths or URIs (:mod:`pipelines.io.storage`): the driver lists an object
store through its filesystem and the tasks read and write through it; Spark itself never opens
either.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import platform
import time
from functools import partial
from typing import Dict, List, Optional

from pipelines import __version__
from pipelines.contract import COLUMNS, MANIFEST, REJECTED_LIST, SPLITS, TEST, TRAIN, VALIDATION
from pipelines.etl import commit
from pipelines.etl.config import ETLConfig
from pipelines.etl.dedupe import LOOK_ALIKE_DISTANCE
from pipelines.etl.labels import SPLIT_RULE
from pipelines.etl.layout import closure_chunks, cut_into
from pipelines.etl.listing import REJECTED, SKIPPED, Excluded, display_path
from pipelines.etl.outcomes import TASK_DDL, Reconciled, SplitStats, reconcile
from pipelines.etl.plan import Plan, check_memory, check_paths, drop_duplicates, hash_candidates, plan, task_partitions
from pipelines.etl.summary import log_results, shown_config, track
from pipelines.etl.transform import process_chunks
from pipelines.io.storage import Location
from pipelines.manifest import Manifest, SplitInfo
from pipelines.runtime.environment import read_settings
from pipelines.runtime.logs import plural
from pipelines.runtime.quiet import quiet_libraries
from pipelines.runtime.spark import log_progress, spark_session

log = logging.getLogger("pipelines")


class NothingWritten(RuntimeError):
    """Spark ran but not one of the candidate images was written; the previous output is kept."""


def run_spark(spark, config: ETLConfig, the_plan: Plan) -> List[dict]:
    """Read, decode, resize and write the candidate images in one Spark job, no shuffle.

    The plan's candidates (already in a seeded-hash order, so every chunk mixes classes) are cut
    into ``partitions`` contiguous chunks of balanced length; task ``i`` reads the files of chunk
    ``i`` in Python and writes ``OUTPUT/runs/<run id>/<split>/part-<partition>-<attempt>.parquet``
    itself (see :mod:`pipelines.etl.transform`), in row groups of ``rows_per_row_group`` rows,
    columns ``path, label (int32), label_name, image (binary, size*size*3 uint8 HWC), height,
    width (int32)``, and its outcome rows beside them (:mod:`pipelines.etl.outcomes`).

    Returns:
        one summary per task (:data:`pipelines.etl.outcomes.TASK_SCHEMA`: its outcome file, chunk
        numbers and Parquet files), for :func:`finish`; ``[]`` when there is no candidate.
    """
    candidates = the_plan.candidates
    if not candidates:
        return []
    the_plan.partitions = task_partitions(spark, config, len(candidates))
    source = config.location(config.input)
    # Why spark.range + a closure rather than a DataFrame of paths: range(P, numPartitions=P) puts
    # exactly one chunk number in each partition without a shuffle, whatever the master, and it
    # is a plain DataFrame API that Spark Connect and Databricks accept; a DataFrame of paths
    # would be sliced by Spark, not by us, and need a repartition (a shuffle) to get our chunks.
    # The cost: the candidate list (about 100 bytes per file) travels with the function to each
    # executor (PySpark broadcasts a large closure once per executor), fine up to millions of files.
    with log_progress(spark, "decode and write", len(candidates)) as counter:
        mapper = partial(process_chunks, chunks=closure_chunks(candidates, the_plan.partitions),
                         run=commit.run_location(config.location(config.output), the_plan.run_id),
                         image_size=config.image_size, max_pixels=config.max_pixels,
                         max_file_bytes=int(config.max_file_mb * 2**20),
                         rows_per_row_group=the_plan.rows_per_row_group, source=None if source.local else source,
                         counter=counter)
        numbers = spark.range(the_plan.partitions, numPartitions=the_plan.partitions)
        return numbers.mapInArrow(mapper, TASK_DDL).toArrow().to_pylist()


def _refuse_empty_result(config: ETLConfig, the_plan: Plan, result: Reconciled, ledger: Location) -> None:
    """Raise :class:`NothingWritten` when candidates existed and no image was written, or none to a
    split the plan gave files (its images all rejected on read): training refuses an empty split."""
    top = ", ".join(f"{n} {reason}" for reason, n in result.task_reasons.most_common(3))
    kept = (f"the output in {display_path(config.output)} was left as it was; every reason is in "
            f"{display_path(ledger.uri)}")
    if not result.written:
        raise NothingWritten(f"no image written: {plural(len(the_plan.candidates), 'candidate image')}, "
                             f"all rejected ({top}); {kept}")
    empty = [split for split in SPLITS if the_plan.expected_rows.get(split) and not result.stats[split].rows]
    if empty:
        planned = ", ".join(f"{split}: {plural(the_plan.expected_rows[split], 'candidate')}" for split in empty)
        raise NothingWritten(f"no image written to the {' and '.join(empty)} split ({planned}, all rejected on "
                             f"read: {top}), which training refuses; {kept}")


def finish(config: ETLConfig, the_plan: Plan, tasks: List[dict], spark_version: str, seconds: float) -> dict:
    """Reconcile, write the run's ``rejected.jsonl``, then commit the run: ``manifest.json``
    naming its files, written last, and the older runs deleted (:func:`pipelines.etl.commit.commit`).

    The run's files lie below its own prefix (``OUTPUT/runs/<run id>/``); the previous output
    stays whole and readable until the manifest replaces it, so a failure here leaves it as it was.

    Returns:
        the manifest (dict).

    Args:
        tasks: what :func:`run_spark` returned.

    Raises:
        RuntimeError: the counts do not reconcile (see :func:`pipelines.etl.outcomes.reconcile`).
        NothingWritten: at least one candidate and no row written, or no row in a split that had
            candidates; the previous output is kept and the run's ``rejected.jsonl`` says why.
        pipelines.etl.commit.RunSuperseded: a newer run committed while this one ran.
    """
    output = config.location(config.output)
    run = commit.run_location(output, the_plan.run_id)
    commit.check_not_superseded(output, the_plan.run_id)
    ledger = run.join(REJECTED_LIST)
    exclusions = ((path, o.status, o.reason) for path, o in sorted(the_plan.outcomes.items())
                  if isinstance(o, Excluded))
    chunks = cut_into(the_plan.candidates, the_plan.partitions) if tasks else []
    result = reconcile(run, len(the_plan.files), exclusions, chunks, tasks, ledger)
    if the_plan.candidates:
        _refuse_empty_result(config, the_plan, result, ledger)
    manifest = _manifest(config, the_plan, result, spark_version, seconds,
                         {split: [p.relative_to(output) for p in s.parts] for split, s in result.stats.items()},
                         ledger.relative_to(output))
    commit.commit(output, manifest, the_plan.run_id)
    return manifest.to_dict()


def _manifest(config: ETLConfig, the_plan: Plan, result: Reconciled, spark_version: str, seconds: float,
              parts: Dict[str, List[str]], ledger: str) -> Manifest:
    """The manifest (see the README's Stage 1 for its fields; :mod:`pipelines.contract` for its
    shape) from the reconciled counts; ``parts``: each split's files and ``ledger``: the rejected
    list, relative to the output."""
    stats, counts = result.stats, result.counts
    num_classes = max(the_plan.classes) + 1
    class_names = [the_plan.classes.get(label) for label in range(num_classes)]
    splits = {split: SplitInfo(
        rows=s.rows, row_groups=s.row_groups, files=s.files,
        mean_row_group_bytes=round(s.bytes_uncompressed / s.row_groups) if s.row_groups else 0,
        mean_row_group_bytes_compressed=round(s.bytes_compressed / s.row_groups) if s.row_groups else 0,
        per_class=[s.per_class.get(label, 0) for label in range(num_classes)], parts=parts[split])
        for split, s in stats.items()}
    extra = {
        "run_id": the_plan.run_id,
        "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "input": display_path(config.input),
        "columns": [name for name, _ in COLUMNS],
        "seed": config.seed,
        "test_fraction": config.test_fraction,
        "validation_fraction": config.validation_fraction,
        "split_rule": SPLIT_RULE,
        "layout": the_plan.layout,
        "classes_not_in_every_split": _classes_not_in_every_split(class_names, stats),
        "min_row_groups": config.min_row_groups,
        # ranks shard the train split by row group; the test split by rows where they outnumber its
        # row groups (pipelines.training.data.onepass.OnePassShard), so only the train split limits them
        "max_world_size": stats[TRAIN].row_groups,
        "files": {
            "found": len(the_plan.files),
            "written": result.written,
            "rejected": counts[REJECTED],
            "skipped": counts[SKIPPED],
            "reasons": dict(result.reasons),
            "list": ledger,
        },
        "seconds": round(seconds, 2),
        "hash_seconds": round(the_plan.hash_seconds, 2),
        **_look_alikes(the_plan),
        "images_per_second": round(result.written / seconds, 2) if seconds > 0 else None,
        "versions": _versions(spark_version),
        "config": shown_config(config),
    }
    return Manifest(image_size=config.image_size, num_classes=num_classes,
                    class_names=[display_path(n) if n is not None else None for n in class_names],
                    rows_per_row_group=the_plan.rows_per_row_group, splits=splits, extra=extra)


def _classes_not_in_every_split(class_names: List[Optional[str]], stats: Dict[str, SplitStats]) -> List[dict]:
    """The classes (folders) whose written rows miss a split: fewer than 3 candidates
    (:data:`SPLIT_RULE`), or images rejected on read; ``[{'label', 'name', 'train', 'validation',
    'test'}]`` by label."""
    missing = []
    for label, name in enumerate(class_names):
        if name is None:
            continue
        rows = {split: stats[split].per_class.get(label, 0) for split in SPLITS}
        if not all(rows.values()):
            missing.append({"label": label, "name": display_path(name), **rows})
    return missing


def _versions(spark_version: str) -> Dict[str, str]:
    import numpy
    import PIL
    import pyarrow

    return {"pipelines": __version__, "python": platform.python_version(), "spark": spark_version,
            "pyarrow": pyarrow.__version__, "pillow": PIL.__version__, "numpy": numpy.__version__}


def run_etl(config: ETLConfig, spark=None) -> dict:
    """Run the whole ETL stage and return its manifest; with tracking, as one MLflow run
    (:func:`track`), started once the input is checked and ended with the job.

    Args:
        config: the stage's configuration.
        spark: a SparkSession to use (a notebook's); by default the active one or a new
            ``local[*]`` one (``config.master`` overrides).

    Returns:
        the manifest written to ``OUTPUT/manifest.json`` (dict).

    Raises:
        FileNotFoundError, NotADirectoryError, ValueError: bad input or output paths, no class
            folders, no image file at all, a tree that cannot be read safely, files or images too
            large for the executors' memory, a tracking store that cannot be used (before Spark runs
            anything). RuntimeError: counts do not reconcile. NothingWritten: candidates but no
            image written (previous output kept). pipelines.tracking.TrackingFailed: the output
            is complete but MLflow could not log it. Any failure before the commit (a full disk,
            a failed task, an interrupt) first deletes the run's own prefix
            (:func:`pipelines.etl.commit.remove_failed_run`): the previous output stands, and
            the rerun finds the room the failed run took.
    """
    from pyspark import SparkContext

    quiet_libraries(config.verbose)  # this process's third-party noise (MLflow's): the config's choice
    check_paths(config)
    if spark is None and SparkContext._active_spark_context is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # We are about to start the JVM ourselves: refuse before it starts, from the master we
        # will give it (spark-submit and existing sessions are checked below, from their conf).
        check_memory(config, config.master or "local[*]", {})
    the_plan = plan(config)
    _log_plan(the_plan)
    output = config.location(config.output)
    output.makedirs()
    with track(config) as tracker:
        spark = spark or spark_session("pipelines-etl", config.master, verbose=config.verbose,
                                       log_level=read_settings().spark_log_level)
        context = spark.sparkContext
        check_memory(config, context.master, dict(context.getConf().getAll()))
        start = time.perf_counter()
        try:
            if config.dedupe:
                the_plan = _without_duplicates(spark, config, the_plan, start)
            tasks = run_spark(spark, config, the_plan)
            manifest = finish(config, the_plan, tasks, spark.version, time.perf_counter() - start)
        except NothingWritten:
            raise  # its rejected.jsonl, the only file it wrote, says why: kept for the user
        except BaseException:  # a full disk, a task failure, Ctrl-C: the rerun finds no leftovers
            commit.remove_failed_run(output, the_plan.run_id)
            raise
        log.info("wrote %s (run %s)", output.join(MANIFEST).uri, the_plan.run_id)
        if tracker:
            log_results(tracker, output, manifest)
    return manifest


def _log_plan(the_plan: Plan) -> None:
    """The driver's one line on what it listed and how it splits it."""
    rows = the_plan.expected_rows
    log.info("listed %s in %s (%s layout); %s (train ~%d, validation ~%d, test ~%d); %s per row group",
             plural(len(the_plan.files), "file"), plural(len(the_plan.classes), "class folder"), the_plan.layout,
             plural(sum(rows.values()), "candidate image"), rows[TRAIN], rows[VALIDATION], rows[TEST],
             plural(the_plan.rows_per_row_group, "row"))


def _without_duplicates(spark, config: ETLConfig, the_plan: Plan, start: float) -> Plan:
    """``the_plan`` after the duplicate check (:func:`hash_candidates`, :func:`drop_duplicates`),
    its ``hash_seconds`` counted from ``start`` (``time.perf_counter()``), said in one line."""
    before = len(the_plan.candidates)
    the_plan = drop_duplicates(config, the_plan, hash_candidates(spark, config, the_plan))
    the_plan.hash_seconds = time.perf_counter() - start
    log.info("duplicate check: %s of the same bytes or pixels as another rejected (%.1f s)",
             plural(before - len(the_plan.candidates), "copy", "copies"), the_plan.hash_seconds)
    pairs, count = the_plan.look_alikes or ([], 0)
    if count:
        log.warning("duplicate check: %s of look-alike files kept (difference hashes within %d bits: re-encoded or "
                    "resized copies, or close photos), each split on its own: %s%s (manifest: look_alikes)",
                    plural(count, "pair"), LOOK_ALIKE_DISTANCE, "; ".join(f"{a} ~ {b}" for a, b, _ in pairs[:5]),
                    f" and {count - 5} more" if count > 5 else "")
    return the_plan


def _look_alikes(the_plan: Plan) -> Dict:
    """The manifest's ``look_alikes`` when the duplicate check ran: the distance, the number of
    pairs and the pairs listed (``[path a, path b, bits]``, at most
    :data:`pipelines.etl.dedupe.LOOK_ALIKES_LISTED`)."""
    if the_plan.look_alikes is None:
        return {}
    pairs, count = the_plan.look_alikes
    return {"look_alikes": {"max_distance": LOOK_ALIKE_DISTANCE, "count": count,
                            "pairs": [[a, b, bits] for a, b, bits in pairs]}}
