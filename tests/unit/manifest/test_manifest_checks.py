"""A manifest is input anyone may have written: its parts, numbers and footers are checked before
any reader opens a file or sizes anything by it. Real ETL-shaped outputs (runs/<run id>/<split>/
part-*.parquet, tests/support/datagen.py's rows), crafted manifests, and a planted ``_common_metadata``
whose pickle writes a marker file when unpickled: after each refusal the marker must not exist."""
import contextlib
import json
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.contract import MAX_CLASSES, MAX_IMAGE_SIZE
from pipelines.manifest import Manifest, ManifestError
from pipelines.runtime.errors import Refused
from pipelines.predict.inputs import plan_split
from pipelines.training.data import (READERS, OnePassShard, load_dataset, open_reader, petastorm_available,
                                     row_groups_of)
from tests.support.datagen import write_split
from tests.support.planted import plant_common_metadata

RUN, OTHER = "20261201T000000000000Z-abcdef", "20261130T000000000000Z-012345"
SIZE = 4


def write_output(root, groups=(2, 1, 1), rows_per_group=2) -> dict:
    """A format-3 output below ``runs/RUN/``: train, validation, test of ``groups`` row groups
    (one part each), its manifest written and returned as a dict."""
    splits, next_id = {}, 0
    for split, n in zip(("train", "validation", "test"), groups):
        folder = os.path.join(root, "runs", RUN, split)
        end = write_split(folder, [n], SIZE, first_id=next_id, rows_per_group=rows_per_group)
        splits[split] = {"rows": end - next_id, "row_groups": n, "files": 1,
                         "parts": [f"runs/{RUN}/{split}/part-00000.parquet"]}
        next_id = end
    manifest = {"format_version": 3, "run_id": RUN, "image": {"height": SIZE, "width": SIZE, "channels": 3},
                "num_classes": next_id, "class_names": [str(i) for i in range(next_id)],
                "rows_per_row_group": rows_per_group, "splits": splits}
    write_manifest(root, manifest)
    return manifest


def read_train(root, reader="own"):
    """What a training rank does first with ``root``: load it, open a reader of its train split."""
    with open_reader(load_dataset(root, 1), "train", 0, 1, None, reader=reader) as opened:
        return next(iter(opened))


def write_manifest(root, manifest):
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def test_a_well_formed_output_loads_and_names_its_files(tmp_path):
    write_output(str(tmp_path))
    data = load_dataset(str(tmp_path), 1)
    assert [p.relative_to(data.location) for p in data.parts("train")] == [f"runs/{RUN}/train/part-00000.parquet"]
    assert (data.train_rows, data.validation_rows, data.test_rows) == (4, 2, 2)


def test_a_part_naming_a_folder_is_refused_before_petastorm_unpickles_its_metadata(tmp_path):
    """The folder is named like a part and holds a real part and a planted _common_metadata."""
    root, marker = str(tmp_path / "etl"), str(tmp_path / "unpickled")
    manifest = write_output(root)
    folder = os.path.join(root, "runs", RUN, "train", "part-evil.parquet")
    write_split(folder, [2], SIZE, rows_per_group=2)
    plant_common_metadata(folder, marker)
    manifest["splits"]["train"]["parts"] = [f"runs/{RUN}/train/part-evil.parquet"]
    write_manifest(root, manifest)
    for reader in READERS if petastorm_available() else ("own",):
        with pytest.raises(ManifestError, match="part-evil.parquet named in manifest.json is not a file"):
            read_train(root, reader)
    with pytest.raises(ManifestError, match="is not a file"):
        OnePassShard(load_dataset(root, 1), "validation", 0, 1)
    with pytest.raises(ManifestError, match="is not a file"):
        plan_split(os.path.join(root, "train"), SIZE)
    assert not os.path.exists(marker)
    if petastorm_available():  # the control: Petastorm handed that folder unpickles the plant
        from petastorm.etl.dataset_metadata import get_schema_from_dataset_url

        with contextlib.suppress(Exception):  # what it does after unpickling does not matter
            get_schema_from_dataset_url("file://" + folder)
        assert os.path.exists(marker)


