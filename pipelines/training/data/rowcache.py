"""The local-disk cache of a rank's row groups: one flat file per row group (magic, length, JSON header, 64-byte
aligned columns), mapped back; nothing is unpickled, so a planted file is only a miss."""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import mmap
import os
import shutil
import stat
import struct
import threading
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural

log = logging.getLogger("pipelines")

#: bytes; tf.data's from_generator takes a 64-byte-aligned NumPy array without copying it (the
#: copy's cost per row group and per warm epoch: docs/benchmarks.md, Figures behind the code's constants)
ALIGN = 64
#: bytes per write of a column: a whole row group in one call cost more CPU per image, and erratically,
#: than writes of 1 MiB; larger and smaller pieces did worse (docs/benchmarks.md, Figures behind the code's constants)
WRITE_BYTES = 1 << 20
SUFFIX = ".rowgroup"
MAGIC = b"PLRG\x01\x00\x00\x00"  # format 1 of the flat file (JSON header)
_LENGTH = struct.Struct("<Q")
FOLDER_MODE, FILE_MODE = 0o700, 0o600
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)

Column = Tuple[str, str, Tuple[int, ...]]  # name, NumPy dtype string, shape as stored
Piece = Tuple[str, object]  # a column's name and some of its bytes (any bytes-like object), in order


class CacheFolderError(Refused):
    """The cache folder is not this user's own or cannot be cleared (a refusal: exit 2 before any rank starts)."""


class DamagedEntry(OSError):
    """A ``*.rowgroup`` file that does not hold what its header says; an ``OSError``, so read as a miss."""


def flat_columns(value) -> Optional[List[Column]]:
    """The columns of a ``dict`` of plain arrays (kinds ``b i u f c``, 1-D equal-size ``bytes``) as stored, or None."""
    if type(value) is not dict:
        return None
    columns: List[Column] = []
    for name, array in value.items():
        if type(array) is not np.ndarray or type(name) is not str:
            return None
        if array.dtype == object:
            if array.ndim != 1 or not all(type(item) is bytes for item in array):
                return None
            width = len(array[0]) if len(array) else 0
            if any(len(item) != width for item in array):
                return None
            columns.append((name, "|u1", (len(array), width)))
        elif array.dtype.kind in "biufc":
            columns.append((name, array.dtype.str, tuple(array.shape)))
        else:
            return None
    return columns


def column_pieces(value, columns: List[Column]) -> Iterator[Piece]:
    """The bytes of ``value``'s ``columns`` as ``write_pieces`` takes them (no joined copy)."""
    for name, _dtype, _shape in columns:
        array = value[name]
        if array.dtype == object:
            for item in array:
                yield name, item
        else:
            data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            for start in range(0, len(data), WRITE_BYTES):
                yield name, data[start:start + WRITE_BYTES]


def column_bytes(columns: List[Column]) -> int:
    """Bytes of the columns' data in a flat file (header and padding not counted)."""
    return sum(np.dtype(dtype).itemsize * int(np.prod(shape)) for _name, dtype, shape in columns)


def write_pieces(f, columns: List[Column], pieces: Iterable[Piece]) -> int:
    """Write a flat file of ``columns`` into ``f`` from ``(name, bytes-like)`` ``pieces`` in column order; its size.

    Raises:
        ValueError: a piece out of order, or a column's bytes not what its shape makes."""
    header = json.dumps([[name, dtype, list(shape)] for name, dtype, shape in columns]).encode()
    f.write(MAGIC + _LENGTH.pack(len(header)) + header)
    expected = [(name, column_bytes([(name, dtype, shape)])) for name, dtype, shape in columns]
    pieces = iter(pieces)
    piece = next(pieces, None)
    for name, size in expected:
        f.write(b"\0" * (-f.tell() % ALIGN))
        written = 0
        while piece is not None and piece[0] == name:
            written += f.write(piece[1])
            piece = next(pieces, None)
        if written != size:
            raise ValueError(f"column {name!r}: {plural(written, 'byte')} written, its shape makes {size}")
    if piece is not None:
        raise ValueError(f"a piece of column {piece[0]!r} out of the columns' order")
    return f.tell()


def write_columns(f, value, columns: List[Column]) -> int:
    """Write the flat form of ``value`` (its ``columns``) into the binary file ``f``; returns the size in bytes."""
    return write_pieces(f, columns, column_pieces(value, columns))


