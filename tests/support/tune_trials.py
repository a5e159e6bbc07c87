"""A trial function for the runners' tests, importable by Spark's Python workers: no training,
a result from the settings alone, and a divergence above a learning rate."""
from pipelines.training.divergence import TrainingDiverged

DIVERGES_ABOVE = 0.001  # base_lr: the trials above it diverge


def settled_trial(settings):
    """``{"val_loss": dropout + 1, "val_accuracy": 1 - dropout}``; raises TrainingDiverged above :data:`DIVERGES_ABOVE`."""
    if settings.base_lr > DIVERGES_ABOVE:
        raise TrainingDiverged(f"the trial diverged at epoch 1: loss (nan) (base_lr {settings.base_lr})")
    return {"val_loss": settings.dropout + 1.0, "val_accuracy": 1.0 - settings.dropout, "best_epoch": 1}
