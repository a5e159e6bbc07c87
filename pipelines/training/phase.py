"""A training phase's outcome (phase 1: the head; phase 2: fine-tuning) and what phase 2 keeps of phase 1."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional

if TYPE_CHECKING:
    from pipelines.training.callbacks import BestWeightsEarlyStopping
    from pipelines.training.inputpath import InputPath
    from pipelines.training.resume import Resume
    from pipelines.training.totals import Totals


@dataclass
class Phase:
    """One phase's outcome as the job reports it: inputs, early stopping, epochs run, ``fit`` seconds, exact totals."""

    inputs: InputPath
    early_stopping: Optional[BestWeightsEarlyStopping]  # None: phase 1 skipped (a resume in phase 2)
    epochs_run: int
    fit_seconds: float
    totals: Totals
    resume: Optional[Resume] = None  # where the phase started
    report: Optional[Dict] = None  # phase 2: what report["fine_tune"] holds
    head: Optional[Dict] = None  # phase 1: the trained head or the probe's, and their validation figures


def phase1_record(phase: Phase, resume) -> Dict:
    """What phase 2's checkpoint markers and the report keep of phase 1 (no test figure: test is read once, last)."""
    if resume.phase == 2:
        return dict(resume.marker["phase1"])
    es = phase.early_stopping
    best = float(es.best) if es.model is not None else resume.marker["early_stopping"]["best"]
    totals = phase.totals
    return {"epochs": resume.initial_epoch + phase.epochs_run, "best_epoch": int(es.best_epoch) + 1,
            "monitor": es.monitor, "best": best, "input_path": phase.inputs.name,
            "validation": {"loss": totals.loss, "accuracy": totals.accuracy, "count": totals.count}}
