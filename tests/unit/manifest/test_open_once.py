"""A part is checked and read as one file: a name swapped after its check (for a folder with a
planted ``_common_metadata``, a link, another file) is refused, never read, and links among a
data folder's parts and run folders are refused by name before any reader opens a file.

Real ETL-shaped outputs (``runs/<run id>/<split>/part-*.parquet``), both readers (Petastorm where
it runs, our own), the one-pass shard and the predict job's plan; the planted pickle writes a
marker file when unpickled, which must never appear."""
import os
import shutil
import subprocess
import sys

import pytest

from pipelines.io.nofollow import LinkRefused
from pipelines.manifest import ManifestError
from pipelines.predict.inputs import plan_split, private_copies
from pipelines.training.data import READERS, OnePassShard, load_dataset, open_reader, petastorm_available, row_groups_of
from tests.support.datagen import write_split
from tests.support.env import REPO, subprocess_env
from tests.support.planted import plant_common_metadata
from tests.unit.manifest.test_manifest_checks import RUN, SIZE, write_output

READERS_HERE = list(READERS) if petastorm_available() else ["own"]
TRAIN_PART = f"runs/{RUN}/train/part-00000.parquet"


def first_rows(data, reader):
    with open_reader(data, "train", 0, 1, None, reader=reader) as opened:
        return next(row_groups_of(opened, SIZE))


def swap_for_folder(root, part, marker):
    """Replace ``root/part`` by a folder holding a real part and a planted ``_common_metadata``."""
    path = os.path.join(root, part)
    os.remove(path)
    write_split(path, [2], SIZE, rows_per_group=2)
    plant_common_metadata(path, marker)


def swap_for_link(root, part, tmp_path):
    """Replace ``root/part`` by a link to a copy of it outside the data folder (same bytes)."""
    path, outside = os.path.join(root, part), str(tmp_path / "outside.parquet")
    shutil.copy(path, outside)
    os.remove(path)
    os.symlink(outside, path)


def swap_for_file(root, part, tmp_path):
    """Replace ``root/part`` by another regular file (a copy renamed over it: another inode)."""
    path, other = os.path.join(root, part), str(tmp_path / "etl" / "other.parquet")
    shutil.copy(path, other)
    os.replace(other, path)


SWAPS = {"folder": lambda root, tmp_path, marker: swap_for_folder(root, TRAIN_PART, marker),
         "link": lambda root, tmp_path, marker: swap_for_link(root, TRAIN_PART, tmp_path),
         "file": lambda root, tmp_path, marker: swap_for_file(root, TRAIN_PART, tmp_path)}


@pytest.mark.parametrize("swap", list(SWAPS))
@pytest.mark.parametrize("reader", READERS_HERE)
def test_a_part_swapped_after_its_footer_check_is_refused_by_the_reader(tmp_path, swap, reader):
    """A one-part train split: the rank loaded and checked it (footers read), then the name is
    swapped; opening the reader refuses it and nothing is unpickled."""
    root, marker = str(tmp_path / "etl"), str(tmp_path / "unpickled")
    write_output(root, groups=(1, 1, 1))
    data = load_dataset(root, 1)
    data.check_footers()
    SWAPS[swap](root, tmp_path, marker)
    with pytest.raises(LinkRefused, match="part-00000.parquet"):
        first_rows(data, reader)
    assert not os.path.exists(marker)


@pytest.mark.parametrize("swap", list(SWAPS))
def test_a_part_swapped_after_loading_is_refused_by_every_other_read(tmp_path, swap):
    """The footer check, the one-pass shard, the data's identity and a copy for predict all read
    the file pinned at load or nothing."""
    root, marker = str(tmp_path / "etl"), str(tmp_path / "unpickled")
    write_output(root, groups=(1, 1, 1))
    data = load_dataset(root, 1)
    plan = plan_split(os.path.join(root, "train"), SIZE)
    SWAPS[swap](root, tmp_path, marker)
    for read in (data.check_footers, lambda: OnePassShard(data, "train", 0, 1), data.identity,
                 lambda: private_copies(plan, str(tmp_path))):
        with pytest.raises(LinkRefused, match="part-00000.parquet"):
            read()
    assert not os.path.exists(marker)


def test_a_part_swapped_between_two_row_groups_is_refused_mid_read(tmp_path):
    """A one-pass read opens the part per row group: the read after a swap is refused."""
    root, marker = str(tmp_path / "etl"), str(tmp_path / "unpickled")
    write_output(root, groups=(2, 1, 1))
    data = load_dataset(root, 1)
    shard = OnePassShard(data, "train", 0, 1)
    batches = shard.batches()
    next(batches)
    swap_for_folder(root, TRAIN_PART, marker)
    with pytest.raises(LinkRefused):
        next(batches)
    assert not os.path.exists(marker)


