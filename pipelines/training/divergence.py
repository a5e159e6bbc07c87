"""Divergence: the pure parts (which values are not finite, where a run stopped, what it says)."""
from __future__ import annotations

import math
import numbers
from typing import List, Mapping, Optional, Sequence

import numpy as np


class TrainingDiverged(RuntimeError):
    """Training reached a non-finite loss, log or weight; every rank raises it at the same step (exit 1, not 2)."""


def non_finite_logs(logs: Optional[Mapping]) -> List[str]:
    """The numeric entries of Keras ``logs`` that are NaN or +-inf, in order, as ``"name (value)"``."""
    found = []
    for name, value in (logs or {}).items():
        if isinstance(value, np.ndarray) and value.size == 1:
            value = value.item()
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isfinite(float(value)):
            found.append(f"{name} ({float(value)})")
    return found


def non_finite_arrays(arrays: Mapping[str, np.ndarray]) -> List[str]:
    """The names of the float ``arrays`` holding a NaN or +-inf, in order."""
    return [name for name, array in arrays.items()
            if np.asarray(array).dtype.kind in "fc" and not np.isfinite(array).all()]


def step_place(epoch: int, step: int, steps: int) -> str:
    """``"epoch 2, step 3 of 5"`` (both 1-based)."""
    return f"epoch {epoch}, step {step} of {steps}"


def epoch_end_place(epoch: int, steps: int) -> str:
    """Where an epoch's end is: ``"epoch 2, step 5 of 5 (the epoch's end)"``."""
    return f"{step_place(epoch, steps, steps)} (the epoch's end)"


def diverged_message(place: str, found: Sequence[Optional[str]], hosts: Sequence[str]) -> str:
    """The one message every rank raises ``TrainingDiverged`` with.

    Args:
        found: per rank, what it found not finite (``"loss (nan)"``), or ``None``.
        hosts: per rank, its host name."""
    parts = [f"non-finite {what} at {place} on rank {rank} (host {hosts[rank] if rank < len(hosts) else '?'})"
             for rank, what in enumerate(found) if what]
    return "training diverged: " + "; ".join(parts)
