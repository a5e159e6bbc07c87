"""The sharding rule, stated once: which items of a split a rank reads.

Rank ``r`` of ``world_size`` ranks reads items ``r, r + world_size, r + 2 * world_size, ...``
(row groups of a split for the readers, rows for the feature cache), so the shards are disjoint,
cover the items and differ in length by at most one. It is the rule Petastorm applies to row
groups with ``make_reader(cur_shard=rank, shard_count=world_size)``, which the Petastorm path
passes instead (:mod:`pipelines.training.data.petastorm.reader`).
"""
from __future__ import annotations

from typing import Sequence, TypeVar

from pipelines.logs import plural

T = TypeVar("T")


def shard(items: Sequence[T], rank: int, world_size: int) -> Sequence[T]:
    """Rank ``rank``'s shard of ``items`` (a list, or a numpy array along its first axis: a view),
    in the items' order.

    Raises:
        ValueError: ``world_size`` < 1, or ``rank`` not in ``[0, world_size)``.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {plural(world_size, 'rank')}")
    return items[rank::world_size]
