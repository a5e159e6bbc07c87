"""The flat row-group cache: its files (round trips, damage, planted content that must not run),
both stores of them (ours, RowGroupFiles; Petastorm's diskcache through RowGroupDisk, real
diskcache, no Petastorm), the cache folders' ownership, the readers' two forms of a row group,
and each real reader whose warm epochs come from the flat files."""
import glob
import mmap
import os
import stat
from collections import Counter, namedtuple

import numpy as np
import pyarrow as pa
import pytest

from pipelines.training.data import DataError, load_dataset, open_reader, petastorm_available, row_groups_of
from pipelines.training.data.rowcache import SUFFIX, RowGroupFiles, flat_columns, rank_cache_folder
from tests.support.datagen import write_dataset
from tests.support.readers import READERS

Group = namedtuple("Group", "image label")  # a reader's batch, as row_groups_of reads it


def images(n, size, first=0):
    return np.array([np.full(size * size * 3, (first + i) % 256, np.uint8).tobytes() for i in range(n)], dtype=object)


FLAT = {
    "images and labels": lambda: {"image": images(5, 4), "label": np.arange(5, dtype=np.int32)},
    "several dtypes and shapes": lambda: {"image": images(3, 2, 7), "label": np.arange(3, dtype=np.int64),
                                          "box": np.arange(12, dtype=np.float64).reshape(3, 4),
                                          "flag": np.array([True, False, True])},
    "one row": lambda: {"image": images(1, 3), "label": np.array([9], np.int32)},
    "images only, wide": lambda: {"image": images(2, 299)},
    "no rows": lambda: {"image": np.array([], dtype=object), "label": np.array([], np.int32)},
    "columns of several writes each": lambda: {  # WRITE_BYTES at a time, the last write short
        "image": (np.arange(3 * 3 * 484 * 484) % 251).astype(np.uint8).reshape(3, -1),
        "label": np.arange(3, dtype=np.int32), "box": np.linspace(0, 1, 300_001)},
}
NOT_FLAT = {  # neither store caches these (a reader's row group never is one of them)
    "images of two lengths": lambda: {"image": np.array([b"abc", b"de"], dtype=object), "label": np.arange(2)},
    "a column of str": lambda: {"name": np.array(["a", "b"], dtype=object)},
    "an Arrow table": lambda: pa.table({"label": [1, 2]}),
    "a list, not a dict": lambda: [np.arange(3)],
    "a dict holding a list": lambda: {"label": [1, 2]},
    "dates": lambda: {"when": np.array(["2026-11-30"], dtype="datetime64[D]")},
    "records": lambda: {"box": np.zeros(2, dtype=[("x", "<i4"), ("y", "<f8")])},
    "a masked array": lambda: {"label": np.ma.masked_array([1, 2], mask=[False, True])},
}


def equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) and a.dtype == object and b.dtype != object:  # flattened bytes column
        return b.shape == (len(a), len(a[0]) if len(a) else 0) and b.tobytes() == b"".join(a)
    if isinstance(a, np.ma.MaskedArray):
        return isinstance(b, np.ma.MaskedArray) and np.array_equal(a.mask, b.mask) and np.array_equal(a.data, b.data)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, pa.Table):
        return a.equals(b)
    return all(equal(x, y) for x, y in zip(a, b)) if isinstance(a, list) else a == b


class Files:
    """Our reader's store, with the interface of a diskcache (set, get)."""

    def __init__(self, folder):
        self.files = RowGroupFiles(rank_cache_folder(folder, "rank0-train"), 1 << 30)

    def set(self, key, value):
        return self.files.put(key, value)

    def get(self, key):
        return self.files.get(key)


def diskcache_store(folder):
    diskcache = pytest.importorskip("diskcache")
    from pipelines.training.data.petastorm.reader import RowGroupDisk

    return diskcache.FanoutCache(rank_cache_folder(folder, "rank0-train"), 3, disk=RowGroupDisk, size_limit=1 << 30)


STORES = [pytest.param("files", id="own-files"), pytest.param("diskcache", id="petastorm-diskcache")]


@pytest.fixture(params=STORES)
def cache(request, tmp_path):
    if request.param == "files":
        yield Files(str(tmp_path / "cache"))
    else:
        with diskcache_store(str(tmp_path / "cache")) as c:
            yield c


def flat_files(tmp_path):
    return glob.glob(str(tmp_path / "cache" / "**" / f"*{SUFFIX}"), recursive=True)


