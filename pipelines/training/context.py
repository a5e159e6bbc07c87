"""One rank's run context: what every step of the spine reads, passed as one argument.

Ray Train hands each worker its run context (``ray.train.get_context()``: world rank and size,
local rank, the run's settings); here :func:`pipelines.training.train.run_training` builds a
:class:`RankContext` once per rank, from what its set-up steps made (:func:`setup_rank`'s
:class:`~pipelines.training.rank.Rank`, :func:`plan_run`'s :class:`~pipelines.training.plan.RunPlan`
with the segments :func:`~pipelines.training.resized.with_segments` added after ``restore``, the
frozen backbone's checksum, :func:`~pipelines.training.train.start_tracking`'s tracker), and every
step after them takes it, plus only what is its own (the phase's input path, where it resumes).
Fine-tuning's phase runs on a context of its own (:meth:`RankContext.for_phase`: its epochs, no
warmup, its lowered rate).
"""
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
    """What a rank knows of its run, the same object for every step after the set-up.

    ``config``: the run's settings, the same on every rank; ``rank``: this process in the Horovod
    world; ``plan``: what every rank computed identically (data, steps, learning rate, output claim,
    data world, segments); ``frozen_sha256``: sha256 of the frozen weights (checkpoint markers keep
    it, ``--resume`` compares it); ``tracker``: rank 0's MLflow run
    (:class:`pipelines.tracking.Tracker`), ``None`` on the other ranks or with tracking off.
    """

    config: TrainConfig
    rank: Rank
    plan: RunPlan
    frozen_sha256: str = ""
    tracker: Optional[Tracker] = None

    @property
    def output_dir(self) -> Optional[str]:
        """Rank 0's local output folder (:attr:`pipelines.training.plan.RunPlan.output_dir`); ``None`` elsewhere."""
        return self.plan.output_dir

    def for_phase(self, epochs: int, lr: float) -> "RankContext":
        """This context for fine-tuning's phase: ``epochs`` in all (phase 1's and phase 2's), no
        warmup, learning rate ``lr`` (phase 2's, :func:`~pipelines.training.model.finetune.phase2_lr`)."""
        fit = dataclasses.replace(self.config.fit, warmup_epochs=0.0, epochs=epochs)
        return dataclasses.replace(self, config=dataclasses.replace(self.config, fit=fit),
                                   plan=dataclasses.replace(self.plan, lr=lr))
