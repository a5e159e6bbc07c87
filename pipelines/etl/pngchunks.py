"""PNG metadata that Pillow's defaults refuse, left out before Pillow sees the file.

Chunks are dropped by libpng's rule (a bad CRC: an error in a critical chunk, dropped in an ancillary one), not with
the process-global ``LOAD_TRUNCATED_IMAGES``. IHDR is never touched (bomb limits apply); the walk's work is bounded."""
from __future__ import annotations

import bisect
import io
import itertools
import struct
import zlib
from typing import BinaryIO, List, Optional, Tuple, cast

from PIL import PngImagePlugin

from pipelines.runtime.logs import plural

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The shortest body Pillow's handlers read (PngStream.chunk_gAMA ... chunk_pHYs); shorter ones raise.
_MIN_LENGTH = {b"gAMA": 4, b"cHRM": 32, b"sRGB": 1, b"pHYs": 9}
# The most chunks dropped from one file (a real file's damaged metadata is a chunk or two); past it, refused.
MAX_DROPPED = 64
# The most chunks one file may have. Each costs the walk and Pillow a turn of a Python loop, and
# Pillow keeps every private chunk in memory (about 8 bytes for each byte of a file of empty ones);
# a real file's chunks are kilobytes (encoders write IDAT in 8-64 KiB pieces).
MAX_CHUNKS = 100_000
_BLOCK = 1 << 16  # compressed bytes handed to zlib at a time (what its unconsumed input holds at most)


class DamagedPng(ValueError):
    """A critical chunk's CRC is bad, or the file has more chunks, or more to drop, than a real image."""


def without_refused_metadata(data: bytes) -> Tuple[BinaryIO, Tuple[str, ...]]:
    """The PNG ``data`` as a file Pillow can open, without the chunks Pillow would refuse it for.

    A truncated or garbled chunk ends the walk (Pillow judges the rest); a file that is no PNG is returned as is.

    Returns:
        ``(file, dropped)``: a seekable view of ``data`` skipping the dropped chunks, one line per chunk dropped.

    Raises:
        DamagedPng: a critical chunk's CRC is bad, or more than `MAX_DROPPED` to drop or `MAX_CHUNKS` chunks."""
    if not data.startswith(PNG_SIGNATURE):
        return io.BytesIO(data), ()
    view, pos, start, left = memoryview(data), len(PNG_SIGNATURE), 0, PngImagePlugin.MAX_TEXT_MEMORY
    kept: List[memoryview] = []
    dropped: List[str] = []
    for count in itertools.count(1):
        if pos + 8 > len(data):
            break
        if count > MAX_CHUNKS:
            raise DamagedPng(f"a PNG of more than {MAX_CHUNKS:,} chunks: refused before Pillow reads it")
        length, kind = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        if end > len(data) or not kind.isalpha():
            break
        if zlib.crc32(view[pos + 8:end - 4], zlib.crc32(kind)) != int.from_bytes(data[end - 4:end], "big"):
            if not kind[0] & 0x20:  # bit 5 of the first letter clear (upper case): critical
                raise DamagedPng(f"damaged PNG: bad CRC in its critical {kind.decode()} chunk")
            why = "bad CRC"
        else:
            why, cost = _refusal(kind, data, pos + 8, end - 4, left)
            left -= cost
        if why is not None:
            if len(dropped) == MAX_DROPPED:
                raise DamagedPng(f"damaged PNG: more than {MAX_DROPPED} of its chunks would make Pillow refuse it "
                                 f"(the first: {dropped[0]})")
            dropped.append(f"{kind.decode()}: {why}")
            kept.append(view[start:pos])
            start = end
        pos = end
        if kind == b"IEND":
            break
    if not dropped:
        return io.BytesIO(data), ()
    kept.append(view[start:])
    return cast(BinaryIO, _Spliced(kept)), tuple(dropped)  # a raw file: read, seek, tell


