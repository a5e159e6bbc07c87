"""One rank's run context: what every step of the training spine reads, passed as one argument."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from pipelines.training.config import TrainConfig
from pipelines.training.plan import RunPlan
from pipelines.training.rank import Rank

if TYPE_CHECKING:
    from pipelines.tracking import Tracker


@dataclass(frozen=True)
class RankContext:
    """What a rank knows of its run; ``tracker``: rank 0's MLflow run, else ``None``."""

    config: TrainConfig
    rank: Rank
    plan: RunPlan
    frozen_sha256: str = ""
    tracker: Optional[Tracker] = None

    @property
    def output_dir(self) -> Optional[str]:
        """Rank 0's local output folder; ``None`` elsewhere."""
        return self.plan.output_dir

    def for_phase(self, epochs: int, lr: float) -> "RankContext":
        """This context for fine-tuning: ``epochs`` in all (both phases), no warmup, rate ``lr``."""
        fit = dataclasses.replace(self.config.fit, warmup_epochs=0.0, epochs=epochs)
        return dataclasses.replace(self, config=dataclasses.replace(self.config, fit=fit),
                                   plan=dataclasses.replace(self.plan, lr=lr))
