"""Pure image functions of the ETL: decode any supported file, orient, convert, resize, pad.

Supported, by content whatever the file's extension: the raster formats Pillow decodes itself,
JPEG (and phones' multi-picture MPO), PNG, GIF, BMP, WebP and TIFF (:data:`ACCEPTED_FORMATS`).
Animated GIF and WebP, and multi-page TIFF, give their first frame. Only those formats' Pillow
plugins ever see a file (``Image.open(..., formats=ACCEPTED_FORMATS)``); everything else is refused
with a reason naming what its magic bytes say (:func:`what_pillow_sees`), in particular EPS/PS
(Pillow's plugin runs Ghostscript, an external program), PSD and PDF, none of them parsed.

The recipe is the one of the original article (``Image.open -> convert('RGB') -> thumbnail ->
paste centred on white -> tobytes``), made correct on every image:

* EXIF orientation is applied (phone photos are otherwise stored sideways);
* every mode converts to RGB, with transparency composited onto white rather than dropped
  (``convert('RGB')`` on RGBA keeps the colour under alpha 0, often black) and 16-bit or float
  greyscale rescaled rather than clipped;
* large JPEGs are decoded at a reduced DCT scale (``Image.draft``), which costs nothing in
  quality because the result is still at least ``size`` on its short side;
* decompression bombs, truncated files and non-images raise :class:`ImageRejected`, never a
  half-processed image;
* a PNG's metadata that Pillow's defaults would refuse the file for (oversized or damaged
  ancillary chunks) is left out and the pixels kept (:mod:`pipelines.etl.pngchunks`).

No Spark here. :func:`resize_to_square` is the whole contract in one call; the Spark job uses its
two halves, :func:`decode_and_fit` and :func:`paste_centred`, to paste straight into the row
group it is filling.
"""
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
# What a rejected file is, told by its first bytes: no Pillow plugin but the accepted ones ever
# parses input (about 40 would, each a parser of untrusted headers). First match wins; the EPS
# spellings come before PostScript's.
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
# Pillow's own bomb threshold (89,478,485 pixels). Pillow also enforces it inside Image.open, so
# a max_pixels above it has no effect unless the caller raises Image.MAX_IMAGE_PIXELS too.
DEFAULT_MAX_PIXELS = Image.MAX_IMAGE_PIXELS


class ImageRejected(ValueError):
    """The bytes are not an image this ETL accepts; ``reason`` says why, in one short line."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class FittedImage:
    """A decoded image shrunk to fit the square: ``image`` is RGB, at most ``size x size``;
    ``height`` and ``width`` are the original's, in pixels, after EXIF orientation; ``dropped``
    names the PNG chunks left out, one line each (:func:`pipelines.etl.pngchunks.without_refused_metadata`)."""

    image: Image.Image
    height: int
    width: int
    dropped: Tuple[str, ...] = ()


@dataclass(frozen=True)
class ResizedImage:
    """One processed image.

    Attributes:
        rgb: ``size * size * 3`` bytes, uint8, row-major HWC (RGB interleaved).
        height, width: size of the original in pixels, after EXIF orientation.
    """

    rgb: bytes
    height: int
    width: int


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert an image of any Pillow mode to RGB, compositing transparency onto white.

    Args:
        img: a loaded image of any mode (1, L, LA, P, RGB, RGBA, CMYK, YCbCr, I, I;16*, F, ...).

    Returns:
        an ``RGB`` image of the same size. Greyscale gives R=G=B; float greyscale is clipped to
        [0, 255]. Integer greyscale (``I``, ``I;16``) is read as
        16-bit and scaled by 1/257, the same for every image (Pillow's own conversion clips).

    Raises:
        ImageRejected: a mode Pillow cannot convert.
    """
    mode = img.mode
    if mode == "RGB":
        return img
    if mode.startswith("I") or mode == "F":
        # One float32 working copy, changed in place: 4 bytes per pixel, not float64 temporaries
        # (part of the per-pixel memory bound, see pipelines.etl.memory). x / 257 is never
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
    """Shrink ``img`` to fit ``size x size``, keeping its aspect (``Image.thumbnail``, LANCZOS).

    Never enlarges: a 28x28 image stays 28x28, as in the original recipe. A 640x480 input
    becomes 299x224; an 8000x3 strip becomes 299x1 (Pillow keeps at least one pixel).
    """
    if img.size[0] > size or img.size[1] > size:
        img.thumbnail((size, size), Image.Resampling.LANCZOS)
    return img


def paste_centred(img: Image.Image, canvas: np.ndarray) -> np.ndarray:
    """Copy an RGB image of at most the canvas's size into the centre of ``canvas``.

    Args:
        img: ``RGB`` image, ``w x h`` no larger than the canvas.
        canvas: uint8 array of shape ``(size, size, 3)``, already white where nothing is pasted.

    Returns:
        ``canvas``, modified in place: the image's top-left corner lands at
        ``((size - w) // 2, (size - h) // 2)`` (column, row), as ``Image.paste`` in the recipe.
    """
    canvas[centred_box(img.size, canvas.shape[0])] = np.asarray(img)
    return canvas


def centred_box(image_size: Tuple[int, int], size: int) -> Tuple[slice, slice]:
    """The ``(rows, columns)`` slices of a ``size x size`` canvas that :func:`paste_centred` fills
    with an image of ``image_size = (w, h)`` pixels (each no larger than ``size``): its top-left
    corner at ``((size - w) // 2, (size - h) // 2)`` (column, row)."""
    w, h = image_size
    top, left = (size - h) // 2, (size - w) // 2
    return slice(top, top + h), slice(left, left + w)


