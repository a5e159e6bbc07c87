"""The working folder of the notebooks and the benchmarks, and a sample through the ETL on demand.

Nothing here needs ``dbutils``: paths are plain (on Databricks, give ``/dbfs/...`` paths), or URIs
(``s3://bucket/work``): then the ETL output lives there, while the sample images it is made from
are fetched to the local :func:`default_workdir` (the ETL reads them from there).
"""
from __future__ import annotations

import json
import os
from typing import Optional

from pipelines.contract import MANIFEST, TRAIN, VALIDATION
from pipelines.etl.config import ETLConfig
from pipelines.etl.job import run_etl
from pipelines.io.storage import resolve
from pipelines.runtime.environment import read_settings
from pipelines.runtime.errors import Refused
from pipelines.tools import samples
from pipelines.tools.weights import ensure_xception_notop_weights


def default_workdir() -> str:
    """The notebooks' and benchmarks' default working folder, a local absolute path (not made
    here): :attr:`pipelines.runtime.environment.Settings.workdir`."""
    return read_settings().workdir


def ensure_sample_etl(workdir: str, image_size: int = 299, test_fraction: float = 0.3, spark=None,
                      input_dir: Optional[str] = None, sample: str = "tuxpaint",
                      per_class: Optional[int] = None, validation_fraction: float = 0.2) -> str:
    """The ETL output ``workdir/etl`` (a folder or a URI), made first when it has no manifest, or
    one of an older format without a validation split (which training refuses).

    With no ``input_dir``, a sample is fetched into ``workdir/<sample>`` first (for a URI
    ``workdir``, into the local :func:`default_workdir`): ``tuxpaint`` (148
    photos, 8 classes) or ``fashion-mnist`` (``per_class`` images of each of 10 classes, all when
    ``None``). An existing ``workdir/etl`` is reused as it is, whatever it was made from.
    Returns the ETL output folder.

    Raises:
        ValueError: an unknown ``sample``.
    """
    if sample not in ("tuxpaint", "fashion-mnist"):
        raise Refused(f"unknown sample {sample!r}: tuxpaint or fashion-mnist")
    location = resolve(workdir).join("etl")
    etl = location.uri
    if not location.join(MANIFEST).exists() or _two_splits(location):
        if not input_dir:
            input_dir = os.path.join(workdir if location.local else default_workdir(), sample)
            extra = ["--per-class", str(per_class)] if (sample == "fashion-mnist" and per_class) else []
            samples.main([sample, "--dest", input_dir, *extra])
        from pyspark.sql import SparkSession  # in-function: keeps `import pipelines` free of PySpark

        ours = spark is None and SparkSession.getActiveSession() is None
        run_etl(ETLConfig(input=input_dir, output=etl, image_size=image_size, test_fraction=test_fraction,
                          validation_fraction=validation_fraction), spark)
        if ours:  # a session this call started would hold a JVM through everything that follows
            SparkSession.getActiveSession().stop()
    return etl


def _two_splits(location) -> bool:
    """Whether the manifest at ``location`` is an older ETL's, with train and test splits only (read
    as plain JSON: anything else is reused as it is, and training says what is wrong with it)."""
    manifest = json.loads(location.join(MANIFEST).read_bytes())
    splits = manifest.get("splits") if isinstance(manifest, dict) else None
    return isinstance(splits, dict) and TRAIN in splits and VALIDATION not in splits


def ensure_weights(weights: str = "") -> str:
    """``weights`` as given (``imagenet``, ``none`` or a path), or, when empty, the path of the
    ImageNet Xception no-top weights converted offline (:mod:`pipelines.tools.weights`)."""
    if weights:
        return weights
    return str(ensure_xception_notop_weights())
