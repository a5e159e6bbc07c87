"""Tests for pipelines.tools.samples: pure helpers offline, the two exports (slow) against real packages."""

import gzip
import struct

import numpy as np
import pytest
from PIL import Image

from pipelines.tools import samples


def _idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    header = struct.pack(">BBBB", 0, 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def test_read_idx_plain_and_gzip(tmp_path):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "plain").write_bytes(_idx_bytes(images))
    (tmp_path / "packed.gz").write_bytes(gzip.compress(_idx_bytes(images)))
    for name in ("plain", "packed.gz"):
        got = samples.read_idx(tmp_path / name)
        assert got.dtype == np.uint8 and got.shape == (2, 3, 4)
        np.testing.assert_array_equal(got, images)


def test_read_idx_big_endian_int32(tmp_path):
    values = np.array([1, -2, 70000], dtype=np.int32)
    (tmp_path / "ints").write_bytes(_idx_bytes(values, code=0x0C))
    got = samples.read_idx(tmp_path / "ints")
    assert got.dtype == np.int32 and got.dtype.isnative
    np.testing.assert_array_equal(got, values)


@pytest.mark.parametrize("mangle, message", [
    (lambda b: b[:-1], "corrupt IDX"),                 # truncated data
    (lambda b: b + b"\0", "corrupt IDX"),              # trailing bytes
    (lambda b: b"\x01" + b[1:], "bad magic"),          # wrong magic number
    (lambda b: b[:2] + b"\x42" + b[3:], "bad magic"),  # unknown element type
    (lambda b: b[:6], "truncated IDX header"),
    (lambda b: gzip.compress(b)[:-10], "corrupt gzip"),
])
def test_read_idx_rejects_corrupt_files(tmp_path, mangle, message):
    path = tmp_path / "bad"
    path.write_bytes(mangle(_idx_bytes(np.zeros((2, 28, 28), np.uint8))))
    with pytest.raises(ValueError, match=message):
        samples.read_idx(path)


def test_composite_transparent_is_white():
    out = samples.composite_on_white(Image.new("RGBA", (5, 4), (0, 0, 0, 0)))
    assert out.mode == "RGB" and out.size == (5, 4)
    pixels = np.asarray(out)
    assert pixels.shape == (4, 5, 3) and (pixels == 255).all()


def test_composite_half_alpha_red_is_pink():
    r, g, b = samples.composite_on_white(Image.new("RGBA", (2, 2), (255, 0, 0, 128))).getpixel((0, 0))
    assert r == 255 and 120 <= g <= 135 and g == b


def test_composite_keeps_opaque_and_palette_images():
    assert samples.composite_on_white(Image.new("RGB", (1, 1), (10, 20, 30))).getpixel((0, 0)) == (10, 20, 30)
    palette = Image.new("P", (1, 1), 0)
    palette.info["transparency"] = 0
    assert samples.composite_on_white(palette).getpixel((0, 0)) == (255, 255, 255)


def test_class_folder_name():
    assert samples.class_folder_name(1, "T-shirt/top") == "001.t-shirt_top"
    assert samples.class_folder_name(10, "Ankle boot") == "010.ankle_boot"
    assert samples.class_folder_name(257, "birds") == "257.birds"
    assert samples.class_folder_name(3, "Mr. Bean's  hat") == "003.mr_bean_s_hat"
    for bad in [(0, "x"), (1000, "x"), (1, "..."), (1, "")]:
        with pytest.raises(ValueError):
            samples.class_folder_name(*bad)


def _grey(value):
    return Image.new("L", (28, 28), value)


def test_write_class_tree_replaces_its_own_tree(tmp_path):
    dest = tmp_path / "tree"
    samples.write_class_tree(dest, [("a", [_grey(0)]), ("b", [_grey(1)]), ("c", [_grey(2)])])
    counts = samples.write_class_tree(dest, [("x", [_grey(0), _grey(9)]), ("y", [_grey(3)])])
    assert counts == {"001.x": 2, "002.y": 1}
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.jpg")) == [
        "001.x/001_0001.jpg", "001.x/001_0002.jpg", "002.y/002_0001.jpg"]
    assert [p.name for p in tmp_path.iterdir()] == ["tree"]  # no staging left behind


def test_write_class_tree_refuses_foreign_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="notes.txt"):
        samples.write_class_tree(tmp_path, [("a", [_grey(0)])])
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_write_class_tree_failure_keeps_old_tree(tmp_path):
    dest = tmp_path / "tree"
    samples.write_class_tree(dest, [("a", [_grey(0)])])

    def broken():
        yield _grey(1)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        samples.write_class_tree(dest, [("new", broken())])
    with pytest.raises(ValueError, match="no images"):
        samples.write_class_tree(dest, [("empty", [])])
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == ["001.a", "001.a/001_0001.jpg"]
    assert [p.name for p in tmp_path.iterdir()] == ["tree"]


@pytest.mark.slow
def test_fashion_mnist_export(tmp_path):
    assert samples.main(["fashion-mnist", "--dest", str(tmp_path), "--per-class", "3"]) == 0
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert [f[:4] for f in folders] == [f"{i:03d}." for i in range(1, 11)]
    assert folders[0] == "001.t-shirt_top" and folders[-1] == "010.ankle_boot"
    files = sorted(tmp_path.glob("*/*.jpg"))
    assert len(files) == 30
    for path in files:
        with Image.open(path) as img:
            img.load()
            assert img.size == (28, 28) and img.mode == "L"


@pytest.mark.slow
def test_tuxpaint_export(tmp_path):
    assert samples.main(["tuxpaint", "--dest", str(tmp_path)]) == 0
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert len(folders) >= 8 and folders[0].startswith("001.")
    files = sorted(tmp_path.glob("*/*.jpg"))
    assert len(files) >= 100
    for path in files:
        assert path.name.startswith(path.parent.name[:3] + "_")
        with Image.open(path) as img:
            img.load()
            assert img.mode == "RGB"
