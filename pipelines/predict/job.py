"""Driver side of batch inference: refuse, plan, predict in Spark, reconcile, report, swap in.

Steps, each a function below:

1. :func:`prepare` - clear errors before Spark starts (:func:`check_paths`; the model resolved
   with its contract, :mod:`pipelines.predict.model`; the input planned,
   :mod:`pipelines.predict.inputs`).
2. :func:`predictions` - the input as a DataFrame (a tree's rows cut into one contiguous chunk per
   task, ``spark.range(P).mapInArrow``, no shuffle, as the ETL does; an ETL split: the files
   its manifest names, read as Parquet), through ``predict_batch_udf`` (:mod:`pipelines.predict.infer`: decode in the executors with the
   ETL's functions, the model loaded once per Python worker, batched); written as Parquet into a
   staging folder beside the output.
3. :func:`finish` - read the written rows back, reconcile (rows = predicted + unreadable = the
   input's rows; a tree's files found = rows + skipped), metrics when rows are labelled
   (:mod:`pipelines.predict.metrics`, the confusion-matrix picture), ``_summary.json``,
   ``_skipped.jsonl``; then the staging folder replaces the output, so a failed run leaves the
   previous output as it was.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from functools import partial
from typing import Dict, Iterator, List, Tuple

from pipelines.contract import row_bytes
from pipelines.etl.layout import closure_chunks, task_count
from pipelines.etl.listing import reason_kind
from pipelines.io.atomic import write_json
from pipelines.io.paths import check_disjoint
from pipelines.predict.config import PredictConfig
from pipelines.predict.infer import PREDICTED, UNREADABLE, TaskCounter, make_predict_fn, result_type
from pipelines.predict.inputs import TREE, InputPlan, Item, class_index, is_etl_split, plan_input, private_copies
from pipelines.predict.metrics import classification_report
from pipelines.predict.model import ModelSpec, resolve_model
from pipelines.runtime import zipcache
from pipelines.runtime.config import to_dict
from pipelines.runtime.environment import read_settings
from pipelines.runtime.errors import MissingInput, NotAFolder, Refused
from pipelines.runtime.logs import plural
from pipelines.runtime.quiet import quiet_libraries
from pipelines.runtime.redact import redact
from pipelines.runtime.spark import log_progress, spark_session
from pipelines.tracking import pictures

log = logging.getLogger("pipelines")

SUMMARY, SKIPPED_LIST, CONFUSION = "_summary.json", "_skipped.jsonl", "_confusion.png"
ARROW_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
SPARK_ARROW_ROWS = 10_000  # Spark's default of ARROW_RECORDS
ARROW_BATCH_BYTES = 8 * 2**20  # stored images per Arrow batch (arrow_batch_rows): a few model batches at 299 px
WRITTEN_BY = "pipelines.predict"  # the summary's mark: a folder this job may replace (owned_files)
ITEM_DDL = "path STRING, label INT, label_name STRING, reason STRING"
# Images per task by default, at most: a model call costs more than an ETL decode, so fewer than
# the ETL's 500 for the same aim (progress that moves, a lost task that redoes little); still 8
# model batches of the default 32, and the model is loaded once per Python worker, not per task.
# Why and what it costs: docs/tracking-and-inference.md ("Progress").
TASK_IMAGES = 256
MAX_PARTITION_BYTES = "spark.sql.files.maxPartitionBytes"
OPEN_COST = "spark.sql.files.openCostInBytes"
# The output's columns, in order (status: predicted | unreadable).
COLUMNS = ("path", "label", "label_name", "status", "reason", "top_labels", "top_names", "top_probabilities")


def arrow_batch_rows(batch_size: int, image_bytes: int, budget: int = ARROW_BATCH_BYTES) -> int:
    """Rows per Arrow batch that Spark sends a Python worker
    (``spark.sql.execution.arrow.maxRecordsPerBatch``): whole model batches, as many as fit in
    ``budget`` bytes of stored images, at least one, at most Spark's default::

        rows = batch_size * max(1, budget // (batch_size * image_bytes))
        then whole model batches of at most 10,000 rows (never less than one model batch)

    Why: ``predict_batch_udf`` cuts each Arrow batch into model batches of ``batch_size``
    (PySpark's ``pyspark.ml.functions.predict_batch_udf`` documentation: its batch size is
    independent of the Arrow batch size), but the worker first receives the whole Arrow batch and
    converts it to pandas. Spark's default, 10,000 rows per Arrow batch (Spark's SQL configuration
    reference, ``spark.sql.execution.arrow.maxRecordsPerBatch``), is meant for rows of a few
    numbers: with an ETL split's image column (``row_bytes(299)`` = 268,203 bytes a row) the
    worker held a whole Parquet partition of images (``benchmarks/predict_bench.py`` measures it).

    Args:
        batch_size: images per model call (``--batch-size``). image_bytes: bytes of one stored
            image (:func:`pipelines.contract.row_bytes`). budget: bytes of images per Arrow batch.

    Returns:
        rows (int, >= 1).
    """
    rows = batch_size * max(1, budget // (batch_size * image_bytes))
    return rows if rows <= SPARK_ARROW_ROWS else max(batch_size, SPARK_ARROW_ROWS // batch_size * batch_size)


def check_paths(config: PredictConfig) -> None:
    """Refuse, before Spark starts, an output that cannot be written safely.

    Raises:
        ValueError: the output is, holds or lies inside the input; or it is a folder with files
            that is not an earlier output of this job (:func:`owned_files`): it is never replaced.
        NotADirectoryError: the output is a file.
    """
    check_disjoint(config.input, config.output)
    out = config.output
    if os.path.exists(out) and not os.path.isdir(out):
        raise NotAFolder(f"output exists and is not a folder: {out}")
    owned_files(out)


def owned_files(output: str) -> List[str]:
    """The names in the folder ``output`` that an earlier run of this job wrote, as its
    ``_summary.json`` records them (``written_by`` :data:`WRITTEN_BY`, ``output_files``); ``[]``
    when the folder is missing or empty. A run replaces only such a folder, and deletes only
    those names.

    Raises:
        ValueError: the folder holds files but no summary of this job, or names its summary
            does not list (a user's files put there since): not an output of this job, refusing
            to replace it.
    """
    names = sorted(os.listdir(output)) if os.path.isdir(output) else []
    if not names:
        return []
    try:
        with open(os.path.join(output, SUMMARY), encoding="utf-8") as f:
            summary = json.load(f)
        listed = summary["output_files"] if summary.get("written_by") == WRITTEN_BY else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        listed = None
    if not isinstance(listed, list):
        raise Refused(f"output {output} holds files but no {SUMMARY} of this job: not an output of this job, "
                      "refusing to overwrite it")
    foreign = [name for name in names if name not in listed]
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise Refused(f"output {output} holds {shown}, which its {SUMMARY} does not list: not an output of "
                      "this job alone, refusing to overwrite it")
    return names


def work_dirs(output: str) -> Tuple[str, str]:
    """``(staging, model download)`` folders: hidden siblings of the output (same file system)."""
    parent, name = os.path.split(output)
    return os.path.join(parent, f".{name}.staging"), os.path.join(parent, f".{name}.model")


def private_folder(output: str) -> str:
    """A new folder (0700, a name nobody could plant) beside ``output``, which Spark's executors
    reach wherever they reach the output: where an ETL split's parts are copied."""
    parent, name = os.path.split(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{name}.input-", dir=parent)


def prepare(config: PredictConfig, download_dir: str) -> Tuple[ModelSpec, InputPlan]:
    """Everything the driver can check before Spark starts: paths, model, input.

    Raises:
        FileNotFoundError, NotADirectoryError, ValueError (``ModelContractError``, ``NoImages``,
            ``UnsupportedTree``): see :func:`check_paths`,
            :func:`~pipelines.predict.model.resolve_model`, :func:`~pipelines.predict.inputs.plan_input`.
    """
    if not os.path.isdir(config.input) and not is_etl_split(config.input.rstrip("/")):
        raise MissingInput(f"input folder does not exist: {config.input}")
    check_paths(config)
    spec = resolve_model(config.model, config.class_names, download_dir)
    return spec, plan_input(config.input, spec.class_names, spec.image_size, config.max_file_bytes)


def emit_items(batches: Iterator, chunks: List[List[tuple]]) -> Iterator:
    """``mapInArrow`` function: the items of the chunk numbers this task receives (:data:`ITEM_DDL`);
    ``chunks`` holds each :class:`Item` as a plain tuple (:func:`pipelines.etl.layout.closure_chunks`)."""
    import pyarrow as pa

    zipcache.install()  # this worker's next tasks start without re-reading pyspark.zip (see the module)
    schema = pa.schema([("path", pa.string()), ("label", pa.int32()), ("label_name", pa.string()),
                        ("reason", pa.string())])
    for batch in batches:
        for chunk in batch.column(0).to_pylist():
            yield pa.RecordBatch.from_pylist([Item._make(item)._asdict() for item in chunks[chunk]], schema=schema)


def input_frame(spark, config: PredictConfig, spec: ModelSpec, plan: InputPlan):
    """The input as a DataFrame ``path, label, label_name, reason, value``; ``value`` is what the
    predict function decodes (a tree's file path, an ETL row's image bytes)."""
    from pyspark.sql import functions as F

    if plan.kind == TREE:
        parts = task_count(len(plan.items), spark.sparkContext.defaultParallelism, TASK_IMAGES, config.num_partitions)
        mapper = partial(emit_items, chunks=closure_chunks(plan.items, parts))
        return spark.range(parts, numPartitions=parts).mapInArrow(mapper, ITEM_DDL).withColumn("value", F.col("path"))
    index = class_index(spec.class_names)  # the split's label names, matched by name with the model's
    labels = F.create_map(*[F.lit(x) for name, i in index.items() for x in (name, i)])
    label = F.try_element_at(labels, F.col("label_name"))
    return spark.read.parquet(*plan.parts).select(
        "path", label.cast("int").alias("label"), F.when(label.isNotNull(), F.col("label_name")).alias("label_name"),
        F.lit(None).cast("string").alias("reason"), F.col("image").alias("value"))


def predictions(spark, config: PredictConfig, spec: ModelSpec, plan: InputPlan, counter=None):
    """The output DataFrame (:data:`COLUMNS`): every input row through ``predict_batch_udf``,
    each batch's rows added to the accumulator ``counter`` when given (the driver's progress)."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import functions as F

    threads = config.threads or int(spark.conf.get("spark.task.cpus", "1"))
    make = make_predict_fn(spec, config.top_k, plan.kind == TREE, config.max_file_bytes, threads, config.verbose,
                           TaskCounter(counter) if counter is not None else None)
    udf = predict_batch_udf(make, return_type=result_type(), batch_size=config.batch_size)
    p = F.col("p")
    ok = p.reason.isNull()
    return input_frame(spark, config, spec, plan).withColumn("p", udf("value", "reason")).select(
        "path", "label", "label_name", F.when(ok, F.lit(PREDICTED)).otherwise(F.lit(UNREADABLE)).alias("status"),
        p.reason.alias("reason"), *[F.when(ok, p[name]).alias(name) for name in COLUMNS[5:]])


def reconcile(plan: InputPlan, table) -> Dict:
    """Counts of the written rows, checked against the plan.

    Args:
        table: the written output (pyarrow), at least ``path`` and ``status``.

    Returns:
        ``{"found", "rows", "predicted", "unreadable", "skipped", "reasons"}``.

    Raises:
        RuntimeError: rows != the input's rows, a tree path missing, duplicated or never listed,
            ``found != rows + skipped``, or ``rows != predicted + unreadable``.
    """
    statuses = Counter(table.column("status").to_pylist())
    rows = table.num_rows
    if rows != plan.rows:
        raise RuntimeError(f"the output holds {plural(rows, 'row')}, the input {plan.rows}")
    if plan.kind == TREE and sorted(table.column("path").to_pylist()) != sorted(i.path for i in plan.items):
        raise RuntimeError("the output's paths are not the listed files, each once")
    if plan.found != rows + len(plan.skipped) or rows != statuses[PREDICTED] + statuses[UNREADABLE]:
        raise RuntimeError(f"counts do not reconcile: found {plan.found}, rows {rows}, skipped {len(plan.skipped)}, "
                           f"predicted {statuses[PREDICTED]}, unreadable {statuses[UNREADABLE]}")
    reasons = Counter(reason_kind(r) for r in table.column("reason").to_pylist() if r is not None)
    return {"found": plan.found, "rows": rows, "predicted": statuses[PREDICTED],
            "unreadable": statuses[UNREADABLE], "skipped": len(plan.skipped), "reasons": dict(reasons)}


def labelled_metrics(table, spec: ModelSpec, folder: str) -> Dict:
    """Metrics of the predicted rows that have a true label, and the confusion-matrix picture
    (``folder/_confusion.png``, its name under ``picture``); ``{}`` when no predicted row is
    labelled. A picture that cannot be drawn is logged and recorded (``picture`` null,
    ``picture_error`` its error), never the job's failure: the predictions are its work."""
    rows = [(t, p[0]) for t, p, s in zip(*(table.column(c).to_pylist() for c in ("label", "top_labels", "status")))
            if t is not None and s == PREDICTED]
    if not rows:
        return {}
    true, predicted = zip(*rows)
    report = classification_report(true, predicted, spec.class_names)
    names = [spec.class_names[c] for c in report["confusion"]["labels"]]
    try:
        pictures.plot_confusion(report["confusion"]["matrix"], names, os.path.join(folder, CONFUSION),
                                title=f"{plural(report['count'], 'labelled image')}, accuracy {report['accuracy']:.4f}")
    except Exception as exc:  # noqa: BLE001 - a picture is a view of the metrics: never the job's failure
        log.error("the confusion picture could not be drawn (%s: %s); the predictions and metrics are written",
                  type(exc).__name__, exc)
        return {**report, "picture": None, "picture_error": f"{type(exc).__name__}: {exc}"}
    return {**report, "picture": CONFUSION}


def finish(config: PredictConfig, spec: ModelSpec, plan: InputPlan, staging: str, seconds: float) -> Dict:
    """Reconcile the staged output, add the summary, the skipped list and the picture; return the summary."""
    import pyarrow.parquet as pq

    table = pq.read_table(staging, columns=["path", "label", "status", "reason", "top_labels"])
    counts = reconcile(plan, table)
    with open(os.path.join(staging, SKIPPED_LIST), "w", encoding="utf-8") as out:
        for path, reason in plan.skipped:
            out.write(json.dumps({"path": path, "reason": reason}, ensure_ascii=False) + "\n")
    summary = {
        "model": spec.source, "model_flavor": spec.flavor, "image_size": spec.image_size,
        "class_names": list(spec.class_names), "input": plan.root, "input_kind": plan.kind,
        "output": config.output, "columns": list(COLUMNS), "top_k": min(config.top_k, spec.num_classes),
        "files": {**counts, "skipped_list": SKIPPED_LIST},
        "labelled": sum(label is not None for label in table.column("label").to_pylist()),
        "metrics": labelled_metrics(table, spec, staging) or None,
        "seconds": round(seconds, 2), "images_per_second": round(counts["rows"] / seconds, 2) if seconds > 0 else None,
        "config": redact(to_dict(config)),
        "written_by": WRITTEN_BY,
        "output_files": sorted({*os.listdir(staging), SUMMARY}),
    }
    write_json(os.path.join(staging, SUMMARY), summary)
    return summary


def swap_in(staging: str, output: str) -> None:
    """Replace the output folder with the staged one: the previous output (checked again to be
    this job's, :func:`owned_files`) is moved aside, the staged one moved in, then the files the
    previous summary lists are deleted, and its folder when nothing else appeared in it."""
    owned = owned_files(output)
    if not os.path.isdir(output):
        os.replace(staging, output)
        return
    old = staging + ".old"
    os.rename(output, old)
    os.replace(staging, output)
    for name in owned:
        path = os.path.join(old, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    try:
        os.rmdir(old)
    except OSError:
        log.warning("kept %s: files appeared in the previous output while this run wrote (not deleted)", old)


def run_predict(config: PredictConfig, spark=None) -> Dict:
    """Run batch inference and return its summary (``OUTPUT/_summary.json``).

    Args:
        config: the stage's configuration.
        spark: a SparkSession to use (a notebook's); by default the active one or a new one
            (``config.master``, else ``local[*]``), started only after every refusal.

    Raises:
        FileNotFoundError, NotADirectoryError, ValueError: see :func:`prepare` (before Spark).
        RuntimeError: the written rows do not reconcile with the input.
    """
    quiet_libraries(config.verbose)  # this process's third-party noise: the config's choice
    staging, download = work_dirs(config.output)
    copies = None
    try:
        spec, plan = prepare(config, download)
        if plan.kind != TREE:
            copies = private_folder(config.output)
            plan = private_copies(plan, copies)
        log.info("model %s: %s, %d px input; input %s (%s): %s to predict, %s skipped", spec.source,
                 plural(spec.num_classes, "class"), spec.image_size, plan.root, plan.kind, plural(plan.rows, "row"),
                 plural(len(plan.skipped), "file"))
        spark = spark or spark_session("pipelines-predict", config.master, verbose=config.verbose,
                                       log_level=read_settings().spark_log_level)
        start = time.perf_counter()
        rows = config.arrow_batch_rows or arrow_batch_rows(config.batch_size, row_bytes(spec.image_size))
        settings = {ARROW_RECORDS: str(rows), **split_partitioning(config, plan)}
        with log_progress(spark, "predict", plan.rows) as counter, session_conf(spark, settings):
            predictions(spark, config, spec, plan, counter).write.mode("overwrite").parquet(staging)
        summary = finish(config, spec, plan, staging, time.perf_counter() - start)
        swap_in(staging, config.output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(download, ignore_errors=True)
        if copies:
            shutil.rmtree(copies, ignore_errors=True)
    log.info("wrote %s", config.output)
    return summary


def split_partitioning(config: PredictConfig, plan: InputPlan) -> Dict[str, str]:
    """Spark's file-split settings that give an ETL split's tasks about :data:`TASK_IMAGES` rows
    each (``{}`` for a tree, or with ``--num-partitions``, which applies to trees only).

    Spark cuts Parquet files into splits of ``spark.sql.files.maxPartitionBytes`` (128 MiB by
    default: thousands of stored images a task) and packs small files up to it, counting
    ``spark.sql.files.openCostInBytes`` (4 MiB) per file. The first is set to the split's mean
    stored bytes per row times :data:`TASK_IMAGES` (at least 1 MiB), the second to an eighth of
    that (up to 8 small files a task). A task still reads whole row groups (Spark assigns each to
    the split holding its middle).
    """
    if plan.kind == TREE or not plan.rows or config.num_partitions:
        return {}
    stored = sum(os.path.getsize(path) for path in plan.parts)
    target = max(2**20, stored * TASK_IMAGES // plan.rows)
    return {MAX_PARTITION_BYTES: str(target), OPEN_COST: str(target // 8)}


@contextlib.contextmanager
def session_conf(spark, values: Dict[str, str]) -> Iterator[None]:
    """Set runtime SQL settings of ``spark`` for the block, then put back what was there (a
    notebook's session keeps its own settings)."""
    before = {key: spark.conf.get(key, None) for key in values}
    for key, value in values.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            spark.conf.set(key, value) if value is not None else spark.conf.unset(key)


def format_summary(summary: Dict) -> str:
    """A short human summary: counts and their reconciliation, reasons, accuracy, per-class figures."""
    files, metrics = summary["files"], summary["metrics"]
    lines = [f"Predict summary ({summary['model']}: {plural(len(summary['class_names']), 'class')}, "
             f"{summary['image_size']} px, top {summary['top_k']}; input {summary['input_kind']})",
             f"  found {files['found']} = rows {files['rows']} + skipped {files['skipped']}; "
             f"rows {files['rows']} = predicted {files['predicted']} + unreadable {files['unreadable']}"]
    lines += [f"  {n:6d} unreadable: {reason}" for reason, n in sorted(files["reasons"].items())]
    if metrics:
        lines.append(f"  accuracy {metrics['accuracy']:.4f} ({metrics['correct']}/"
                     f"{plural(metrics['count'], 'labelled image')}); confusion matrix: {metrics['picture']}")
        for c in metrics["per_class"]:
            figures = ", ".join(f"{key} {c[key]:.3f}" if c[key] is not None else f"{key} -"
                                for key in ("precision", "recall"))
            lines.append(f"    {c['label']:4d} {str(c['name'])[:30]:30s} {figures}, support {c['support']}")
    else:
        lines.append(f"  no labelled image ({plural(summary['labelled'], 'row')} with a label)")
    lines.append(f"  {summary['images_per_second']} images/s ({summary['seconds']} s in Spark); wrote "
                 f"{summary['output']}")
    return "\n".join(lines)
