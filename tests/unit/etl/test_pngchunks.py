"""PNGs whose metadata Pillow's defaults refuse: the metadata is dropped, the pixels kept (no Spark).

Each kind is a chunk inserted into a good PNG; the decoded pixels must equal those of the same PNG
without it. Damage to critical chunks and decompression bombs are still rejected.
"""
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from pipelines.etl.images import ImageRejected, decode_and_fit
from pipelines.etl.pngchunks import _Spliced, without_refused_metadata
from tests.support.imagegen import encode, png_bomb, png_chunk, png_chunks, png_with

MiB = 2**20
BAD_CRC = 0x12345678


def photo(mode: str = "RGB", **save) -> bytes:
    rng = np.random.default_rng(7)
    img = Image.fromarray(rng.integers(0, 255, (12, 20, 4), dtype=np.uint8), "RGBA").convert(mode)
    return encode(img, "PNG", **save)


def pixels(data: bytes) -> tuple:
    fitted = decode_and_fit(data, 32)
    return fitted.image.tobytes(), fitted.image.size, fitted.height, fitted.width


def zipped(n: int) -> bytes:
    return zlib.compress(b"a" * n, 9)


def zTXt(key: bytes, n: int) -> bytes:
    return png_chunk(b"zTXt", key + b"\0\0" + zipped(n))


REFUSED = {  # id: (chunk, where it goes, the start of its line in `dropped`)
    "zTXt over MAX_TEXT_CHUNK": (zTXt(b"k", MiB + 1), b"IDAT", "zTXt: decompresses past"),
    "zTXt over MAX_TEXT_CHUNK after IDAT": (zTXt(b"k", MiB + 1), b"IEND", "zTXt: decompresses past"),
    "iTXt over MAX_TEXT_CHUNK": (png_chunk(b"iTXt", b"XML:com.adobe.xmp\0\1\0\0\0" + zipped(2 * MiB)), b"IDAT",
                                 "iTXt: decompresses past"),
    "iCCP over MAX_TEXT_CHUNK": (png_chunk(b"iCCP", b"icc\0\0" + zipped(MiB + 1)), b"IDAT", "iCCP: decompresses past"),
    "zTXt of an unknown method": (png_chunk(b"zTXt", b"k\0\1xyz"), b"IDAT", "zTXt: unknown compression method 1"),
    "tEXt with a bad CRC": (png_chunk(b"tEXt", b"Comment\0hello", BAD_CRC), b"IDAT", "tEXt: bad CRC"),
    "tIME with a bad CRC": (png_chunk(b"tIME", struct.pack(">HBBBBB", 2024, 5, 1, 12, 0, 0), BAD_CRC), b"IDAT",
                            "tIME: bad CRC"),
    "gAMA with a bad CRC": (png_chunk(b"gAMA", struct.pack(">I", 45455), BAD_CRC), b"IDAT", "gAMA: bad CRC"),
    "a private chunk with a bad CRC": (png_chunk(b"prVt", b"vendor data", BAD_CRC), b"IDAT", "prVt: bad CRC"),
    "gAMA shorter than its field": (png_chunk(b"gAMA", b"\0\1"), b"IDAT", "gAMA: 2 bytes, shorter"),
    "pHYs shorter than its fields": (png_chunk(b"pHYs", b"\0" * 5), b"IDAT", "pHYs: 5 bytes, shorter"),
}


@pytest.mark.parametrize("kind", list(REFUSED))
def test_refused_metadata_is_dropped_and_the_pixels_kept(kind):
    chunk, before, reason = REFUSED[kind]
    for good in (photo("RGB"), photo("RGBA"), photo("P", transparency=3)):
        data = png_with(good, chunk, before)
        assert pixels(data) == pixels(good), kind
        dropped = decode_and_fit(data, 32).dropped
        assert len(dropped) == 1 and dropped[0].startswith(reason), dropped


def test_text_past_max_text_memory_is_dropped_chunk_by_chunk():
    """66 zTXt chunks of 1 MiB - 100 bytes each pass MAX_TEXT_MEMORY (64 MiB) at the 65th: the ones
    that fit are kept, the two past it dropped (Pillow refuses the whole file)."""
    good = photo()
    texts = b"".join(zTXt(b"k%d" % i, MiB - 100) for i in range(66))
    fitted = decode_and_fit(png_with(good, texts), 32)
    assert fitted.image.tobytes() == decode_and_fit(good, 32).image.tobytes()
    assert fitted.dropped == ("zTXt: text past Pillow's MAX_TEXT_MEMORY (67108864 bytes in all)",) * 2


