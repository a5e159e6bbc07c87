"""The local-disk cache of a rank's row groups: one flat file per row group, mapped back into memory.

A row group, as a reader produces it (a dict of NumPy columns; the ETL's images as one
``uint8 (rows, bytes per row)`` block or an object array of equal-length ``bytes``), is written
as one file: a magic number, an 8-byte length, a JSON header naming each column's dtype and
shape, then each column's bytes, 64-byte aligned. A warm read maps the file (``mmap``,
read-only) and returns the same dict with each column as an array over the map, without
copying: the copy into a tensor is the first. Reading a file runs no code of the file's: the
header is JSON, the dtypes only plain numeric ones (nothing is unpickled; a planted file is at
worst a damaged entry, read as a miss).

Both readers store row groups in this form: ours (:class:`RowGroupFiles`, one file per row group
in the reader's own folder) and Petastorm's ``LocalDiskCache`` (through
:class:`pipelines.training.data.petastorm.reader.RowGroupDisk`, a ``diskcache.Disk``).

The cache folders are the rank's own: :func:`rank_cache_folder` makes each one fresh, owner-only
(0700, files 0600), and refuses a cache root owned by another user or a rank folder it cannot
clear (``--cache-dir`` on a shared disk must not hand a rank another user's files).

A full disk is not an error of training: :class:`RowGroupFiles` stops caching at the first
``ENOSPC`` or ``EDQUOT`` (said once per process, naming the folder) and the reader reads what did
not fit from Parquet.

Measured with ``benchmarks/loader_bench.py`` (README, Loader): see the figures there.
"""
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
    """The cache folder is not this user's own, or what is in it cannot be removed: the message
    names the folder and what to do (bad input: a refusal, exit 2 where it is known before any
    rank starts)."""


class DamagedEntry(OSError):
    """A ``*.rowgroup`` file that does not hold what its header says (cut short, overwritten,
    planted). An ``OSError``: a cache counts it as a miss and the row group is read from Parquet
    again."""


def flat_columns(value) -> Optional[List[Column]]:
    """The columns of ``value`` as a flat file stores them, or None when it cannot.

    ``value`` qualifies when it is a ``dict`` of plain NumPy arrays (no subclass: a masked array
    would lose its mask) under ``str`` names, each either of a numeric or boolean dtype (kinds
    ``b i u f c``: dates, strings and records are not stored) or a 1-D object array of ``bytes``
    all of one length (stored as ``uint8 (rows, length)``).
    """
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
    """The bytes of ``value``'s ``columns`` (:func:`flat_columns`) as :func:`write_pieces` takes
    them: an object column item by item (no joined copy), a numeric one in ``WRITE_BYTES`` slices."""
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
    """Write a flat file into the binary file ``f``: the header naming ``columns``, then each
    column's bytes, 64-byte aligned, as ``pieces`` deliver them (``(column name, bytes-like)``
    in column order, a column in as many pieces as its producer likes); returns the size in bytes.

    Raises:
        ValueError: a piece out of column order, or a column's bytes not what its dtype and shape
            make (the file is then not a whole entry: the caller removes it).
    """
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
    """Write the flat form of ``value`` (its ``columns``, :func:`flat_columns`) into the binary
    file ``f``; returns the size in bytes."""
    return write_pieces(f, columns, column_pieces(value, columns))


def _parse_header(mapped) -> Tuple[List[Column], int]:
    """The columns a flat file's header names and the offset after it (ValueError, KeyError,
    TypeError or struct.error when it is not a header this module wrote)."""
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
    """The columns of one ``*.rowgroup`` file, as read-only arrays over one memory map of it (the
    map lives as long as any of them).

    The file must end where its last column ends. (Truncating a file while arrays of it are in
    use is outside interference: the map then faults, SIGBUS, like any mapped file.)

    Raises:
        OSError: the file cannot be opened or mapped (a cache takes that for an entry evicted
            meanwhile, a miss); :class:`DamagedEntry` (an ``OSError``, a miss too) when its header
            cannot be read or its size is not what the header says.
    """
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
    """Refuse an existing ``path`` (not followed if a link) owned by another user; a missing one
    passes (it will be made ours). Made nothing: for the checks before any rank starts.

    Raises:
        CacheFolderError: naming the folder, its owner's uid and ours.
    """
    try:
        owner = os.lstat(path).st_uid
    except FileNotFoundError:
        return
    if owner != os.geteuid():
        raise CacheFolderError(f"{option} {path} is owned by uid {owner}, not by this user (uid "
                               f"{os.geteuid()}): give a cache folder of your own")


def own_folder(path: str, option: str = "--cache-dir") -> str:
    """``path`` as a folder of this user's: made (0700) when missing; refused when it is a link,
    not a folder, or owned by another user (whose files a rank would read as its own).

    Raises:
        CacheFolderError: naming the folder, its owner's uid and ours.
    """
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
    """A fresh, empty, owner-only (0700) folder ``cache_root/name`` for one reader's cache.

    Whatever of ours was there (a killed run's leftovers) is removed first; a folder that cannot
    be cleared is refused, never reused, and another user's is neither used nor removed.

    Raises:
        CacheFolderError: ``cache_root`` is not this user's (:func:`own_folder`), or ``name``
            there is another user's, cannot be removed (its error named) or is made by someone
            else meanwhile.
    """
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
    """The flat files of one reader's row groups in its own ``folder`` (:func:`rank_cache_folder`),
    at most ``limit_bytes`` in all (row groups beyond it are not cached: a rank's shard is sized
    to fit, :func:`pipelines.training.data.readers.cache_size_bytes`). Thread-safe.

    A file is written under a temporary name and renamed, so a reader sees whole files only; a
    full disk (``ENOSPC``, ``EDQUOT``) ends caching for this folder, said once.
    """

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
        """Store ``value`` (a dict of columns, :func:`flat_columns`) under ``key``; returns whether
        it was stored (not when it is not flat, over the limit, or the disk is full).

        Raises:
            OSError: a write failing for another reason than a full disk.
        """
        columns = flat_columns(value)
        return columns is not None and self.put_pieces(key, columns, column_pieces(value, columns))

    def put_pieces(self, key: str, columns: List[Column], pieces: Iterable[Piece]) -> bool:
        """Store under ``key`` a row group of these ``columns`` whose bytes ``pieces`` deliver
        (:func:`write_pieces`), so that a reader can decode a row group straight into its file;
        returns whether it was stored (not when over the limit or the disk is full: then
        ``pieces`` may be partly consumed).

        Raises:
            OSError: a write failing for another reason than a full disk; whatever ``pieces``
                raises, and ValueError for pieces that do not fill the columns: the file is
                removed first.
        """
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
