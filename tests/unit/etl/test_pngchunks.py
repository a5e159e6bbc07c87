"""PNGs whose metadata Pillow's defaults refuse: the metadata is dropped, the pixels kept (no Spark).

Each kind is a chunk inserted into a good PNG; the decoded pixels must equal those of the same PNG
without it. Damage to critical chunks and decompression bombs are still rejected.
"""
import functools
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


@functools.lru_cache(maxsize=None)
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


@pytest.fixture
def inflated(monkeypatch):
    """The bytes Python's zlib inflaters give while a test runs, in all (the chunk walk's and
    Pillow's own text decoding): a counting wrapper over the real ``zlib.decompressobj``."""
    real, counts = zlib.decompressobj, []

    class Counting:
        def __init__(self, *args, **kwargs):
            self._inflater = real(*args, **kwargs)

        def decompress(self, data, max_length=0):
            out = self._inflater.decompress(data, max_length)
            counts.append(len(out))
            return out

        def __getattr__(self, name):  # eof, unconsumed_tail, unused_data, flush
            return getattr(self._inflater, name)

    monkeypatch.setattr(zlib, "decompressobj", Counting)
    return counts


def stream_of_zeros(n: int) -> bytes:
    """A zlib stream of ``n`` zero bytes, compressed a MiB at a time (``n`` may be gigabytes)."""
    packer, block = zlib.compressobj(9), bytes(MiB)
    return b"".join(packer.compress(block[:min(MiB, n - at)]) for at in range(0, n, MiB)) + packer.flush()


def broken_stream(n: int) -> bytes:
    """A zlib stream that inflates ``n`` bytes, then fails its checksum (zlib raises)."""
    good = zipped(n)
    return good[:-4] + bytes(b ^ 0xFF for b in good[-4:])