def test_plain_text_past_max_text_memory_follows_pillows_limit(monkeypatch):
    """A tEXt chunk over the limit, with the limit lowered (a 64 MiB tEXt would be slow to build):
    the limit is read from Pillow at each call."""
    monkeypatch.setattr(PngImagePlugin, "MAX_TEXT_MEMORY", 1000)
    good = photo()
    small, large = png_chunk(b"tEXt", b"a\0" + b"x" * 600), png_chunk(b"tEXt", b"b\0" + b"y" * 600)
    assert decode_and_fit(png_with(good, small), 32).dropped == ()
    fitted = decode_and_fit(png_with(good, small + large), 32)
    assert fitted.dropped == ("tEXt: text past Pillow's MAX_TEXT_MEMORY (1000 bytes in all)",)
    assert fitted.image.tobytes() == decode_and_fit(good, 32).image.tobytes()


def test_metadata_pillow_accepts_is_kept_beside_a_dropped_chunk():
    """The EXIF orientation (eXIf, 6: rotate 270) still turns the image when a tIME is dropped."""
    exif = Image.Exif()
    exif[0x0112] = 6
    oriented = photo(exif=exif.tobytes())
    bad_time = png_chunk(b"tIME", bytes(7), BAD_CRC)
    fitted = decode_and_fit(png_with(oriented, bad_time + zTXt(b"ok", 1000)), 32)
    assert fitted.dropped == ("tIME: bad CRC",)
    assert (fitted.height, fitted.width) == (20, 12) and fitted.image.size == (12, 20)
    assert fitted.image.tobytes() == decode_and_fit(oriented, 32).image.tobytes()
    assert without_refused_metadata(oriented)[1] == ()


def with_bad_crc(png: bytes, kind: bytes) -> bytes:
    return png[:8] + b"".join(c[:-4] + struct.pack(">I", BAD_CRC) if c[4:8] == kind else c
                              for c in png_chunks(png))


@pytest.mark.parametrize("kind, png", [(b"IHDR", photo()), (b"PLTE", photo("P")), (b"IDAT", photo()),
                                       (b"IEND", photo())], ids=["IHDR", "PLTE", "IDAT", "IEND"])
def test_a_critical_chunk_with_a_bad_crc_is_rejected(kind, png):
    with pytest.raises(ImageRejected) as info:
        decode_and_fit(with_bad_crc(png, kind), 32)
    assert info.value.reason == f"damaged PNG: bad CRC in its critical {kind.decode()} chunk"


def test_truncated_pixels_are_still_rejected_with_metadata_dropped():
    good = png_with(photo(), png_chunk(b"tEXt", b"k\0v", BAD_CRC))
    idat_end = good.index(b"IEND") - 4
    with pytest.raises(ImageRejected, match="undecodable"):
        decode_and_fit(good[: idat_end - 20], 32)


def test_decompression_bombs_are_still_rejected_with_metadata_dropped():
    bad_text = png_chunk(b"tEXt", b"k\0v", BAD_CRC)
    with pytest.raises(ImageRejected, match="decompression bomb"):
        decode_and_fit(png_with(png_bomb(), bad_text), 32)
    big = png_with(encode(Image.new("RGB", (100, 100)), "PNG"), bad_text)
    with pytest.raises(ImageRejected, match="decompression bomb"):
        decode_and_fit(big, 32, max_pixels=9999)
    assert decode_and_fit(big, 32, max_pixels=10000).dropped == ("tEXt: bad CRC",)


def test_the_spliced_file_reads_and_seeks_as_its_parts_end_to_end():
    data = bytes(range(256)) * 4
    view = memoryview(data)
    parts = [view[0:10], view[10:10], view[50:300], view[700:1024]]
    whole = b"".join(parts)
    spliced = _Spliced(parts)
    assert spliced.read() == whole and spliced.read(5) == b""
    for pos, n in ((0, 1), (9, 3), (10, 250), (259, 1000), (len(whole) - 1, 4)):
        assert spliced.seek(pos) == pos and spliced.read(n) == whole[pos:pos + n], (pos, n)
    spliced.seek(-7, io.SEEK_END)
    assert spliced.read() == whole[-7:] and spliced.tell() == len(whole)
