"""Pure arithmetic of the Parquet layout and of the work split: rows per row group, which task reads which files.

Readers shard a split by whole row groups, so a split needs at least as many as the largest world size reading it."""
from __future__ import annotations

import hashlib
from typing import List, Mapping, Sequence, Tuple, TypeVar

T = TypeVar("T")


def rows_per_row_group(row_bytes: int, target_bytes: float, split_rows: Mapping[str, int],
                       min_row_groups: int) -> int:
    """Rows per row group: near ``target_bytes`` of decoded rows, few enough for ``min_row_groups`` in every split."""
    by_bytes = max(1, round(target_bytes / row_bytes))
    by_count = min((rows // min_row_groups for rows in split_rows.values() if rows > 0), default=by_bytes)
    return max(1, min(by_bytes, by_count))


def spread_order(relative_path: str, seed: int) -> bytes:
    """Sort key mixing classes in every task's chunk: a seeded hash, not the split's, so test files spread too."""
    return hashlib.blake2b(f"{seed}:{relative_path}".encode("utf-8", "surrogateescape"),
                           digest_size=8, person=b"etl-spread").digest()


def cut_into(items: Sequence[T], parts: int) -> List[List[T]]:
    """``items`` in ``parts`` contiguous chunks of lengths differing by at most one; ValueError when ``parts < 1``."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    n = len(items)
    return [list(items[i * n // parts:(i + 1) * n // parts]) for i in range(parts)]


def closure_chunks(items: Sequence[tuple], parts: int) -> List[List[Tuple]]:
    """`cut_into` for a Spark closure: named tuples as plain tuples, which cloudpickle ships several times faster."""
    return [[tuple(item) for item in chunk] for chunk in cut_into(items, parts)]


# Images per ETL task at most: progress moves task by task in steps of a few seconds, and a task's own costs stay
# a few percent of it (docs/etl.md, "Progress and task size").
TASK_IMAGES = 500


def task_count(items: int, parallelism: int, per_task: int, requested: int = 0) -> int:
    """Spark tasks: ``requested`` if > 0, else ``max(2 * parallelism, ceil(items / per_task))``; within 1..items."""
    if per_task < 1:
        raise ValueError(f"per_task must be >= 1, got {per_task}")
    wanted = requested if requested > 0 else max(2 * parallelism, -(-items // per_task))
    return max(1, min(wanted, items))
