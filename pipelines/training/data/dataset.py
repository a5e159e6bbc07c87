"""The ETL's output as training sees it: its manifest, checked once, and the refusals of a run it cannot feed.

:class:`Dataset` is an ETL output's ``root`` and its :class:`pipelines.manifest.Manifest`: the
global counts (all ranks) the step arithmetic is planned from
(:func:`pipelines.training.schedule.plan_steps`), the classes, the stored images' size, and the
split's Parquet parts, the only files a reader opens. :func:`load_dataset` reads and checks it on
every rank (and once before any rank starts: :func:`pipelines.training.plan.check_run`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from pipelines.contract import MANIFEST, MANIFEST_FORMAT, SPLITS, TEST, TRAIN, VALIDATION
from pipelines.io.paths import check_url_safe
from pipelines.io.storage import check_reachable, resolve
from pipelines.manifest import Manifest, data_identity
from pipelines.runtime.logs import plural
from pipelines.training.data.errors import DataError


@dataclass(frozen=True)
class Dataset:
    """An ETL output folder as training sees it: its ``root`` and its :class:`Manifest`.

    Images are uint8 RGB, HWC, :attr:`stored_size` pixels square; the counts are global (all ranks).
    """

    root: str
    manifest: Manifest
    storage_options: Dict[str, str] = field(default_factory=dict, compare=False)
    _footers_checked: list = field(default_factory=list, compare=False, repr=False)  # [True] once checked
    _parts: dict = field(default_factory=dict, compare=False, repr=False)  # {split: pinned parts}, found once

    def check_footers(self) -> None:
        """:meth:`pipelines.manifest.Manifest.check_footers`, once per Dataset: before any reader
        opens a part or sizes a cache by the manifest's counts (:meth:`parts` and
        :func:`pipelines.training.data.readers.open_reader` call it).

        Raises:
            pipelines.manifest.ManifestError: a part that is not a file, footers that disagree.
        """
        if not self._footers_checked:
            self.manifest.check_footers(self.location, self.pin_parts())
            self._footers_checked.append(True)

    def pin_parts(self) -> dict:
        """``{split: parts}``: every split's parts found, opened and checked once
        (:meth:`pipelines.manifest.Manifest.part_locations`: regular files, no link below the
        root), the only files any reader of this Dataset opens, each as the file pinned here.

        Raises:
            pipelines.manifest.ManifestError: a part missing, a link, or not a file, naming it.
        """
        if not self._parts:
            location = self.location
            self._parts.update({split: self.manifest.part_locations(location, split) for split in self.manifest.splits})
        return self._parts

    @property
    def location(self):
        """The root as a :class:`pipelines.io.storage.Location` (a local folder or a URI)."""
        return resolve(self.root, self.storage_options)

    @property
    def stored_size(self) -> int:
        """Side of the stored square images in pixels: the ETL's ``--image-size`` (the manifest's
        ``image_size``), not the model's input side (``TrainConfig.model.input_size``)."""
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
        """The data's :class:`pipelines.manifest.DataIdentity`: the run id and every part's path,
        size and Parquet footer (one footer read per part), what results kept beyond a run are
        keyed by (the feature cache)."""
        return data_identity(self.location, self.manifest, self.pin_parts())

    def parts(self, split: str) -> list:
        """The split's Parquet files as the manifest names them (:class:`pipelines.io.pinned.PinnedFile`,
        :meth:`pin_parts`), in the manifest's order: a reader reads these and nothing else (a rerun
        of the ETL may be writing other files next to them); their footers checked first
        (:meth:`check_footers`)."""
        self.check_footers()
        return self.pin_parts()[split]


def load_dataset(root: str, world_size: int, storage_options: Optional[Dict[str, str]] = None) -> Dataset:
    """Read and check the ETL's ``manifest.json`` for a run of ``world_size`` ranks.

    Args:
        root: a local folder, ``file://`` URL or URI (``s3://bucket/etl``).
        storage_options: ``--storage-option`` values for a URI's backend.

    Raises:
        DataError: no manifest (not an ETL output), a manifest without a validation split
            (:func:`check_validation_split`), an empty split, or fewer row groups in the train split
            than ranks (:func:`check_train_row_groups`).
        pipelines.io.storage.StorageError: an unknown scheme, a missing bucket, refused credentials.
        pipelines.io.paths.UnsafePathError: ``root`` holds a character a ``file://`` URL cannot carry.
        pipelines.manifest.ManifestError: a manifest out of bounds or naming a part outside its
            run's split folder (:func:`pipelines.manifest.check_manifest`), a part that is not a
            regular file of ``root`` (a link, in a linked folder, a folder); its footers are checked
            before the first reader opens (:meth:`Dataset.check_footers`).
    """
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
    """Refuse a manifest of an older format, with train and test splits only.

    Training chooses its epoch (early stopping, best weights, fine-tuning's start) on the
    validation split and reads the test split once, for the figure it reports; a two-split
    output could only choose on test, which makes that figure optimistic. The rule is a refusal,
    not a hold-out carved from train here: the ETL's split is the one place a split is decided
    (stratified, seeded, recorded in the manifest), and rerunning it is cheap next to training.

    Raises:
        DataError: naming the manifest's format and the command that writes three splits.
    """
    if VALIDATION not in manifest.splits:
        raise DataError(f"{root} was written by an older ETL (manifest format {manifest.format_version}: "
                        f"{' and '.join(manifest.splits)} splits only): training chooses its epoch on a "
                        f"validation split, never on the test split it reports; rerun jobs/etl.py on the "
                        f"images to write train, validation and test (manifest format {MANIFEST_FORMAT})")


def check_train_row_groups(data: Dataset, world_size: int) -> None:
    """Refuse a train split of fewer row groups than ranks: its looping readers give each rank
    whole row groups (:func:`~pipelines.training.data.sharding.shard`), so a rank would have none. (The
    test split is read by one-pass shards, by rows where ranks outnumber its row groups: never
    refused.)

    Raises:
        DataError: naming both numbers and the ETL flags that give more row groups
            (``--min-row-groups``: the fewest per split; ``--row-group-mb``: their size).
    """
    groups = data.row_groups(TRAIN)
    if groups < world_size:
        raise DataError(f"the train split has {plural(groups, 'row group')} but {plural(world_size, 'rank')} need "
                        f"one each (a rank reads whole row groups): use at most {plural(groups, 'rank')}, or rerun "
                        f"the ETL with --min-row-groups {world_size} (or a smaller --row-group-mb)")