def white_canvas(size: int) -> np.ndarray:
    """A white ``(size, size, 3)`` uint8 array."""
    return np.full((size, size, 3), 255, np.uint8)


def decode_and_fit(data: bytes, size: int = DEFAULT_IMAGE_SIZE, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> FittedImage:
    """Decode an encoded image, orient it, convert it to RGB and shrink it to fit ``size``.

    Args:
        data: the file's bytes, any of :data:`ACCEPTED_FORMATS` (by content, not by name).
        size: side of the target square in pixels (:data:`pipelines.contract.DEFAULT_IMAGE_SIZE`).
        max_pixels: images with more pixels than this are rejected as decompression bombs
            (``None`` disables the check).

    Returns:
        :class:`FittedImage`: an ``RGB`` image of at most ``size x size`` and the original's
        height and width (after EXIF orientation).

    Raises:
        ImageRejected: empty, non-image, unsupported format (``"not a supported raster image
            (...)"``), truncated, corrupt (``"damaged PNG: ..."``: a critical chunk's CRC) or too
            large input. Damaged or oversized PNG metadata is no reason: it is dropped (``dropped``).
    """
    if size <= 0:
        raise ValueError(f"size must be positive, got {size}")
    return _decoded(data, max_pixels, size,
                    lambda img, height, width, dropped: FittedImage(fit_within(img, size), height, width, dropped))


@dataclass(frozen=True)
class Fingerprint:
    """What the duplicate check compares of one file (:mod:`pipelines.etl.dedupe`).

    Attributes:
        pixels: sha256 (64 hex digits) of the image as the ETL reads it, at full size (oriented,
            RGB, transparency on white: :func:`to_rgb`), with its width and height: equal for
            copies whatever their container, compression or metadata.
        dhash: 64-bit difference hash of its greyscale at 9 x 8 (LANCZOS; bit ``i`` of row ``r``:
            pixel ``i + 1`` brighter than pixel ``i``), as 16 hex digits: close in Hamming distance
            for re-encoded and resized copies.
    """

    pixels: str
    dhash: str


def fingerprint(data: bytes, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Fingerprint:
    """The :class:`Fingerprint` of an encoded image: decoded in full (no reduced-scale JPEG
    decode, whose pixels a lossless copy in another format would not have).

    Raises:
        ImageRejected: as :func:`decode_and_fit`.
    """
    def of(img: Image.Image, height: int, width: int, dropped) -> Fingerprint:
        digest = hashlib.sha256(f"{width}x{height}:".encode())
        digest.update(img.tobytes())
        grey = np.asarray(img.convert("L").resize((9, 8), Image.Resampling.LANCZOS, reducing_gap=2.0), np.int16)
        bits = (grey[:, 1:] > grey[:, :-1]).ravel()
        return Fingerprint(digest.hexdigest(), f"{int(np.packbits(bits).view('>u8')[0]):016x}")

    return _decoded(data, max_pixels, None, of)


def _decoded(data: bytes, max_pixels: int | None, draft_size: int | None, finish):
    """``finish(image, height, width, dropped)`` of the image ``data`` holds: oriented, RGB
    (:func:`to_rgb`), a JPEG decoded at a reduced DCT scale while its short side stays at least
    ``draft_size`` (``None``: in full); every failure on the way, ``finish``'s too, as
    :class:`ImageRejected` (see :func:`decode_and_fit`)."""
    if not data:
        raise ImageRejected("empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            # Between Pillow's limit and twice it, Pillow only warns; a bomb is a bomb either way.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            # Only raster formats Pillow decodes itself, by content: scraped folders mix formats
            # and extensions, and Pillow's other plugins (EPS runs Ghostscript) have no business
            # in a data pipeline. The first frame of an animation (Pillow's default) is the image.
            # Scoped, not ImageFile.LOAD_TRUNCATED_IMAGES: that global also admits truncated pixels.
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
    """A short description of bytes that none of :data:`ACCEPTED_FORMATS` opens, for a reason.

    Judged by magic bytes alone (:data:`_MAGIC_NAMES`, and the brand of HEIF/AVIF files): no Pillow
    plugin outside :data:`ACCEPTED_FORMATS` parses the file, not even its header (each is a parser of
    untrusted input, and EPS's would lead to Ghostscript).

    Returns:
        e.g. ``"EPS"``, ``"a PDF document"``, ``"a Photoshop document (PSD)"``, or
        ``"Pillow cannot identify it"`` (none of the accepted formats' parsers and no magic number
        knows it).
    """
    start = data[:1024]
    for magic, name in _MAGIC_NAMES:
        # text formats may follow blank lines; binary ones (PCX starts with a newline byte) may not
        if start.startswith(magic) or start.lstrip().startswith(magic):
            return name
    if data[4:8] == b"ftyp" and data[8:12] in _FTYP_BRANDS:
        return _FTYP_BRANDS[data[8:12]]
    return "Pillow cannot identify it"


def resize_to_square(data: bytes, size: int = DEFAULT_IMAGE_SIZE, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> ResizedImage:
    """Decode an encoded image and return it as ``size x size`` RGB bytes on white.

    :func:`decode_and_fit` then :func:`paste_centred` on a :func:`white_canvas`.

    Returns:
        :class:`ResizedImage` with ``len(rgb) == size * size * 3`` (uint8, row-major HWC).

    Raises:
        ImageRejected: empty, non-image, truncated, corrupt or too large input.
    """
    fitted = decode_and_fit(data, size, max_pixels)
    rgb = paste_centred(fitted.image, white_canvas(size)).tobytes()
    return ResizedImage(rgb, fitted.height, fitted.width)
