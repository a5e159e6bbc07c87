"""The flat row-group cache: diskcache round trips (real diskcache, no Petastorm), the reader's
two forms of a row group, and a real Petastorm reader whose warm epochs come from the flat files."""
import glob
from collections import Counter
import mmap
import os
from collections import namedtuple

import diskcache
import numpy as np
import pyarrow as pa
import pytest

from pipelines.training.data import DataError, load_dataset, open_reader, row_groups_of
from pipelines.training.rowcache import SUFFIX, RowGroupDisk, flat_columns
from tests.datagen import write_dataset


Group = namedtuple("Group", "image label")  # a Petastorm batch, as row_groups_of reads it


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
}
PICKLED = {
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


@pytest.fixture
def cache(tmp_path):
    with diskcache.FanoutCache(str(tmp_path / "cache"), 3, disk=RowGroupDisk, size_limit=1 << 30) as c:
        yield c


@pytest.mark.parametrize("name", FLAT)
def test_a_row_group_is_one_flat_file_mapped_back_without_a_copy(cache, tmp_path, name):
    value = FLAT[name]()
    cache.set("k", value)
    files = glob.glob(str(tmp_path / "cache" / "**" / f"*{SUFFIX}"), recursive=True)
    assert len(files) == 1
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


@pytest.mark.parametrize("name", PICKLED)
def test_anything_else_is_pickled_by_diskcache_unchanged(cache, tmp_path, name):
    value = PICKLED[name]()
    assert flat_columns(value) is None
    cache.set("k", value)
    assert not glob.glob(str(tmp_path / "cache" / "**" / f"*{SUFFIX}"), recursive=True)
    assert equal(value, cache.get("k"))


def test_evicted_row_groups_leave_no_file_and_read_as_misses(tmp_path):
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


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_file_is_a_miss_and_the_next_set_replaces_it(cache, tmp_path, damage):
    """diskcache counts an OSError from fetch as a miss: Petastorm then reads Parquet and sets again."""
    value = FLAT["images and labels"]()
    cache.set("k", value)
    (path,) = glob.glob(str(tmp_path / "cache" / "**" / f"*{SUFFIX}"), recursive=True)
    DAMAGE[damage](path, os.path.getsize(path))
    assert cache.get("k") is None
    cache.set("k", value)
    assert equal(value, cache.get("k"))


def test_threads_storing_while_others_evict_never_fail(tmp_path):
    """Eviction removes folders that became empty (diskcache's Disk.remove) while another thread is
    about to write a file into one: the store tries again, as diskcache's own writes do. 8 threads,
    a cache far smaller than what they store; every value read back is the one stored."""
    import threading

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


def test_a_petastorm_reader_serves_its_warm_epochs_from_the_flat_files(tmp_path):
    root = str(tmp_path / "etl")
    write_dataset(root, train_groups=[4, 3], test_groups=[2])  # 7 one-row groups, pixels = row id
    data = load_dataset(root, world_size=1)
    forms, seen = [], []
    with open_reader(data, "train", 0, 1, str(tmp_path / "cache")) as reader:
        for _ in range(6 * 7):  # six epochs: the first reads Parquet, the others mostly the cache
            group = next(reader)
            forms.append(group.image.dtype)
            (pixels, labels), = row_groups_of([group], 4)
            assert np.array_equal(pixels, np.broadcast_to((labels % 256)[:, None, None, None].astype(np.uint8),
                                                          pixels.shape))
            seen += labels.tolist()
        assert len(glob.glob(str(tmp_path / "cache" / "**" / f"*{SUFFIX}"), recursive=True)) == 7
    assert forms[:7].count(np.dtype(object)) >= 1 and forms[-7:] == [np.dtype(np.uint8)] * 7
    counts = Counter(seen)  # a looping reader's epochs overlap by a row group or so at their edges
    assert set(counts) == set(range(7)) and all(5 <= n <= 7 for n in counts.values()), counts
