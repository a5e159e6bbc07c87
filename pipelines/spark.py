"""Spark session helpers shared by the stages: session creation and progress logging."""
from __future__ import annotations

import logging
import os
import sys
import threading
from contextlib import contextmanager
from typing import Dict, Iterator, Optional

log = logging.getLogger("pipelines")


def spark_session(app_name: str, master: Optional[str] = None, conf: Optional[Dict[str, str]] = None):
    """The active SparkSession, or a new one.

    Under ``spark-submit`` the master comes from it; under plain ``python`` it is ``master`` or
    ``local[*]``. Python workers run the same interpreter as the driver unless
    ``PYSPARK_PYTHON`` says otherwise, so a virtual environment is used end to end.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "false")
    if master:
        builder = builder.master(master)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("PIPELINES_SPARK_LOG_LEVEL", "WARN"))
    return spark


@contextmanager
def log_progress(spark, every_s: float = 10.0) -> Iterator[None]:
    """Log the tasks done per active Spark stage every ``every_s`` seconds while the block runs."""
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(every_s):
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    log.info("spark stage %d (%s): %d/%d tasks done, %d running", stage_id,
                             info.name.split(" at ")[0], info.numCompletedTasks, info.numTasks,
                             info.numActiveTasks)

    thread = threading.Thread(target=report, name="spark-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1.0)
