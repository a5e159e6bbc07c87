"""Spark session helpers shared by the stages: session creation and progress logging."""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Dict, Iterator, Mapping, Optional

from pipelines.runtime.environment import environment
from pipelines.runtime.progress import progress_line
from pipelines.runtime.quiet import spark_log_options
from pipelines.runtime.redact import SPARK_REDACTION_REGEX

log = logging.getLogger("pipelines")

# The locale of every JVM and Python worker this module starts, whatever the caller's: under
# LC_ALL=C a JVM encodes file names as ASCII (sun.jnu.encoding=ANSI_X3.4-1968). Java 17 takes
# sun.jnu.encoding from the locale only (-Dsun.jnu.encoding is ignored: checked with
# `java -XshowSettings:properties`), so the environment is what matters; -Dfile.encoding=UTF-8
# makes the JVM's default charset (logs, text files) UTF-8 too.
UTF8_ENV = {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
UTF8_JAVA_OPTIONS = "-Dfile.encoding=UTF-8"
DEFAULT_MASTER = "local[*]"  # under plain python, without a master
LOOPBACK = "127.0.0.1"


def utf8_conf(verbose: bool = False) -> Dict[str, str]:
    """Spark settings that give executors (their JVM and Python workers) a UTF-8 locale, and the
    driver the quiet log4j configuration (:func:`pipelines.runtime.quiet.spark_log_options`) unless ``verbose``.

    ``spark.*.defaultJavaOptions`` (not ``extraJavaOptions``), so that a user's own
    ``extraJavaOptions`` are added to them, not replaced.
    """
    conf = {"spark.driver.defaultJavaOptions": f"{UTF8_JAVA_OPTIONS} {spark_log_options(verbose)}".strip(),
            "spark.executor.defaultJavaOptions": UTF8_JAVA_OPTIONS}
    conf.update({f"spark.executorEnv.{key}": value for key, value in UTF8_ENV.items()})
    return conf


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``, ``local[N,F]``: Spark's ``Utils.isLocalMaster`` (not
    ``local-cluster[...]``, whose executors are separate processes)."""
    master = master.strip()
    return master == "local" or master.startswith("local[")


def service_conf(master: str, environ: Mapping[str, str]) -> Dict[str, str]:
    """What a session this module starts serves on the network, for the master ``master``.

    No web UI: it listens on every interface (``SPARK_LOCAL_IP`` alone narrows it; Spark has no
    setting of its own) and lets anyone who reaches it read the job's environment; a caller's
    ``spark.ui.enabled=true`` turns it back on, still without its links that kill jobs and stages
    (``spark.ui.killEnabled``). On a ``local`` master (one JVM: driver and executor) without
    ``SPARK_LOCAL_IP`` in ``environ``, the driver's own services (its RPC endpoint, the block
    manager, the rank-log sink of ``--spark-np N``) listen on 127.0.0.1 alone, not on the address
    the host name resolves to.
    """
    conf = {"spark.ui.enabled": "false", "spark.ui.killEnabled": "false"}
    if is_local_master(master) and not environ.get("SPARK_LOCAL_IP"):
        conf.update({"spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK})
    return conf


def spark_session(app_name: str, master: Optional[str] = None, conf: Optional[Dict[str, str]] = None,
                  verbose: bool = False, log_level: str = ""):
    """The active SparkSession, or a new one, its log level ``log_level``, else ``INFO`` when
    ``verbose``, else ``WARN`` (a job passes its config's ``verbose`` and the environment's
    :attr:`pipelines.runtime.environment.Settings.spark_log_level`).

    Under ``spark-submit`` the master comes from it; under plain ``python`` it is ``master`` or
    ``local[*]`` (:data:`DEFAULT_MASTER`). Python workers run the same interpreter as the driver unless
    ``PYSPARK_PYTHON`` says otherwise, so a virtual environment is used end to end. When this
    call starts the JVM itself, the JVM, the executors and their Python workers get a UTF-8
    locale (:data:`UTF8_ENV`, :func:`utf8_conf`) whatever the caller's, no web UI, and a ``local``
    master's services on loopback (:func:`service_conf`); ``conf`` wins over those. Under
    ``spark-submit`` the JVM is already running: pass ``--conf`` settings there. A new SparkContext hides the product's secret keys in its UI and
    event log, under ``spark-submit`` too (``spark.redaction.regex``:
    :data:`pipelines.runtime.redact.SPARK_REDACTION_REGEX`; ``conf`` may set another).
    """
    from pyspark import SparkContext  # in the function: `import pipelines` stays free of PySpark
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    launching = SparkContext._active_spark_context is None and "PYSPARK_GATEWAY_PORT" not in os.environ
    builder = SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "false")
    if master:
        builder = builder.master(master)
    own = {**utf8_conf(verbose), **service_conf(master or DEFAULT_MASTER, os.environ)} if launching else {}
    for key, value in {**own, "spark.redaction.regex": SPARK_REDACTION_REGEX,
                       **(conf or {})}.items():
        builder = builder.config(key, value)
    with environment(UTF8_ENV if launching else {}):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level or ("INFO" if verbose else "WARN"))
    return spark


@contextmanager
def log_progress(spark, what: str, total: int, unit: str = "image", every_s: float = 10.0) -> Iterator[object]:
    """Log the progress of a Spark job on the driver while the block runs: ``total`` items, counted
    by the job's tasks in the accumulator this yields (each task adds 1 per item it finishes).

    Logged (the ``pipelines`` logger: the terminal, and the driver's log under spark-submit): a
    first line at the start, one every ``every_s`` seconds, and a last one when the block ends
    without an error, each :func:`pipelines.runtime.progress.progress_line` (items done out of ``total``,
    items/s, the time left) followed by the active stages' tasks from Spark's status tracker
    (``tasks 12/62 done, 2 running``).

    Why an accumulator: it is Spark's own per-item count, exact (Spark merges a task's updates
    once, when the task succeeds: a failed or retried attempt adds nothing); PySpark sends a
    task's updates with its result, so the count moves task by task, by as many items as a task
    holds: the jobs bound that (:func:`pipelines.etl.layout.task_count`).

    Yields:
        the accumulator (``pyspark.Accumulator`` of int, 0) to pass to the tasks.
    """
    context = spark.sparkContext
    counter = context.accumulator(0)
    tracker = context.statusTracker()
    start = time.perf_counter()

    def line(finished: bool = False) -> str:
        text = progress_line(what, counter.value, total, time.perf_counter() - start, unit, finished)
        return text if finished else text + _tasks_text(tracker)

    log.info("%s", line())
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(every_s):
            log.info("%s", line())

    thread = threading.Thread(target=report, name="spark-progress", daemon=True)
    thread.start()
    try:
        yield counter
    finally:
        stop.set()
        thread.join(timeout=1.0)
    log.info("%s", line(finished=True))


def _tasks_text(tracker) -> str:
    """``" (tasks 12/62 done, 2 running)"``: the active stages' tasks, summed; ``""`` when no stage
    is active."""
    done = count = running = 0
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            done, count, running = done + info.numCompletedTasks, count + info.numTasks, running + info.numActiveTasks
    return f" (tasks {done}/{count} done, {running} running)" if count else ""