@pytest.mark.parametrize("linked", ["runs", f"runs/{RUN}", f"runs/{RUN}/train", TRAIN_PART])
def test_a_linked_part_or_run_folder_is_refused_by_name_before_any_read(tmp_path, linked):
    """The link names a copy of the same data outside ``--data``: refused all the same, when the
    data is loaded (training's check before ranks, every rank) and when predict plans the split."""
    root, outside = str(tmp_path / "etl"), str(tmp_path / "outside")
    write_output(root)
    shutil.move(os.path.join(root, linked), outside)
    os.symlink(outside, os.path.join(root, linked))
    shown = os.path.join(root, linked)
    with pytest.raises(ManifestError, match=f"{shown} is a symbolic link"):
        load_dataset(root, 1)
    with pytest.raises(ManifestError, match="is a symbolic link"):
        plan_split(os.path.join(root, "train" if linked != f"runs/{RUN}/train" else "validation"), SIZE)


def test_a_linked_run_folder_exits_2_in_one_line_before_any_rank_starts(tmp_path):
    """``jobs/train.py --spark-np -2`` on data whose run folder is a link: exit 2, one line naming
    it, TensorFlow never loaded, no output."""
    data, out = str(tmp_path / "data"), tmp_path / "out"
    write_output(data, groups=(4, 2, 2))
    run = os.path.join(data, "runs", RUN)
    shutil.move(run, str(tmp_path / "elsewhere"))
    os.symlink(str(tmp_path / "elsewhere"), run)
    main = ("import runpy, sys; sys.argv = ['jobs/train.py', *sys.argv[1:]]\n"
            "try:\n    runpy.run_path('jobs/train.py', run_name='__main__')\n"
            "finally:\n    print('tensorflow loaded:', 'tensorflow' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", main, "--data", data, "--output", str(out), "--weights", "none",
                           "--backbone", "tiny", "--spark-np", "-2"], capture_output=True, text=True, cwd=REPO,
                          env=subprocess_env(), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and f"{run} is a symbolic link" in proc.stderr, proc.stderr
    assert proc.stdout.strip() == "tensorflow loaded: False"
    assert not out.exists()


def test_unswapped_parts_read_as_before_and_predict_copies_are_private(tmp_path):
    """The control: nothing swapped, every reader reads the rows; predict's copies are the same
    bytes, mode 0600."""
    root = str(tmp_path / "etl")
    write_output(root)
    data = load_dataset(root, 1)
    for reader in READERS_HERE:
        images, labels = first_rows(data, reader)
        assert images.shape == (2, SIZE, SIZE, 3) and len(labels) == 2
    copies = private_copies(plan_split(os.path.join(root, "test"), SIZE), str(tmp_path))
    assert len(copies.parts) == 1 and os.stat(copies.parts[0]).st_mode & 0o777 == 0o600
    with open(copies.parts[0], "rb") as f, open(os.path.join(root, f"runs/{RUN}/test/part-00000.parquet"), "rb") as g:
        assert f.read() == g.read()



def test_a_racing_link_flip_never_gets_the_links_rows_read(tmp_path):
    """A thread flips the part between itself and a link to a part of other rows (outside the
    data folder) while the own reader and one-pass reads read it again and again: every read
    gives the part's own rows or a refusal, never the link's."""
    import threading
    import time

    root = str(tmp_path / "etl")
    write_output(root, groups=(1, 1, 1))
    outside = str(tmp_path / "outside")
    write_split(outside, [1], SIZE, first_id=100, rows_per_group=2)  # labels 100, 101
    path, parked = os.path.join(root, TRAIN_PART), str(tmp_path / "etl" / "parked")
    data = load_dataset(root, 1)
    own = set(next(OnePassShard(data, "train", 0, 1).batches())[1].tolist())
    stop, flips = threading.Event(), [0]

    def flip():
        while not stop.is_set():
            os.rename(path, parked)
            os.symlink(os.path.join(outside, "part-00000.parquet"), path)
            os.remove(path)
            os.rename(parked, path)
            flips[0] += 1

    flipper = threading.Thread(target=flip)
    flipper.start()
    seen, refused, deadline = set(), 0, time.monotonic() + 3
    try:
        while time.monotonic() < deadline and (flips[0] < 10 or refused < 10):
            try:
                seen.update(next(OnePassShard(data, "train", 0, 1).batches())[1].tolist())
            except (LinkRefused, FileNotFoundError):  # a link, or the name between two renames
                refused += 1
    finally:
        stop.set()
        flipper.join()
    assert flips[0] >= 10 and refused >= 10, (flips, refused)  # the race was run, and hit
    assert seen <= own == {0, 1}, seen  # never the link's rows (100, 101)
