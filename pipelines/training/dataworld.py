"""A run's arithmetic on another world size than it started on: pure (issue 38, item 3).

The rule. A run's arithmetic is fixed by the world it started on, its *data world*: ``n0`` ranks
of ``b`` rows each (``--batch-size``), recorded in ``train_run.json``'s and every checkpoint
marker's ``world`` (:func:`pipelines.training.records.ownership.world_of`). For the rest of the run, whatever
the physical world size ``n`` is later:

* the global batch is ``G = n0 x b`` and an epoch ``train_rows // G`` steps
  (:func:`pipelines.training.schedule.plan_steps` with ``n0``);
* the learning rate is ``base_lr x n0`` and the warmup ramps to it with ``n0``
  (:func:`pipelines.training.schedule.warmup_lr`, :class:`pipelines.training.warmup.DataWorldWarmup`);
* each of the ``n0`` *virtual ranks* ``v`` keeps its own stream exactly as a rank of the data world
  reads it: its shard (row groups ``v::n0``, :func:`pipelines.training.data.sharding.shard`), its seed
  (``--seed + v``), its position (:mod:`pipelines.training.data.stream`);
* global step ``k`` trains the concatenation over ``v = 0 .. n0-1`` of virtual rank ``v``'s ``b``
  rows of that step; physical rank ``j`` of ``n`` computes rows ``[lo_j, hi_j)`` of it,
  ``lo_j = floor(j G / n)`` (:func:`rank_rows`), so per-rank batches differ by one row at most and
  a rank reads only the virtual streams its range overlaps (:meth:`DataWorld.share`).

So a run continued on another world trains on the same rows at every step as an uninterrupted one;
what differs is the order of floating-point sums and each rank's dropout draws.

Gradient averaging with unequal batches. Horovod's ``DistributedOptimizer`` averages the ranks'
gradients, and Keras' default loss reduction (``SUM_OVER_BATCH_SIZE``) divides a rank's weighted
loss sum by its batch size ``b_j``. Weighting each row of rank ``j`` by ``w_j = n b_j / G``
(:func:`loss_weight`) makes the average the exact mean over the ``G`` rows::

    (1/n) sum_j (1/b_j) sum_{i in j} w_j l_i = (1/n) sum_j (n/G) sum_{i in j} l_i = (1/G) sum_i l_i

When ``G % n == 0`` every ``b_j = G/n`` and ``w_j = 1``: no weights at all. (Checked numerically
in both stacks' Keras: ``tests/unit/training/test_dataworld.py``.)
"""
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
    """What physical rank ``rank`` of ``world_size`` computes at every step: the ``pieces`` of the
    virtual ranks' batches, in global-batch order, ``rows`` in all (its per-rank batch ``b_j``),
    and the loss ``weight`` of each of its rows (:func:`loss_weight`; ``None``: no weights)."""

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
    """``(lo, hi)``: the rows of a global batch of ``global_batch`` rows that physical rank
    ``rank`` of ``world_size`` computes, ``lo = floor(rank x global_batch / world_size)``, ``hi``
    the next rank's ``lo`` (``global_batch`` for the last). Contiguous, disjoint, covering.

    Raises:
        ValueError: ``rank`` not in ``[0, world_size)``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {plural(world_size, 'rank')}")
    return rank * global_batch // world_size, (rank + 1) * global_batch // world_size


def loss_weight(rows: int, global_batch: int, world_size: int) -> Optional[float]:
    """The loss weight of each of the ``rows`` rows of a rank of ``world_size``:
    ``world_size x rows / global_batch`` (module doc), or ``None`` when ``global_batch`` divides
    evenly over the ranks (every weight would be 1)."""
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
        """The data world a run record's ``world`` (:func:`pipelines.training.records.ownership.world_of`)
        names; a record without one (written before worlds were) is taken to be of this launch's
        ``world_size`` and ``batch_size``."""
        if not isinstance(world, dict) or not isinstance(world.get("world_size"), int):
            return cls(world_size, batch_size)
        return cls(int(world["world_size"]), int(world.get("batch_size") or batch_size))

    def check(self, world_size: int) -> None:
        """Refuse a physical world this run cannot continue on.

        Raises:
            pipelines.runtime.errors.Refused: ``world_size`` < 1, or larger than the global batch (a rank
                would have no row to compute).
        """
        if not 1 <= world_size <= self.global_batch:
            raise Refused(f"world size {world_size}: a run of global batch {self.global_batch} ({self.size} x "
                          f"{plural(self.batch_size, 'row')}) continues on 1 to {plural(self.global_batch, 'rank')}")

    def same(self, world_size: int) -> bool:
        """Whether ``world_size`` is the data world's own (today's path, unchanged)."""
        return world_size == self.size

    def per_rank_batches(self, world_size: int) -> List[int]:
        """``b_j`` of every physical rank of ``world_size``: ``[b] * n0`` on the data world itself."""
        self.check(world_size)
        return [hi - lo for lo, hi in (rank_rows(self.global_batch, j, world_size) for j in range(world_size))]

    def share(self, rank: int, world_size: int) -> RankShare:
        """Physical rank ``rank`` of ``world_size``'s :class:`RankShare`: its rows ``[lo, hi)`` of
        each global batch (:func:`rank_rows`) as pieces of the virtual ranks' ``b`` rows.

        Raises:
            pipelines.runtime.errors.Refused: as :meth:`check`.
            ValueError: ``rank`` not in ``[0, world_size)``.
        """
        self.check(world_size)
        b = self.batch_size
        lo, hi = rank_rows(self.global_batch, rank, world_size)
        pieces = tuple(Piece(v, max(lo - v * b, 0), min(hi - v * b, b)) for v in range(lo // b, -(-hi // b)))
        return RankShare(rank, world_size, pieces, hi - lo, loss_weight(hi - lo, self.global_batch, world_size))

    def describe(self, world_size: int) -> str:
        """``data world 2 x 4 rows (global batch 8) on world size 3: per-rank batches 2, 3, 3 (rows
        weighted 0.75, 1.125, 1.125)`` (for the log)."""
        batches = self.per_rank_batches(world_size)
        text = (f"data world {self.size} x {plural(self.batch_size, 'row')} (global batch {self.global_batch}) on "
                f"world size {world_size}: per-rank batches {', '.join(map(str, batches))}")
        if self.global_batch % world_size:
            weights = [loss_weight(rows, self.global_batch, world_size) for rows in batches]
            text += f" (rows weighted {', '.join(f'{w:g}' for w in weights)})"
        return text
