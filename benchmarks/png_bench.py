"""What one hostile input file costs the ETL's decode (``pipelines.etl.images.decode_and_fit``, the
function each task calls per file): CPU seconds, peak memory and the bytes Python's zlib inflated,
each file in a fresh process, against a plain photo of the same pixels.

The files are the worst cases of each limit: the PNG chunk walk's text budget (Pillow's
``MAX_TEXT_MEMORY``, every byte inflated charged: 64 zTXt chunks inflating 1 MiB each, then 5,000 of
them), one zTXt of 1 GiB, a file of ``--max-file-mb`` made of the smallest chunks (the walk's and
Pillow's per-chunk loops), and an image at Pillow's ``MAX_IMAGE_PIXELS``, transparent and
EXIF-rotated (the decode's worst case in memory, ``pipelines.etl.memory``).

Printed, one line per file: its size, the outcome (kept with N chunks dropped, or the rejection),
CPU seconds (user + system) of the decode, the growth of the process's peak resident memory
during the decode, and the bytes inflated.

Usage: python benchmarks/png_bench.py [--max-file-mb 50] [--cases NAME,...]
"""
from __future__ import annotations

import argparse
import io
import os
import resource
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MiB = 2**20


def _chunk(kind: bytes, body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")


def _photo(width: int = 640, height: int = 480, mode: str = "RGB", **save) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 255, (height, width, 4), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGBA").convert(mode).save(buf, "PNG", **save)
    return buf.getvalue()


def _with(png: bytes, extra: bytes) -> bytes:
    """``png`` with ``extra`` chunks right after its IHDR (before any IDAT)."""
    return png[:33] + extra + png[33:]


def _zeros(n: int) -> bytes:
    packer, block = zlib.compressobj(9), bytes(MiB)
    return b"".join(packer.compress(block[:min(MiB, n - at)]) for at in range(0, n, MiB)) + packer.flush()


def build(case: str, max_file_bytes: int) -> bytes:
    """The bytes of the file ``case`` names (:data:`CASES`)."""
    over = zlib.compress(b"a" * (MiB + 1), 9)  # a zTXt stream 1 byte past MAX_TEXT_CHUNK
    if case == "photo":
        return _photo()
    if case == "64-ztxt":
        return _with(_photo(), b"".join(_chunk(b"zTXt", b"k%d\0\0" % i + over) for i in range(64)))
    if case == "5000-ztxt":
        return _with(_photo(), b"".join(_chunk(b"zTXt", b"k%d\0\0" % i + over) for i in range(5000)))
    if case == "1gib-ztxt":
        return _with(_photo(), _chunk(b"zTXt", b"k\0\0" + _zeros(2**30)))
    if case == "tiny-chunks":
        photo = _photo()
        return _with(photo, _chunk(b"prVt", b"") * ((max_file_bytes - len(photo)) // 12))
    if case == "max-pixels":
        from PIL import Image

        side = int(Image.MAX_IMAGE_PIXELS ** 0.5)
        exif = Image.Exif()
        exif[0x0112] = 6  # rotate 270: a transposed copy
        buf = io.BytesIO()
        Image.new("RGBA", (side, side), (200, 10, 10, 128)).save(buf, "PNG", compress_level=1, exif=exif.tobytes())
        return buf.getvalue()
    raise ValueError(case)


CASES = ("photo", "64-ztxt", "5000-ztxt", "1gib-ztxt", "tiny-chunks", "max-pixels")


def measure(path: str) -> str:
    """Decode the file ``path`` once, in this process: one result line's figures."""
    from pipelines.etl.images import ImageRejected, decode_and_fit
    from pipelines.runtime.logs import plural

    with open(path, "rb") as f:
        data = f.read()
    real, inflated = zlib.decompressobj, [0]

    class Counting:
        def __init__(self, *args):
            self._inflater = real(*args)

        def decompress(self, chunk, max_length=0):
            out = self._inflater.decompress(chunk, max_length)
            inflated[0] += len(out)
            return out

        def __getattr__(self, name):
            return getattr(self._inflater, name)

    zlib.decompressobj = Counting
    rss, before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, os.times()
    try:
        fitted = decode_and_fit(data, 299)
        outcome = f"kept, {plural(len(fitted.dropped), 'chunk')} dropped"
    except ImageRejected as exc:
        outcome = f"rejected: {exc.reason[:60]}"
    after = os.times()
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
    cpu = after.user - before.user + after.system - before.system
    return f"{len(data) / MiB:9.1f} MiB  {cpu:6.2f} s CPU  {grown:7.0f} MiB peak  {inflated[0] / MiB:8.1f} MiB inflated  {outcome}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-file-mb", type=float, default=50.0, help="the ETL's --max-file-mb (tiny-chunks' size)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # a child: decode this file
    args = parser.parse_args(argv)
    if args.measure:
        print(measure(args.measure))
        return 0
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        parser.error(f"--cases {args.cases}: unknown {', '.join(unknown) or 'none given'}; choose from {', '.join(CASES)}")
    with tempfile.TemporaryDirectory(prefix="png-bench-") as tmp:
        for case in cases:
            path = os.path.join(tmp, case + ".png")
            with open(path, "wb") as f:
                f.write(build(case, int(args.max_file_mb * MiB)))
            child = subprocess.run([sys.executable, __file__, "--measure", path], capture_output=True, text=True)
            line = child.stdout.strip() or f"failed: {child.stderr.strip().splitlines()[-1:]}"
            print(f"{case:12s} {line}", flush=True)
            os.remove(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
