"""The ETL's output as training sees it: its manifest, checked once, and the refusals of a run it cannot feed."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional

from pipelines.contract import MANIFEST, MANIFEST_FORMAT, SPLITS, TEST, TRAIN, VALIDATION
from pipelines.io.paths import check_url_safe
from pipelines.io.storage import check_reachable, resolve
from pipelines.manifest import Manifest, data_identity
from pipelines.runtime.logs import plural
from pipelines.training.data.errors import DataError

if TYPE_CHECKING:
    from pipelines.io.pinned import PinnedFile


@dataclass(frozen=True)
class Dataset:
    """An ETL output folder (``root``, ``Manifest``): uint8 RGB HWC images, ``stored_size`` px; global counts."""

    root: str
    manifest: Manifest
    storage_options: Dict[str, str] = field(default_factory=dict, compare=False)
    _footers_checked: List[bool] = field(default_factory=list, compare=False, repr=False)  # [True] once checked
    _parts: Dict[str, List[PinnedFile]] = field(default_factory=dict, compare=False, repr=False)  # found once

    def check_footers(self) -> None:
        """The manifest's footer check (``ManifestError``), once, before a reader opens a part or sizes a cache."""
        if not self._footers_checked:
            self.manifest.check_footers(self.location, self.pin_parts())
            self._footers_checked.append(True)

    def pin_parts(self) -> Dict[str, List[PinnedFile]]:
        """``{split: parts}``, found, opened and checked once; ``ManifestError``: a part missing, a link, not a file."""
        if not self._parts:
            location = self.location
            self._parts.update({split: self.manifest.part_locations(location, split) for split in self.manifest.splits})
        return self._parts

    @property
    def location(self):
        """The root as a ``pipelines.io.storage.Location`` (a local folder or a URI)."""
        return resolve(self.root, self.storage_options)

    @property
    def stored_size(self) -> int:
        """Side of the stored square images in pixels (the ETL's ``--image-size``), not the model's input side."""
        return self.manifest.image_size

    @property
    def num_classes(self) -> int:
        return self.manifest.num_classes

    @property
    def class_names(self) -> List[Optional[str]]:
        return self.manifest.class_names

    @property
    def rows_per_row_group(self) -> int:
        return self.manifest.rows_per_row_group

    @property
    def row_bytes(self) -> int:
        return self.manifest.row_bytes

    def rows(self, split: str) -> int:
        return self.manifest.splits[split].rows

    def row_groups(self, split: str) -> int:
        return self.manifest.splits[split].row_groups

    @property
    def train_rows(self) -> int:
        return self.rows(TRAIN)

    @property
    def validation_rows(self) -> int:
        return self.rows(VALIDATION)

    @property
    def test_rows(self) -> int:
        return self.rows(TEST)

    @property
    def run_id(self) -> Optional[str]:
        """The ETL run the manifest commits (``None``: a format-1 manifest)."""
        return self.manifest.extra.get("run_id")

    def identity(self):
        """The data's ``DataIdentity`` (run id, each part's path, size and footer), the feature cache's key."""
        return data_identity(self.location, self.manifest, self.pin_parts())

    def parts(self, split: str) -> list:
        """The split's Parquet files in the manifest's order, footers checked: a reader reads these and nothing else."""
        self.check_footers()
        return self.pin_parts()[split]


def load_dataset(root: str, world_size: int, storage_options: Optional[Dict[str, str]] = None) -> Dataset:
    """Read and check the ETL's ``manifest.json`` for a run of ``world_size`` ranks.

    Args:
        root: a local folder, ``file://`` URL or URI (``s3://bucket/etl``).

    Raises:
        DataError: not an ETL output, no validation split, an empty split, fewer train row groups than ranks.
        StorageError: an unknown scheme, a missing bucket, refused credentials.
        UnsafePathError: ``root`` holds a character a ``file://`` URL cannot carry.
        ManifestError: a manifest out of bounds, or a part outside its split folder or not a regular file."""
    location = resolve(root, storage_options)
    check_reachable(location, "--data")
    # Petastorm opens the parts by URL, a URI's too (petastorm.legacy_fs.split_urls)
    check_url_safe(location.path if location.local else "/" + location.path, "--data")
    root = location.uri
    try:
        data = Dataset(root, Manifest.read(location), dict(storage_options or {}))
    except FileNotFoundError:
        raise DataError(f"no {MANIFEST} in {root}: --data must be the output folder of jobs/etl.py") from None
    check_validation_split(data.manifest, root)
    for split in SPLITS:
        if data.rows(split) == 0:
            raise DataError(f"the {split} split of {root} is empty")
    check_train_row_groups(data, world_size)
    data.pin_parts()  # a part that is a link, or in a linked run folder, is refused here, by name
    return data


def check_validation_split(manifest: Manifest, root: str) -> None:
    """Refuse (``DataError``) a manifest with train and test splits only: choosing epochs on test would flatter it."""
    if VALIDATION not in manifest.splits:
        raise DataError(f"{root} was written by an older ETL (manifest format {manifest.format_version}: "
                        f"{' and '.join(manifest.splits)} splits only): training chooses its epoch on a "
                        f"validation split, never on the test split it reports; rerun jobs/etl.py on the "
                        f"images to write train, validation and test (manifest format {MANIFEST_FORMAT})")


def check_train_row_groups(data: Dataset, world_size: int) -> None:
    """Refuse (``DataError``) a train split of fewer row groups than ranks: each rank reads whole row groups."""
    groups = data.row_groups(TRAIN)
    if groups < world_size:
        raise DataError(f"the train split has {plural(groups, 'row group')} but {plural(world_size, 'rank')} need "
                        f"one each (a rank reads whole row groups): use at most {plural(groups, 'rank')}, or rerun "
                        f"the ETL with --min-row-groups {world_size} (or a smaller --row-group-mb)")
