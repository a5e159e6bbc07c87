"""Driver side of batch inference: refuse, plan, predict in Spark, reconcile, report, swap in.

The output is written into a staging folder and swapped in at the end: a failed run leaves the previous output."""
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
# Images per task at most: fewer than the ETL's 500, as a model call costs more than a decode
# (docs/tracking-and-inference.md, "Progress").
TASK_IMAGES = 256
MAX_PARTITION_BYTES = "spark.sql.files.maxPartitionBytes"
OPEN_COST = "spark.sql.files.openCostInBytes"
# The output's columns, in order (status: predicted | unreadable).
COLUMNS = ("path", "label", "label_name", "status", "reason", "top_labels", "top_names", "top_probabilities")


def arrow_batch_rows(batch_size: int, image_bytes: int, budget: int = ARROW_BATCH_BYTES) -> int:
    """Rows per Arrow batch sent to a Python worker: whole model batches in ``budget`` bytes, at most Spark's 10,000.

    The worker makes pandas of a whole Arrow batch before ``predict_batch_udf`` cuts it into model batches."""
    rows = batch_size * max(1, budget // (batch_size * image_bytes))
    return rows if rows <= SPARK_ARROW_ROWS else max(batch_size, SPARK_ARROW_ROWS // batch_size * batch_size)


def check_paths(config: PredictConfig) -> None:
    """Refuse, before Spark starts, an output that is a file, overlaps the input, or is not this job's."""
    check_disjoint(config.input, config.output)
    out = config.output
    if os.path.exists(out) and not os.path.isdir(out):
        raise NotAFolder(f"output exists and is not a folder: {out}")
    owned_files(out)


def owned_files(output: str) -> List[str]:
    """The names in ``output`` that an earlier run of this job wrote, as its ``_summary.json`` lists them.

    A run replaces only such a folder, and deletes only those names; ``[]`` for a missing or empty folder.

    Raises:
        ValueError: the folder holds files but no summary of this job, or names the summary does not list."""
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
    """A new private folder (0700, an unguessable name) beside ``output``, where the executors reach it."""
    parent, name = os.path.split(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{name}.input-", dir=parent)


def prepare(config: PredictConfig, download_dir: str) -> Tuple[ModelSpec, InputPlan]:
    """Everything the driver can check before Spark starts: paths, model, input."""
    if not os.path.isdir(config.input) and not is_etl_split(config.input.rstrip("/")):
        raise MissingInput(f"input folder does not exist: {config.input}")
    check_paths(config)
    spec = resolve_model(config.model, config.class_names, download_dir)
    return spec, plan_input(config.input, spec.class_names, spec.image_size, config.max_file_bytes)


def emit_items(batches: Iterator, chunks: List[List[tuple]]) -> Iterator:
    """``mapInArrow`` function: the items (`ITEM_DDL`) of the chunk numbers this task receives."""
    import pyarrow as pa

    zipcache.install()  # this worker's next tasks start without re-reading pyspark.zip (see zipcache)
    schema = pa.schema([("path", pa.string()), ("label", pa.int32()), ("label_name", pa.string()),
                        ("reason", pa.string())])
    for batch in batches:
        for chunk in batch.column(0).to_pylist():
            yield pa.RecordBatch.from_pylist([Item._make(item)._asdict() for item in chunks[chunk]], schema=schema)


def input_frame(spark, config: PredictConfig, spec: ModelSpec, plan: InputPlan):
    """The input as a DataFrame ``path, label, label_name, reason, value`` (``value``: a file path or image bytes)."""
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
    """The output DataFrame (`COLUMNS`); each batch's rows are added to the accumulator ``counter`` when given."""
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
    """Counts of the written pyarrow ``table``, ``{"found", "rows", "predicted", "unreadable", "skipped", "reasons"}``.

    Raises:
        RuntimeError: rows != the input's rows, a tree path missing, duplicated or never listed,
            ``found != rows + skipped``, or ``rows != predicted + unreadable``."""
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
    """Metrics of the labelled predicted rows, ``{}`` if none, and a confusion picture that never fails the job."""
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
    """Reconcile the staged output, write the summary, the skipped list and the picture; return the summary."""
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
    """Replace the output with the staged folder, deleting only the files the previous summary lists."""
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

    ``spark``: a session to use; by default the active one or a new one, started only after every refusal.

    Raises:
        FileNotFoundError, NotADirectoryError, ValueError: refused before Spark starts.
        RuntimeError: the written rows do not reconcile with the input."""
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
    """Spark's file-split settings that give an ETL split's tasks about `TASK_IMAGES` rows each.

    ``maxPartitionBytes`` becomes the mean stored bytes of `TASK_IMAGES` rows (at least 1 MiB) and ``openCostInBytes``
    an eighth of that. ``{}`` for a tree or with ``--num-partitions``."""
    if plan.kind == TREE or not plan.rows or config.num_partitions:
        return {}
    stored = sum(os.path.getsize(path) for path in plan.parts)
    target = max(2**20, stored * TASK_IMAGES // plan.rows)
    return {MAX_PARTITION_BYTES: str(target), OPEN_COST: str(target // 8)}


@contextlib.contextmanager
def session_conf(spark, values: Dict[str, str]) -> Iterator[None]:
    """Set SQL settings of ``spark`` for the block, then restore the previous values (a notebook keeps its own)."""
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