def _refusal(kind: bytes, data: bytes, start: int, end: int, left: int) -> Tuple[Optional[str], int]:
    """Why Pillow would refuse the file for the chunk body ``data[start:end]`` (or ``None``), and its cost to the text
    budget (``left`` bytes remain): the bytes inflated, or the text Pillow counts."""
    if kind in _MIN_LENGTH and end - start < _MIN_LENGTH[kind]:
        return f"{plural(end - start, 'byte')}, shorter than its fields ({_MIN_LENGTH[kind]})", 0
    if kind not in (b"tEXt", b"zTXt", b"iTXt", b"iCCP"):
        return None, 0
    nul = data.find(b"\0", start, end)
    if nul < 0:  # no keyword's end: Pillow reads the chunk as a keyword without text (iCCP: refuses)
        return ("no compression method", 0) if kind == b"iCCP" else (None, 0)
    at = nul + 1  # the text (tEXt), compression method (zTXt, iCCP) or flags (iTXt)
    counted = kind == b"iTXt" or (kind != b"iCCP" and nul > start)  # Pillow counts a keyword's text
    if kind == b"tEXt":
        return (_past_memory(), 0) if counted and end - at > left else (None, end - at if counted else 0)
    if kind == b"iTXt":
        language = data.find(b"\0", at + 2, end) if end - at >= 2 else -1
        text = data.find(b"\0", language + 1, end) + 1 if language >= 0 else 0
        if not text or (data[at] != 0 and data[at + 1] != 0):
            return None, 0  # Pillow ignores it: no translated keyword's end, an unknown method
        if data[at] == 0:  # not compressed
            return (_past_memory(), 0) if end - text > left else (None, end - text)
        stream = memoryview(data)[text:end]
    elif kind == b"iCCP" and at == end:
        return "no compression method", 0
    elif at < end and data[at] != 0:
        return f"unknown compression method {data[at]}", 0
    else:
        stream = memoryview(data)[at + 1:end]
    if left <= 0:
        return _past_memory(), 0
    limit = min(PngImagePlugin.MAX_TEXT_CHUNK, left)
    size, reached = _inflated(stream, limit)
    if not reached:
        return None, size
    if limit < PngImagePlugin.MAX_TEXT_CHUNK:
        return _past_memory(), size
    return f"decompresses past Pillow's MAX_TEXT_CHUNK ({plural(PngImagePlugin.MAX_TEXT_CHUNK, 'byte')})", size


def _inflated(stream: memoryview, limit: int) -> Tuple[int, bool]:
    """``(bytes, reached)``: what inflating ``stream`` costs up to ``limit`` (a broken one: ``limit``); nothing held."""
    inflater, size = zlib.decompressobj(), 0
    try:
        for at in range(0, len(stream), _BLOCK):
            size += len(inflater.decompress(stream[at:at + _BLOCK], limit - size))
            if size >= limit or inflater.eof:
                break
    except zlib.error:
        return limit, False
    return size, size >= limit


def _past_memory() -> str:
    return f"text past Pillow's MAX_TEXT_MEMORY ({plural(PngImagePlugin.MAX_TEXT_MEMORY, 'byte')} in all)"


class _Spliced(io.RawIOBase):
    """A read-only, seekable file whose bytes are ``parts`` (views of one buffer) end to end."""

    def __init__(self, parts: List[memoryview]):
        super().__init__()
        self._parts = [part for part in parts if len(part)]
        self._starts = list(itertools.accumulate((len(part) for part in self._parts), initial=0))
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._starts[-1]}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        out, done = memoryview(buffer).cast("B"), 0
        index = bisect.bisect_right(self._starts, self._pos) - 1
        while done < len(out) and index < len(self._parts):
            part = self._parts[index][self._pos - self._starts[index]:]
            n = min(len(part), len(out) - done)
            out[done:done + n] = part[:n]
            done, self._pos, index = done + n, self._pos + n, index + 1
        return done
