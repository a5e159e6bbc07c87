"""Early stopping: the metric watched, and patience counted in optimizer steps with a floor in epochs.

Patience in epochs alone means different things at different data sizes: three epochs are about
4,500 steps on Caltech-256 and 15 steps on 74 images. Counted in steps, it is the same amount of
optimisation at any size; the floor in epochs keeps at least that many exact validations
without a gain before a run stops.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict

MONITORS = ("val_loss", "val_accuracy")


@dataclass(frozen=True)
class StoppingRule:
    """When early stopping ends a run.

    Attributes:
        monitor: the exact validation metric watched: ``val_loss`` (lower is better) or
            ``val_accuracy`` (higher is better).
        patience_steps: optimizer steps without a gain before the run stops (0: epochs only).
        patience_epochs: the floor: at least this many epochs without a gain.
        min_delta: smallest change of ``monitor`` that counts as a gain (>= 0, in its units).
    """

    monitor: str
    patience_steps: int
    patience_epochs: int
    min_delta: float

    def patience(self, steps_per_epoch: int) -> int:
        """Epochs without a gain before stopping, for ``steps_per_epoch`` (>= 1) steps an epoch.

        Returns:
            ``max(patience_epochs, ceil(patience_steps / steps_per_epoch))``.
        """
        return max(self.patience_epochs, math.ceil(self.patience_steps / max(1, steps_per_epoch)))


#: The named rules of ``--stopping``: ``converge`` (the default) and the article's.
RULES: Dict[str, StoppingRule] = {
    "converge": StoppingRule(monitor="val_loss", patience_steps=100, patience_epochs=3, min_delta=0.0),
    "article": StoppingRule(monitor="val_accuracy", patience_steps=0, patience_epochs=3, min_delta=0.001),
}
