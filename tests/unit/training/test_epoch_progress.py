"""Training's progress line within an epoch (rank 0's): its arithmetic, words and cadence, without
Horovod (the callback driven by hand with a stand-in clock)."""
import pytest

from pipelines.training.epochprogress import EVERY_S, EpochProgress, epoch_line


@pytest.mark.parametrize("args, line", [
    # 120 steps in 42.5 s: 2.82 steps/s x 16 = 45.2 images/s; 280 steps left: 99.2 s, + 8 s of validation
    ((2, 10, 120, 400, 16, 42.5, 8.0), "epoch 2/10: 120/400 steps (30 %), 45.2 images/s, 1 min 47 s left in the epoch"),
    ((2, 10, 120, 400, 16, 42.5), "epoch 2/10: 120/400 steps (30 %), 45.2 images/s, 1 min 39 s left in the epoch's "
                                  "steps, then validation"),
    ((1, 3, 399, 400, 8, 399.0, 0.0), "epoch 1/3: 399/400 steps (99 %), 8.0 images/s, 1 s left in the epoch"),
    ((7, 7, 1234, 5000, 64, 600.0, 30.0),
     "epoch 7/7: 1,234/5,000 steps (24 %), 131.6 images/s, 31 min 1 s left in the epoch"),  # 1831.1 s
    ((1, 3, 6, 6, 8, 3.0), "epoch 1/3: 6/6 steps (100 %), 16.0 images/s, steps done in 3 s, then validation"),
    ((4, 5, 1, 1, 2, 0.5, 9.0), "epoch 4/5: 1/1 step (100 %), 4.0 images/s, steps done in 0 s, then validation"),
    ((1, 1, 1, 10, 8, 0.0), "epoch 1/1: 1/10 steps (10 %), rate not known yet (0 s elapsed)"),
])
def test_the_line_says_steps_of_the_epoch_images_per_second_and_time_left(args, line):
    assert epoch_line(*args) == line


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _epoch(progress, clock, epoch, step_ends, val_seconds):
    progress.on_epoch_begin(epoch)
    start = clock.now
    for batch, at in enumerate(step_ends):
        clock.now = start + at
        progress.on_train_batch_end(batch)
    progress.on_epoch_end(epoch, {"loss": 1.0, "val_seconds": val_seconds})


def test_a_line_at_least_every_10_s_and_after_the_last_step_with_the_last_validation_counted():
    clock, lines = Clock(), []
    progress = EpochProgress(6, 8, clock=clock, write=lines.append)
    progress.set_params({"epochs": 2, "steps": 6})
    assert EVERY_S == 10.0
    _epoch(progress, clock, 0, [3, 9, 12, 15, 23, 24], val_seconds=5.0)
    assert lines == [
        "epoch 1/2: 3/6 steps (50 %), 2.0 images/s, 12 s left in the epoch's steps, then validation",
        "epoch 1/2: 5/6 steps (83 %), 1.7 images/s, 5 s left in the epoch's steps, then validation",  # 10 s after
        "epoch 1/2: 6/6 steps (100 %), 2.0 images/s, steps done in 24 s, then validation",
    ]
    lines.clear()
    _epoch(progress, clock, 1, [11, 12, 13, 30, 31, 32], val_seconds=6.0)  # a clock of its own: from the epoch's start
    assert lines == [
        "epoch 2/2: 1/6 steps (16 %), 0.7 images/s, 1 min 0 s left in the epoch",  # 55 s of steps + epoch 1's 5 s
        "epoch 2/2: 4/6 steps (66 %), 1.1 images/s, 20 s left in the epoch",
        "epoch 2/2: 6/6 steps (100 %), 1.5 images/s, steps done in 32 s, then validation",
    ]


def test_short_epochs_give_one_line_each():
    clock, lines = Clock(), []
    progress = EpochProgress(3, 4, clock=clock, write=lines.append)
    progress.set_params({"epochs": 5})
    for epoch in range(3):
        _epoch(progress, clock, epoch, [0.5, 1.0, 1.5], val_seconds=0.2)
    assert [line.split(",")[0] for line in lines] == [f"epoch {e}/5: 3/3 steps (100 %)" for e in (1, 2, 3)]