@pytest.mark.parametrize("name", FLAT)
def test_a_row_group_is_one_flat_owner_only_file_mapped_back_without_a_copy(cache, tmp_path, name):
    value = FLAT[name]()
    assert cache.set("k", value)
    files = flat_files(tmp_path)
    assert len(files) == 1 and stat.S_IMODE(os.stat(files[0]).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "cache" / "rank0-train").st_mode) == 0o700  # no one else enters
    got = cache.get("k")
    assert equal(value, got)
    for array in got.values():
        assert not array.flags.writeable
        base = array
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)  # a view of the file, no copy
        assert array.ctypes.data % 64 == 0 or array.nbytes == 0
    if "label" in value:
        size = int(np.sqrt(got["image"].shape[1] / 3)) or 4
        (pixels, labels), = row_groups_of([Group(got["image"], got["label"])], size)
        assert len(pixels) == len(labels) == len(value["label"])  # no rows stay readable once cached


@pytest.mark.parametrize("name", NOT_FLAT)
def test_anything_else_is_not_cached(cache, tmp_path, name):
    value = NOT_FLAT[name]()
    assert flat_columns(value) is None
    assert not cache.set("k", value)
    assert cache.get("k") is None and not flat_files(tmp_path)


def test_evicted_row_groups_leave_no_file_and_read_as_misses(tmp_path):
    """Petastorm's store: diskcache evicts the oldest row groups (ours never evicts: a shard is
    sized to fit, and what does not is not stored)."""
    diskcache = pytest.importorskip("diskcache")
    from pipelines.training.data.petastorm.reader import RowGroupDisk

    one = FLAT["images only, wide"]()
    size = 2 * 299 * 299 * 3
    with diskcache.Cache(str(tmp_path / "c"), disk=RowGroupDisk, size_limit=3 * size,
                         eviction_policy="least-recently-stored", cull_limit=10) as c:
        for key in range(8):
            c.set(key, one)
        kept = [key for key in range(8) if c.get(key) is not None]
        assert 0 < len(kept) < 8 and kept == list(range(8 - len(kept), 8))  # the oldest went first
        assert len(glob.glob(str(tmp_path / "c" / "**" / f"*{SUFFIX}"), recursive=True)) == len(kept)
        os.remove(glob.glob(str(tmp_path / "c" / "**" / f"*{SUFFIX}"), recursive=True)[0])
        assert sum(c.get(key) is None for key in kept) == 1  # a file gone under the cache is a miss



