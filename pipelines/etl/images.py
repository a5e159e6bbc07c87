"""Pure image functions of the ETL: decode any supported file, orient, convert, resize, pad.

Only the Pillow plugins of `ACCEPTED_FORMATS` parse a file; anything else is rejected, named by its magic bytes."""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from typing import Tuple

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError, features

from pipelines.contract import DEFAULT_IMAGE_SIZE
from pipelines.etl.pngchunks import DamagedPng, without_refused_metadata

WHITE = (255, 255, 255)
# Pillow's own decoders, no external program. Pillow's JPEG opener also returns phones'
# multi-picture (MPO) files. WebP only where this Pillow was built with libwebp.
ACCEPTED_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "TIFF") + (("WEBP",) if features.check("webp") else ())
# What a rejected file is, told by its first bytes (no other plugin parses it). First match wins: EPS before PostScript.
_MAGIC_NAMES = (
    (b"%PDF", "a PDF document"), (b"\xc5\xd0\xd3\xc6", "EPS"), (b"%!PS-Adobe-3.0 EPSF", "EPS"),
    (b"%!PS", "PostScript"), (b"8BPS", "a Photoshop document (PSD)"), (b"gimp xcf", "a GIMP image (XCF)"),
    (b"\x00\x00\x01\x00", "an icon (ICO)"), (b"icns", "an icon (ICNS)"), (b"DDS ", "a DirectDraw surface (DDS)"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"), (b"\xffO\xffQ", "JPEG 2000"), (b"\xff\x0a", "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL ", "JPEG XL"), (b"<svg", "an SVG drawing"), (b"<?xml", "an XML document"),
    (b"P1", "a Netpbm image (PBM/PGM/PPM)"), (b"P2", "a Netpbm image (PBM/PGM/PPM)"),
    (b"P3", "a Netpbm image (PBM/PGM/PPM)"), (b"P4", "a Netpbm image (PBM/PGM/PPM)"),
    (b"P5", "a Netpbm image (PBM/PGM/PPM)"), (b"P6", "a Netpbm image (PBM/PGM/PPM)"),
    (b"\x0a\x05\x01", "a PCX image"), (b"\x59\xa6\x6a\x95", "a Sun raster image"),
    (b"\x76\x2f\x31\x01", "an OpenEXR image"), (b"#?RADIANCE", "a Radiance HDR image"),
    (b"\x01\xda", "an SGI image"),
)
# ISO base media files (HEIF, AVIF): the brand at bytes 8..12, after the box size and 'ftyp'.
_FTYP_BRANDS = {b"heic": "a HEIF image (HEIC)", b"heix": "a HEIF image (HEIC)", b"mif1": "a HEIF image",
                b"avif": "an AVIF image"}
_EXIF_ORIENTATION = 0x0112
_ORIENTATIONS_SWAPPING_AXES = (5, 6, 7, 8)  # transpose, rotate 270, transverse, rotate 90
# Pillow's own bomb threshold, which Image.open also enforces: a larger max_pixels needs Image.MAX_IMAGE_PIXELS raised
DEFAULT_MAX_PIXELS = Image.MAX_IMAGE_PIXELS


class ImageRejected(ValueError):
    """The bytes are not an image this ETL accepts; ``reason`` says why, in one short line."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class FittedImage:
    """A decoded RGB image shrunk to fit; the original's ``height`` and ``width`` (px, oriented); PNG chunks dropped."""

    image: Image.Image
    height: int
    width: int
    dropped: Tuple[str, ...] = ()


@dataclass(frozen=True)
class ResizedImage:
    """``rgb``: ``size * size * 3`` bytes, uint8 HWC; the original's ``height`` and ``width`` (px, oriented)."""

    rgb: bytes
    height: int
    width: int


def to_rgb(img: Image.Image) -> Image.Image:
    """An image of any Pillow mode as RGB, transparency composited onto white, integer greyscale read as 16-bit and
    scaled by 1/257 (Pillow's conversion clips); `ImageRejected` if it cannot convert."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode.startswith("I") or mode == "F":
        # One float32 copy changed in place (the memory bound: pipelines.etl.memory). x / 257 is never
        # within float32 error of a .5 tie for integer x, so rounding matches float64.
        values = np.array(img, dtype=np.float32)
        if mode.startswith("I"):  # 16-bit range (what PNG and TIFF greyscale carry) to 8-bit
            values /= 257.0
        np.clip(np.rint(values, out=values), 0, 255, out=values)
        return Image.fromarray(values.astype(np.uint8)).convert("RGB")  # 2-D uint8 is mode L
    has_alpha = mode in ("RGBA", "LA", "RGBa", "La", "PA") or (
        mode in ("P", "L", "RGB", "1") and "transparency" in img.info
    )
    if has_alpha:
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, WHITE + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    try:
        return img.convert("RGB")
    except (ValueError, OSError) as exc:
        raise ImageRejected(f"cannot convert mode {mode} to RGB: {exc}") from exc


def fit_within(img: Image.Image, size: int) -> Image.Image:
    """Shrink ``img`` to fit ``size x size`` keeping its aspect (LANCZOS); never enlarges, as the recipe."""
    if img.size[0] > size or img.size[1] > size:
        img.thumbnail((size, size), Image.Resampling.LANCZOS)
    return img


def paste_centred(img: Image.Image, canvas: np.ndarray) -> np.ndarray:
    """Copy an RGB image no larger than the ``(size, size, 3)`` uint8 ``canvas`` into its centre; returns ``canvas``."""
    canvas[centred_box(img.size, canvas.shape[0])] = np.asarray(img)
    return canvas


def centred_box(image_size: Tuple[int, int], size: int) -> Tuple[slice, slice]:
    """The ``(rows, columns)`` slices of a ``size x size`` canvas an image of ``(w, h)`` pixels is pasted into."""
    w, h = image_size
    top, left = (size - h) // 2, (size - w) // 2
    return slice(top, top + h), slice(left, left + w)


def white_canvas(size: int) -> np.ndarray:
    return np.full((size, size, 3), 255, np.uint8)


def decode_and_fit(data: bytes, size: int = DEFAULT_IMAGE_SIZE, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> FittedImage:
    """Decode an image (by content), orient it, convert it to RGB and shrink it to fit ``size`` pixels.

    Raises:
        ImageRejected: empty, not a supported raster image, truncated, corrupt, or over ``max_pixels``."""
    if size <= 0:
        raise ValueError(f"size must be positive, got {size}")
    return _decoded(data, max_pixels, size,
                    lambda img, height, width, dropped: FittedImage(fit_within(img, size), height, width, dropped))


@dataclass(frozen=True)
class Fingerprint:
    """What the duplicate check compares of one file.

    Attributes:
        pixels: sha256 hex of the full-size image as read, with its size: equal for copies in any container.
        dhash: 64-bit difference hash of its 9 x 8 greyscale, 16 hex digits: close for re-encoded or resized copies."""

    pixels: str
    dhash: str


def fingerprint(data: bytes, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Fingerprint:
    """The `Fingerprint` of an encoded image, decoded in full (a lossless copy has no reduced-scale JPEG's pixels)."""
    def of(img: Image.Image, height: int, width: int, dropped) -> Fingerprint:
        digest = hashlib.sha256(f"{width}x{height}:".encode())
        digest.update(img.tobytes())
        grey = np.asarray(img.convert("L").resize((9, 8), Image.Resampling.LANCZOS, reducing_gap=2.0), np.int16)
        bits = (grey[:, 1:] > grey[:, :-1]).ravel()
        return Fingerprint(digest.hexdigest(), f"{int(np.packbits(bits).view('>u8')[0]):016x}")

    return _decoded(data, max_pixels, None, of)


def _decoded(data: bytes, max_pixels: int | None, draft_size: int | None, finish):
    """``finish(image, height, width, dropped)`` of the image in ``data``; any failure as `ImageRejected`."""
    if not data:
        raise ImageRejected("empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            # Between Pillow's limit and twice it, Pillow only warns; a bomb is a bomb either way.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            # Only the accepted formats' plugins, by content; an animation's first frame is the image.
            stream, dropped = without_refused_metadata(data)
            img: Image.Image = Image.open(stream, formats=ACCEPTED_FORMATS)
            width, height = img.size
            if max_pixels is not None and width * height > max_pixels:
                raise ImageRejected(
                    f"decompression bomb: {width}x{height} = {width * height} pixels > {max_pixels}")
            if img.getexif().get(_EXIF_ORIENTATION, 1) in _ORIENTATIONS_SWAPPING_AXES:
                width, height = height, width
            if img.format == "JPEG" and draft_size is not None:
                # DCT-domain downscale by 1/2, 1/4 or 1/8 while the short side stays >= draft_size.
                img.draft(img.mode, (draft_size, draft_size))
            img = ImageOps.exif_transpose(img)  # loads the pixels: truncation surfaces here
            return finish(to_rgb(img), height, width, dropped)
    except ImageRejected:
        raise
    except DamagedPng as exc:
        raise ImageRejected(str(exc)) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageRejected(f"decompression bomb: {exc}") from exc
    except UnidentifiedImageError:
        raise ImageRejected(f"not a supported raster image ({what_pillow_sees(data)}; accepted: "
                            f"{', '.join(ACCEPTED_FORMATS)})") from None
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoder failure is this file's fault, not the job's
        raise ImageRejected(f"undecodable: {type(exc).__name__}: {exc}") from exc


def what_pillow_sees(data: bytes) -> str:
    """What bytes no accepted format opens are, by magic bytes alone (``"EPS"``): no other plugin parses them."""
    start = data[:1024]
    for magic, name in _MAGIC_NAMES:
        # text formats may follow blank lines; binary ones (PCX starts with a newline byte) may not
        if start.startswith(magic) or start.lstrip().startswith(magic):
            return name
    if data[4:8] == b"ftyp" and data[8:12] in _FTYP_BRANDS:
        return _FTYP_BRANDS[data[8:12]]
    return "Pillow cannot identify it"


def resize_to_square(data: bytes, size: int = DEFAULT_IMAGE_SIZE, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> ResizedImage:
    """An encoded image as ``size x size`` RGB bytes on white (`decode_and_fit`, `paste_centred`)."""
    fitted = decode_and_fit(data, size, max_pixels)
    rgb = paste_centred(fitted.image, white_canvas(size)).tobytes()
    return ResizedImage(rgb, fitted.height, fitted.width)
