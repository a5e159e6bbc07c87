"""The contract between the ETL and training, stated once: file names, splits, schema, manifest.

The ETL (``pipelines.etl``) writes an output folder that training (``pipelines.training``) reads;
neither imports the other, both import this module::

    OUTPUT/manifest.json                       the Manifest below, written last, in one PUT: the commit
    OUTPUT/runs/<run id>/<split>/part-*.parquet each split's Parquet files, named in the manifest
                                               (``splits.<split>.parts``, relative to OUTPUT): IMAGE_SCHEMA
                                               rows, row groups of rows_per_row_group rows
    OUTPUT/runs/<run id>/rejected.jsonl        every input file not written, with status and reason
                                               (named in the manifest: ``files.list``)

OUTPUT is a local path or a URI (:mod:`pipelines.storage`). Each ETL run writes below its own run
prefix (``run_id`` in the manifest: UTC time, then a random suffix, so ids sort by start time) and
commits by writing the manifest; then it deletes the runs older than itself, never a newer one
(:mod:`pipelines.etl.commit`). Readers read the files the manifest names and nothing else: that is
what makes an output on an object store (no atomic rename) safe while a rerun writes next to it,
or dies half-way. A format-1 manifest names no parts; its split's files are the ``*.parquet``
files of ``OUTPUT/<split>/`` (:meth:`Manifest.part_locations`).

Changing a column, a file name or a manifest key means changing it here, and the manifest's
``format_version`` when old outputs can no longer be read.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from pipelines.errors import Refused

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
    """``name``, read from a file (a checkpoint marker, a run record), checked to be the plain name
    of a file beside that file: a non-empty string without ``/``, ``\\`` or NUL, not ``.`` or ``..``
    (so never absolute nor outside the folder, on a local disk or an object store), and matching
    ``pattern`` when given (e.g. :data:`CHECKPOINT_NAME`).

    Raises:
        ValueError: naming ``what`` (where the name was read) and the name.
    """
    if not isinstance(name, str) or not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise Refused(f"{what}: the name {name!r} is not a plain file name")
    if pattern is not None and not pattern.fullmatch(name):
        raise Refused(f"{what}: the name {name!r} is not of the form {pattern.pattern}")
    return name


class ManifestError(Refused):
    """A ``manifest.json`` that cannot be read as this contract's: another shape, a value out of
    bounds, a part that is not a file of its own run's split folder, or footers that disagree."""


# Bounds of a manifest's numbers, checked before any of them sizes an allocation (a cache, a row
# group, a model's head). MAX_ROW_GROUP_BYTES is the ETL's largest --row-group-mb (1024 MiB): a row
# group holds at most that, or one row (pipelines/etl/layout.py rows_per_row_group).
MAX_IMAGE_SIZE = 4096  # 48 MiB a row
MAX_CLASSES = 100_000
MAX_ROW_GROUP_BYTES = 1024 * 2**20


def image_schema():
    """The pyarrow schema of :data:`COLUMNS` (pyarrow is imported only when asked for)."""
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, type_name)()) for name, type_name in COLUMNS])


# The ETL's default side of its stored square images, pixels: Xception's own input size
# (tf.keras.applications.Xception, "default input image size for this model is 299x299").
DEFAULT_IMAGE_SIZE = 299


def row_bytes(image_size: int) -> int:
    """Bytes of one stored image: ``image_size ** 2 * 3`` (uint8 RGB, square), the one statement
    of that formula (``row_bytes(299)`` = 268,203)."""
    return image_size * image_size * 3


# The model's input contract, the same in training, in the exported model (model.json's "input")
# and in batch inference: the ETL's stored image itself, uint8 RGB (batch, S, S, 3), values 0-255.
# Every model takes it as it is and preprocesses inside its graph, on its own device:
# float32 = image * PREPROCESS_SCALE + PREPROCESS_OFFSET (Xception's preprocess_input, x / 127.5 - 1,
# in [-1, 1]). No caller preprocesses: a caller that did would preprocess twice.
MODEL_INPUT_NAME = "image"
MODEL_INPUT_DTYPE = "uint8"
MODEL_INPUT_RANGE = (0, 255)
PREPROCESS_SCALE = 1 / 127.5
PREPROCESS_OFFSET = -1.0


def _location(root):
    """``root`` (a path, a URI or a :class:`pipelines.storage.Location`) as a Location."""
    from pipelines.storage import Location, resolve

    return root if isinstance(root, Location) else resolve(root)


