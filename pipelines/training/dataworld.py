"""A run's arithmetic on another world size than it started on: pure.

The *data world* (``n0`` ranks of ``b`` rows) fixes global batch ``G = n0 x b`` and every stream. Physical
rank ``j`` of ``n`` computes rows ``[floor(j G / n), floor((j+1) G / n))`` of each step, each weighing
``w_j = n b_j / G`` so that Horovod's mean of per-rank means is the mean over ``G``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Tuple

from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural


class Piece(NamedTuple):
    """Rows ``[start, stop)`` of virtual rank ``virtual_rank``'s ``b`` rows of every step."""

    virtual_rank: int
    start: int
    stop: int


@dataclass(frozen=True)
class RankShare:
    """What physical rank ``rank`` of ``world_size`` computes each step: ``pieces`` in global-batch order,
    ``rows`` in all (``b_j``), and each row's loss ``weight`` (``None``: unweighted)."""

    rank: int
    world_size: int
    pieces: Tuple[Piece, ...]
    rows: int
    weight: Optional[float]

    @property
    def virtual_ranks(self) -> List[int]:
        """The virtual ranks whose streams this rank reads, in order."""
        return [piece.virtual_rank for piece in self.pieces]


def rank_rows(global_batch: int, rank: int, world_size: int) -> Tuple[int, int]:
    """``(lo, hi)``: rank ``rank``'s rows of a global batch.

    Raises:
        ValueError: ``rank`` not in ``[0, world_size)``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {plural(world_size, 'rank')}")
    return rank * global_batch // world_size, (rank + 1) * global_batch // world_size


def loss_weight(rows: int, global_batch: int, world_size: int) -> Optional[float]:
    """Each row's loss weight on a rank of ``rows`` rows; ``None`` when ``global_batch`` divides evenly."""
    if global_batch % world_size == 0:
        return None
    return world_size * rows / global_batch


@dataclass(frozen=True)
class DataWorld:
    """A run's data world: ``size`` ranks (``n0``) of ``batch_size`` rows (``b``) each."""

    size: int
    batch_size: int

    def __post_init__(self):
        if self.size < 1 or self.batch_size < 1:
            raise ValueError(f"a data world has >= 1 rank and >= 1 row per rank, got {self.size} and "
                             f"{self.batch_size}")

    @property
    def global_batch(self) -> int:
        """``G = n0 x b``: rows per step, on every physical world."""
        return self.size * self.batch_size

    @classmethod
    def of_record(cls, world: Optional[Dict], batch_size: int, world_size: int) -> "DataWorld":
        """The data world a run record's ``world`` names; without one, this launch's size and batch."""
        if not isinstance(world, dict) or not isinstance(world.get("world_size"), int):
            return cls(world_size, batch_size)
        return cls(int(world["world_size"]), int(world.get("batch_size") or batch_size))

    def check(self, world_size: int) -> None:
        """Refuse a physical world this run cannot continue on.

        Raises:
            pipelines.runtime.errors.Refused: ``world_size`` < 1, or larger than the global batch."""
        if not 1 <= world_size <= self.global_batch:
            raise Refused(f"world size {world_size}: a run of global batch {self.global_batch} ({self.size} x "
                          f"{plural(self.batch_size, 'row')}) continues on 1 to {plural(self.global_batch, 'rank')}")

    def same(self, world_size: int) -> bool:
        """Whether ``world_size`` is the data world's own (the unchanged path)."""
        return world_size == self.size

    def per_rank_batches(self, world_size: int) -> List[int]:
        """``b_j`` of every physical rank of ``world_size``."""
        self.check(world_size)
        return [hi - lo for lo, hi in (rank_rows(self.global_batch, j, world_size) for j in range(world_size))]

    def share(self, rank: int, world_size: int) -> RankShare:
        """The ``RankShare`` of physical rank ``rank`` of ``world_size``.

        Raises:
            pipelines.runtime.errors.Refused: as ``check``.
            ValueError: ``rank`` not in ``[0, world_size)``."""
        self.check(world_size)
        b = self.batch_size
        lo, hi = rank_rows(self.global_batch, rank, world_size)
        pieces = tuple(Piece(v, max(lo - v * b, 0), min(hi - v * b, b)) for v in range(lo // b, -(-hi // b)))
        return RankShare(rank, world_size, pieces, hi - lo, loss_weight(hi - lo, self.global_batch, world_size))

    def describe(self, world_size: int) -> str:
        """One log line: data world, global batch, per-rank batches and row weights on ``world_size``."""
        batches = self.per_rank_batches(world_size)
        text = (f"data world {self.size} x {plural(self.batch_size, 'row')} (global batch {self.global_batch}) on "
                f"world size {world_size}: per-rank batches {', '.join(map(str, batches))}")
        if self.global_batch % world_size:
            weights = [loss_weight(rows, self.global_batch, world_size) for rows in batches]
            text += f" (rows weighted {', '.join(f'{w:g}' for w in weights)})"
        return text