@pytest.mark.skipif(not petastorm_available(), reason="Petastorm cannot run with this pyarrow")
def test_petastorm_reads_the_parts_and_never_a_pickle_beside_them(tmp_path):
    """A _common_metadata planted beside the parts (and at the run and the root) is never read:
    Petastorm is handed files only, so it infers its schema from them."""
    root, marker = str(tmp_path / "etl"), str(tmp_path / "unpickled")
    write_output(root)
    for folder in (os.path.join(root, "runs", RUN, "train"), os.path.join(root, "runs", RUN), root):
        plant_common_metadata(folder, marker)
    data = load_dataset(root, 1)
    with open_reader(data, "train", 0, 1, None, reader="petastorm") as reader:
        images, labels = next(row_groups_of(reader, SIZE))
    assert images.shape[1:] == (SIZE, SIZE, 3) and len(labels) == 2
    assert not os.path.exists(marker)


@pytest.mark.parametrize("part", [
    f"runs/{RUN}/train/../../{OTHER}/train/part-00000.parquet",  # ``..``
    f"runs/{RUN}/train/../test/part-00000.parquet",
    f"/tmp/runs/{RUN}/train/part-00000.parquet",  # absolute
    f"runs/{OTHER}/train/part-00000.parquet",  # another run's prefix
    f"runs/{RUN}/test/part-00000.parquet",  # another split's file
    f"runs/{RUN}/train",  # the folder itself
    f"runs/{RUN}/train/sub/part-00000.parquet",
    f"runs/{RUN}/train/_common_metadata",
    f"runs/{RUN}/train/part-00000.parquet/",
    "manifest.json", 7, None])
def test_a_part_outside_its_runs_split_folder_is_refused_before_any_file_is_read(tmp_path, part):
    manifest = write_output(str(tmp_path))
    manifest["splits"]["train"]["parts"] = [part]
    with pytest.raises(ManifestError, match=re.escape(f"the train part {part!r} is not runs/{RUN}/train/part-")):
        Manifest.from_dict(manifest)
    write_manifest(str(tmp_path), manifest)
    with pytest.raises(Refused):  # what training and predict see: the same refusal, exit 2
        load_dataset(str(tmp_path), 1)
    with pytest.raises(Refused):
        plan_split(os.path.join(str(tmp_path), "train"), SIZE)


@pytest.mark.parametrize("run_id", [None, "../x", OTHER + "/..", ""])
def test_parts_need_the_manifests_own_run_id(tmp_path, run_id):
    manifest = write_output(str(tmp_path))
    manifest["run_id"] = run_id
    with pytest.raises(ManifestError, match="names parts but its run_id .* is not a run id"):
        Manifest.from_dict(manifest)


def test_a_part_named_twice_is_refused(tmp_path):
    manifest = write_output(str(tmp_path))
    manifest["splits"]["train"]["parts"] *= 2
    with pytest.raises(ManifestError, match="names a part twice"):
        Manifest.from_dict(manifest)


@pytest.mark.parametrize("edit,message", [
    (lambda m: m["image"].update(height=MAX_IMAGE_SIZE + 1), f"image.height is {MAX_IMAGE_SIZE + 1}, outside 1..4096"),
    (lambda m: m["image"].update(height=0), "image.height is 0, outside"),
    (lambda m: m["image"].update(height=10**12), "image.height is 1000000000000, outside"),
    (lambda m: m["image"].update(height="4"), "image.height is '4', not an integer"),
    (lambda m: m["image"].update(height=4.5), "image.height is 4.5, not an integer"),
    (lambda m: m.update(num_classes=MAX_CLASSES + 1), f"num_classes is {MAX_CLASSES + 1}, outside"),
    (lambda m: m.update(num_classes=True), "num_classes is True, not an integer"),
    (lambda m: m.update(num_classes=3), "one name .* for each of the 3 labels, got 8 entries"),
    (lambda m: m.update(rows_per_row_group=10**9), r"rows_per_row_group is 1000000000, outside 1\.\.22369622"),
    (lambda m: m.update(rows_per_row_group=0), "rows_per_row_group is 0, outside"),
    (lambda m: m["splits"]["train"].update(rows=2**41), "splits.train.rows is 2199023255552, outside"),
    (lambda m: m["splits"]["train"].update(row_groups=-1), "splits.train.row_groups is -1, outside 0.."),
    (lambda m: m["splits"]["test"].update(per_class=[1, 1]), "per_class has 2 counts, not one per label"),
    (lambda m: m.pop("splits"), "not an ETL manifest of this contract .KeyError"),
])
def test_numbers_out_of_bounds_are_refused_before_they_size_anything(tmp_path, edit, message):
    manifest = write_output(str(tmp_path))
    edit(manifest)
    with pytest.raises(ManifestError, match=message):
        Manifest.from_dict(manifest)


