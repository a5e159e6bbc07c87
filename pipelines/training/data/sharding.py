"""The sharding rule, stated once: rank ``r`` of ``world_size`` reads items ``r, r + world_size, ...``.

Petastorm applies the same rule with ``make_reader(cur_shard=rank, shard_count=world_size)``. A one-pass read
gives every rank a share however short the split (``one_pass_pieces``)."""
from __future__ import annotations

from typing import Any, List, Protocol, Sequence, Tuple, TypeVar

from pipelines.runtime.logs import plural


class _Sliceable(Protocol):
    def __getitem__(self, index: slice) -> Any: ...


S = TypeVar("S", bound=_Sliceable)  # a list, a tuple or a numpy array

#: a piece of a one-pass shard: a row group (anything with ``rows``), its first row, its end row
Piece = Tuple[Any, int, int]


def shard(items: S, rank: int, world_size: int) -> S:
    """Rank ``rank``'s shard of ``items`` (a list, or a view of a numpy array along its first axis).

    Raises:
        ValueError: ``world_size`` < 1, or ``rank`` not in ``[0, world_size)``."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {plural(world_size, 'rank')}")
    return items[rank::world_size]


def row_ranges(groups: Sequence, rank: int, world_size: int) -> List[Piece]:
    """Rank ``rank``'s rows ``[rank * N // world_size, (rank + 1) * N // world_size)`` of the ``N`` rows of
    ``groups``, as ``(row group, first row, end row)`` slices."""
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
    """Rank ``rank``'s share of a split read once, as ``(row group, first row, end row)`` pieces: whole row
    groups by ``shard`` while there are at least ``world_size``, else ``row_ranges``; disjoint and covering."""
    if len(groups) >= world_size:
        return [(group, 0, group.rows) for group in shard(groups, rank, world_size)]
    return row_ranges(groups, rank, world_size)
