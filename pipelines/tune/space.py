"""The search space of the head's settings and the settings a trial draws from it (pure)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, Optional

from pipelines.runtime.errors import Refused

#: Significant digits of a drawn float setting: what the trial trains with and the flag says.
DIGITS = 3


@dataclass(frozen=True)
class Range:
    """A searched setting's range ``low`` < ``high``: log scale with ``log`` (ends > 0), integers with ``integer``."""

    low: float
    high: float
    log: bool = False
    integer: bool = False


def parse_range(flag: str, text: str, at_least: Optional[float] = None, below: Optional[float] = None,
                log: bool = False, integer: bool = False) -> Range:
    """``LOW,HIGH`` as a `Range` of the flag ``flag``, within the bounds ``at_least`` and ``below`` when given.

    Raises:
        Refused: not two numbers, NaN or an infinity, ``LOW >= HIGH``, or an end outside the bounds; naming ``flag``."""
    parts = [part.strip() for part in str(text).split(",")]
    try:
        low, high = (int(p) if integer else float(p) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        low = high = None
    kind = "integers" if integer else "numbers"
    if low is None or high is None:
        raise Refused(f"{flag} {text}: give LOW,HIGH, two {kind} (e.g. {flag} {'50,400' if integer else '0.1,0.5'})")
    if not (math.isfinite(low) and math.isfinite(high)):
        raise Refused(f"{flag} {text}: both ends must be finite numbers")
    if not low < high:
        raise Refused(f"{flag} {text}: an empty range: LOW must be below HIGH")
    floor = 0 if log and (at_least is None or at_least <= 0) else at_least
    if floor is not None and not (low > floor if log else low >= floor):
        raise Refused(f"{flag} {text}: LOW must be {'>' if log else '>='} {floor:g}"
                      + (" (the range is searched on a log scale)" if log else ""))
    if below is not None and not high < below:
        raise Refused(f"{flag} {text}: HIGH must be below {below:g}")
    return Range(low, high, log, integer)


def significant(value: float, digits: int = DIGITS) -> float:
    """``value`` rounded to ``digits`` significant digits (0 stays 0)."""
    return float(f"{value:.{digits}g}")


@dataclass(frozen=True)
class HeadSettings:
    """One trial's settings of the head, each a flag of ``jobs/train.py``."""

    base_lr: float  # one rank's learning rate, > 0
    dropout: float  # in [0, 1)
    weight_decay: float  # Nadam's decoupled decay, >= 0
    patience_steps: int  # early stopping's patience in optimizer steps, >= 0

    def train_flags(self) -> str:
        """The settings as ``jobs/train.py`` flags: ``--base-lr 0.00213 --dropout 0.31 ...``."""
        return (f"--base-lr {self.base_lr:.{DIGITS}g} --dropout {self.dropout:.{DIGITS}g} "
                f"--weight-decay {self.weight_decay:.{DIGITS}g} --patience-steps {self.patience_steps}")

    def to_dict(self) -> Dict[str, float]:
        """``{"base_lr": ..., "dropout": ..., "weight_decay": ..., "patience_steps": ...}``."""
        return asdict(self)


@dataclass(frozen=True)
class SearchSpace:
    """The ranges the search draws each `HeadSettings` field from."""

    base_lr: Range
    dropout: Range
    weight_decay: Range
    patience_steps: Range

    def suggest(self, trial) -> HeadSettings:
        """Draw one trial's settings through an ``optuna.Trial``, floats rounded to `DIGITS` significant digits."""
        drawn = {}
        for name in ("base_lr", "dropout", "weight_decay", "patience_steps"):
            r = getattr(self, name)
            if r.integer:
                drawn[name] = trial.suggest_int(name, int(r.low), int(r.high), log=r.log)
            else:
                drawn[name] = significant(trial.suggest_float(name, r.low, r.high, log=r.log))
        return HeadSettings(**drawn)