def manifest_sha256(root) -> str:
    """sha256 of the bytes of ``root/manifest.json``: the identity of one ETL output (the manifest
    records when it was made, its counts and its row groups), which its runs are tracked by.

    Args:
        root: the output, a path, URI or :class:`pipelines.storage.Location`.

    Raises:
        FileNotFoundError: ``root`` has no manifest.
    """
    import hashlib

    return hashlib.sha256(_location(root).join(MANIFEST).read_bytes()).hexdigest()


@dataclass(frozen=True)
class SplitInfo:
    """One split as the ETL wrote it, counts read back from the Parquet footers.

    Attributes:
        rows, files, row_groups: counts. mean_row_group_bytes(_compressed): bytes per row group.
        per_class: rows per label, ``per_class[label]``.
        parts: the split's Parquet files, ``/``-separated paths relative to the output root, in
            the order readers take them (empty in a format-1 manifest).
    """

    rows: int
    row_groups: int
    files: int = 0
    mean_row_group_bytes: int = 0
    mean_row_group_bytes_compressed: int = 0
    per_class: List[int] = dataclasses.field(default_factory=list)
    parts: List[str] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``, typed where training reads it; ``extra`` keeps every other top-level
    key the ETL reports (file counts, reasons, seed, versions, config) as they are.

    Attributes:
        image_size: side of the stored square images, pixels.
        num_classes: labels are ``0 .. num_classes - 1``.
        class_names: name of each label (``None`` for a number no folder used).
        rows_per_row_group: rows of every row group but each file's last.
        splits: ``{split: SplitInfo}`` for each of :data:`SPLITS` the manifest holds (a format-2
            manifest has no ``validation``).
        format_version: the manifest's ``format_version`` (1 when absent).
    """

    image_size: int
    num_classes: int
    class_names: List[Optional[str]]
    rows_per_row_group: int
    splits: Dict[str, SplitInfo]
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)
    format_version: int = MANIFEST_FORMAT

    _TYPED = ("format_version", "image", "num_classes", "class_names", "rows_per_row_group", "splits")

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.image_size)

    @classmethod
    def from_dict(cls, value: Dict[str, Any]) -> "Manifest":
        """Parse the JSON object and check it (:func:`check_manifest`): a manifest comes from a
        folder anyone may have written, so nothing in it is used before it is checked.

        Raises:
            ManifestError: another shape (a missing key, a count that is not an integer), or a
                value :func:`check_manifest` refuses.
        """
        fields = {f.name for f in dataclasses.fields(SplitInfo)}
        try:
            manifest = cls(image_size=_integer(value["image"]["height"], "image.height"),
                           num_classes=_integer(value["num_classes"], "num_classes"),
                           class_names=list(value["class_names"]),
                           rows_per_row_group=_integer(value["rows_per_row_group"], "rows_per_row_group"),
                           splits={s: SplitInfo(**{k: v for k, v in value["splits"][s].items() if k in fields})
                                   for s in SPLITS if s != VALIDATION or s in value["splits"]},
                           extra={k: v for k, v in value.items() if k not in cls._TYPED},
                           format_version=_integer(value.get("format_version", 1), "format_version"))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(f"{MANIFEST} is not an ETL manifest of this contract ({type(exc).__name__}: "
                                f"{exc})") from None
        check_manifest(manifest)
        return manifest

    def to_dict(self) -> Dict[str, Any]:
        """The JSON object: format version, image, classes, row groups, splits, then ``extra``."""
        return {"format_version": self.format_version,
                "image": {"height": self.image_size, "width": self.image_size, "channels": 3, "dtype": "uint8",
                          "layout": "HWC", "column": "image"},
                "num_classes": self.num_classes, "class_names": self.class_names,
                "rows_per_row_group": self.rows_per_row_group,
                "splits": {s: {"path": s, **dataclasses.asdict(info)} for s, info in self.splits.items()},
                **self.extra}

    @classmethod
    def read(cls, root) -> "Manifest":
        """The manifest of the output ``root`` (a path, URI or :class:`pipelines.storage.Location`).

        Raises:
            FileNotFoundError: ``root`` has no ``manifest.json`` (not an ETL output).
            pipelines.storage.StorageError: ``root`` cannot be resolved.
        """
        return cls.from_dict(json.loads(_location(root).join(MANIFEST).read_bytes().decode("utf-8")))

    def write(self, root) -> str:
        """Write ``root/manifest.json`` whole or not at all (one PUT on object stores, a rename on
        local disks); returns its URI."""
        target = _location(root).join(MANIFEST)
        target.write_json(self.to_dict())
        return target.uri

    def rejected_location(self, root):
        """The list of files not written (:data:`REJECTED_LIST`), as the manifest names it
        (``files.list``, relative to ``root``), a :class:`pipelines.storage.Location`."""
        return _location(root).join(*self.extra.get("files", {}).get("list", REJECTED_LIST).split("/"))

    def part_locations(self, root, split: str) -> list:
        """The Parquet files of ``split`` as :class:`pipelines.storage.Location`: the manifest's
        ``parts`` below ``root`` (their names checked by :func:`check_manifest`), each found to be
        a file by one listing of its run's split folder, or for a format-1 manifest the
        ``*.parquet`` files of ``root/<split>/`` (names starting with ``_`` or ``.`` excluded),
        sorted. Only files: a reader handed a folder (Petastorm, pyarrow) would read the folder's
        ``_common_metadata``, and Petastorm unpickles the schema it finds there.

        Raises:
            ManifestError: a part that is missing or is not a file (a folder named like a part).
        """
        import pyarrow.fs as pafs

        root = _location(root)
        parts = self.splits[split].parts
        if not parts:
            return root.join(split).files(".parquet")
        folder = root.join(*parts[0].split("/")[:-1])
        files = {i.base_name for i in folder.list(recursive=False) if i.type == pafs.FileType.File}
        for part in parts:
            if part.rsplit("/", 1)[-1] not in files:
                raise ManifestError(f"{root.uri}: the {split} part {part} named in {MANIFEST} is not a file "
                                    f"of {folder.uri} (missing, or a folder): refused before any reader opens it")
        return [root.join(*p.split("/")) for p in parts]

    def check_footers(self, root) -> None:
        """Check every part's Parquet footer against the manifest before any reader sizes
        anything by it: the contract's columns and types (:data:`COLUMNS`), no row group over
        ``rows_per_row_group`` rows, and each split's rows and row groups the manifest's counts.
        One footer read per part (a ranged read of its tail; no image is read).

        Raises:
            ManifestError: naming the part and what disagrees. FileNotFoundError, OSError: a part
                cannot be read.
        """
        import pyarrow.parquet as pq

        from pipelines.logs import plural

        root, schema = _location(root), image_schema()
        for split, info in self.splits.items():
            rows = groups = 0
            for part in self.part_locations(root, split):
                with part.filesystem.open_input_file(part.path) as f:
                    meta = pq.read_metadata(f)
                shown = f"{root.uri}: {part.relative_to(root)}"
                if not meta.schema.to_arrow_schema().remove_metadata().equals(schema):
                    raise ManifestError(f"{shown}: its columns are not the contract's {schema.names} "
                                        f"({meta.schema.to_arrow_schema().remove_metadata()})")
                largest = max((meta.row_group(g).num_rows for g in range(meta.num_row_groups)), default=0)
                if largest > self.rows_per_row_group:
                    raise ManifestError(f"{shown}: a row group of {plural(largest, 'row')}, over the manifest's "
                                        f"rows_per_row_group {self.rows_per_row_group}")
                rows, groups = rows + meta.num_rows, groups + meta.num_row_groups
            if (rows, groups) != (info.rows, info.row_groups):
                raise ManifestError(f"{root.uri}: the {split} split's footers hold {plural(rows, 'row')} in "
                                    f"{plural(groups, 'row group')}, its {MANIFEST} says {info.rows} in "
                                    f"{info.row_groups}")


def _integer(value: Any, what: str) -> int:
    """``value``, a JSON integer (not a bool, a float or a string)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestError(f"{MANIFEST}: {what} is {value!r}, not an integer")
    return value