HOSTILE = {  # id: (the chunks, built when used; the rejection, or None: kept, its dropped lines say
    # "decompresses past"; the most the file may inflate)
    "5,000 zTXt past MAX_TEXT_CHUNK (a 5 MiB file)": (
        lambda: [zTXt(b"k%d" % i, MiB + 1) for i in range(5000)], "damaged PNG: more than 64 of its chunks", 64 * MiB),
    "3,000 zTXt of 0.5 MiB each": (
        lambda: [zTXt(b"k%d" % i, MiB // 2) for i in range(3000)], "damaged PNG: more than 64 of its chunks",
        64 * MiB),
    "1,000 compressed iTXt past MAX_TEXT_CHUNK": (
        lambda: [png_chunk(b"iTXt", b"k%d\0\1\0\0\0" % i + zipped(2 * MiB)) for i in range(1000)],
        "damaged PNG: more than 64 of its chunks", 64 * MiB),
    "1,000 broken zlib streams of 1 MiB - 1": (
        lambda: [png_chunk(b"zTXt", b"k%d\0\0" % i + broken_stream(MiB - 1)) for i in range(1000)],
        "damaged PNG: more than 64 of its chunks", 64 * MiB),
    "one zTXt of 64 MiB": (lambda: [png_chunk(b"zTXt", b"k\0\0" + stream_of_zeros(64 * MiB))], None, MiB),
    "one iCCP of 64 MiB": (lambda: [png_chunk(b"iCCP", b"icc\0\0" + stream_of_zeros(64 * MiB))], None, MiB),
    "64 dropped chunks, the most": (lambda: [zTXt(b"k%d" % i, MiB + 1) for i in range(64)], None, 64 * MiB),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_text_chunks_cost_at_most_the_text_budget(kind, inflated):
    """Each zlib stream is inflated only as far as the file's remaining budget (MAX_TEXT_MEMORY,
    charged with every byte inflated) and MAX_TEXT_CHUNK: a file costs at most 64 MiB of
    inflation, whatever its chunks, and past 64 dropped chunks it is refused. Counted: the bytes
    inflated (the walk's and Pillow's), and the walk's peak Python memory."""
    import tracemalloc

    build, rejected, most = HOSTILE[kind]
    chunks = build()
    data = png_with(photo(), b"".join(chunks))
    tracemalloc.start()
    try:
        without_refused_metadata(data)
    except Exception:  # noqa: BLE001 - judged below, through the ETL's own decode
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3 * MiB, (kind, peak)  # a MiB of output at a time (and its buffer), 64 short lines
    del inflated[:]
    if rejected:
        with pytest.raises(ImageRejected, match=rejected):
            decode_and_fit(data, 32)
    else:
        fitted = decode_and_fit(data, 32)
        assert fitted.image.tobytes() == decode_and_fit(photo(), 32).image.tobytes()
        assert fitted.dropped and all(line.endswith("decompresses past Pillow's MAX_TEXT_CHUNK (1048576 bytes)")
                                      for line in fitted.dropped), fitted.dropped
    assert sum(inflated) <= most, (kind, sum(inflated))


def test_the_text_budget_counts_dropped_inflation_too(inflated):
    """70 zTXt of 1 MiB + 1: the first 64 inflate 1 MiB each and are dropped, spending the budget;
    the rest are dropped without inflating a byte, and the 65th dropped refuses the file."""
    data = png_with(photo(), b"".join(zTXt(b"k%d" % i, MiB + 1) for i in range(70)))
    with pytest.raises(ImageRejected, match=r"more than 64 of its chunks would make Pillow refuse it \(the first: "
                                            r"zTXt: decompresses past Pillow's MAX_TEXT_CHUNK"):
        decode_and_fit(data, 32)
    assert sum(inflated) == 64 * MiB


def test_a_broken_stream_costs_its_limit_so_many_cannot_pass_unbudgeted(inflated, monkeypatch):
    """A broken zlib stream is text Pillow reads as empty, so it is kept; each still costs
    MAX_TEXT_CHUNK, and once the budget is spent the next is dropped."""
    monkeypatch.setattr(PngImagePlugin, "MAX_TEXT_MEMORY", 3 * MiB)
    chunks = b"".join(png_chunk(b"zTXt", b"k%d\0\0" % i + broken_stream(MiB - 1)) for i in range(5))
    fitted = decode_and_fit(png_with(photo(), chunks), 32)
    assert fitted.dropped == ("zTXt: text past Pillow's MAX_TEXT_MEMORY (3145728 bytes in all)",) * 2


@pytest.mark.parametrize("width,height,accepted", [(30000, 30000, False), (9460, 9460, False), (9459, 9459, True)])
def test_a_pixel_bomb_is_refused_by_pillows_own_limit_before_any_pixel_is_decoded(width, height, accepted, inflated):
    """Pillow's MAX_IMAGE_PIXELS (89,478,485) holds with metadata dropped: over it the file is
    rejected from its header alone (the IDAT stream is 64 zero bytes); at it, decoding starts (and
    fails on the missing rows: a truncated file)."""
    data = png_with(png_bomb(width, height), zTXt(b"k", MiB + 1))
    with pytest.raises(ImageRejected) as info:
        decode_and_fit(data, 32, max_pixels=None)
    assert info.value.reason.startswith("undecodable" if accepted else "decompression bomb"), info.value.reason
    assert sum(inflated) <= MiB


def test_a_file_of_more_chunks_than_a_real_image_has_is_refused_before_pillow_reads_it():
    """100,001 empty private chunks (Pillow would keep each): refused. The same photo with its
    pixel stream cut into one IDAT per byte (hundreds of chunks) decodes to the same pixels."""
    good = photo()
    with pytest.raises(ImageRejected, match="a PNG of more than 100,000 chunks: refused before Pillow reads it"):
        decode_and_fit(png_with(good, png_chunk(b"prVt", b"") * 100_001), 32)
    chunks = png_chunks(good)
    stream = b"".join(c[8:-4] for c in chunks if c[4:8] == b"IDAT")
    split = good[:8] + b"".join(c for c in chunks if c[4:8] not in (b"IDAT", b"IEND")) + b"".join(
        png_chunk(b"IDAT", stream[i:i + 1]) for i in range(len(stream))) + png_chunk(b"IEND", b"")
    assert len(stream) > 300 and pixels(split) == pixels(good)
