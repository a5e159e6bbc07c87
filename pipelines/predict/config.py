"""Configuration of the batch-inference stage (``jobs/predict.py``)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from pipelines.io.paths import check_url_safe
from pipelines.io.storage import check_not_root
from pipelines.runtime.checks import check_number, check_types
from pipelines.runtime.config import field, settle_verbose, verbose_field
from pipelines.runtime.environment import read_settings
from pipelines.runtime.errors import Refused

MLFLOW_SCHEMES = ("models:/", "runs:/")


def is_mlflow_uri(model: str) -> bool:
    """True for an MLflow model URI (``models:/NAME/VERSION``, ``runs:/RUN_ID/PATH``)."""
    return model.startswith(MLFLOW_SCHEMES)


@dataclass
class PredictConfig:
    """Batch inference with a trained model: an image tree or an ETL split in, one Parquet row per image out.

    Raises `Refused`, naming the flag, for a value of another type or out of range, or an unusable path.
    """

    model: str = field(help="model.keras (with model.json), a training run's folder, or models:/NAME/VERSION "
                            "or runs:/RUN_ID/PATH")
    input: str = field(help="a folder tree of images, any layout, or an ETL output split (ETL/test)")
    output: str = field(help="output Parquet folder, e.g. out/predictions.parquet: one row per input image")
    top_k: int = field(3, help="labels and probabilities kept per image (at most the number of classes)")
    batch_size: int = field(32, help="images per model call in each Python worker")
    class_names: str = field("", help="JSON list of class names (a run's class_names.json), for an MLflow "
                                      "model without them")
    max_file_mb: float = field(50.0, help="files larger than this are rows with a reason, never read, MiB")
    num_partitions: int = field(0, help="Spark partitions; 0 = at least 2 per core and at most about 256 images a task")
    threads: int = field(0, help="TensorFlow threads per Python worker; 0 = spark.task.cpus (1 by default)")
    arrow_batch_rows: int = field(0, help="rows per Arrow batch sent to a Python worker; 0 = whole model "
                                          "batches of at most 8 MiB")
    master: Optional[str] = field(None, help="Spark master when not set by spark-submit (default local[*])")
    verbose: Optional[bool] = verbose_field("Spark's INFO log")

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("top_k", "batch_size"):
            if getattr(self, name) < 1:
                raise Refused(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.num_partitions < 0 or self.threads < 0 or self.arrow_batch_rows < 0:
            raise Refused(f"--num-partitions, --threads and --arrow-batch-rows must be >= 0, got "
                          f"{self.num_partitions}, {self.threads} and {self.arrow_batch_rows}")
        check_number("max_file_mb", self.max_file_mb, above=0)
        if not self.model or not self.input or not self.output:
            raise Refused("--model, --input and --output must not be empty")
        if not is_mlflow_uri(self.model):
            self.model = os.path.abspath(os.path.expanduser(self.model))
        if self.class_names:
            self.class_names = os.path.abspath(os.path.expanduser(self.class_names))
        self.input = os.path.abspath(os.path.expanduser(self.input))
        # Spark writes the output through a Hadoop path (a URL): refuse what a URL cannot carry.
        self.output = check_url_safe(self.output, "--output")
        check_not_root(self.output, "--output")  # a run replaces its output folder whole
        self.verbose = settle_verbose(self.verbose, read_settings())  # the launching process's environment

    @property
    def max_file_bytes(self) -> int:
        """``--max-file-mb`` in bytes."""
        return int(self.max_file_mb * 2**20)
