"""Generators of test images and Caltech-style trees, including every kind of bad file."""
from __future__ import annotations

import io
import os
import struct
import zlib

import numpy as np
from PIL import Image


def encode(img: Image.Image, fmt: str = "JPEG", **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def jpeg_with_orientation(width: int, height: int, orientation: int) -> bytes:
    """A JPEG whose stored pixels are ``width x height`` with an EXIF orientation tag."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    img = Image.new("RGB", (width, height), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, width // 2, height))  # left half red: shows the rotation
    return encode(img, "JPEG", exif=exif.tobytes(), quality=95)


def png_chunk(kind: bytes, data: bytes, crc: int | None = None) -> bytes:
    """One PNG chunk: length, type, data and its CRC (``crc`` given: that CRC instead, e.g. a bad one)."""
    crc = zlib.crc32(kind + data) if crc is None else crc
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc & 0xFFFFFFFF)


def png_chunks(png: bytes) -> list:
    """The chunks of a well-formed PNG, each as its bytes (length, type, data, CRC)."""
    pos, chunks = 8, []
    while pos < len(png):
        end = pos + 12 + struct.unpack(">I", png[pos:pos + 4])[0]
        chunks.append(png[pos:end])
        pos = end
    return chunks


def png_with(png: bytes, extra: bytes, before: bytes = b"IDAT") -> bytes:
    """``png`` with the chunk bytes ``extra`` inserted before its first chunk of type ``before``."""
    chunks = png_chunks(png)
    at = next(i for i, c in enumerate(chunks) if c[4:8] == before)
    return png[:8] + b"".join(chunks[:at]) + extra + b"".join(chunks[at:])


def png_bomb(width: int = 30000, height: int = 30000) -> bytes:
    """A tiny PNG that declares ``width x height`` pixels (a decompression bomb header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
            + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + png_chunk(b"IEND", b""))


def write(path: str, data: bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as out:
        out.write(data)
    return path


def random_photo(rng: np.random.Generator, width: int, height: int, label: int) -> Image.Image:
    """A noisy image whose mean colour depends on ``label`` (learnable by a tiny model)."""
    base = np.array([(label * 97) % 256, (label * 53 + 80) % 256, (label * 31 + 160) % 256], np.float64)
    pixels = base + rng.normal(0, 25, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def folder_name(c: int, plain: bool = False) -> str:
    """Class folder ``c`` (0-based) of :func:`make_tree`: ``001.class0`` or, ``plain``, ``class0``."""
    return f"class{c}" if plain else f"{c + 1:03d}.class{c}"


def make_tree(root: str, classes: int = 3, per_class: int = 12, seed: int = 0, bad: bool = True,
              plain: bool = False) -> dict:
    """A Caltech-style tree under ``root`` (``plain``: folders ``class0``, ``class1``... as Keras and
    torchvision expect); with ``bad``, every kind of bad or stray file too.

    Returns:
        ``{'good': n, 'rejected': {relpath: reason_prefix}, 'skipped': {relpath: reason_prefix}}``.
    """
    rng = np.random.default_rng(seed)
    for c in range(classes):
        for i in range(per_class):
            w, h = int(rng.integers(40, 120)), int(rng.integers(40, 120))
            ext = ".JPEG" if i == 0 else ".jpg"
            write(os.path.join(root, folder_name(c, plain), f"{i:04d}{ext}"),
                  encode(random_photo(rng, w, h, c), quality=90))
    good = classes * per_class
    rejected, skipped = {}, {}
    if bad:
        first, second = folder_name(0, plain), folder_name(1, plain)
        # good ones in unusual forms
        write(os.path.join(root, first, "deep", "nested", "x.png"),
              encode(Image.new("RGBA", (50, 30), (0, 0, 0, 0)), "PNG"))
        write(os.path.join(root, first, "grey.jpg"), encode(Image.new("L", (64, 48), 128)))
        write(os.path.join(root, first, "cmyk.jpg"), encode(Image.new("CMYK", (64, 48), (0, 255, 255, 0))))
        write(os.path.join(root, first, "with space é.jpg"), encode(random_photo(rng, 50, 50, 0)))
        good += 4
        full = encode(random_photo(rng, 200, 150, 1), quality=90)
        rejected[write(os.path.join(root, second, "truncated.jpg"), full[: len(full) // 2])] = "undecodable"
        rejected[write(os.path.join(root, second, "empty.jpg"), b"")] = "empty file"
        rejected[write(os.path.join(root, second, "notes.jpg"), b"this is text, not a JPEG\n" * 10)] = "not a supported raster image"
        rejected[write(os.path.join(root, second, "bomb.png"), png_bomb())] = "decompression bomb"
        skipped[write(os.path.join(root, second, "_hidden.jpg"), encode(random_photo(rng, 20, 20, 1)))] = "hidden name"
        skipped[write(os.path.join(root, second, ".dotfile.jpg"), encode(random_photo(rng, 20, 20, 1)))] = "hidden name"
        skipped[write(os.path.join(root, second, "readme.txt"), b"notes")] = "not an image extension"
        skipped[write(os.path.join(root, "stray.jpg"), encode(random_photo(rng, 20, 20, 1)))] = "not inside a class folder"
        # a hidden folder at the root is no class (and no mix of layouts)
        skipped[write(os.path.join(root, "_unsorted", "a.jpg"), encode(random_photo(rng, 20, 20, 1)))] = "hidden name"
    return {"good": good, "rejected": rejected, "skipped": skipped}


# A minimal valid EPS (Pillow identifies it; rendering it would need Ghostscript) and PDF.
EPS = (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n%%EndComments\n"
       b"newpath 0 0 moveto 10 10 lineto stroke\nshowpage\n%%EOF\n")
PDF = (b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
       b"2 0 obj << /Type /Pages /Kids [] /Count 0 >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n")


def animated(fmt: str, colours=((255, 0, 0), (0, 0, 255)), size=(12, 8)) -> bytes:
    """A two-frame animation (GIF or WebP) or two-page TIFF whose first frame is ``colours[0]``."""
    frames = [Image.new("RGB", size, c) for c in colours]
    return encode(frames[0], fmt, save_all=True, append_images=frames[1:],
                  **({"lossless": True} if fmt == "WEBP" else {}))


def scene(seed: int, width: int = 320, height: int = 240) -> Image.Image:
    """A photo-like RGB image with structure at every scale (a gradient and a few filled shapes,
    placed by ``seed``): its difference hash survives re-encoding and resizing, unlike noise's."""
    from PIL import ImageDraw

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(angle) * x / width + np.sin(angle) * y / height + 1) / 2
    img = Image.fromarray(np.stack([ramp * c for c in rng.uniform(80, 255, 3)], axis=-1).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = rng.integers(0, width - 40), rng.integers(0, height - 40)
        box = (int(x0), int(y0), int(x0 + rng.integers(30, width // 2)), int(y0 + rng.integers(30, height // 2)))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    return img


def jpeg_with_segment(jpeg: bytes, marker: int, payload: bytes) -> bytes:
    """``jpeg`` with one more segment (``marker``: 0xFE a comment, 0xE1 an EXIF APP1) right after
    its start-of-image marker: other bytes, the same compressed pixels."""
    segment = bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload
    return jpeg[:2] + segment + jpeg[2:]