def _bounded(value: Any, what: str, low: int, high: int) -> int:
    value = _integer(value, what)
    if not low <= value <= high:
        raise ManifestError(f"{MANIFEST}: {what} is {value}, outside {low}..{high}")
    return value


def check_manifest(manifest: "Manifest") -> None:
    """Refuse a manifest whose values could make a reader allocate without bound or read a file
    that is not its run's: every number an integer within its bound (:data:`MAX_IMAGE_SIZE`,
    :data:`MAX_CLASSES`, a row group of at most :data:`MAX_ROW_GROUP_BYTES` or one row), one class
    name (a string or null) per label, and each part ``runs/<run id>/<split>/part-*.parquet``
    (:data:`RUN_ID`, :data:`PART_NAME`): the manifest's own ``run_id`` and the split it is listed
    under, so never absolute, never ``..``, never another run's file, each named once. No file is
    read (:meth:`Manifest.part_locations` checks each part is a file, :meth:`Manifest.check_footers`
    the footers).

    Raises:
        ManifestError: naming the key and the value refused.
    """
    _bounded(manifest.image_size, "image.height", 1, MAX_IMAGE_SIZE)
    _bounded(manifest.num_classes, "num_classes", 1, MAX_CLASSES)
    if len(manifest.class_names) != manifest.num_classes or not all(
            n is None or isinstance(n, str) for n in manifest.class_names):
        raise ManifestError(f"{MANIFEST}: class_names must hold one name (a string or null) for each of the "
                            f"{manifest.num_classes} labels, got {len(manifest.class_names)} entries")
    most_rows = max(1, (MAX_ROW_GROUP_BYTES + manifest.row_bytes) // manifest.row_bytes)
    _bounded(manifest.rows_per_row_group, "rows_per_row_group", 1, most_rows)
    run_id = manifest.extra.get("run_id")
    for split, info in manifest.splits.items():
        _bounded(info.rows, f"splits.{split}.rows", 0, 2**40)
        _bounded(info.row_groups, f"splits.{split}.row_groups", 0, 2**40)
        if info.per_class and len(info.per_class) != manifest.num_classes:
            raise ManifestError(f"{MANIFEST}: splits.{split}.per_class has {len(info.per_class)} counts, "
                                f"not one per label ({manifest.num_classes})")
        if not info.parts:
            continue
        if not (isinstance(run_id, str) and RUN_ID.fullmatch(run_id)):
            raise ManifestError(f"{MANIFEST}: names parts but its run_id {run_id!r} is not a run id")
        prefix = f"{RUNS}/{run_id}/{split}/"
        for part in info.parts:
            if not (isinstance(part, str) and part.startswith(prefix) and PART_NAME.fullmatch(part[len(prefix):])):
                raise ManifestError(f"{MANIFEST}: the {split} part {part!r} is not {prefix}part-*.parquet, a "
                                    "file of this run's own split folder: refused before any file is read")
        if len(set(info.parts)) != len(info.parts):
            raise ManifestError(f"{MANIFEST}: the {split} split names a part twice")


# The identity of an ETL run's data, which every result derived from it and kept beyond one
# training is keyed by (the feature cache, pipelines/training/data/features.py), and the leases of the
# trainings that read it (pipelines/leases.py: OUTPUT/runs/<run id>/READERS/<reader>.json).
READERS = "readers"


@dataclass(frozen=True)
class DataIdentity:
    """Which data an ETL output holds: ``run_id`` (the manifest's, ``None`` in a format-1
    manifest) and ``sha256``, hex, of the run id and, for every split the manifest holds, each
    part's path relative to the output, its size in bytes and its Parquet footer (row groups, rows,
    each column chunk's offsets, sizes and statistics). A rerun of the ETL is another run id, so
    another identity even with the same counts; files changed in place (a format-1 output has no
    run prefix) change their footers' byte sizes and offsets."""

    run_id: Optional[str]
    sha256: str

    def to_dict(self) -> Dict[str, Any]:
        return {"run_id": self.run_id, "sha256": self.sha256}


def data_identity(root, manifest: "Manifest") -> DataIdentity:
    """The :class:`DataIdentity` of the output ``root`` whose manifest is ``manifest``: one footer
    read per part (a ranged read of each file's tail; no image is read).

    Raises:
        FileNotFoundError: a part the manifest names is missing. OSError: it cannot be read.
    """
    import hashlib

    import pyarrow.parquet as pq

    root = _location(root)
    digest = hashlib.sha256(json.dumps({"run_id": manifest.extra.get("run_id")}).encode())
    for split in sorted(manifest.splits):
        for part in manifest.part_locations(root, split):
            with part.filesystem.open_input_file(part.path) as f:
                size, footer = f.size(), pq.read_metadata(f).to_dict()
            record = {"split": split, "part": part.relative_to(root), "bytes": size, "footer": footer}
            digest.update(json.dumps(record, sort_keys=True, default=str).encode())
    return DataIdentity(manifest.extra.get("run_id"), digest.hexdigest())
