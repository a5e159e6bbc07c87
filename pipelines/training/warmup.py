"""The learning-rate warmup of a run's data world: the ramp of the world size it started on."""
from __future__ import annotations

import horovod.tensorflow.keras as hvd


class DataWorldWarmup(hvd.callbacks.LearningRateWarmupCallback):
    """Horovod's warmup with the data world's size ``n0`` in place of ``hvd.size()``.

    ``initial_lr``: the rate after it (``base_lr x n0``); ``warmup_epochs`` > 0, may be fractional. On the data
    world itself the rates match Horovod's bit for bit."""

    def __init__(self, initial_lr: float, warmup_epochs: float, steps_per_epoch: int, data_world_size: int):
        super().__init__(initial_lr=initial_lr, warmup_epochs=warmup_epochs, steps_per_epoch=steps_per_epoch,
                         verbose=0)
        size = data_world_size

        def multiplier(epoch):
            epoch += 1. / self.steps_per_epoch  # Horovod's: round numbers at each epoch's end
            return 1. / size * (epoch * (size - 1) / warmup_epochs + 1)

        self.multiplier = multiplier
        self.data_world_size = size
