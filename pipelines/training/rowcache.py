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

import mmap
import os
import pickle
import struct
from typing import Dict, List, Optional, Tuple

import diskcache
import numpy as np
from diskcache.core import MODE_BINARY, UNKNOWN

ALIGN = 64  # bytes; TensorFlow and NumPy's vectorised copies prefer aligned sources
SUFFIX = ".rowgroup"
_LENGTH = struct.Struct("<Q")

Column = Tuple[str, str, Tuple[int, ...]]  # name, NumPy dtype string, shape as stored


def flat_columns(value) -> Optional[List[Column]]:
    """The columns of ``value`` as :class:`RowGroupDisk` stores them, or None when it cannot
    (then diskcache pickles it).

    ``value`` qualifies when it is a ``dict`` of NumPy arrays, each either of a fixed-size dtype or
    an object array of ``bytes`` all of one length (stored as ``uint8 (rows, length)``).
    """
    if type(value) is not dict:
        return None
    columns = []
    for name, array in value.items():
        if not isinstance(array, np.ndarray):
            return None
        if array.dtype == object:
            if array.ndim != 1 or not all(type(item) is bytes for item in array):
                return None
            width = len(array[0]) if len(array) else 0
            if any(len(item) != width for item in array):
                return None
            columns.append((name, "|u1", (len(array), width)))
        elif array.dtype.hasobject:
            return None
        else:
            columns.append((name, array.dtype.str, array.shape))
    return columns


class RowGroupDisk(diskcache.Disk):
    """diskcache serialisation of Petastorm row groups as flat, memory-mapped files (module doc)."""

    def store(self, value, read, key=UNKNOWN):
        """diskcache's ``store``: ``(size in bytes, mode, filename, db value)``; a row group is
        written to its own ``*.rowgroup`` file, anything else as diskcache would."""
        columns = None if read else flat_columns(value)
        if columns is None:
            return super().store(value, read, key)
        filename, full_path = self.filename(key, value)
        filename, full_path = filename[:-len(".val")] + SUFFIX, full_path[:-len(".val")] + SUFFIX
        os.makedirs(os.path.dirname(full_path), exist_ok=True)
        header = pickle.dumps(columns, protocol=pickle.HIGHEST_PROTOCOL)
        with open(full_path, "xb") as f:
            f.write(_LENGTH.pack(len(header)) + header)
            for name, _dtype, _shape in columns:
                f.write(b"\0" * (-f.tell() % ALIGN))
                array = value[name]
                if array.dtype == object:
                    for item in array:  # straight from each bytes object: no joined copy
                        f.write(item)
                else:
                    f.write(np.ascontiguousarray(array).data)
            size = f.tell()
        return size, MODE_BINARY, filename, None

    def fetch(self, mode, filename, value, read):
        """diskcache's ``fetch``: a ``*.rowgroup`` file comes back as a dict of read-only arrays
        over one memory map of the file (the map lives as long as any of them)."""
        if read or mode != MODE_BINARY or not filename.endswith(SUFFIX):
            return super().fetch(mode, filename, value, read)
        return read_row_group(os.path.join(self._directory, filename))


def read_row_group(path: str) -> Dict[str, np.ndarray]:
    """The columns of one ``*.rowgroup`` file, as arrays over a read-only memory map of it.

    Raises:
        OSError: the file cannot be opened or mapped; diskcache's ``get`` takes that for an entry
            evicted meanwhile, a miss, and Petastorm reads the row group again.
        ValueError: the file is shorter than its header says (a damaged cache).
    """
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    (length,) = _LENGTH.unpack_from(mapped)
    offset = _LENGTH.size + length
    columns = pickle.loads(mapped[_LENGTH.size:offset])
    out = {}
    for name, dtype, shape in columns:
        offset += -offset % ALIGN
        array = np.frombuffer(mapped, dtype, int(np.prod(shape)), offset).reshape(shape)
        out[name] = array
        offset += array.nbytes
    return out
