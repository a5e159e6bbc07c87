"""The ETL's manifest, typed and checked: what training and batch inference read of an ETL output.

Nothing in it (anyone may have written it) is used before `check_manifest` and `Manifest.check_footers` check it."""
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
    """A ``manifest.json`` not of this contract: another shape, a value out of bounds, a foreign part, bad footers."""


def _location(root):
    """A path or URI resolved without storage options; a store that needs them is passed as a `Location`."""
    return root if isinstance(root, Location) else resolve(root)


def manifest_sha256(root) -> str:
    """sha256 of ``root/manifest.json``'s bytes: the identity of one ETL output, which its runs are tracked by."""
    return hashlib.sha256(_location(root).join(MANIFEST).read_bytes()).hexdigest()


@dataclass(frozen=True)
class SplitInfo:
    """One split as written: counts, rows per label, ``parts`` relative to the output (none in format 1)."""

    rows: int
    row_groups: int
    files: int = 0
    mean_row_group_bytes: int = 0
    mean_row_group_bytes_compressed: int = 0
    per_class: List[int] = dataclasses.field(default_factory=list)
    parts: List[str] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``, typed where training reads it; ``extra`` keeps the other top-level keys as they are.

    Attributes:
        image_size: side of the stored square images, pixels.
        class_names: name of each label (``None`` for a number no folder used)."""

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
        """Parse the JSON object and check it (`check_manifest`); `ManifestError` for another shape."""
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
        return {"format_version": self.format_version,
                "image": {"height": self.image_size, "width": self.image_size, "channels": 3, "dtype": "uint8",
                          "layout": "HWC", "column": "image"},
                "num_classes": self.num_classes, "class_names": self.class_names,
                "rows_per_row_group": self.rows_per_row_group,
                "splits": {s: {"path": s, **dataclasses.asdict(info)} for s, info in self.splits.items()},
                **self.extra}

    @classmethod
    def read(cls, root) -> "Manifest":
        """The manifest of the output ``root``; FileNotFoundError when it has none (not an ETL output)."""
        return cls.from_dict(json.loads(_location(root).join(MANIFEST).read_bytes().decode("utf-8")))

    def write(self, root) -> str:
        """Write ``root/manifest.json`` whole or not at all; returns its URI."""
        target = _location(root).join(MANIFEST)
        target.write_json(self.to_dict())
        return target.uri

    def rejected_location(self, root):
        """The list of files not written, as the manifest names it (``files.list``)."""
        return _location(root).join(*self.extra.get("files", {}).get("list", REJECTED_LIST).split("/"))

    def part_locations(self, root, split: str) -> list:
        """The Parquet files of ``split`` (format 1: ``ROOT/<split>/*.parquet``), pinned; `ManifestError` if not files.

        Only regular files: a reader handed a folder would read its ``_common_metadata``, which Petastorm unpickles."""
        root = _location(root)
        parts = self.splits[split].parts or [f"{split}/{name}" for name in _format_1_names(root, split)]
        if not root.local and self.splits[split].parts:
            _check_listed(root, split, parts)
        return [_pin_part(root, split, part) for part in parts]

    def check_footers(self, root, parts: Optional[Dict[str, list]] = None) -> None:
        """Check each part's footer (one ranged read): columns, row groups, counts; raises `ManifestError`."""
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
    try:
        return pin(root, part)
    except (nofollow.LinkRefused, FileNotFoundError, NotADirectoryError) as exc:
        raise ManifestError(f"{root.uri}: the {split} part {part} named in {MANIFEST} is not a file of this "
                            f"output (missing, a folder, or a link): {exc}") from None


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestError(f"{MANIFEST}: {what} is {value!r}, not an integer")
    return value


def _bounded(value: Any, what: str, low: int, high: int) -> int:
    value = _integer(value, what)
    if not low <= value <= high:
        raise ManifestError(f"{MANIFEST}: {what} is {value}, outside {low}..{high}")
    return value


def check_manifest(manifest: "Manifest") -> None:
    """Refuse (`ManifestError`) values that could make a reader allocate without bound or read a file not its run's.

    Every number an integer within its bound, one class name per label, and each part
    ``runs/<run id>/<split>/part-*.parquet`` of the manifest's own ``run_id`` and split, named once."""
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


# the key of every result derived from an ETL run's data and kept beyond one training (the feature cache)


@dataclass(frozen=True)
class DataIdentity:
    """Which data an ETL output holds: ``run_id``, and a hex ``sha256`` of it and its parts' paths, sizes, footers."""

    run_id: Optional[str]
    sha256: str

    def to_dict(self) -> Dict[str, Any]:
        return {"run_id": self.run_id, "sha256": self.sha256}


def data_identity(root, manifest: "Manifest", parts: Optional[Dict[str, list]] = None) -> DataIdentity:
    """The `DataIdentity` of the output ``root``: one footer read per part, ``parts`` as `check_footers` takes."""
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
