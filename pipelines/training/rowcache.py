"""How the Petastorm local-disk cache stores a row group: one flat file, mapped back into memory.

Petastorm's ``LocalDiskCache`` is a ``diskcache.FanoutCache``; by default it pickles each row
group, and every warm read unpickles it, converts Arrow's binary column to an object array of
Python ``bytes`` (one copy per image) and training joins those into one array (another). On the 2
cores of our benchmark machine, that was 220 µs of CPU per 299 px image, next to the ~670 µs the
whole in-memory tail takes.

:class:`RowGroupDisk` is a ``diskcache.Disk`` (diskcache's own extension point, passed through
Petastorm's ``cache_extra_settings``) that writes a row group, as the reader's workers produce it
with ``convert_early_to_numpy=True`` (a dict of NumPy columns), as one file: a small header, then
each column's bytes, 64-byte aligned; a column of equal-length ``bytes`` (the ETL's images) is
written as one contiguous block. A warm read maps the file (``mmap``, read-only) and returns the
same dict with that column as a 2-D ``uint8`` array, ``(rows, bytes per row)``, without copying:
the copy into a tensor is the first. Anything else (another value type, ragged ``bytes``) is
stored by diskcache's own pickling, unchanged.

Measured with ``benchmarks/loader_bench.py`` (README, Loader): see the figures there.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import struct
from typing import Dict, List, Optional, Tuple

import diskcache
import numpy as np
from diskcache.core import MODE_BINARY, UNKNOWN

from pipelines.logs import plural

ALIGN = 64  # bytes; TensorFlow and NumPy's vectorised copies prefer aligned sources
SUFFIX = ".rowgroup"
_LENGTH = struct.Struct("<Q")

Column = Tuple[str, str, Tuple[int, ...]]  # name, NumPy dtype string, shape as stored


def flat_columns(value) -> Optional[List[Column]]:
    """The columns of ``value`` as :class:`RowGroupDisk` stores them, or None when it cannot
    (then diskcache pickles it).

    ``value`` qualifies when it is a ``dict`` of plain NumPy arrays (no subclass: a masked array
    would lose its mask), each either of a numeric or boolean dtype (kinds ``b i u f c``: dates,
    strings and records are pickled) or a 1-D object array of ``bytes`` all of one length (stored
    as ``uint8 (rows, length)``).
    """
    if type(value) is not dict:
        return None
    columns = []
    for name, array in value.items():
        if type(array) is not np.ndarray:
            return None
        if array.dtype == object:
            if array.ndim != 1 or not all(type(item) is bytes for item in array):
                return None
            width = len(array[0]) if len(array) else 0
            if any(len(item) != width for item in array):
                return None
            columns.append((name, "|u1", (len(array), width)))
        elif array.dtype.kind in "biufc":
            columns.append((name, array.dtype.str, array.shape))
        else:
            return None
    return columns


class DamagedEntry(OSError):
    """A ``*.rowgroup`` file that does not hold what its header says (cut short, overwritten).
    An ``OSError``, so diskcache's ``get`` counts it as a miss and Petastorm reads the row group
    from Parquet again, whose ``set`` replaces the file."""


def _open_new(full_path: str):
    """``open(full_path, "xb")``, its folder made first; tried 10 times, as diskcache's own
    ``Disk._write`` does, because another thread's eviction removes folders that became empty
    (``Disk.remove``) between our ``makedirs`` and ``open``."""
    for attempt in range(10):
        try:
            os.makedirs(os.path.dirname(full_path), exist_ok=True)
            return open(full_path, "xb")
        except FileNotFoundError:
            if attempt == 9:
                raise
    raise AssertionError("unreachable")


def _write_columns(f, value, columns: List[Column]) -> int:
    """Write the header and each column (64-byte aligned) of ``value`` into ``f``; returns the size."""
    header = pickle.dumps(columns, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_LENGTH.pack(len(header)) + header)
    for name, _dtype, _shape in columns:
        f.write(b"\0" * (-f.tell() % ALIGN))
        array = value[name]
        if array.dtype == object:
            for item in array:  # straight from each bytes object: no joined copy
                f.write(item)
        else:
            f.write(np.ascontiguousarray(array).data)
    return f.tell()


class RowGroupDisk(diskcache.Disk):
    """diskcache serialisation of Petastorm row groups as flat, memory-mapped files (module doc)."""

    def store(self, value, read, key=UNKNOWN):
        """diskcache's ``store``: ``(size in bytes, mode, filename, db value)``; a row group is
        written to its own ``*.rowgroup`` file (removed again if writing fails: no orphan), anything
        else as diskcache would."""
        columns = None if read else flat_columns(value)
        if columns is None:
            return super().store(value, read, key)
        filename, full_path = self.filename(key, value)
        filename, full_path = filename[:-len(".val")] + SUFFIX, full_path[:-len(".val")] + SUFFIX
        try:
            with _open_new(full_path) as f:
                size = _write_columns(f, value, columns)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(full_path)
            raise
        return size, MODE_BINARY, filename, None

    def fetch(self, mode, filename, value, read):
        """diskcache's ``fetch``: a ``*.rowgroup`` file comes back as a dict of read-only arrays
        over one memory map of the file (the map lives as long as any of them)."""
        if read or mode != MODE_BINARY or not filename.endswith(SUFFIX):
            return super().fetch(mode, filename, value, read)
        return read_row_group(os.path.join(self._directory, filename))


def read_row_group(path: str) -> Dict[str, np.ndarray]:
    """The columns of one ``*.rowgroup`` file, as arrays over a read-only memory map of it.

    The file must end where its last column ends. (Truncating a file while arrays of it are in
    use is outside interference: the map then faults, SIGBUS, like any mapped file.)

    Raises:
        OSError: the file cannot be opened or mapped, diskcache's ``get`` takes that for an entry
            evicted meanwhile, a miss; :class:`DamagedEntry` (an ``OSError``, a miss too) when its
            header cannot be read or its size is not what the header says.
    """
    with open(path, "rb") as f:
        try:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise DamagedEntry(f"{path}: empty") from None
    try:
        (length,) = _LENGTH.unpack_from(mapped)
        offset = _LENGTH.size + length
        columns = pickle.loads(mapped[_LENGTH.size:offset])
        out = {}
        for name, dtype, shape in columns:
            offset += -offset % ALIGN
            out[name] = np.frombuffer(mapped, dtype, int(np.prod(shape)), offset).reshape(shape)
            offset += out[name].nbytes
    except Exception as exc:  # struct, pickle, NumPy: each says "not what was written" its own way
        raise DamagedEntry(f"{path}: {exc}") from None
    if offset != len(mapped):
        raise DamagedEntry(f"{path}: its header describes {plural(offset, 'byte')}, the file holds {len(mapped)}")
    return out
