"""The ETL's manifest, typed and checked: what training and batch inference read of an ETL output.

``OUTPUT/manifest.json`` (:data:`pipelines.contract.MANIFEST`, written last, in one PUT: the
commit) is a :class:`Manifest`: the stored images' side, the classes, the row groups, and for each
split its counts and its parts, the only files a reader reads (:meth:`Manifest.part_locations`).
It comes from a folder anyone may have written, so nothing in it is used before it is checked:
its values against the contract's bounds (:func:`check_manifest`), its parts' footers against its
counts and the contract's columns (:meth:`Manifest.check_footers`). :func:`data_identity` names the
data one ETL run holds. The names, columns and bounds themselves are :mod:`pipelines.contract`'s.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from pipelines.contract import (
    MANIFEST,
    MANIFEST_FORMAT,
    MAX_CLASSES,
    MAX_IMAGE_SIZE,
    MAX_ROW_GROUP_BYTES,
    PART_NAME,
    REJECTED_LIST,
    RUN_ID,
    RUNS,
    SPLITS,
    VALIDATION,
    image_schema,
    row_bytes,
)
from pipelines.io import nofollow
from pipelines.io.pinned import pin
from pipelines.io.storage import Location, resolve
from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural


class ManifestError(Refused):
    """A ``manifest.json`` that cannot be read as this contract's: another shape, a value out of
    bounds, a part that is not a file of its own run's split folder, or footers that disagree."""


def _location(root):
    """``root`` (a path, a URI or a :class:`pipelines.io.storage.Location`) as a Location. A URI
    string is resolved without storage options: a caller whose store needs them passes the
    Location it resolved with them (``Dataset.location``)."""
    return root if isinstance(root, Location) else resolve(root)


def manifest_sha256(root) -> str:
    """sha256 of the bytes of ``root/manifest.json``: the identity of one ETL output (the manifest
    records when it was made, its counts and its row groups), which its runs are tracked by.

    Args:
        root: the output, a path, URI or :class:`pipelines.io.storage.Location`.

    Raises:
        FileNotFoundError: ``root`` has no manifest.
    """
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
        """The manifest of the output ``root`` (a path, URI or :class:`pipelines.io.storage.Location`).

        Raises:
            FileNotFoundError: ``root`` has no ``manifest.json`` (not an ETL output).
            pipelines.io.storage.StorageError: ``root`` cannot be resolved.
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
        (``files.list``, relative to ``root``), a :class:`pipelines.io.storage.Location`."""
        return _location(root).join(*self.extra.get("files", {}).get("list", REJECTED_LIST).split("/"))

    def part_locations(self, root, split: str) -> list:
        """The Parquet files of ``split``, each a :class:`pipelines.io.pinned.PinnedFile`: the
        manifest's ``parts`` below ``root`` (their names checked by :func:`check_manifest`), or for
        a format-1 manifest the ``*.parquet`` files of ``root/<split>/`` (names starting with ``_``
        or ``.`` excluded), sorted. Only regular files, each checked as it is opened: a local part
        is opened without following a link anywhere below ``root`` and pinned (device, inode), so a
        reader reads that file or nothing (:mod:`pipelines.io.pinned`); an object's key is found to
        be a file by one listing of its folder. A reader handed a folder (Petastorm, pyarrow) would
        read the folder's ``_common_metadata``, and Petastorm unpickles the schema it finds there.

        Raises:
            ManifestError: a part that is missing, a link, in a linked folder, or not a file (a
                folder named like a part), naming it.
        """
        root = _location(root)
        parts = self.splits[split].parts or [f"{split}/{name}" for name in _format_1_names(root, split)]
        if not root.local and self.splits[split].parts:
            _check_listed(root, split, parts)
        return [_pin_part(root, split, part) for part in parts]

    def check_footers(self, root, parts: Optional[Dict[str, list]] = None) -> None:
        """Check every part's Parquet footer against the manifest before any reader sizes
        anything by it: the contract's columns and types (:data:`COLUMNS`), no row group over
        ``rows_per_row_group`` rows, and each split's rows and row groups the manifest's counts.
        One footer read per part (a ranged read of its tail; no image is read).

        Args:
            parts: ``{split: pinned parts}`` already found (:meth:`part_locations`); a split
                missing from it is found here.

        Raises:
            ManifestError: naming the part and what disagrees. FileNotFoundError, OSError: a part
                cannot be read.
        """
        import pyarrow.parquet as pq

        root, schema = _location(root), image_schema()
        for split, info in self.splits.items():
            rows = groups = 0
            for part in (parts or {}).get(split) or self.part_locations(root, split):
                with part.open() as f:
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


def _format_1_names(root, split: str) -> List[str]:
    """The ``*.parquet`` names directly in a format-1 output's ``root/<split>/`` (not ``_``/``.``)."""
    if root.local:
        names = nofollow.list_below(root.path, split)
    else:
        names = [location.name for location in root.join(split).files(".parquet")]
    return [n for n in names if n.endswith(".parquet") and not n.startswith(("_", "."))]


def _check_listed(root, split: str, parts: List[str]) -> None:
    """Refuse an object store's part that one listing of its folder does not show as a file."""
    import pyarrow.fs as pafs

    folder = root.join(*parts[0].split("/")[:-1])
    files = {i.base_name for i in folder.list(recursive=False) if i.type == pafs.FileType.File}
    for part in parts:
        if part.rsplit("/", 1)[-1] not in files:
            raise ManifestError(f"{root.uri}: the {split} part {part} named in {MANIFEST} is not a file "
                                f"of {folder.uri} (missing, or a folder): refused before any reader opens it")


def _pin_part(root, split: str, part: str):
    """:func:`pipelines.io.pinned.pin` of one part, its refusal a :class:`ManifestError` naming it."""
    try:
        return pin(root, part)
    except (nofollow.LinkRefused, FileNotFoundError, NotADirectoryError) as exc:
        raise ManifestError(f"{root.uri}: the {split} part {part} named in {MANIFEST} is not a file of this "
                            f"output (missing, a folder, or a link): {exc}") from None


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
# training is keyed by (the feature cache, pipelines/training/data/features.py).


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


def data_identity(root, manifest: "Manifest", parts: Optional[Dict[str, list]] = None) -> DataIdentity:
    """The :class:`DataIdentity` of the output ``root`` whose manifest is ``manifest``: one footer
    read per part (a ranged read of each file's tail; no image is read), ``parts`` as
    :meth:`Manifest.check_footers` takes them.

    Raises:
        FileNotFoundError: a part the manifest names is missing. OSError: it cannot be read.
    """
    import pyarrow.parquet as pq

    root = _location(root)
    digest = hashlib.sha256(json.dumps({"run_id": manifest.extra.get("run_id")}).encode())
    for split in sorted(manifest.splits):
        for part in (parts or {}).get(split) or manifest.part_locations(root, split):
            with part.open() as f:
                size, footer = f.size(), pq.read_metadata(f).to_dict()
            record = {"split": split, "part": part.relative_to(root), "bytes": size, "footer": footer}
            digest.update(json.dumps(record, sort_keys=True, default=str).encode())
    return DataIdentity(manifest.extra.get("run_id"), digest.hexdigest())
