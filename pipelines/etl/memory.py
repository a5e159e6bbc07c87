"""Pure arithmetic of the ETL's memory bound: what one task holds, and what the executors can.

``tasks_per_worker * task_bytes`` must fit ``spark.executor.pyspark.memory``, or a local master's physical memory;
other masters without that setting are not checked."""
from __future__ import annotations

import os
import re
from typing import Mapping, Optional, Tuple

from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural

DECODE_BYTES_PER_PIXEL = 16  # decode_and_fit's measured worst case: transparent, rotated by EXIF (4+4+4+3) and noise
WORKER_BASE_BYTES = 256 * 2**20  # a Python worker with numpy, pyarrow, Pillow and pyspark imported
_LOCAL = re.compile(r"^local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")
_SIZE = re.compile(r"^(\d+)\s*([kmgtp]?)b?$", re.IGNORECASE)


def task_bytes(max_file_bytes: int, max_pixels: int, row_group_bytes: int, row_bytes: int) -> int:
    """Most bytes one task holds: the worker, the file, its decoded pixels, a row group buffer per split."""
    return (WORKER_BASE_BYTES + max_file_bytes + DECODE_BYTES_PER_PIXEL * max_pixels
            + 2 * (row_group_bytes + row_bytes))


def parse_size_mib(value: str) -> int:
    """Spark's memory strings (``"2g"``, ``"512m"``, ``"1024"`` = MiB) as bytes; `Refused` when not a size."""
    match = _SIZE.match(value.strip())
    if not match:
        raise Refused(f"not a memory size: {value!r}")
    number, unit = int(match.group(1)), match.group(2).lower() or "m"
    return number * 2 ** (10 * "kmgtp".index(unit) + 10)


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def executor_memory(master: str, conf: Mapping[str, str], cpu_count: int,
                    physical_bytes: int) -> Optional[Tuple[int, int, str]]:
    """``(tasks per worker, bytes their Python workers may hold, whence)``, or ``None``: unknown."""
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
    """Refuse (`Refused`, figures in GiB) ``need`` bytes a task that the executors cannot hold."""
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
