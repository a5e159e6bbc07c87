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
    # resumed after step 57: 143 steps run here in 3 s, 47.7 steps/s x 8 (not 200 steps' 533.3)
    ((1, 2, 200, 200, 8, 3.0, None, 143), "epoch 1/2: 200/200 steps (100 %), 381.3 images/s, steps done in 3 s, "
                                          "then validation"),
    # 20 steps run here in 10 s (steps 58..77): 2 steps/s; 123 left: 61.5 s
    ((1, 2, 77, 200, 8, 10.0, None, 20, 58), "epoch 1/2: 77/200 steps (38 %, resumed at step 58), 16.0 images/s, "
                                             "1 min 2 s left in the epoch's steps, then validation"),
    ((3, 4, 58, 200, 8, 0.0, 5.0, 1, 58), "epoch 3/4: 58/200 steps (29 %, resumed at step 58), rate not known yet "
                                          "(0 s elapsed)"),
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


@pytest.mark.parametrize("given", [{}, {"epochs": 2}, {"epochs": 2, "epochs_done": 0, "steps_done": 0}],
                         ids=["fit-epochs", "run-epochs", "fresh-position"])
def test_a_line_at_least_every_10_s_and_after_the_last_step_with_the_last_validation_counted(given):
    clock, lines = Clock(), []
    progress = EpochProgress(6, 8, **given, clock=clock, write=lines.append)
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


def _run(progress, clock, epochs_done, steps_done, epochs, steps, step_s, val_seconds):
    """The hooks a run from a position calls, as ``loop.run_epochs`` calls them (the first epoch from step
    ``steps_done + 1``), each epoch's steps ``step_s`` seconds apart; returns each epoch's lines."""
    out, lines = [], []
    progress.write = lines.append
    progress.set_params({"epochs": epochs, "steps": steps, "verbose": 2})
    for epoch in range(epochs_done, epochs):
        progress.on_epoch_begin(epoch)
        start = clock.now
        first = steps_done if epoch == epochs_done else 0
        for batch in range(first, steps):
            clock.now = start + step_s * (batch - first + 1)
            progress.on_train_batch_end(batch)
        progress.on_epoch_end(epoch, {"loss": 1.0, "val_seconds": val_seconds})
        out.append(list(lines))
        lines.clear()
    return out


def test_a_fresh_run_reads_as_before_through_the_job_s_fit_calls():
    clock = Clock()
    progress = EpochProgress(20, 4, epochs=2, epochs_done=0, steps_done=0, clock=clock)
    lines = sum(_run(progress, clock, 0, 0, epochs=2, steps=20, step_s=1.0, val_seconds=3.0), [])
    assert lines == [
        "epoch 1/2: 10/20 steps (50 %), 4.0 images/s, 10 s left in the epoch's steps, then validation",
        "epoch 1/2: 20/20 steps (100 %), 4.0 images/s, steps done in 20 s, then validation",
        "epoch 2/2: 10/20 steps (50 %), 4.0 images/s, 13 s left in the epoch",  # 10 s of steps + 3 s of validation
        "epoch 2/2: 20/20 steps (100 %), 4.0 images/s, steps done in 20 s, then validation",
    ]


def test_a_resumed_epoch_says_the_run_s_epoch_and_the_rate_of_the_steps_run_here():
    # resumed after step 7 of epoch 1 of 2: steps 8..20, then epoch 2
    clock = Clock()
    progress = EpochProgress(20, 4, epochs=2, epochs_done=0, steps_done=7, clock=clock)
    resumed, after = _run(progress, clock, 0, 7, epochs=2, steps=20, step_s=1.0, val_seconds=3.0)
    assert resumed == [
        # 10 steps (8..17) in 10 s: 1 step/s x 4; 3 steps left: 3 s (before: "epoch 1/1", 6.8 images/s)
        "epoch 1/2: 17/20 steps (85 %, resumed at step 8), 4.0 images/s, 3 s left in the epoch's steps, "
        "then validation",
        # 13 steps in 13 s, said once (before: 20 x 4 / 13 = 6.2 images/s)
        "epoch 1/2: 20/20 steps (100 %), 4.0 images/s, steps done in 13 s, then validation",
    ]
    assert after == [  # the epoch after it: whole, its time left with the resumed epoch's validation
        "epoch 2/2: 10/20 steps (50 %), 4.0 images/s, 13 s left in the epoch",
        "epoch 2/2: 20/20 steps (100 %), 4.0 images/s, steps done in 20 s, then validation",
    ]


def test_a_run_resumed_within_a_later_epoch_counts_from_there():
    # 3 epochs, resumed after step 15 of epoch 2
    clock = Clock()
    progress = EpochProgress(20, 4, epochs=3, epochs_done=1, steps_done=15, clock=clock)
    resumed, after = _run(progress, clock, 1, 15, epochs=3, steps=20, step_s=0.5, val_seconds=2.0)
    assert resumed == [  # 5 steps in 2.5 s: 2 steps/s x 4; the only line says where it resumed
        "epoch 2/3: 20/20 steps (100 %, resumed at step 16), 8.0 images/s, steps done in 2 s, then validation"]
    assert after == ["epoch 3/3: 20/20 steps (100 %), 8.0 images/s, steps done in 10 s, then validation"]


def test_a_run_resumed_at_an_epoch_s_end_reads_as_a_fresh_one():
    clock = Clock()
    progress = EpochProgress(20, 4, epochs=3, epochs_done=1, steps_done=0, clock=clock)
    lines = sum(_run(progress, clock, 1, 0, epochs=3, steps=20, step_s=2.0, val_seconds=1.0), [])
    assert [line.split(", ")[0] for line in lines] == ["epoch 2/3: 5/20 steps (25 %)", "epoch 2/3: 10/20 steps (50 %)",
                                                     "epoch 2/3: 15/20 steps (75 %)", "epoch 2/3: 20/20 steps (100 %)",
                                                     "epoch 3/3: 5/20 steps (25 %)", "epoch 3/3: 10/20 steps (50 %)",
                                                     "epoch 3/3: 15/20 steps (75 %)", "epoch 3/3: 20/20 steps (100 %)"]
    assert all("resumed" not in line and "2.0 images/s" in line for line in lines)
