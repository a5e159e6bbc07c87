"""Materialise offline sample image sets as Caltech-256-style trees ``DEST/NNN.<class>/NNN_IIII.jpg``.

DEST may hold only class folders this module wrote; the new tree is swapped in whole, never left partial."""

from __future__ import annotations

import argparse
import gzip
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from PIL import Image

from pipelines.runtime.environment import read_settings
from pipelines.runtime.logs import plural

log = logging.getLogger(__name__)

JPEG_QUALITY = 90
TUXPAINT_PACKAGE = "tuxpaint-stamps-default"
TUXPAINT_STAMPS = "usr/share/tuxpaint/stamps"
# class name -> folder under TUXPAINT_STAMPS whose PNGs are (almost) all photos.
TUXPAINT_CATEGORIES = {
    "birds": "animals/birds",
    "fish": "animals/fish",
    "insects": "animals/insects",
    "mammals": "animals/mammals",
    "fruit": "food/fruit",
    "vegetables": "food/vegetables",
    "tools": "household/tools",
    "flowers": "plants/flowers",
}
MIRRORED_COPY = re.compile(r"_(mirror|flip)\.png$", re.IGNORECASE)

FASHION_PACKAGE = "dataset-fashion-mnist"
FASHION_DIR = "usr/share/datasets/fashion-mnist"
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_CLASS_DIR = re.compile(r"^(\d{3})\.[a-z0-9_-]+$")
_IMAGE_FILE = re.compile(r"^(\d{3})_\d{4,}\.jpg$")


# ---------------------------------------------------------------- pure helpers

def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (the MNIST format), plain or gzip-compressed, in native byte order.

    Raises:
        ValueError: naming the file, when the magic number, element type or data length do not match."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path}: corrupt gzip stream ({exc})") from None
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, offset=4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(f"{path}: corrupt IDX file: header {shape} needs {plural(expected, 'data byte')}, "
                         f"found {len(raw) - header}")
    return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def composite_on_white(img: Image.Image) -> Image.Image:
    """Flatten an image with any alpha onto white; returns a new RGB image of the same size."""
    rgba = img.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def sanitize_name(name: str) -> str:
    """Lower-case ``name`` with each run of characters outside [a-z0-9-] made ``_`` (``'T-shirt/top'`` -> ``'t-shirt_top'``).

    Raises:
        ValueError: nothing usable is left."""
    clean = re.sub(r"[^a-z0-9-]+", "_", name.lower()).strip("_")
    if not clean.strip("-"):
        raise ValueError(f"class name {name!r} has no usable characters")
    return clean


def class_folder_name(index: int, name: str) -> str:
    """Caltech-style folder name for 1-based class ``index``: ``(1, 'Ankle boot')`` -> ``'001.ankle_boot'``.

    Raises:
        ValueError: an index outside 1..999 or an unusable name."""
    if not 1 <= index <= 999:
        raise ValueError(f"class index {index} outside 1..999")
    return f"{index:03d}.{sanitize_name(name)}"


