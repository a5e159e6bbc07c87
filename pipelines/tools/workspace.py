"""The working folder of the notebooks and the benchmarks, and a sample through the ETL on demand."""
from __future__ import annotations

import json
import os
from typing import Optional

from pipelines.backbones import DEFAULT_BACKBONE, backbone_spec
from pipelines.contract import MANIFEST, TRAIN, VALIDATION
from pipelines.etl.config import ETLConfig
from pipelines.etl.job import run_etl
from pipelines.io.storage import resolve
from pipelines.runtime.environment import read_settings
from pipelines.runtime.errors import Refused
from pipelines.tools import samples
from pipelines.tools.weights import ensure_notop_weights


def default_workdir() -> str:
    """The default working folder, a local absolute path (``Settings.workdir``; not made here)."""
    return read_settings().workdir


def ensure_sample_etl(workdir: str, image_size: int = 299, test_fraction: float = 0.3, spark=None,
                      input_dir: Optional[str] = None, sample: str = "tuxpaint",
                      per_class: Optional[int] = None, validation_fraction: float = 0.2) -> str:
    """The ETL output ``workdir/etl``, made if it has no manifest or an old one without validation split.

    Without ``input_dir`` the ``sample`` (``tuxpaint`` or ``fashion-mnist``) is fetched first.

    Raises:
        ValueError: an unknown ``sample``."""
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
    """Whether the manifest at ``location`` is an older ETL's, with train and test splits only."""
    manifest = json.loads(location.join(MANIFEST).read_bytes())
    splits = manifest.get("splits") if isinstance(manifest, dict) else None
    return isinstance(splits, dict) and TRAIN in splits and VALIDATION not in splits


def ensure_weights(weights: str = "", backbone: str = DEFAULT_BACKBONE) -> str:
    """``weights`` as given (``imagenet``, ``none`` or a path), else ``backbone``'s default: the path of its offline
    weights if its row has them, else ``imagenet`` (Keras' download) if pretrained, else ``none``."""
    spec = backbone_spec(backbone)
    if weights:
        return weights
    if spec.offline is not None:
        return str(ensure_notop_weights(backbone))
    return "imagenet" if spec.pretrained else "none"
