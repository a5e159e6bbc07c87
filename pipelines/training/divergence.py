"""Divergence: a NaN or infinite loss, log or weight ends the run on every rank at the same step.

The pure parts: which values are not finite, where a run stopped and what it says. The collective
check every rank runs is :class:`pipelines.training.callbacks.DivergenceGuard`; the checkpoint rule
(``--resume`` never continues from a checkpoint holding a non-finite value) is
:func:`pipelines.training.schedule.newest_complete_checkpoint`. See docs/training.md#divergence.
"""
from __future__ import annotations

import math
import numbers
from typing import List, Mapping, Optional, Sequence

import numpy as np


class TrainingDiverged(RuntimeError):
    """Training reached a non-finite loss, log or weight: every rank raises it at the same step,
    with the same message naming the epoch, the step and each rank (and its host) that found one.

    A failure of the run (exit 1), not a refusal of its input: deliberately not a ``ValueError``
    (:class:`pipelines.runtime.errors.Refused` is one, and only it exits 2).
    """


def non_finite_logs(logs: Optional[Mapping]) -> List[str]:
    """The numeric entries of Keras ``logs`` (``{"loss": 0.7, "val_loss": nan, ...}``, Python or
    NumPy scalars) that are NaN or +-inf, in their order, each as ``"name (value)"``:
    ``["val_loss (nan)"]``. Non-numeric entries are ignored; ``None`` has none."""
    found = []
    for name, value in (logs or {}).items():
        if isinstance(value, np.ndarray) and value.size == 1:
            value = value.item()
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isfinite(float(value)):
            found.append(f"{name} ({float(value)})")
    return found


def non_finite_arrays(arrays: Mapping[str, np.ndarray]) -> List[str]:
    """The names of the arrays (any shape; float or integer dtype) holding at least one NaN or
    +-inf value, in ``arrays``' order."""
    return [name for name, array in arrays.items()
            if np.asarray(array).dtype.kind in "fc" and not np.isfinite(array).all()]


def step_place(epoch: int, step: int, steps: int) -> str:
    """Where a training step is: ``"epoch 2, step 3 of 5"`` (both 1-based, as the console,
    checkpoints and ``metrics.json`` count epochs)."""
    return f"epoch {epoch}, step {step} of {steps}"


def epoch_end_place(epoch: int, steps: int) -> str:
    """Where an epoch's end is: ``"epoch 2, step 5 of 5 (the epoch's end)"``."""
    return f"{step_place(epoch, steps, steps)} (the epoch's end)"


def diverged_message(place: str, found: Sequence[Optional[str]], hosts: Sequence[str]) -> str:
    """The one message every rank raises :class:`TrainingDiverged` with.

    Args:
        place: :func:`step_place` or :func:`epoch_end_place`.
        found: per rank (index = rank), what it found not finite (``"loss (nan)"``), or ``None``.
        hosts: per rank, its host name.

    Returns:
        ``"training diverged: non-finite loss (nan) at epoch 2, step 3 of 5 on rank 1 (host h1)"``,
        with ``; ...`` for each further rank that found one.
    """
    parts = [f"non-finite {what} at {place} on rank {rank} (host {hosts[rank] if rank < len(hosts) else '?'})"
             for rank, what in enumerate(found) if what]
    return "training diverged: " + "; ".join(parts)