def write_class_tree(dest: str | os.PathLike,
                     classes: Sequence[tuple[str, Iterable[Image.Image]]]) -> dict[str, int]:
    """Write ``classes`` (name and images, in class-number order) under ``dest``; return {folder: image count}.

    Raises:
        FileExistsError, ValueError: ``dest`` holds other files (nothing written); a class without images."""
    dest = Path(dest)
    old = _our_class_folders(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.staging-", dir=dest.parent))
    counts: dict[str, int] = {}
    try:
        for index, (name, images) in enumerate(classes, start=1):
            folder = class_folder_name(index, name)
            (staging / folder).mkdir()
            n = 0
            for n, img in enumerate(images, start=1):
                img.save(staging / folder / f"{index:03d}_{n:04d}.jpg", quality=JPEG_QUALITY)
            if n == 0:
                raise ValueError(f"class {name!r} has no images")
            counts[folder] = n
        dest.mkdir(exist_ok=True)
        for path in old:
            shutil.rmtree(path)
        for folder in counts:
            os.replace(staging / folder, dest / folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return counts


def _our_class_folders(dest: Path) -> list[Path]:
    """Class folders already in ``dest``; ``FileExistsError`` if it holds anything else."""
    if not dest.exists():
        return []
    if not dest.is_dir():
        raise FileExistsError(f"{dest} exists and is not a directory")
    foreign, ours = [], []
    for entry in sorted(dest.iterdir()):
        match = _CLASS_DIR.match(entry.name)
        if (match and entry.is_dir() and not entry.is_symlink()
                and all(_is_our_image(f, match.group(1)) for f in entry.iterdir())):
            ours.append(entry)
        else:
            foreign.append(entry.name)
    if foreign:
        raise FileExistsError(
            f"{dest} holds files this command did not write ({', '.join(foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''}); choose an empty or new --dest")
    return ours


def _is_our_image(path: Path, prefix: str) -> bool:
    match = _IMAGE_FILE.match(path.name)
    return bool(match) and match.group(1) == prefix and path.is_file() and not path.is_symlink()


# ---------------------------------------------------------------- Debian packages

def cache_dir() -> Path:
    """The set-up tools' cache folder (``Settings.cache``)."""
    return Path(read_settings().cache)


def fetch_deb(package: str, debs: Path) -> Path:
    """Path of ``debs/<package>_*.deb``, fetched with ``apt-get download`` (and ``apt-get update`` once) if needed.

    Raises:
        SystemExit: with apt's message, when apt-get is missing or fails."""
    cached = sorted(debs.glob(f"{package}_*.deb"))
    if cached:
        log.info("using cached %s", cached[-1])
        return cached[-1]
    if not shutil.which("apt-get"):
        raise SystemExit(f"apt-get not found: {package} is a Debian package; on a Debian/Ubuntu "
                         f"machine run this again, or put its .deb into {debs}/")
    debs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=debs) as tmp:
        log.info("downloading %s with apt-get into %s", package, debs)
        result = _run(["apt-get", "download", package], cwd=tmp)
        if result.returncode and re.search(r"Unable to locate|no installation candidate|"
                                           r"Can't select", result.stderr):
            log.info("apt does not know %s yet: running apt-get update", package)
            update = _run(["apt-get", "update"])
            if update.returncode:
                raise SystemExit(f"apt-get update failed (it needs root):\n{update.stderr.strip()}")
            result = _run(["apt-get", "download", package], cwd=tmp)
        found = sorted(Path(tmp).glob(f"{package}_*.deb"))
        if result.returncode or not found:
            raise SystemExit(f"apt-get download {package} failed:\n{result.stderr.strip()}")
        return Path(shutil.move(str(found[-1]), debs / found[-1].name))


def unpack_package(package: str, name: str) -> Path:
    """Root of ``package`` unpacked with ``dpkg -x`` into ``<cache>/<name>/``, reused if present, never partial.

    Raises:
        SystemExit: dpkg is missing or fails."""
    target = cache_dir() / name
    if target.is_dir():
        log.info("using cached %s", target)
        return target
    deb = fetch_deb(package, cache_dir() / "debs")
    if not shutil.which("dpkg"):
        raise SystemExit(f"dpkg not found: cannot unpack {deb}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        result = _run(["dpkg", "-x", str(deb), str(tmp)])
        if result.returncode:
            raise SystemExit(f"dpkg -x {deb} failed:\n{result.stderr.strip()}")
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _run(cmd: list[str], cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


# ---------------------------------------------------------------- the two sample sets

def tuxpaint_sources(root: str | os.PathLike) -> list[tuple[str, list[Path]]]:
    """(class name, sorted PNG paths) for each class of ``TUXPAINT_CATEGORIES`` under the unpacked package ``root``.

    Raises:
        FileNotFoundError: a category folder is missing or has no usable PNG (another package version)."""
    stamps = Path(root) / TUXPAINT_STAMPS
    sources = []
    for name, folder in sorted(TUXPAINT_CATEGORIES.items()):
        pngs = sorted(p for p in (stamps / folder).glob("*")
                      if p.suffix.lower() == ".png" and p.is_file() and not MIRRORED_COPY.search(p.name))
        if not pngs:
            raise FileNotFoundError(f"no PNG photos in {stamps / folder}: package layout changed?")
        sources.append((name, pngs))
    return sources


def _load_photo(path: Path) -> Image.Image:
    with Image.open(path) as img:
        return composite_on_white(img)


def export_tuxpaint(dest: str | os.PathLike) -> dict[str, int]:
    """Write the tuxpaint photo classes under ``dest``; returns {folder name: image count}."""
    sources = tuxpaint_sources(unpack_package(TUXPAINT_PACKAGE, "tuxpaint"))
    return write_class_tree(dest, [(name, map(_load_photo, paths)) for name, paths in sources])


def load_fashion_mnist(root: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Train then test Fashion-MNIST from ``root``: images ``(70000, 28, 28)`` and labels ``(70000,)`` in 0..9, uint8.

    Raises:
        FileNotFoundError, ValueError: a missing file; a corrupt or inconsistent one."""
    folder = Path(root) / FASHION_DIR
    images, labels = [], []
    for split in ("train", "t10k"):
        x = read_idx(_one_of(folder, f"{split}-images-idx3-ubyte"))
        y = read_idx(_one_of(folder, f"{split}-labels-idx1-ubyte"))
        if x.ndim != 3 or x.shape[1:] != (28, 28) or y.shape != x.shape[:1] or x.dtype != np.uint8:
            raise ValueError(f"{folder}: unexpected {split} shapes {x.shape} {x.dtype} / {y.shape}")
        if y.size and y.max() >= len(FASHION_CLASSES):
            raise ValueError(f"{folder}: {split} label {y.max()} outside 0..9")
        images.append(x)
        labels.append(y)
    return np.concatenate(images), np.concatenate(labels)


def _one_of(folder: Path, stem: str) -> Path:
    for path in (folder / f"{stem}.gz", folder / stem):
        if path.is_file():
            return path
    raise FileNotFoundError(f"{folder / stem}[.gz] not found")


def export_fashion_mnist(dest: str | os.PathLike, per_class: int | None = None) -> dict[str, int]:
    """Write Fashion-MNIST as greyscale JPEGs under ``dest`` (the first ``per_class`` of each class if given).

    Raises:
        ValueError: ``per_class`` < 1."""
    if per_class is not None and per_class < 1:
        raise ValueError(f"--per-class must be at least 1, got {per_class}")
    images, labels = load_fashion_mnist(unpack_package(FASHION_PACKAGE, "fashion-mnist"))
    classes = []
    for label, name in enumerate(FASHION_CLASSES):
        picked = np.flatnonzero(labels == label)[:per_class]
        classes.append((name, (Image.fromarray(images[i]) for i in picked)))
    return write_class_tree(dest, classes)


# ---------------------------------------------------------------- CLI

def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``pipelines-samples {tuxpaint,fashion-mnist} --dest DIR [--per-class N]``."""
    parser = argparse.ArgumentParser(prog="pipelines-samples", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tux = sub.add_parser("tuxpaint", help="real colour photos in 8 classes (tuxpaint-stamps-default)")
    tux.add_argument("--dest", required=True, type=Path)
    fm = sub.add_parser("fashion-mnist", help="70,000 28x28 greyscale images in 10 classes")
    fm.add_argument("--dest", required=True, type=Path)
    fm.add_argument("--per-class", type=int, default=None, metavar="N",
                    help="keep the first N images of each class (default: all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    start = time.monotonic()
    try:
        if args.command == "tuxpaint":
            counts = export_tuxpaint(args.dest)
        else:
            counts = export_fashion_mnist(args.dest, args.per_class)
    except (FileExistsError, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    for folder, n in counts.items():
        print(f"  {folder:<24} {n:6d}")
    print(f"{args.command}: {plural(len(counts), 'class')}, {plural(sum(counts.values()), 'image')} in {args.dest} "
          f"({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