def cut(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def grow(path, size):
    with open(path, "ab") as f:
        f.write(b"junk")


def scribble_header(path, size):
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(b"\xff" * 16)


DAMAGE = {"emptied": lambda p, n: cut(p, 0), "cut inside the length": lambda p, n: cut(p, 4),
          "cut inside the header": lambda p, n: cut(p, 20), "one byte short": lambda p, n: cut(p, n - 1),
          "junk appended": grow, "header overwritten": scribble_header, "deleted": lambda p, n: os.remove(p)}


LAYOUT = [("image", "|u1", (2, 3)), ("label", "<i4", (2,))]
PIECES = {  # pieces that do not fill LAYOUT's columns exactly, in order
    "an image byte short": [("image", b"abc"), ("image", b"de"), ("label", np.arange(2, dtype=np.int32))],
    "an image byte over": [("image", b"abcdefg"), ("label", np.arange(2, dtype=np.int32))],
    "labels before images": [("label", np.arange(2, dtype=np.int32)), ("image", b"abcdef")],
    "a column not in the layout": [("image", b"abcdef"), ("label", np.arange(2, dtype=np.int32)), ("box", b"x")],
    "no labels": [("image", b"abcdef")],
}


def test_pieces_in_column_order_make_the_file_put_makes(tmp_path):
    store = RowGroupFiles(rank_cache_folder(str(tmp_path), "rank0-train"), 1 << 30)
    labels = np.array([7, 9], np.int32)
    assert store.put_pieces("a", LAYOUT, [("image", b"ab"), ("image", b""), ("image", b"cdef"), ("label", labels)])
    assert store.put("b", {"image": np.frombuffer(b"abcdef", np.uint8).reshape(2, 3), "label": labels})
    assert open(store.path("a"), "rb").read() == open(store.path("b"), "rb").read()
    assert store.get("a")["image"].tobytes() == b"abcdef" and store.get("a")["label"].tolist() == [7, 9]


@pytest.mark.parametrize("name", PIECES)
def test_pieces_that_do_not_fill_the_columns_are_refused_and_leave_nothing(tmp_path, name):
    store = RowGroupFiles(rank_cache_folder(str(tmp_path), "rank0-train"), 1 << 30)
    with pytest.raises(ValueError, match="bytes written, its shape makes|out of the columns' order"):
        store.put_pieces("k", LAYOUT, iter(PIECES[name]))
    assert os.listdir(store.folder) == [] and store.stored == 0 and store.get("k") is None


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_file_is_a_miss_and_the_next_set_replaces_it(cache, tmp_path, damage):
    """Both stores count a damaged file as a miss: the reader then reads Parquet and sets again."""
    value = FLAT["images and labels"]()
    assert cache.set("k", value)
    (path,) = flat_files(tmp_path)
    DAMAGE[damage](path, os.path.getsize(path))
    assert cache.get("k") is None
    cache.set("k", value)
    assert equal(value, cache.get("k"))


# Petastorm's cache alone stores through RowGroupDisk: where Petastorm cannot run (the current stack), nothing does
@pytest.mark.skipif(not petastorm_available(), reason="Petastorm cannot run with this pyarrow")
def test_threads_storing_while_others_evict_never_fail(tmp_path):
    """Eviction removes folders that became empty (diskcache's Disk.remove) while another thread is
    about to write a file into one: the store tries again, as diskcache's own writes do. 8 threads,
    a cache far smaller than what they store; every value read back is the one stored."""
    import threading

    diskcache = pytest.importorskip("diskcache")
    from pipelines.training.data.petastorm.reader import RowGroupDisk

    width = 20_000
    errors, wrong = [], []

    def value(key):
        return {"image": np.array([bytes([(key + i) % 256]) * width for i in range(3)], dtype=object),
                "label": np.full(3, key, np.int32)}

    with diskcache.FanoutCache(str(tmp_path / "c"), 6, disk=RowGroupDisk, size_limit=6 * 20 * width,
                               eviction_policy="least-recently-stored") as c:
        def work(seed):
            rng = np.random.default_rng(seed)
            try:
                for key in rng.integers(0, 200, 1500).tolist():
                    got = c.get(key)
                    if got is None:
                        c.set(key, value(key))
                    elif not (np.all(got["label"] == key) and got["image"][:, 0].tolist() == [(key + i) % 256
                                                                                         for i in range(3)]):
                        wrong.append(key)
            except Exception as exc:  # noqa: BLE001 - any failure of a thread is the finding
                errors.append(repr(exc))

        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [] and wrong == []


@pytest.mark.parametrize("group, reason", [
    (Group(images(3, 4)[:2].tolist() + [b"\0" * 47], np.arange(3)), "object array, one image short"),
    (Group(np.array(images(2, 4).tolist() + [b"\0" * 49], dtype=object), np.arange(3)), "one image long"),
    (Group(images(3, 4)[:1].tolist() + [b"\0" * 47, b"\0" * 49], np.arange(3)), "sizes that add up, rows shifted"),
    (Group(images(3, 4)[:2].tolist() + [None], np.arange(3)), "a missing image"),
    (Group(images(3, 4), np.arange(2)), "one image more than labels"),
    (Group(np.zeros((3, 47), np.uint8), np.arange(3)), "flat, rows of the wrong width"),
    (Group(np.zeros(48 * 3, np.uint8), np.arange(3)), "flat, not 2-D"),
])
def test_an_image_of_another_size_is_refused_in_either_form(group, reason):
    group = Group(np.array(group.image, dtype=object) if isinstance(group.image, list) else group.image, group.label)
    with pytest.raises(DataError, match="not 4x4x3 bytes"):
        list(row_groups_of([group], 4)), reason


def test_both_forms_of_a_row_group_give_the_same_images():
    objects = images(3, 4, 10)
    flat = np.frombuffer(b"".join(objects), np.uint8).reshape(3, 48)
    (a, la), (b, lb) = row_groups_of([Group(objects, np.arange(3)), Group(flat, np.arange(3))], 4)
    assert a.shape == b.shape == (3, 4, 4, 3) and np.array_equal(a, b) and la.dtype == np.int32
    assert np.array_equal(a[:, 0, 0, 0], [10, 11, 12])


def mapped(array):
    while isinstance(array, np.ndarray):
        array = array.base
    return isinstance(array, memoryview) and isinstance(array.obj, mmap.mmap)


@pytest.mark.parametrize("reader", READERS)
def test_a_reader_serves_its_warm_epochs_from_the_flat_files(tmp_path, reader):
    root = str(tmp_path / "etl")
    write_dataset(root, train_groups=[4, 3], test_groups=[2])  # 7 one-row groups, pixels = row id
    data = load_dataset(root, world_size=1)
    forms, seen = [], []
    with open_reader(data, "train", 0, 1, str(tmp_path / "cache"), reader=reader) as opened:
        for _ in range(6 * 7):  # six epochs: the first reads Parquet, the others mostly the cache
            group = next(opened)
            forms.append(group.image.dtype != object and mapped(group.image))
            (pixels, labels), = row_groups_of([group], 4)
            assert np.array_equal(pixels, np.broadcast_to((labels % 256)[:, None, None, None].astype(np.uint8),
                                                          pixels.shape))
            seen += labels.tolist()
        assert len(flat_files(tmp_path)) == 7
    # Petastorm's first epoch comes from Parquet; ours decodes into the flat files and maps them back
    assert all(forms[-7:]) and all(forms[:7]) == (reader == "own")
    assert not os.path.exists(tmp_path / "cache" / "rank0-train")  # the reader's cache goes with it
    counts = Counter(seen)  # Petastorm's looping epochs overlap by a row group or so at their edges
    assert set(counts) == set(range(7)) and all(5 <= n <= 7 for n in counts.values()), counts
    if reader == "own":
        assert all(n == 6 for n in counts.values())  # ours: every epoch each row group once


# --- a shared --cache-dir: nothing planted runs, nothing foreign is used or deleted ----------------

class Planted:
    """Unpickling this creates ``marker``: the proof that a cache ran a file's code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def old_format_file(path, marker):
    """A flat file as the previous format wrote it (an 8-byte length, then a pickled header)."""
    import pickle
    import struct

    header = pickle.dumps(Planted(marker))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0" * 64)


def test_a_planted_pickle_in_a_flat_file_does_not_run(tmp_path):
    from pipelines.training.data.rowcache import DamagedEntry, read_row_group

    marker = tmp_path / "ran"
    files = Files(str(tmp_path / "cache"))
    for key, make in {"old header": old_format_file,
                      "pickle only": lambda p, m: open(p, "wb").write(__import__("pickle").dumps(Planted(m)))}.items():
        make(files.files.path(key), str(marker))
        with pytest.raises(DamagedEntry):
            read_row_group(files.files.path(key))
        assert files.get(key) is None and not os.path.exists(files.files.path(key))  # a miss, removed
    assert not marker.exists()


def test_a_planted_pickled_diskcache_value_does_not_run(tmp_path):
    """A value diskcache itself pickled (what Petastorm's default store writes, or a planted one)
    reads as a miss through RowGroupDisk: never unpickled. Large and small pickles (a file, inline)."""
    diskcache = pytest.importorskip("diskcache")
    from pipelines.training.data.petastorm.reader import RowGroupDisk

    marker = str(tmp_path / "ran")
    folder = rank_cache_folder(str(tmp_path / "cache"), "rank0-train")
    with diskcache.Cache(folder) as plain:  # diskcache's own Disk: pickles
        plain.set("small", Planted(marker))
        plain.set("large", [Planted(marker)] + [b"x" * 100_000])
    with diskcache.Cache(folder, disk=RowGroupDisk) as c:
        assert c.get("small") is None and c.get("large") is None
    assert not os.path.exists(marker)


@pytest.mark.parametrize("reader", READERS)
def test_a_planted_rank_folder_is_replaced_and_nothing_in_it_runs(tmp_path, reader):
    root = str(tmp_path / "etl")
    write_dataset(root, train_groups=[3], test_groups=[1])
    data = load_dataset(root, world_size=1)
    marker = str(tmp_path / "ran")
    planted = tmp_path / "cache" / "rank0-train"
    planted.mkdir(parents=True)
    for i in range(3):  # the file names our reader would use, and diskcache's
        old_format_file(str(planted / f"{i:06d}{SUFFIX}"), marker)
    if reader == "petastorm":  # a pickled value in diskcache's own store, where Petastorm's cache lives
        pytest.importorskip("diskcache").Cache(str(planted / "000")).set("k", Planted(marker))
    with open_reader(data, "train", 0, 1, str(tmp_path / "cache"), reader=reader) as opened:
        labels = [int(x) for _ in range(3 * 3) for x in next(opened).label]
        assert stat.S_IMODE(os.stat(planted).st_mode) == 0o700
    assert sorted(set(labels)) == [0, 1, 2] and not os.path.exists(marker)


NOBODY = 65534


@pytest.mark.parametrize("what", ["the cache root", "the rank's folder", "a link as the rank's folder"])
def test_a_cache_folder_of_another_user_is_refused_and_kept(tmp_path, what):
    from pipelines.training.data.rowcache import CacheFolderError

    root = tmp_path / "cache"
    root.mkdir()
    target = root if what == "the cache root" else root / "rank0-train"
    if what == "a link as the rank's folder":
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
    else:
        target.mkdir(exist_ok=True)
        (target / "theirs").write_text("x")
    os.lchown(target, NOBODY, NOBODY)
    with pytest.raises(CacheFolderError, match=f"owned by uid {NOBODY}, not by this user"):
        rank_cache_folder(str(root), "rank0-train")
    assert os.path.lexists(target) and (what.startswith("a link") or (target / "theirs").exists())


def test_a_foreign_cache_dir_is_refused_on_the_command_line_with_exit_2(tmp_path, capsys):
    from pipelines.runtime.config import parse_config
    from pipelines.training.config import TrainConfig

    (tmp_path / "shared").mkdir()
    os.chown(tmp_path / "shared", NOBODY, NOBODY)
    with pytest.raises(SystemExit) as info:
        parse_config(TrainConfig, ["--data", str(tmp_path), "--output", str(tmp_path / "out"), "--cache-dir",
                                   str(tmp_path / "shared"), "--no-tracking"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"--cache-dir {tmp_path / 'shared'} is owned by uid {NOBODY}" in err, err


@pytest.fixture
def tmpfs(tmp_path):
    """``mount(name, size, read_only=False)``: a real small tmpfs mounted at ``tmp_path/name``
    (the tests run as root), unmounted after the test; skipped where mounting is impossible."""
    import subprocess

    mounted = []

    def mount(name, size="2m", read_only=False, fill=None):
        point = tmp_path / name
        point.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        if fill:
            fill(point)
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], check=False)


def planted_file(point):
    (point / "rank0-train").mkdir()
    (point / "rank0-train" / "old").write_text("x")


@pytest.mark.parametrize("how", ["read-only disk", "a mount point inside"])
def test_a_rank_folder_that_cannot_be_cleared_is_refused_not_reused(tmp_path, tmpfs, how):
    from pipelines.training.data.rowcache import CacheFolderError

    if how == "read-only disk":
        root = tmpfs("cache", read_only=True, fill=planted_file)
    else:
        root = tmp_path / "cache"
        tmpfs("cache/rank0-train/busy")
    with pytest.raises(CacheFolderError, match=r"cache folder .*rank0-train cannot be cleared \(.*\): remove it"):
        rank_cache_folder(str(root), "rank0-train")
    assert os.path.isdir(root / "rank0-train")


# --- a full cache disk: training goes on, said once ------------------------------------------------

@pytest.mark.parametrize("reader", READERS)
def test_a_full_cache_disk_leaves_every_row_readable_and_is_said_once(tmp_path, tmpfs, caplog, monkeypatch, reader):
    """16 row groups of 20 rows at 64 px (246 KB each, 3.9 MB) through a cache on a 3 MiB tmpfs:
    the disk fills in epoch 1; every epoch still delivers its rows, pixels right; the warning
    comes once, however many row groups did not fit."""
    import logging

    from pipelines.training.data import rowcache

    monkeypatch.setattr(rowcache, "_SAID", [])
    root = str(tmp_path / "etl")
    write_dataset(root, train_groups=[8, 8], test_groups=[1], size=64, rows_per_group=20)
    data = load_dataset(root, world_size=1)
    cache = tmpfs("cache", size="3m")
    seen = Counter()
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        with open_reader(data, "train", 0, 1, str(cache), reader=reader) as opened:
            for _ in range(3 * 16):
                (pixels, labels), = row_groups_of([next(opened)], 64)
                assert np.array_equal(pixels[:, 0, 0, 0], (labels % 256).astype(np.uint8))
                seen.update(labels.tolist())
            cached = flat_files_under(cache)
            assert 0 < cached < 16
    assert set(seen) == set(range(320)) and min(seen.values()) >= 2
    full = [r for r in caplog.records if "training goes on" in r.getMessage()]
    assert len(full) == 1 and "space" in full[0].getMessage().lower(), [r.getMessage() for r in caplog.records]


def flat_files_under(folder):
    return len(glob.glob(os.path.join(str(folder), "**", f"*{SUFFIX}"), recursive=True))
