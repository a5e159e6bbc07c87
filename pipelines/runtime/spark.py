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
    """Spark ``defaultJavaOptions`` giving executors a UTF-8 locale and the driver a quiet log4j unless ``verbose``."""
    conf = {"spark.driver.defaultJavaOptions": f"{UTF8_JAVA_OPTIONS} {spark_log_options(verbose)}".strip(),
            "spark.executor.defaultJavaOptions": UTF8_JAVA_OPTIONS}
    conf.update({f"spark.executorEnv.{key}": value for key, value in UTF8_ENV.items()})
    return conf


def is_local_master(master: str) -> bool:
    """Whether ``master`` is ``local``, ``local[N]``, ``local[*]`` or ``local[N,F]`` (not ``local-cluster[...]``)."""
    master = master.strip()
    return master == "local" or master.startswith("local[")


def service_conf(master: str, environ: Mapping[str, str]) -> Dict[str, str]:
    """What a session this module starts serves on the network: no web UI (it shows the job's environment);
    on a ``local`` master without ``SPARK_LOCAL_IP``, services on 127.0.0.1 alone."""
    conf = {"spark.ui.enabled": "false", "spark.ui.killEnabled": "false"}
    if is_local_master(master) and not environ.get("SPARK_LOCAL_IP"):
        conf.update({"spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK})
    return conf


def spark_session(app_name: str, master: Optional[str] = None, conf: Optional[Dict[str, str]] = None,
                  verbose: bool = False, log_level: str = ""):
    """The active SparkSession, or a new one, at log level ``log_level``, else ``INFO`` if ``verbose``, else ``WARN``.

    Under plain ``python`` the master is ``master`` or ``DEFAULT_MASTER`` (``conf`` wins over our settings);
    under ``spark-submit`` pass ``--conf`` there."""
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
    """Log a Spark job's progress on the driver while the block runs: at the start, every ``every_s``, at a clean end.

    Yields:
        The accumulator (int, starting at 0) to pass to the tasks."""
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
    """``" (tasks 12/62 done, 2 running)"`` summed over the active stages; ``""`` when none is active."""
    done = count = running = 0
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            done, count, running = done + info.numCompletedTasks, count + info.numTasks, running + info.numActiveTasks
    return f" (tasks {done}/{count} done, {running} running)" if count else ""
