"""Configuration of the ETL stage (``jobs/etl.py``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from pipelines import tracking as trk
from pipelines.contract import DEFAULT_IMAGE_SIZE, MAX_IMAGE_SIZE, row_bytes
from pipelines.etl.images import DEFAULT_MAX_PIXELS
from pipelines.io import storage
from pipelines.io.options import storage_options_field
from pipelines.io.paths import check_url_safe
from pipelines.runtime.checks import check_number, check_types
from pipelines.runtime.config import field, settle_verbose, verbose_field
from pipelines.runtime.environment import read_settings
from pipelines.runtime.errors import Refused


@dataclass
class ETLConfig:
    """Spark ETL: a Caltech-256-style tree of images (JPEG, PNG, GIF, BMP, WebP, TIFF) to Parquet
    train/validation/test splits.

    Raises `Refused` naming the flag: a value of another type or out of range, an unusable input or output.
    """

    input: str = field(help="image tree ROOT/CLASS/IMAGE (path or s3://bucket/prefix); CLASS names all NNN.name "
                            "or all plain")
    output: str = field(help="output folder, a path or URI (s3://bucket/prefix): manifest.json, runs/RUN_ID/ "
                             "Parquet splits")
    image_size: int = field(DEFAULT_IMAGE_SIZE, help="side of the square output images, pixels")
    test_fraction: float = field(0.1, help="share of each class's files in the test split, in (0, 1)")
    validation_fraction: float = field(0.1, help="share of each class's files in the validation split, in (0, 1); "
                                                 "its sum with --test-fraction < 1")
    seed: int = field(42, help="seed of the deterministic train/validation/test assignment")
    # 32 MiB: fastest in the loader benchmark's sweep (docs/benchmarks.md), and still >= 25 test row groups
    # for a Caltech-256-sized input (30,607 images at 299 px, 10 % test)
    row_group_mb: float = field(32.0, help="target uncompressed row-group size, MiB, in (0, 1024]; fewer rows "
                                           "if a split needs --min-row-groups")
    min_row_groups: int = field(8, help="minimum row groups per split (when it has the rows): the largest "
                                        "world size training can use")
    max_pixels: int = field(DEFAULT_MAX_PIXELS, help="images with more pixels are rejected as decompression bombs")
    max_file_mb: float = field(50.0, help="files larger than this are rejected unread, MiB; refused before "
                                          "Spark if executors cannot hold it")
    dedupe: bool = field(True, help="keep one copy of each image, reject the rest (one more Spark pass); "
                                    "else copies may cross splits")
    num_partitions: int = field(0, help="Spark tasks for hashing and decoding; 0 = at least 2 per core and "
                                         "at most 500 images a task")
    master: Optional[str] = field(None, help="Spark master when not set by spark-submit (default local[*])")
    verbose: Optional[bool] = verbose_field("Spark's INFO log")
    tracking: Optional[bool] = field(None, help=trk.HELP["tracking"])
    tracking_uri: str = field("", help=trk.HELP["tracking_uri"])
    experiment: str = field("pipelines-etl", help=trk.HELP["experiment"])
    run_name: str = field("", help=trk.HELP["run_name"])
    storage_options: Dict[str, str] = storage_options_field()

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("test_fraction", "validation_fraction"):
            check_number(name, getattr(self, name), above=0, below=1)
        if self.test_fraction + self.validation_fraction >= 1.0:
            raise Refused(f"--test-fraction {self.test_fraction} and --validation-fraction "
                          f"{self.validation_fraction} add up to {self.test_fraction + self.validation_fraction:g}: "
                          "they must leave a share of each class to train on (their sum below 1)")
        if not 0 < self.image_size <= MAX_IMAGE_SIZE:  # the contract's bound: readers refuse larger
            raise Refused(f"--image-size must be in 1..{MAX_IMAGE_SIZE}, got {self.image_size}")
        check_number("row_group_mb", self.row_group_mb, above=0, at_most=1024, why="Arrow binary arrays hold < 2 GiB")
        check_number("max_file_mb", self.max_file_mb, above=0)
        if self.max_pixels < 1:
            raise Refused(f"--max-pixels must be >= 1, got {self.max_pixels}")
        if not self.input or not self.output:
            raise Refused("--input and --output must not be empty")
        if any(ch in self.input for ch in "*?[]{}\\"):
            raise Refused(f"--input {self.input!r} contains a glob character (* ? [ ] {{ }} \\), which "
                          "Spark would expand: rename or link the folder")
        if self.min_row_groups < 1:
            raise Refused(f"--min-row-groups must be >= 1, got {self.min_row_groups}")
        if self.num_partitions < 0:
            raise Refused(f"--num-partitions must be >= 0, got {self.num_partitions}")
        storage.check_not_root(self.output, "--output")  # a run's commit cleans its output folder
        self.input = self.location(self.input).uri
        # Training opens a local output by file:// URL: refuse now what it could not open later.
        self.output = self.location(self.output).uri
        if storage.is_local(self.output):
            self.output = check_url_safe(self.output, "--output")
        if self.storage_options and storage.is_local(self.input) and storage.is_local(self.output):
            raise Refused("--storage-option is only used for URIs (s3://...), and --input and --output are local")
        settings = read_settings()  # here, in the launching process: the one read of the environment
        self.verbose = settle_verbose(self.verbose, settings)
        self.tracking, self.tracking_uri = trk.resolve(self.tracking, self.tracking_uri, self.output, self.experiment,
                                                       settings)

    def location(self, uri: str) -> storage.Location:
        """``uri`` resolved with ``--storage-option``, which applies to URIs only."""
        return storage.resolve(uri, None if storage.is_local(uri) else self.storage_options)

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.image_size)
