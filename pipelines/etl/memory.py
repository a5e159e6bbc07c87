"""Pure arithmetic of the ETL's memory bound: what one task holds, and what the executors can.

A task reads one file at a time into Python (never more than ``max_file_bytes + 1`` bytes) and
decodes it; so at any moment it holds at most

    task_bytes = WORKER_BASE_BYTES + max_file_bytes + DECODE_BYTES_PER_PIXEL * max_pixels
                 + 2 * (row_group_bytes + row_bytes)

(the Python worker itself, the encoded file, the decoded pixels and their conversions, and one
row-group buffer per split). ``DECODE_BYTES_PER_PIXEL`` is the measured worst case of
:func:`pipelines.etl.images.decode_and_fit`: an RGBA or transparent palette image rotated by its
EXIF orientation keeps the decoded image, its transposed copy, the RGBA conversion, a white
background, the composite and the RGB result (4 + 4 + 4 + 3 bytes per pixel plus noise);
16-bit greyscale needs about 9. JPEGs decode at a reduced DCT scale and need far less.

The executors can hold ``tasks_per_worker * task_bytes`` when that is at most the memory the
Python workers of one executor may use: ``spark.executor.pyspark.memory`` when it is set (Spark
gives each Python worker that divided by the executor's cores), else, for a local master, the
machine's physical memory. For other masters without ``spark.executor.pyspark.memory`` nothing
is known and nothing is refused.
"""
from __future__ import annotations

import os
import re
from typing import Mapping, Optional, Tuple

from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural

DECODE_BYTES_PER_PIXEL = 16
WORKER_BASE_BYTES = 256 * 2**20  # a Python worker with numpy, pyarrow, Pillow and pyspark imported
_LOCAL = re.compile(r"^local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")
_SIZE = re.compile(r"^(\d+)\s*([kmgtp]?)b?$", re.IGNORECASE)


def task_bytes(max_file_bytes: int, max_pixels: int, row_group_bytes: int, row_bytes: int) -> int:
    """Upper bound of the bytes one ETL task holds (formula in the module docstring)."""
    return (WORKER_BASE_BYTES + max_file_bytes + DECODE_BYTES_PER_PIXEL * max_pixels
            + 2 * (row_group_bytes + row_bytes))


def parse_size_mib(value: str) -> int:
    """Spark's memory strings (``"2g"``, ``"512m"``, ``"1024"`` = MiB) -> bytes.

    Raises:
        ValueError: not a size.
    """
    match = _SIZE.match(value.strip())
    if not match:
        raise Refused(f"not a memory size: {value!r}")
    number, unit = int(match.group(1)), match.group(2).lower() or "m"
    return number * 2 ** (10 * "kmgtp".index(unit) + 10)


def physical_memory_bytes() -> int:
    """This machine's physical memory (``SC_PHYS_PAGES * SC_PAGE_SIZE``)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def executor_memory(master: str, conf: Mapping[str, str], cpu_count: int,
                    physical_bytes: int) -> Optional[Tuple[int, int, str]]:
    """Concurrent tasks per worker and the bytes their Python workers can hold together.

    Args:
        master: Spark master URL (``local[4]``, ``local[*]``, ``spark://...``).
        conf: the Spark configuration known so far (may be empty before Spark starts).
        cpu_count, physical_bytes: this machine's cores and memory (for local masters).

    Returns:
        ``(tasks, bytes, where)`` with ``where`` naming the source of ``bytes``, or ``None`` when
        nothing is known (a cluster master without ``spark.executor.pyspark.memory``).
    """
    task_cpus = max(1, int(conf.get("spark.task.cpus", "1")))
    local = _LOCAL.match(master.strip())
    if local:
        threads = local.group(1)
        cores = 1 if threads is None else cpu_count if threads == "*" else int(threads)
    else:
        cores = int(conf.get("spark.executor.cores", "1"))
    tasks = max(1, cores // task_cpus)
    if conf.get("spark.executor.pyspark.memory"):
        return tasks, parse_size_mib(conf["spark.executor.pyspark.memory"]), \
            f"spark.executor.pyspark.memory={conf['spark.executor.pyspark.memory']}"
    if local:
        return tasks, physical_bytes, f"the physical memory of this machine ({master})"
    return None


def check_task_memory(need: int, available: Optional[Tuple[int, int, str]]) -> None:
    """Refuse a configuration whose tasks cannot fit in the executors' memory.

    Args:
        need: :func:`task_bytes` of the configuration.
        available: :func:`executor_memory`'s answer (``None``: unknown, nothing refused).

    Raises:
        ValueError: ``tasks * need`` exceeds the memory, with both figures in GiB.
    """
    if available is None:
        return
    tasks, memory, where = available
    if tasks * need > memory:
        raise Refused(
            f"not enough memory for --max-file-mb/--max-pixels: each task may hold "
            f"{need / 2**30:.2f} GiB (the file, {DECODE_BYTES_PER_PIXEL} bytes per decoded pixel, "
            f"buffers), x {plural(tasks, 'concurrent task')} = {tasks * need / 2**30:.2f} GiB > "
            f"{memory / 2**30:.2f} GiB, {where}; lower --max-file-mb or --max-pixels, or use fewer "
            "cores per worker")
