"""Driver side of the ETL: list, plan, run the Spark job, lay out the splits, reconcile, report.

Steps, each a function below:

1. :func:`check_paths` and :func:`check_memory` - clear errors before Spark starts (missing
   input, a bucket that does not exist or refused credentials, overlapping output, an output
   holding foreign data, a ``--max-file-mb``/``--max-pixels`` the executors cannot hold).
2. :func:`plan` - the job's own listing, the tree's layout (``NNN.name`` or plain class folders),
   classification, the stratified train/validation/test assignment (per class, on the driver) and
   the row-group plan; the candidate images sorted by a seeded hash of their relative path.
   :func:`hash_candidates` and :func:`drop_duplicates` (``--dedupe``, the default) - a first Spark
   pass hashes every candidate's bytes, one file per content is kept (:mod:`pipelines.etl.dedupe`),
   the other copies are recorded as rejections, and the kept files are split again.
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

Input and output are local paths or URIs (:mod:`pipelines.storage`): the driver lists an object
store through its filesystem and the tasks read and write through it; Spark itself never opens
either.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import platform
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from pipelines import __version__
from pipelines.config import to_dict
from pipelines.errors import MissingInput, NotAFolder, Refused
from pipelines.etl.config import ETLConfig
from pipelines.etl.images import DEFAULT_MAX_PIXELS
from pipelines.contract import (COLUMNS, MANIFEST, REJECTED_LIST, SPLITS, TEST, TRAIN, VALIDATION, Manifest,
                                SplitInfo, manifest_sha256)
from pipelines.etl import commit
from pipelines.etl.dedupe import duplicates
from pipelines.etl.labels import SPLIT_RULE, ClassFolder, split_class
from pipelines.etl.layout import TASK_IMAGES, closure_chunks, cut_into, rows_per_row_group, spread_order, task_count
from pipelines.etl.listing import REJECTED, SKIPPED, Excluded, ListedFile, classify, display_path, list_tree, reason_kind
from pipelines.etl.outcomes import TASK_DDL, Reconciled, SplitStats, read_hashes, reconcile
from pipelines.etl.memory import check_task_memory, executor_memory, physical_memory_bytes, task_bytes
from pipelines.logs import plural
from pipelines.paths import check_disjoint
from pipelines.redact import redact
from pipelines.etl.transform import Candidate, hash_chunks, process_chunks
from pipelines.spark import log_progress
from pipelines.storage import Location, check_reachable

log = logging.getLogger("pipelines")


class NothingWritten(RuntimeError):
    """Spark ran but not one of the candidate images was written; the previous output is kept."""


@dataclass
class Plan:
    """What the driver knows before Spark runs.

    ``candidates`` are the files to read, in the order that spreads them over tasks
    (:func:`pipelines.etl.layout.spread_order`), each with its label and split.
    """

    files: List[ListedFile]
    outcomes: Dict[str, object]  # path -> ClassFolder (candidate) or Excluded
    classes: Dict[int, str]
    expected_rows: Dict[str, int]
    rows_per_row_group: int
    candidates: List[Candidate] = field(default_factory=list)
    partitions: int = 0
    layout: str = ""  # labels.CALTECH | labels.FOLDERS
    hash_seconds: float = 0.0  # the duplicate check's Spark pass (hash_candidates), 0 when not run
    run_id: str = field(default_factory=commit.new_run_id)  # this run's prefix: OUTPUT/runs/<run_id>/


def check_paths(config: ETLConfig) -> None:
    """Refuse, before Spark starts, input/output combinations that cannot work.

    Raises:
        pipelines.storage.StorageError (a ValueError): a bucket that does not exist, or refused
            credentials, for the input or the output.
        FileNotFoundError: the input folder is missing (no object under the prefix).
        NotADirectoryError: the input or the output is a file.
        ValueError: output equal to, inside, or containing the input (a rerun would read its own
            output as input, or overwrite the input); an output holding data that is not this
            job's (:func:`pipelines.etl.commit.check_output`).
    """
    source, output = config.location(config.input), config.location(config.output)
    check_reachable(source, "--input")
    check_reachable(output, "--output")
    if not source.exists():
        raise MissingInput(f"input folder does not exist: {config.input}")
    if not source.is_dir():
        raise NotAFolder(f"input is not a folder: {config.input}")
    check_disjoint(config.input, config.output)
    commit.check_output(output)


def assign_splits(files: List[ListedFile], labels: Dict[str, int], seed: int, test_fraction: float,
                  validation_fraction: float) -> Dict[str, str]:
    """The stratified train/validation/test split of the candidate files, decided on the driver.

    Args:
        files: the candidate files. labels: ``{path: label}`` of each.
        seed, test_fraction, validation_fraction: as in ``ETLConfig``.

    Returns:
        ``{path: 'train' | 'validation' | 'test'}``: per class, :func:`pipelines.etl.labels.split_class`
        of the class's relative paths (a class of 1 candidate only trains, of 2 trains and is tested,
        of 3 or more is in every split: :func:`pipelines.etl.labels.split_sizes`). The tasks write
        what this says.
    """
    by_class: Dict[int, List[str]] = {}
    for f in files:
        by_class.setdefault(labels[f.path], []).append(f.relative_path)
    split_of: Dict[str, str] = {}
    for paths in by_class.values():
        split_of.update(split_class(paths, seed, test_fraction, validation_fraction))
    return {f.path: split_of[f.relative_path] for f in files}


def plan(config: ETLConfig) -> Plan:
    """List and classify every file under the input; split; choose rows per row group.

    Returns:
        the :class:`Plan`, its candidates in :func:`pipelines.etl.layout.spread_order` order, each
        with its label and split (:func:`assign_splits`, the same assignment the row-group plan
        counts); byte-identical copies are still candidates here (:func:`drop_duplicates` removes
        them once a Spark pass has hashed them).

    Raises:
        ValueError: no class folder, a mix of ``NNN.name`` and plain folders, two folders with
            the same number, or no candidate image at all (nothing to write: committing an empty
            run would replace a previous output with nothing).
    """
    files, layout = list_tree(config.location(config.input))
    if not layout.folders:
        raise Refused(f"no class folder under {config.input} (expected ROOT/CLASS/image files, CLASS either "
                      "NNN.name or a plain name)")
    max_bytes = int(config.max_file_mb * 2**20)
    outcomes = {f.path: classify(f.relative_path, f.size_bytes, max_bytes, layout, unread=f.unread) for f in files}
    the_plan = _split_candidates(config, Plan(files, outcomes, layout.classes, {}, 0, layout=layout.kind))
    if not the_plan.candidates:
        _refuse_no_candidate(config, files, outcomes)
    return the_plan


def _split_candidates(config: ETLConfig, the_plan: Plan) -> Plan:
    """The plan with its candidates (the files whose outcome is a ClassFolder), their splits,
    expected rows and rows per row group computed from its ``outcomes``."""
    files, outcomes = the_plan.files, the_plan.outcomes
    listed = sorted((f for f in files if isinstance(outcomes[f.path], ClassFolder)),
                    key=lambda f: (spread_order(f.relative_path, config.seed), f.relative_path))
    splits = assign_splits(listed, {f.path: outcomes[f.path].label for f in listed}, config.seed,
                           config.test_fraction, config.validation_fraction)
    candidates = [Candidate(f.path, outcomes[f.path].label, outcomes[f.path].name, splits[f.path]) for f in listed]
    expected = Counter(c.split for c in candidates)
    rpg = rows_per_row_group(config.row_bytes, config.row_group_mb * 2**20, dict(expected),
                             config.min_row_groups)
    return replace(the_plan, candidates=candidates, expected_rows={s: expected.get(s, 0) for s in SPLITS},
                   rows_per_row_group=rpg)


def hash_candidates(spark, config: ETLConfig, the_plan: Plan) -> Iterator[Tuple[str, str]]:
    """The sha256 of every candidate's bytes, read by Spark tasks over the same chunks as
    :func:`run_spark` (:func:`pipelines.etl.transform.hash_chunks`: at most ``--max-file-mb`` + 1
    bytes a file, one file held at a time), which write them below the run's prefix.

    Returns:
        ``(path, sha256 hex)`` of each candidate that could be read (one unreadable now is left
        out: the main pass records why), read back task file by task file
        (:func:`pipelines.etl.outcomes.read_hashes`).
    """
    partitions = _partitions(spark, config, len(the_plan.candidates))
    source = config.location(config.input)
    run = commit.run_location(config.location(config.output), the_plan.run_id)
    with log_progress(spark, "duplicate check", len(the_plan.candidates)) as counter:
        mapper = partial(hash_chunks, chunks=closure_chunks(the_plan.candidates, partitions), run=run,
                         max_file_bytes=int(config.max_file_mb * 2**20), source=None if source.local else source,
                         counter=counter)
        tasks = spark.range(partitions, numPartitions=partitions).mapInArrow(mapper, TASK_DDL).toArrow().to_pylist()
    return read_hashes(run, tasks)


def drop_duplicates(config: ETLConfig, the_plan: Plan, hashes: Iterable[Tuple[str, str]]) -> Plan:
    """The plan with one candidate per content: every other copy's outcome becomes a rejection
    (:func:`pipelines.etl.dedupe.duplicates`, which names the kept file) and the kept candidates
    are split again (:func:`assign_splits`), so each content lies in one split only.
    ``hashes``: ``(path, sha256)`` of the candidates hashed."""
    by_relative = {f.relative_path: f.path for f in the_plan.files}
    relative = {f.path: f.relative_path for f in the_plan.files}
    candidate = {c.path: c for c in the_plan.candidates}
    rejected = duplicates((relative[path], candidate[path].label, candidate[path].label_name, digest)
                          for path, digest in hashes)
    if not rejected:
        return the_plan
    outcomes = dict(the_plan.outcomes)
    for relative_path, reason in rejected.items():
        outcomes[by_relative[relative_path]] = Excluded(REJECTED, reason)
    return _split_candidates(config, replace(the_plan, outcomes=outcomes))


def _partitions(spark, config: ETLConfig, candidates: int) -> int:
    """The number of Spark tasks (and chunks) for ``candidates`` files: ``--num-partitions``, else
    at least two per core and at most :data:`pipelines.etl.layout.TASK_IMAGES` files a task
    (:func:`pipelines.etl.layout.task_count`); at most one per file."""
    return task_count(candidates, spark.sparkContext.defaultParallelism, TASK_IMAGES, config.num_partitions)


def _refuse_no_candidate(config: ETLConfig, files: List[ListedFile], outcomes: Dict[str, object]) -> None:
    """Raise ``ValueError`` for a tree with no candidate image, naming the commonest reasons."""
    reasons = Counter(reason_kind(o.reason) for o in outcomes.values() if isinstance(o, Excluded))
    why = "; ".join(f"{n} {reason}" for reason, n in reasons.most_common(3)) or "no file at all"
    raise Refused(f"no image file to write under {display_path(config.input)} "
                  f"({plural(len(files), 'file')} listed: {why}); the output was not touched")


def check_memory(config: ETLConfig, master: str, conf: Dict[str, str]) -> None:
    """Refuse a ``--max-file-mb``/``--max-pixels`` whose tasks the executors cannot hold.

    One task holds at most one file (``max_file_mb`` MiB) and its decoded pixels
    (``16 bytes * max_pixels``) plus a Python worker and two row-group buffers
    (:func:`pipelines.etl.memory.task_bytes`); ``tasks per worker * that`` must fit in
    ``spark.executor.pyspark.memory`` when set, else, for a local master, in this machine's
    physical memory (:func:`pipelines.etl.memory.executor_memory`).

    Raises:
        ValueError: it does not fit; the message names both figures in GiB.
    """
    # Pillow refuses more than its own limit whatever max_pixels says (pipelines.etl.images).
    pixels = min(config.max_pixels, DEFAULT_MAX_PIXELS)
    need = task_bytes(int(config.max_file_mb * 2**20), pixels, int(config.row_group_mb * 2**20), config.row_bytes)
    check_task_memory(need, executor_memory(master, conf, os.cpu_count() or 1, physical_memory_bytes()))


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
    the_plan.partitions = _partitions(spark, config, len(candidates))
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
    """Raise :class:`NothingWritten` when candidates existed and none was written."""
    top = ", ".join(f"{n} {reason}" for reason, n in result.task_reasons.most_common(3))
    raise NothingWritten(
        f"no image written: {plural(len(the_plan.candidates), 'candidate image')}, all rejected ({top}); "
        f"the output in {display_path(config.output)} was left as it was; every reason is in "
        f"{display_path(ledger.uri)}")


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
        NothingWritten: at least one candidate and no row written; the previous output is kept
            and the run's ``rejected.jsonl`` says why.
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
    if the_plan.candidates and not result.written:
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
        # row groups (pipelines.training.data.OnePassShard), so only the train split limits them
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
        "images_per_second": round(result.written / seconds, 2) if seconds > 0 else None,
        "versions": _versions(spark_version),
        "config": shown_config(config),
    }
    return Manifest(image_size=config.image_size, num_classes=num_classes,
                    class_names=[display_path(n) if n is not None else None for n in class_names],
                    rows_per_row_group=the_plan.rows_per_row_group, splits=splits, extra=extra)


def shown_config(config: ETLConfig) -> dict:
    """The config as the manifest and MLflow show it: names with ``\\xNN`` escapes, and only the
    keys of ``--storage-option`` (their values may be secrets)."""
    return redact({**to_dict(config), "input": display_path(config.input), "output": display_path(config.output),
                   "storage_options": sorted(config.storage_options)})


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

    from pipelines.environment import read_settings
    from pipelines.quiet import quiet_libraries
    from pipelines.spark import spark_session

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
    log.info("duplicate check: %s of the same bytes as another rejected (%.1f s)",
             plural(before - len(the_plan.candidates), "copy", "copies"), the_plan.hash_seconds)
    return the_plan


def log_results(tracker, output: Location, manifest: dict) -> None:
    """Log the manifest's counts, its sha256 and layout, and the manifest and rejected list as
    artifacts (copied to a local temporary folder first when the output is a URI: MLflow logs
    local files).

    Raises:
        pipelines.tracking.TrackingFailed: MLflow could not log them.
    """
    files = [output.join(MANIFEST), Manifest.from_dict(manifest).rejected_location(output)]
    with tempfile.TemporaryDirectory(prefix="etl-artifacts-") as tmp:
        local = [f.path if f.local else os.path.join(tmp, f.name) for f in files]
        for f, path in zip(files, local):
            f.download(path)
        tracker.log_results(manifest_metrics(manifest), {"manifest_sha256": manifest_sha256(output),
                                                         "layout": manifest.get("layout"), "run_id": manifest["run_id"]},
                            [(path, None) for path in local])


@contextlib.contextmanager
def track(config: ETLConfig) -> Iterator[Optional[object]]:
    """The ETL's MLflow run (a :class:`pipelines.tracking.Tracker`; ``None`` with tracking off) with
    the config as params, ended with the block (FAILED when it raises).

    Raises:
        pipelines.tracking.TrackingUnavailable: the store cannot be used.
    """
    if not config.tracking:
        yield None
        return
    from pipelines import tracking

    params = shown_config(config)
    with tracking.start(config.tracking_uri, config.experiment, config.location(config.output), config.run_name,
                        params,
                        {"stage": "etl", "output": display_path(config.output)}) as tracker:
        yield tracker


def manifest_metrics(manifest: dict) -> Dict[str, float]:
    """The counts of a manifest as flat MLflow metrics: ``files.<outcome>``, ``<split>.rows``,
    ``<split>.row_groups``, ``num_classes``, ``max_world_size``, ``seconds``, ``images_per_second``."""
    metrics = {f"files.{key}": manifest["files"][key] for key in ("found", "written", "rejected", "skipped")}
    for split in SPLITS:
        metrics.update({f"{split}.{key}": manifest["splits"][split][key] for key in ("rows", "row_groups", "files")})
    metrics.update({key: manifest[key] for key in ("num_classes", "max_world_size", "seconds", "images_per_second")})
    return metrics


def format_summary(manifest: dict) -> str:
    """A short human summary of a manifest: counts, reconciliation, rejections, classes missing
    from a split, speed."""
    files, splits = manifest["files"], manifest["splits"]
    lines = [
        f"ETL summary ({manifest['image']['height']} px, {plural(manifest['num_classes'], 'class')}, "
        f"{manifest.get('layout', 'caltech')} layout)",
        f"  found {files['found']} = written {files['written']} + rejected {files['rejected']} "
        f"+ skipped {files['skipped']}",
    ]
    for split in (name for name in SPLITS if name in splits):  # a format-2 manifest has no validation
        s = splits[split]
        lines.append(f"  {split:10s}: {plural(s['rows'], 'row')} in {plural(s['row_groups'], 'row group')} "
                     f"(~{s['mean_row_group_bytes'] / 2**20:.2f} MiB each, "
                     f"{s['mean_row_group_bytes_compressed'] / 2**20:.2f} MiB compressed)")
    lines.append(f"  max world size (row groups of the train split): {manifest['max_world_size']}")
    for reason, n in sorted(files["reasons"].items()):
        lines.append(f"  {n:6d} {reason}")
    if files["rejected"] + files["skipped"]:
        lines.append(f"  details: {files['list']}")
    small = manifest.get("classes_not_in_every_split", [])
    if small:
        shown = ", ".join(f"{c['label']} {c['name']!r} ({', '.join(f'{c.get(s, 0)} {s}' for s in SPLITS)})"
                          for c in small[:10])
        more = f" and {len(small) - 10} more (manifest: classes_not_in_every_split)" if len(small) > 10 else ""
        lines.append(f"  WARNING: {plural(len(small), 'class')} {'is' if len(small) == 1 else 'are'} not in every "
                     f"split ({manifest.get('split_rule', SPLIT_RULE)}): {shown}{more}")
    hashing = f", {manifest['hash_seconds']} s of it hashing for duplicates" if manifest.get("hash_seconds") else ""
    lines.append(f"  {manifest['images_per_second']} images/s ({manifest['seconds']} s in Spark{hashing})")
    if manifest["max_world_size"] < manifest["min_row_groups"]:
        lines.append(f"  WARNING: the train split has fewer than {plural(manifest['min_row_groups'], 'row group')} "
                     "(--min-row-groups): too few rows for that many ranks")
    return "\n".join(lines)
