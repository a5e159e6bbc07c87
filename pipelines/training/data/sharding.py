"""The sharding rule, stated once: which items of a split a rank reads.

Rank ``r`` of ``world_size`` ranks reads items ``r, r + world_size, r + 2 * world_size, ...`` (``shard``:
row groups for the readers, rows for the feature cache), so the shards are disjoint, cover the items and
differ in length by at most one. Petastorm applies the same rule to row groups with
``make_reader(cur_shard=rank, shard_count=world_size)``, which its path passes instead.

A one-pass read (exact evaluation, the feature cache) must give every rank a share however short the
split: ``one_pass_pieces`` keeps ``shard`` of the row groups while there are at least as many as ranks,
and cuts the split's rows into contiguous ranges beyond that (``row_ranges``).
"""
from __future__ import annotations

from typing import Any, List, Protocol, Sequence, Tuple, TypeVar

from pipelines.runtime.logs import plural


class _Sliceable(Protocol):
    def __getitem__(self, index: slice) -> Any: ...


S = TypeVar("S", bound=_Sliceable)  # a list, a tuple or a numpy array

#: a piece of a one-pass shard: a row group (anything with ``rows``), its first row, its end row
Piece = Tuple[Any, int, int]


def shard(items: S, rank: int, world_size: int) -> S:
    """Rank ``rank``'s shard of ``items`` (a list, or a numpy array along its first axis: a view),
    in the items' order.

    Raises:
        ValueError: ``world_size`` < 1, or ``rank`` not in ``[0, world_size)``.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {plural(world_size, 'rank')}")
    return items[rank::world_size]


def row_ranges(groups: Sequence, rank: int, world_size: int) -> List[Piece]:
    """Rank ``rank``'s rows ``[rank * N // world_size, (rank + 1) * N // world_size)`` of the ``N`` rows of
    ``groups`` (in order; each has ``rows``), as ``(row group, first row, end row)`` slices of the row groups
    they lie in (a rank may get none when ``N < world_size``)."""
    total = sum(group.rows for group in groups)
    first, end = rank * total // world_size, (rank + 1) * total // world_size
    pieces, offset = [], 0
    for group in groups:
        start, stop = max(first - offset, 0), min(end - offset, group.rows)
        if start < stop:
            pieces.append((group, start, stop))
        offset += group.rows
    return pieces


def one_pass_pieces(groups: Sequence, rank: int, world_size: int) -> List[Piece]:
    """Rank ``rank``'s share of a split read once, as ``(row group, first row, end row)`` pieces: its whole
    row groups by ``shard`` (shards differ by at most one row group) while ``groups`` are at least
    ``world_size``; else ``row_ranges`` (shards differ by at most one row, and no world size is refused for a
    short split). Either way the ranks' pieces are disjoint and cover the split."""
    if len(groups) >= world_size:
        return [(group, 0, group.rows) for group in shard(groups, rank, world_size)]
    return row_ranges(groups, rank, world_size)
