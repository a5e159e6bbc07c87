"""Early stopping: the metric watched, and patience in optimizer steps (the same at any data size) with a
floor in epochs."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Dict, Optional

from pipelines.runtime.checks import check_number
from pipelines.runtime.errors import Refused

#: The metrics a rule may watch: the exact validation metrics every epoch logs.
MONITORS = ("val_loss", "val_accuracy")


@dataclass(frozen=True)
class StoppingRule:
    """When early stopping ends a run.

    Attributes:
        patience_steps: optimizer steps without a gain before the run stops (0: epochs only).
        patience_epochs: the floor: at least this many epochs without a gain.
        min_delta: smallest change of ``monitor`` that counts as a gain (>= 0, in its units)."""

    monitor: str
    patience_steps: int
    patience_epochs: int
    min_delta: float

    def __post_init__(self) -> None:
        """Refuse a value no run can use, naming its flag.

        Raises:
            pipelines.runtime.errors.Refused: unknown ``monitor``, ``patience_epochs`` < 1, ``patience_steps`` < 0,
                ``min_delta`` not finite and >= 0."""
        if self.monitor not in MONITORS:
            raise Refused(f"--monitor {self.monitor}: early stopping watches a metric every epoch logs: "
                          f"{' or '.join(MONITORS)}")
        for flag, value, least in (("--patience", self.patience_epochs, 1),
                                   ("--patience-steps", self.patience_steps, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or not value >= least:
                raise Refused(f"{flag} must be an integer >= {least}, got {value}")
        check_number("--min-delta", self.min_delta, at_least=0)

    @property
    def mode(self) -> str:
        """Keras' ``mode``: ``min`` for a loss, ``max`` for an accuracy."""
        return "min" if self.monitor.endswith("loss") else "max"

    def patience(self, steps_per_epoch: int) -> int:
        """Epochs without a gain before stopping: ``max(patience_epochs, ceil(patience_steps / steps_per_epoch))``."""
        return max(self.patience_epochs, math.ceil(self.patience_steps / max(1, steps_per_epoch)))

    def to_dict(self) -> Dict:
        """The rule as records keep it."""
        return {"monitor": self.monitor, "patience_steps": self.patience_steps,
                "patience_epochs": self.patience_epochs, "min_delta": self.min_delta}


#: The named rules of ``--stopping``: ``converge`` (the default) and the article's.
RULES: Dict[str, StoppingRule] = {
    "converge": StoppingRule(monitor="val_loss", patience_steps=150, patience_epochs=3, min_delta=0.0),
    "article": StoppingRule(monitor="val_accuracy", patience_steps=0, patience_epochs=3, min_delta=0.001),
}


def resolve(name: str, monitor: str = "", patience_epochs: Optional[int] = None,
            patience_steps: Optional[int] = None, min_delta: Optional[float] = None) -> StoppingRule:
    """The rule ``name`` of ``RULES`` with each value given (not empty, not ``None``) in place of its own.

    Raises:
        pipelines.runtime.errors.Refused: ``--stopping`` names no rule, or a value the rule refuses."""
    if name not in RULES:
        raise Refused(f"--stopping {name}: choose one of {', '.join(RULES)}")
    given: Dict[str, Any] = {"monitor": monitor or None, "patience_epochs": patience_epochs, "patience_steps": patience_steps,
             "min_delta": min_delta}
    return replace(RULES[name], **{key: value for key, value in given.items() if value is not None})
