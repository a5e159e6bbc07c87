"""Driver side of the ETL: check and plan (`pipelines.etl.plan`), run the Spark job, reconcile, commit, report.

Each task writes its chunk's Parquet files below the run's prefix; `finish` reconciles every file and commits."""

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
    """Read, decode, resize and write the candidates in one Spark job, one contiguous chunk per task, no shuffle;
    returns one `TASK_SCHEMA` row per task, for `finish` (``[]`` without candidates)."""
    candidates = the_plan.candidates
    if not candidates:
        return []
    the_plan.partitions = task_partitions(spark, config, len(candidates))
    source = config.location(config.input)
    # spark.range(P, numPartitions=P) puts one chunk number in each partition without a shuffle, on any
    # master (Spark Connect too); the candidate list (~100 bytes a file) travels in the closure.
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
    """Raise `NothingWritten` when candidates existed and no image was written, in all or in a planned split."""
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
    """Reconcile, write the run's ``rejected.jsonl``, then commit the run; returns the manifest (dict).

    Raises:
        RuntimeError: the counts do not reconcile. NothingWritten: no row written, in all or in a planned split.
        RunSuperseded: a newer run committed while this one ran."""
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
    """The manifest from the reconciled counts; ``parts`` and ``ledger`` relative to the output."""
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
        # only the train split limits the ranks: evaluated splits are sharded by rows when needed
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
    """``[{'label', 'name', 'train', 'validation', 'test'}]`` of the classes missing a split."""
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
    """Run the whole ETL stage, tracked as one MLflow run; returns the manifest written (dict).

    ``spark``: a session to use (a notebook's); by default the active one or a new one on ``config.master``.

    Raises:
        Refused: bad input or output, or too little memory, before Spark runs. RuntimeError: counts do not reconcile.
        NothingWritten: no image written. TrackingFailed: the output is complete but MLflow could not log it."""
    from pyspark import SparkContext

    quiet_libraries(config.verbose)  # this process's third-party noise (MLflow's): the config's choice
    check_paths(config)
    if spark is None and SparkContext._active_spark_context is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # refuse before we start the JVM; spark-submit and existing sessions are checked below
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
    rows = the_plan.expected_rows
    log.info("listed %s in %s (%s layout); %s (train ~%d, validation ~%d, test ~%d); %s per row group",
             plural(len(the_plan.files), "file"), plural(len(the_plan.classes), "class folder"), the_plan.layout,
             plural(sum(rows.values()), "candidate image"), rows[TRAIN], rows[VALIDATION], rows[TEST],
             plural(the_plan.rows_per_row_group, "row"))


def _without_duplicates(spark, config: ETLConfig, the_plan: Plan, start: float) -> Plan:
    """``the_plan`` after the duplicate check, its ``hash_seconds`` counted from ``start`` (``perf_counter``)."""
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
    """The manifest's ``look_alikes`` when the duplicate check ran: distance, count, listed pairs."""
    if the_plan.look_alikes is None:
        return {}
    pairs, count = the_plan.look_alikes
    return {"look_alikes": {"max_distance": LOOK_ALIKE_DISTANCE, "count": count,
                            "pairs": [[a, b, bits] for a, b, bits in pairs]}}
