"""PNG metadata that Pillow's defaults refuse, left out before Pillow sees the file.

Pillow refuses a whole PNG for damage in chunks that carry no pixels: a compressed text or ICC
chunk (zTXt, iTXt, iCCP) that decompresses past ``PngImagePlugin.MAX_TEXT_CHUNK`` (1 MiB), text
past ``MAX_TEXT_MEMORY`` (64 MiB in all), an ancillary chunk before the first IDAT with a bad CRC
(which even reads as "cannot identify image file"), a gAMA, cHRM, sRGB or pHYs chunk shorter
than its fields (Pillow issues #2445, #8363). Its only switch, ``ImageFile.LOAD_TRUNCATED_IMAGES``,
is process-global and also admits truncated pixel data, so it is never set here. Instead
:func:`without_refused_metadata` walks the chunks (headers and CRCs only, no pixel decoding) and
hands Pillow a view of the same bytes without those chunks, by libpng's default rule
(``png_set_crc_action``, PNG_CRC_DEFAULT): a bad CRC in a critical chunk (IHDR, PLTE, IDAT, IEND)
is an error, one in an ancillary chunk drops that chunk. Pixel-bearing ancillary chunks (tRNS,
eXIf, APNG's) are only dropped for a bad CRC, as libpng does; IHDR is never touched, so the
decompression-bomb limits on the declared size still apply.

The limits are read from Pillow at each call, so a caller that changes them is followed.
"""
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


class DamagedPng(ValueError):
    """A critical chunk of the PNG is damaged (bad CRC): its pixels cannot be trusted."""


def without_refused_metadata(data: bytes) -> Tuple[BinaryIO, Tuple[str, ...]]:
    """The PNG ``data`` as a file Pillow can open, without the chunks Pillow would refuse it for.

    Args:
        data: a file's bytes; anything that does not start with the PNG signature is returned as is.

    Returns:
        ``(file, dropped)``: a read-only, seekable file over ``data`` (no copy of its bytes: a view
        that skips the dropped chunks) and one line per dropped chunk, e.g.
        ``("tIME: bad CRC", "zTXt: decompresses past Pillow's MAX_TEXT_CHUNK (1048576 bytes)")``;
        ``dropped`` is empty, and ``file`` a plain ``io.BytesIO``, when nothing was dropped.
        A truncated or garbled chunk ends the walk: Pillow judges the rest, as it would have.

    Raises:
        DamagedPng: a critical chunk's CRC does not match its bytes.
    """
    if not data.startswith(PNG_SIGNATURE):
        return io.BytesIO(data), ()
    view, pos, start, text_left = memoryview(data), len(PNG_SIGNATURE), 0, PngImagePlugin.MAX_TEXT_MEMORY
    kept: List[memoryview] = []
    dropped: List[str] = []
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        if end > len(data) or not kind.isalpha():
            break
        body = view[pos + 8:end - 4]
        if zlib.crc32(body, zlib.crc32(kind)) != int.from_bytes(data[end - 4:end], "big"):
            if not kind[0] & 0x20:  # bit 5 of the first letter clear (upper case): critical
                raise DamagedPng(f"damaged PNG: bad CRC in its critical {kind.decode()} chunk")
            why, text = "bad CRC", 0
        else:
            why, text = _refusal(kind, body)
        if why is None and text > text_left:
            why = f"text past Pillow's MAX_TEXT_MEMORY ({plural(PngImagePlugin.MAX_TEXT_MEMORY, 'byte')} in all)"
        if why is None:
            text_left -= text
        else:
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


def _refusal(kind: bytes, body: memoryview) -> Tuple[Optional[str], int]:
    """Why Pillow's handler of a chunk with a good CRC would refuse the file (``None``: it would
    not), and how many bytes of text the chunk adds to Pillow's ``MAX_TEXT_MEMORY`` count (at least
    Pillow's own count, which is of decoded characters)."""
    if kind in _MIN_LENGTH and len(body) < _MIN_LENGTH[kind]:
        return f"{plural(len(body), 'byte')}, shorter than its fields ({_MIN_LENGTH[kind]})", 0
    if kind not in (b"tEXt", b"zTXt", b"iTXt", b"iCCP"):
        return None, 0
    raw = body.tobytes()
    key, sep, value = raw.partition(b"\0")
    if kind == b"tEXt":
        return None, len(value) if key else 0
    if kind == b"iTXt":
        compressed = len(value) >= 2 and value[0] != 0 and value[1] == 0
        value = value[2:].split(b"\0", 2)[-1]
    else:  # zTXt, iCCP: keyword, NUL, compression method, zlib stream
        if kind == b"iCCP" and len(value) < 1:
            return "no compression method", 0
        if value and value[0] != 0:
            return f"unknown compression method {value[0]}", 0
        compressed, value = True, value[1:]
    if compressed:
        inflater = zlib.decompressobj()
        try:
            value = inflater.decompress(value, PngImagePlugin.MAX_TEXT_CHUNK)
        except zlib.error:
            return None, 0  # Pillow reads a broken stream as empty text
        if inflater.unconsumed_tail:
            return f"decompresses past Pillow's MAX_TEXT_CHUNK ({plural(PngImagePlugin.MAX_TEXT_CHUNK, 'byte')})", 0
    return None, len(value) if key and kind != b"iCCP" else 0


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
