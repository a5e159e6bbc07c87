"""Pure arithmetic of the Parquet layout and of the work split: rows per row group, which task
reads which files.

Petastorm shards a dataset by whole row groups (rank ``r`` of ``n`` reads row groups
``r, r + n, ...``), so a split needs at least as many row groups as the largest world size that
will read it, and a row group is the unit a reader holds in memory.
"""
from __future__ import annotations

import hashlib
from typing import List, Mapping, Sequence, Tuple, TypeVar

T = TypeVar("T")


def rows_per_row_group(row_bytes: int, target_bytes: float, split_rows: Mapping[str, int],
                       min_row_groups: int) -> int:
    """Rows per row group: near ``target_bytes`` of decoded data, small enough for every split
    to get ``min_row_groups`` row groups.

    Args:
        row_bytes: uncompressed bytes of one row's image (``size**2 * 3``).
        target_bytes: wanted uncompressed row-group size in bytes.
        split_rows: expected rows per split (e.g. ``{'train': 900, 'test': 100}``).
        min_row_groups: wanted minimum number of row groups per split.

    Returns:
        ``max(1, min(round(target_bytes / row_bytes), min_split_rows // min_row_groups))``,
        ignoring empty splits. A split with fewer rows than ``min_row_groups`` gets one row per
        row group, and then fewer row groups than asked (the manifest says so).
    """
    by_bytes = max(1, round(target_bytes / row_bytes))
    by_count = min((rows // min_row_groups for rows in split_rows.values() if rows > 0), default=by_bytes)
    return max(1, min(by_bytes, by_count))


def spread_order(relative_path: str, seed: int) -> bytes:
    """Sort key that spreads files over tasks: a seeded hash of the path relative to the root.

    Sorting candidates by it mixes classes within every contiguous chunk (so row groups mix
    classes) and gives the same order for the same seed on every run. It is a different hash
    from the split's ranking (:func:`pipelines.etl.labels.split_class`), so the test files are not
    bunched in a few tasks.
    """
    return hashlib.blake2b(f"{seed}:{relative_path}".encode("utf-8", "surrogateescape"),
                           digest_size=8, person=b"etl-spread").digest()


def cut_into(items: Sequence[T], parts: int) -> List[List[T]]:
    """``items`` cut into ``parts`` contiguous chunks whose lengths differ by at most one.

    ``cut_into(range(7), 3) == [[0, 1], [2, 3], [4, 5, 6]]``; chunks are empty when
    ``parts > len(items)``.

    Raises:
        ValueError: ``parts < 1``.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    n = len(items)
    return [list(items[i * n // parts:(i + 1) * n // parts]) for i in range(parts)]


def closure_chunks(items: Sequence[tuple], parts: int) -> List[List[Tuple]]:
    """:func:`cut_into` for a Spark task's closure: the chunks of ``items`` (named tuples) with
    each item as a plain ``tuple`` of its fields; the task rebuilds them with ``Type._make``.

    Why: cloudpickle, which ships a PySpark closure, calls back into Python for every object that
    is not exactly a built-in type: named tuples pickled and unpickled several times slower than
    tuples (docs/benchmarks.md, Figures behind the code's constants).
    """
    return [[tuple(item) for item in chunk] for chunk in cut_into(items, parts)]


# Images per ETL task by default: at most this many, so that the progress count (which moves task
# by task: pipelines.runtime.spark.log_progress) moves in steps of a few seconds of one core's work, and a
# lost task redoes that much; enough that a task's own costs (its start, its share of the
# closure, one Parquet file per split and its last, partial row group) stay a few percent of it.
# Figures: docs/etl.md ("Progress and task size").
TASK_IMAGES = 500


def task_count(items: int, parallelism: int, per_task: int, requested: int = 0) -> int:
    """Spark tasks for ``items`` items: ``requested`` when given (> 0), else
    ``max(2 * parallelism, ceil(items / per_task))`` (two tasks per core at least, so a slow task
    does not leave a core idle at the end; at most ``per_task`` items a task); never more than one
    task per item, never fewer than 1.

    ``task_count(30607, 2, 500) == 62``; ``task_count(40, 2, 500) == 4``;
    ``task_count(3, 2, 500) == 3``; ``task_count(1000, 2, 500, requested=2) == 2``.

    Raises:
        ValueError: ``per_task < 1``.
    """
    if per_task < 1:
        raise ValueError(f"per_task must be >= 1, got {per_task}")
    wanted = requested if requested > 0 else max(2 * parallelism, -(-items // per_task))
    return max(1, min(wanted, items))