def test_the_largest_row_group_the_etl_writes_is_accepted(tmp_path):
    """1024 MiB, the ETL's largest --row-group-mb, of 299 px rows (268,203 bytes): round(4003.49)
    = 4,003 rows; the bound is 4,004 (1024 MiB and one row), 4,005 is refused."""
    manifest = write_output(str(tmp_path))
    manifest.update(image={"height": 299}, rows_per_row_group=round(1024 * 2**20 / 268_203))
    assert Manifest.from_dict(manifest).rows_per_row_group == 4003
    manifest.update(rows_per_row_group=4005)
    with pytest.raises(ManifestError, match=r"rows_per_row_group is 4005, outside 1\.\.4004"):
        Manifest.from_dict(manifest)


def _rewrite(root, split, table, row_group_size):
    pq.write_table(table, os.path.join(root, "runs", RUN, split, "part-00000.parquet"), row_group_size=row_group_size)


@pytest.mark.parametrize("change,message", [
    (lambda root, m: m["splits"]["train"].update(rows=5), "footers hold 4 rows in 2 row groups, its manifest.json "
                                                           "says 5 in 2"),
    (lambda root, m: m["splits"]["test"].update(row_groups=2, rows=2), "footers hold 2 rows in 1 row group, .* "
                                                                       "says 2 in 2"),
    (lambda root, m: m.update(rows_per_row_group=1), "a row group of 2 rows, over the manifest's rows_per_row_group 1"),
    (lambda root, m: _rewrite(root, "test", pq.read_table(os.path.join(root, "runs", RUN, "test", "part-00000.parquet"))
                              .drop_columns(["height"]), 2), "its columns are not the contract's"),
    (lambda root, m: _rewrite(root, "test", pq.read_table(os.path.join(root, "runs", RUN, "test", "part-00000.parquet"))
                              .cast(pa.schema([("path", pa.string()), ("label", pa.int64()), ("label_name", pa.string()),
                                               ("image", pa.binary()), ("height", pa.int32()),
                                               ("width", pa.int32())])), 2), "its columns are not the contract's"),
])
def test_footers_that_disagree_with_the_manifest_are_refused_before_a_reader_opens(tmp_path, change, message):
    root = str(tmp_path)
    manifest = write_output(root)
    change(root, manifest)
    write_manifest(root, manifest)
    with pytest.raises(ManifestError, match=message):
        read_train(root)
    split = "train" if manifest["splits"]["train"]["rows"] == 5 else "test"
    with pytest.raises(ManifestError, match=message):
        plan_split(os.path.join(root, split), SIZE)


def test_a_missing_part_is_refused(tmp_path):
    manifest = write_output(str(tmp_path))
    os.remove(os.path.join(str(tmp_path), "runs", RUN, "validation", "part-00000.parquet"))
    with pytest.raises(ManifestError, match="the validation part .* is not a file"):
        read_train(str(tmp_path))
    assert manifest["splits"]["validation"]["parts"] == [f"runs/{RUN}/validation/part-00000.parquet"]


def test_the_etl_never_writes_an_image_size_its_readers_refuse(tmp_path):
    from pipelines.etl.config import ETLConfig

    assert ETLConfig(input=str(tmp_path), output=str(tmp_path / "o"), image_size=MAX_IMAGE_SIZE).image_size == 4096
    with pytest.raises(Refused, match=r"--image-size must be in 1\.\.4096, got 4097"):
        ETLConfig(input=str(tmp_path), output=str(tmp_path / "o"), image_size=MAX_IMAGE_SIZE + 1)
