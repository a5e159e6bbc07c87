"""The bounds of a run's world size (``--min-np``, ``--max-np``) and the size of a relaunch (pure arithmetic)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural


@dataclass(frozen=True)
class WorldBounds:
    """A run's world: it starts on ``np`` ranks; a relaunch may take ``min_np`` to ``max_np`` (both ``np``: fixed)."""

    np: int
    min_np: int
    max_np: int

    @classmethod
    def of(cls, np: int, min_np: Optional[int] = None, max_np: Optional[int] = None) -> "WorldBounds":
        """The bounds of a run of ``np`` ranks, ``min_np`` and ``max_np`` defaulting to ``np``.

        Raises:
            pipelines.runtime.errors.Refused: as ``check_bounds``."""
        bounds = cls(np, np if min_np is None else min_np, np if max_np is None else max_np)
        check_bounds(bounds)
        return bounds

    @property
    def fixed(self) -> bool:
        """Whether every attempt runs on ``np`` ranks."""
        return self.min_np == self.max_np == self.np

    def relaunch_size(self, slots: int) -> Optional[int]:
        """A relaunch's world size for ``slots`` free slots: ``min(max_np, slots)``, or None when below ``min_np``."""
        size = min(self.max_np, slots)
        return size if size >= self.min_np else None


def check_bounds(bounds: WorldBounds) -> None:
    """Refuse bounds no run can keep: ``1 <= min_np <= np <= max_np``, all integers.

    Raises:
        pipelines.runtime.errors.Refused: naming the flags and their values."""
    for flag, value in (("--min-np", bounds.min_np), ("--max-np", bounds.max_np)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise Refused(f"{flag} must be an integer, got {value!r}")
    if bounds.min_np < 1:
        raise Refused(f"--min-np must be at least 1 (a run needs a rank), got {bounds.min_np}")
    if bounds.min_np > bounds.np:
        raise Refused(f"--min-np {bounds.min_np} is above the world size {bounds.np} (--spark-np {bounds.np}): "
                      f"a run starts on --spark-np ranks and continues on no fewer than --min-np")
    if bounds.max_np < bounds.min_np < bounds.np:
        raise Refused(f"--max-np {bounds.max_np} is below --min-np {bounds.min_np}")
    if bounds.max_np < bounds.np:
        raise Refused(f"--max-np {bounds.max_np} is below the world size {bounds.np} (--spark-np {bounds.np}): "
                      f"a run starts on --spark-np ranks and grows to at most --max-np")


def relaunch_line(bounds: WorldBounds, previous: Optional[int], size: int, slots: int) -> str:
    """The driver's line on a relaunch's world (``relaunching on 2 ranks (world size 3 -> 2): ...``)."""
    change = f"world size {previous} -> {size}" if previous not in (None, size) else f"world size {size}"
    return (f"relaunching on {plural(size, 'rank')} ({change}): the cluster offers {plural(slots, 'task slot')} now "
            f"(--min-np {bounds.min_np}, --max-np {bounds.max_np})")