def _parse_header(mapped) -> Tuple[List[Column], int]:
    """The columns a flat file's header names and the offset after it (ValueError and kin when not ours)."""
    if mapped[:len(MAGIC)] != MAGIC:
        raise ValueError("not a flat row-group file of this format")
    (length,) = _LENGTH.unpack_from(mapped, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    if length > len(mapped) - start:
        raise ValueError("header longer than the file")
    columns = []
    for name, dtype, shape in json.loads(bytes(mapped[start:start + length])):
        if type(name) is not str or np.dtype(dtype).kind not in "biufc":
            raise ValueError(f"column {name!r} of dtype {dtype!r}")
        if not all(type(n) is int and n >= 0 for n in shape):
            raise ValueError(f"column {name!r} of shape {shape!r}")
        columns.append((name, dtype, tuple(shape)))
    return columns, start + length


def read_row_group(path: str) -> Dict[str, np.ndarray]:
    """The columns of one ``*.rowgroup`` file, as read-only arrays over one memory map of it.

    Raises:
        OSError: the file cannot be opened or mapped; ``DamagedEntry`` when it is not what its header says."""
    with open(path, "rb") as f:
        try:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise DamagedEntry(f"{path}: empty") from None
    try:
        columns, offset = _parse_header(mapped)
        out = {}
        for name, dtype, shape in columns:
            offset += -offset % ALIGN
            out[name] = np.frombuffer(mapped, dtype, int(np.prod(shape)), offset).reshape(shape)
            offset += out[name].nbytes
    except Exception as exc:  # struct, JSON, NumPy: each says "not what was written" its own way
        raise DamagedEntry(f"{path}: {exc}") from None
    if offset != len(mapped):
        raise DamagedEntry(f"{path}: its header describes {plural(offset, 'byte')}, the file holds {len(mapped)}")
    return out


def open_private(path: str):
    """``path`` created for writing, owner-only (0600), never an existing file or a link."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE), "wb")


def refuse_foreign(path: str, option: str = "--cache-dir") -> None:
    """Raise ``CacheFolderError`` if ``path`` exists (a link not followed) and is another user's; makes nothing."""
    try:
        owner = os.lstat(path).st_uid
    except FileNotFoundError:
        return
    if owner != os.geteuid():
        raise CacheFolderError(f"{option} {path} is owned by uid {owner}, not by this user (uid "
                               f"{os.geteuid()}): give a cache folder of your own")


def own_folder(path: str, option: str = "--cache-dir") -> str:
    """``path`` as this user's folder, made (0700) if missing; ``CacheFolderError`` if a link, a file or another's."""
    try:
        os.makedirs(path, mode=FOLDER_MODE, exist_ok=True)
        info = os.lstat(path)
    except OSError as exc:
        raise CacheFolderError(f"{option} {path}: cannot make the folder ({exc.strerror})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise CacheFolderError(f"{option} {path} is not a folder (a link or a file): give a folder of your own")
    refuse_foreign(path, option)
    return path


def rank_cache_folder(cache_root: str, name: str) -> str:
    """A fresh, empty, owner-only (0700) folder ``cache_root/name``; our leftovers there are removed first.

    Raises:
        CacheFolderError: either is another user's (never removed), cannot be cleared, or was made meanwhile."""
    own_folder(cache_root)
    path = os.path.join(cache_root, name)
    with contextlib.suppress(FileNotFoundError):
        owner = os.lstat(path).st_uid
        if owner != os.geteuid():
            raise CacheFolderError(f"cache folder {path} is owned by uid {owner}, not by this user (uid "
                                   f"{os.geteuid()}): it is not removed; give another --cache-dir")
    try:
        if os.path.islink(path) or os.path.isfile(path):
            os.remove(path)  # a link is removed, never followed
        elif os.path.lexists(path):
            shutil.rmtree(path)
        os.mkdir(path, FOLDER_MODE)  # fails if anyone made it since: never someone else's folder
    except OSError as exc:
        raise CacheFolderError(f"cache folder {path} cannot be cleared ({exc.strerror or exc}: "
                               f"{exc.filename or path}): remove it, or give another --cache-dir") from None
    return path


_SAID: list = []  # whether a full cache disk was reported: said once per process


def say_full_once(folder: str, exc: OSError) -> None:
    """Log, once per process, that the cache in ``folder`` stopped at a full disk (``exc``)."""
    if not _SAID:
        _SAID.append(folder)
        log.warning("cache %s: %s; training goes on, reading the row groups that are not cached from Parquet",
                    folder, exc.strerror or exc)


class RowGroupFiles:
    """The flat files of one reader's row groups in its own ``folder``, at most ``limit_bytes`` in all; thread-safe."""

    def __init__(self, folder: str, limit_bytes: int):
        self.folder, self.limit_bytes = folder, limit_bytes
        self.stored, self.full = 0, False
        self._lock = threading.Lock()

    def path(self, key: str) -> str:
        return os.path.join(self.folder, key + SUFFIX)

    def get(self, key: str) -> Optional[Dict[str, np.ndarray]]:
        """The cached columns of ``key``, or None (never stored, or damaged: then removed)."""
        try:
            return read_row_group(self.path(key))
        except FileNotFoundError:
            return None
        except OSError:
            with self._lock, contextlib.suppress(OSError):
                self.stored -= os.path.getsize(self.path(key))
                os.remove(self.path(key))
            return None

    def put(self, key: str, value: Dict[str, np.ndarray]) -> bool:
        """Store ``value`` (a dict of columns) under ``key``; whether stored (errors as ``put_pieces``)."""
        columns = flat_columns(value)
        return columns is not None and self.put_pieces(key, columns, column_pieces(value, columns))

    def put_pieces(self, key: str, columns: List[Column], pieces: Iterable[Piece]) -> bool:
        """Store under ``key`` a row group of ``columns`` from ``pieces``; False (``pieces`` maybe half read) if not.

        Raises:
            OSError: a write failing for another reason than a full disk.
            ValueError: ``pieces`` do not fill the columns (or whatever ``pieces`` raises); the file is removed."""
        size = column_bytes(columns)
        with self._lock:
            if self.full or self.stored + size > self.limit_bytes:
                return False
            self.stored += size
        temporary = f"{self.path(key)}.{threading.get_ident()}.tmp"
        try:
            with open_private(temporary) as f:
                write_pieces(f, columns, pieces)
            os.replace(temporary, self.path(key))
            return True
        except BaseException as exc:
            with self._lock:
                self.stored -= size
                with contextlib.suppress(OSError):
                    os.remove(temporary)
                if not isinstance(exc, OSError) or exc.errno not in FULL_DISK:
                    raise
                if not self.full:
                    self.full = True
                    say_full_once(self.folder, exc)
            return False
