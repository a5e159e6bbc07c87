"""The contract between the ETL and training, stated once: file names, splits, schema, manifest::

    OUTPUT/manifest.json                          the manifest, written last, in one PUT: the commit
    OUTPUT/runs/<run id>/<split>/part-*.parquet   each split's files (named in the manifest), COLUMNS rows
    OUTPUT/runs/<run id>/rejected.jsonl           every input file not written, with status and reason

A column, name or key changes here (and in `pipelines.manifest`), with a new ``format_version`` if old outputs break."""
from __future__ import annotations

import re
from typing import Any, Optional

from pipelines.runtime.errors import Refused

MANIFEST = "manifest.json"
REJECTED_LIST = "rejected.jsonl"
RUNS = "runs"  # OUTPUT/runs/<run id>/: one ETL run's files
# A run id (pipelines/etl/commit.py new_run_id: UTC start time to the microsecond, 6 random hex
# digits) and the name of a part one ETL task writes (pipelines/etl/transform.py: part-<task>).
RUN_ID = re.compile(r"^\d{8}T\d{12}Z-[0-9a-f]{6}$")
PART_NAME = re.compile(r"^part-[0-9A-Za-z_-]{1,64}\.parquet$")
# The three splits, each stratified by class, seeded and deterministic (pipelines/etl/labels.py):
# training fits on TRAIN, chooses its epoch (early stopping, best weights, fine-tuning's start) on
# VALIDATION only, and reads TEST once, after training, for the figure it reports.
TRAIN, VALIDATION, TEST = "train", "validation", "test"
SPLITS = (TRAIN, VALIDATION, TEST)
EVALUATED = (VALIDATION, TEST)  # read whole, every row once (the training reads TRAIN in a loop)
# Format 3: the VALIDATION split. A format-2 manifest (train and test only) still reads
# (Manifest.from_dict, batch inference on its splits) but never trains: selecting an epoch on its
# test split would report a figure chosen on the data it is reported on (pipelines/training/data/dataset.py).
MANIFEST_FORMAT = 3

# A training run's output folder (``jobs/train.py --output``), which batch inference reads a model
# from: the names stated once. MODEL_SHA256 is model.json's key holding the hex sha256 of the bytes of
# MODEL_FILE, which a reader checks before loading it.
MODEL_FILE = "model.keras"
MODEL_CONTRACT = "model.json"
MODEL_SHA256 = "model_sha256"
METRICS = "metrics.json"
HISTORY = "history.csv"
CLASS_NAMES = "class_names.json"
TENSORBOARD = "tensorboard"  # a folder: TensorBoard's event files
TRAIN_RUN = "train_run.json"  # which training run the output belongs to (pipelines/training/records/ownership.py)
PROGRESS = "progress.json"  # the last step rank 0 saw end (pipelines/training/records/progress.py): steps redone
CHECKPOINT_WEIGHTS = "checkpoint-{epoch}.npz"  # epoch N's trainable weights and optimizer state
CHECKPOINT_MARKER = "checkpoint-{epoch}.json"  # its completion marker, written after the weights
# a checkpoint within epoch N (1-based), after its STEP-th training step (1-based, fewer than the epoch's)
STEP_CHECKPOINT_WEIGHTS = "checkpoint-{epoch}-step-{step}.npz"
STEP_CHECKPOINT_MARKER = "checkpoint-{epoch}-step-{step}.json"
# any of the four, epoch and step >= 1
CHECKPOINT_NAME = re.compile(r"^checkpoint-([1-9][0-9]*)(?:-step-([1-9][0-9]*))?\.(npz|json)$")

# (name, pyarrow type name): what each split's Parquet files hold, in order.
COLUMNS = (
    ("path", "string"),       # the source file, absolute
    ("label", "int32"),
    ("label_name", "string"),
    ("image", "binary"),      # row_bytes(size) bytes: uint8 RGB, row-major HWC
    ("height", "int32"),      # of the original, after EXIF orientation
    ("width", "int32"),
)


def plain_name(name: Any, what: str, pattern: Optional["re.Pattern"] = None) -> str:
    """``name``, read from a file, checked to be the plain name of a file beside it (matching ``pattern`` if given).

    Plain: non-empty, without ``/``, a backslash or NUL, not ``.`` or ``..``. Raises `Refused` naming ``what``."""
    if not isinstance(name, str) or not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise Refused(f"{what}: the name {name!r} is not a plain file name")
    if pattern is not None and not pattern.fullmatch(name):
        raise Refused(f"{what}: the name {name!r} is not of the form {pattern.pattern}")
    return name


# Bounds of a manifest's numbers, checked before any of them sizes an allocation (a cache, a row
# group, a model's head). MAX_ROW_GROUP_BYTES is the ETL's largest --row-group-mb (1024 MiB): a row
# group holds at most that, or one row (pipelines/etl/layout.py rows_per_row_group).
MAX_IMAGE_SIZE = 4096  # 48 MiB a row
MAX_CLASSES = 100_000
MAX_ROW_GROUP_BYTES = 1024 * 2**20


def image_schema():
    """The pyarrow schema of `COLUMNS` (pyarrow imported only when asked for)."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, type_name)()) for name, type_name in COLUMNS])


# The ETL's default side of its stored square images, pixels: Xception's own input size
# (tf.keras.applications.Xception, "default input image size for this model is 299x299").
DEFAULT_IMAGE_SIZE = 299


def row_bytes(image_size: int) -> int:
    """Bytes of one stored image, uint8 RGB, square: the one statement of ``image_size ** 2 * 3``."""
    return image_size * image_size * 3


# The model's input contract, the same in training, in the exported model (model.json's "input")
# and in batch inference: the ETL's stored image itself, uint8 RGB (batch, S, S, 3), values 0-255.
# Every model takes it as it is and preprocesses inside its graph, on its own device, as its
# backbone's row says (pipelines/backbones.py: float32 = image * scale + offset; Xception's
# preprocess_input, x / 127.5 - 1, for xception). No caller preprocesses: a caller that did would
# preprocess twice.
MODEL_INPUT_NAME = "image"
MODEL_INPUT_DTYPE = "uint8"
MODEL_INPUT_RANGE = (0, 255)


# The leases of the trainings that read an ETL run (pipelines/io/leases.py:
# OUTPUT/runs/<run id>/READERS/<reader>.json), which its commit keeps.
READERS = "readers"
