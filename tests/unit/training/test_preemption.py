"""Step checkpoints, mid-epoch resume and the preemption notice, in one process (TensorFlow, no
Horovod): the arithmetic, the checkpoint names, a resumed loop against an uninterrupted one, SIGTERM."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pipelines.runtime.errors import Refused
from pipelines.training.checkpoints.writer import Interval
from pipelines.training.loop import run_epochs, start_row
from pipelines.training.checkpoints.names import checkpoint_position
from tests.support.env import REPO


@pytest.mark.parametrize("done, steps_done, spe, batch, first, row", [
    (0, 0, 5, 4, 0, 0),      # fresh
    (2, 0, 5, 4, 0, 40),     # after epoch 2
    (1, 3, 5, 4, 0, 32),     # within epoch 2
    (2, 4, 5, 4, 0, 56),     # within the last epoch
    (0, 1, 2, 16, 0, 16),
    (6, 2, 5, 4, 4, 48),     # phase 2 from epoch 5
    (1, 5, 5, 4, 0, 40),     # epoch 2 trained, not validated: epoch 3's first row
    (2, 5, 5, 4, 0, 60),     # the last epoch's validation
])
def test_a_position_becomes_the_stream_row_of_an_uninterrupted_run(done, steps_done, spe, batch, first, row):
    assert start_row(done, steps_done, spe, batch, first) == row


@pytest.mark.parametrize("done, steps_done, spe, first", [(0, 6, 5, 0), (0, -1, 5, 0), (1, 0, 5, 2)])
def test_a_position_outside_the_run_is_refused(done, steps_done, spe, first):
    with pytest.raises(ValueError, match="no position after"):
        start_row(done, steps_done, spe, 4, first)


def test_checkpoint_names_order_in_time():
    names = ["checkpoint-1.json", "checkpoint-2-step-3.npz", "checkpoint-2-step-10.json", "checkpoint-2.npz",
             "checkpoint-3-step-1.json", "checkpoint-10.json"]
    assert [checkpoint_position(n) for n in names] == [(1, 0), (1, 3), (1, 10), (2, 0), (2, 1), (10, 0)]
    assert sorted(names, key=checkpoint_position) == names
    for other in ("checkpoint-0.json", "checkpoint-2-step-0.npz", "checkpoint-2-step-.npz", "model.keras",
                  "checkpoint-2.json.tmp"):
        assert checkpoint_position(other) == (0, 0), other


@pytest.mark.parametrize("steps, minutes, epoch, step, seconds, due", [
    (2, None, 1, 2, 0, True), (2, None, 1, 3, 0, False), (2, None, 2, 1, 0, True),  # 5 + 1 = 6: even
    (3, None, 1, 5, 0, False),   # an epoch's last step: the epoch's checkpoint follows
    (None, 1.5, 1, 1, 89.9, False), (None, 1.5, 1, 1, 90.0, True), (None, None, 1, 2, 1e9, False),
    (4, 10.0, 2, 3, 601, True),
])
def test_a_step_checkpoint_is_due_every_n_steps_of_the_run_or_after_m_minutes(steps, minutes, epoch, step,
                                                                               seconds, due):
    assert Interval(steps, minutes, 5).due(epoch, step, seconds) is due


@pytest.mark.parametrize("flag, value", [("checkpoint_every_steps", 0), ("checkpoint_every_steps", -3),
                                         ("checkpoint_every_minutes", 0.0), ("checkpoint_every_minutes", -1.0),
                                         ("checkpoint_every_minutes", float("nan"))])
def test_an_interval_of_zero_or_less_is_refused_by_name(flag, value, tmp_path):
    from pipelines.training.config import TrainConfig

    with pytest.raises(Refused, match=f"--{flag.replace('_', '-')} must be positive"):
        TrainConfig(data=str(tmp_path), output=str(tmp_path / "out"), tracking=False, **{flag: value})


def test_the_command_line_refuses_a_zero_interval_with_exit_2_before_any_rank(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "jobs", "train.py"), "--data", str(tmp_path),
                           "--output", str(tmp_path / "out"), "--checkpoint-every-steps", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--checkpoint-every-steps must be positive, got 0" in proc.stderr and "Traceback" not in proc.stderr


NOTICE = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, {repo!r})
    from pipelines.training import preemption
    preemption.REPEAT_S = 0.1  # a SIGTERM later than this after the first is a second notice
    with preemption.PreemptionNotice(rank=3) as notice:
        assert preemption.current() is notice
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("requested", notice.requested, flush=True)
        if {twice}:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            print("still alive", flush=True)
    print("restored", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, preemption.current(), flush=True)
""")


def test_a_first_sigterm_raises_the_notice_and_a_second_ends_the_process_at_once():
    once = subprocess.run([sys.executable, "-c", NOTICE.format(repo=REPO, twice=False)], capture_output=True,
                          text=True, timeout=60)
    assert once.returncode == 0, once.stderr
    assert once.stdout.split("\n")[:2] == ["requested True", "restored True None"]
    assert "rank 3: SIGTERM received" in once.stderr
    twice = subprocess.run([sys.executable, "-c", NOTICE.format(repo=REPO, twice=True)], capture_output=True,
                           text=True, timeout=60)
    assert twice.returncode == -signal.SIGTERM and twice.stdout == "requested True\n", (twice.returncode, twice.stdout)


def guard_run(notice_at, steps=4, epochs=2):
    """A DivergenceGuard over a real 2-epoch fit whose other rank's notice arrives after
    ``notice_at`` (epoch, step); returns what on_preempted saw and the exception."""
    from pipelines.stack.kerasapi import keras
    from pipelines.training.callbacks import DivergenceGuard, PreemptAtEpochEnd
    from pipelines.training.preemption import Preempted, PreemptionNotice

    where, seen = {"epoch": 0}, []

    class Place(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            where["epoch"] = epoch + 1

        def on_train_batch_begin(self, batch, logs=None):
            where["step"] = batch + 1

    def count(flags):  # this rank's flags, and the other rank's notice from notice_at on
        return float(flags[0]), float(flags[1]) + ((where["epoch"], where["step"]) >= notice_at)

    agreed = []
    guard = DivergenceGuard(steps, count=count, gather=lambda mine: [mine, "other"], notice=PreemptionNotice(),
                            on_preempted=lambda epoch, step: seen.append((epoch, step)) or "marker.json",
                            agree=lambda value: agreed.append(value) or value)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    x, y = np.random.rand(4 * steps, 2).astype(np.float32), np.arange(4 * steps) % 2
    with pytest.raises(Preempted) as raised:
        model.fit(x, y, batch_size=4, epochs=epochs, callbacks=[Place(), guard, PreemptAtEpochEnd(guard)], verbose=0)
    assert agreed == [raised.value.checkpoint]  # every rank waited for rank 0's checkpoint
    return seen, raised.value


def test_a_notice_on_any_rank_stops_this_one_after_the_same_step_with_its_checkpoint():
    seen, raised = guard_run(notice_at=(1, 2))
    assert seen == [(1, 2)] and raised.checkpoint == "marker.json"
    assert str(raised) == "preempted: every rank stopped after step 2 of epoch 1 (a SIGTERM)"


@pytest.mark.parametrize("steps", [4, 1])
def test_a_notice_at_an_epochs_last_step_stops_at_the_epochs_end_after_its_checkpoint(steps):
    seen, raised = guard_run(notice_at=(1, steps), steps=steps)
    assert seen == [] and raised.checkpoint == "checkpoint-1.json"
    assert str(raised) == "preempted: every rank stopped after epoch 1 (a SIGTERM)"


def small_model(seed=7):
    from pipelines.stack.kerasapi import keras
    from pipelines.training.checkpoints.files import build_optimizer
    from pipelines.training.checkpoints.files import resumable_dropout

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    x = resumable_dropout(0.5, seed)(keras.layers.Dense(8, activation="relu")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="head")(x))
    model.compile(optimizer=keras.optimizers.Nadam(0.01), loss="sparse_categorical_crossentropy")
    # built before fit, as compile_distributed does: Keras 2's Nadam bakes a Python count of its
    # u_product updates into the traced step, and a lazy build traces the step twice
    build_optimizer(model)
    return model


VALIDATION_ROWS = (np.linspace(0, 1, 30, dtype=np.float32).reshape(5, 6), np.arange(5) % 3)


def stream_at(row, batch=4):
    """A positioned stream: batch b holds rows ``row + b * batch ...`` of a fixed endless sequence."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x, y = rng.random((23, 6), np.float32), rng.integers(0, 3, 23).astype(np.int32)

    def batches():
        start = row
        while True:
            index = np.arange(start, start + batch) % len(x)
            yield x[index], y[index]
            start += batch

    return tf.data.Dataset.from_generator(batches, output_signature=(
        tf.TensorSpec((batch, 6), tf.float32), tf.TensorSpec((batch,), tf.int32)))


def checkpointed_fit(model, directory, position=(0, 0), stop_after=None, state=None, history=None, best_weights=None):
    """The job's loop from ``position`` (epochs done, steps done) over 3 epochs of 5 steps, with the job's
    checkpoint writer every step and early stopping on the validation loss (exact: 5 rows, one batch);
    ``stop_after`` (epoch, step): a kill there, once its checkpoint is written."""
    from pipelines.stack.kerasapi import keras
    from pipelines.training.callbacks import BestWeightsEarlyStopping
    from pipelines.training.checkpoints.writer import CheckpointMarker

    class Validation(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            loss = float(self.model.evaluate(*VALIDATION_ROWS, verbose=0))
            logs.update(val_loss=loss)

    class Kill(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch + 1

        def on_train_batch_end(self, batch, logs=None):
            if (self.epoch, batch + 1) == stop_after:
                raise KeyboardInterrupt("killed")

    os.makedirs(directory, exist_ok=True)
    stopper = BestWeightsEarlyStopping(state=state, best_weights=best_weights, monitor="val_loss", patience=10)
    callbacks = [Validation(), stopper, CheckpointMarker(directory, stopper, history or [], every=Interval(1, None, 5)),
                 Kill()]
    run_epochs(model, stream_at(start_row(*position, 5, 4)), callbacks, *position, 3, 5)


def state_of(model):
    from pipelines.training.checkpoints.files import checkpoint_variables

    return {key: v.numpy() for key, v in checkpoint_variables(model).items()}


@pytest.mark.parametrize("stop_after", [(2, 3), (1, 1), (3, 4)])
def test_a_run_killed_after_a_step_and_resumed_ends_bit_for_bit_as_the_uninterrupted_one(stop_after, tmp_path):
    """Weights, Nadam's state and the dropout generator's, after 3 epochs of 5 steps: the same
    whether the run went through or was killed after ``stop_after`` and resumed from its step
    checkpoint in two ``fit`` calls; each run's history too."""
    import json

    from pipelines.training.checkpoints.files import load_checkpoint
    from pipelines.training.checkpoints.choose import newest_complete_checkpoint
    from pipelines.training.checkpoints.names import checkpoint_path

    whole = small_model()
    checkpointed_fit(whole, str(tmp_path / "whole"))
    killed_dir = str(tmp_path / "killed")
    with pytest.raises(KeyboardInterrupt):
        checkpointed_fit(small_model(), killed_dir, stop_after=stop_after)
    marker = newest_complete_checkpoint(killed_dir)
    assert marker["_name"] == f"checkpoint-{stop_after[0]}-step-{stop_after[1]}.json"
    assert (marker["epoch"], marker["step"]) == (stop_after[0] - 1, stop_after[1])
    steps = sorted(n for n in os.listdir(killed_dir) if "-step-" in n)  # only the newest step checkpoint is kept
    assert steps == [marker["_name"], marker["weights"]]

    resumed = small_model(seed=8)  # another start: everything comes from the checkpoints, as restore() loads them
    best, best_weights = marker["early_stopping"]["best_epoch"], None
    if best:
        load_checkpoint(resumed, checkpoint_path(killed_dir, best), optimizer=False)
        best_weights = resumed.get_weights()
    load_checkpoint(resumed, os.path.join(killed_dir, marker["weights"]))
    checkpointed_fit(resumed, killed_dir, (marker["epoch"], marker["step"]),
                     state=marker["early_stopping"], history=list(marker["history"]), best_weights=best_weights)
    expected, got = state_of(whole), state_of(resumed)
    assert sorted(expected) == sorted(got) and any(k.startswith("rng_") for k in got)
    for key in expected:
        assert np.array_equal(expected[key], got[key]), key
    with open(tmp_path / "whole" / "checkpoint-3.json") as f, open(os.path.join(killed_dir, "checkpoint-3.json")) as g:
        whole_history, resumed_history = json.load(f)["history"], json.load(g)["history"]
    # every epoch's logs alike, but the interrupted epoch's running mean of the training loss: the
    # resumed process averages its own steps only (docs/cluster.md)
    interrupted = stop_after[0] - 1
    assert resumed_history[interrupted]["loss"] != whole_history[interrupted]["loss"]
    for entry in (whole_history[interrupted], resumed_history[interrupted]):
        del entry["loss"]
    assert whole_history == resumed_history
    assert not [n for n in os.listdir(killed_dir) if "-step-" in n]  # epoch 3's checkpoint replaced them


HOLDING = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, {repo!r})
    from pipelines.training import preemption
    preemption.REPEAT_S = 0.1
    with preemption.PreemptionNotice() as notice:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        with preemption.holding(notice):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            print("checkpoint written", flush=True)
        print("not reached", flush=True)
""")


def test_a_second_sigterm_while_the_checkpoint_is_written_ends_the_process_right_after_it():
    proc = subprocess.run([sys.executable, "-c", HOLDING.format(repo=REPO)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGTERM and proc.stdout == "checkpoint written\n", (proc.returncode, proc.stdout)


def validated_fit(model, directory, position=(0, 0), notice_at=None, marker=None, best_weights=None, monkeypatch=None):
    """The job's epoch end in one process: the exact validation (its shard evaluated batch by
    batch, 3 batches; the sums over ranks those of this one) with the divergence guard's checks
    between batches, early stopping on ``val_loss``, the checkpoint writer, the stop at the epoch's
    end; a notice raised after validation batch ``notice_at`` (epoch, batch); resumed from
    ``marker`` (a checkpoint's: its early stopping state, history and epoch logs) when given."""
    import tensorflow as tf

    from pipelines.stack.kerasapi import keras
    from pipelines.training import evaluate
    from pipelines.training.callbacks import BestWeightsEarlyStopping, DivergenceGuard, PreemptAtEpochEnd
    from pipelines.training.checkpoints.writer import CheckpointMarker
    from pipelines.training.preemption import PreemptionNotice
    from pipelines.training.rank import Rank
    from pipelines.training.resume import Resume

    monkeypatch.setattr(evaluate, "allreduce_totals", lambda totals: totals)  # one rank: its own sums
    monkeypatch.setattr(evaluate, "verify_total", lambda count, data, split: None)
    x = np.linspace(0, 1, 30, dtype=np.float32).reshape(5, 6)
    y = np.arange(5, dtype=np.int32) % 3

    class Inputs:
        def evaluate_shard(self, model, split, after_batch=None):
            return evaluate.evaluate_dataset(model, tf.data.Dataset.from_tensor_slices((x, y)).batch(2), after_batch)

    notice = PreemptionNotice()

    class Notice(keras.callbacks.Callback):
        def on_validation_batch_end(self, epoch, batch, logs=None):
            if (epoch + 1, batch) == notice_at:
                notice.requested = True

    os.makedirs(directory, exist_ok=True)
    resume = Resume(marker)
    stopper = BestWeightsEarlyStopping(state=marker and marker["early_stopping"], best_weights=best_weights,
                                       monitor="val_loss", patience=10)
    checkpoints = CheckpointMarker(directory, stopper, list(marker["history"]) if marker else [])
    guard = DivergenceGuard(5, count=lambda flags: flags, gather=lambda mine: [mine], notice=notice,
                            on_preempted=checkpoints.write_step, agree=lambda value: value)
    callbacks = [guard, stopper, checkpoints, PreemptAtEpochEnd(guard), Notice()]
    callbacks = [evaluate.exact_validation(Inputs(), None, callbacks), *callbacks]
    trained = resume.epoch_logs(Rank(0, 1, 0, 1, threads=1)) if position[1] == 5 else None
    run_epochs(model, stream_at(start_row(*position, 5, 4)), callbacks, *position, 3, 5, trained_logs=trained)


@pytest.mark.parametrize("notice_at", [(2, 2), (3, 1)])
def test_a_notice_in_validation_checkpoints_the_epochs_steps_and_the_resumed_run_ends_bit_for_bit(
        notice_at, tmp_path, monkeypatch):
    """A notice after validation batch B of epoch E stops the run at the next check: a checkpoint
    of the epoch's 5 trained steps, with its logs, before its validation; the resumed run runs that
    validation and the epochs after it, and ends with the uninterrupted run's weights, optimizer
    and generator state and the same history, training loss included."""
    import json

    from pipelines.training.checkpoints.files import load_checkpoint
    from pipelines.training.preemption import Preempted
    from pipelines.training.checkpoints.choose import newest_complete_checkpoint
    from pipelines.training.checkpoints.names import checkpoint_path

    whole = small_model()
    validated_fit(whole, str(tmp_path / "whole"), monkeypatch=monkeypatch)
    stopped_dir = str(tmp_path / "stopped")
    with pytest.raises(Preempted) as raised:
        validated_fit(small_model(), stopped_dir, notice_at=notice_at, monkeypatch=monkeypatch)
    epoch = notice_at[0]
    assert str(raised.value) == f"preempted: every rank stopped in the validation of epoch {epoch}, its steps trained " \
                                "(a SIGTERM)"
    marker = newest_complete_checkpoint(stopped_dir)
    assert raised.value.checkpoint == marker["_name"] == f"checkpoint-{epoch}-step-5.json"
    assert (marker["epoch"], marker["step"]) == (epoch - 1, 5) and [len(marker["epoch_logs"])] == [1]
    assert not os.path.exists(os.path.join(stopped_dir, f"checkpoint-{epoch}.json"))  # its validation: not run

    resumed = small_model(seed=8)
    best, best_weights = marker["early_stopping"]["best_epoch"], None
    if best:
        load_checkpoint(resumed, checkpoint_path(stopped_dir, best), optimizer=False)
        best_weights = resumed.get_weights()
    load_checkpoint(resumed, os.path.join(stopped_dir, marker["weights"]))
    position = (marker["epoch"], marker["step"])
    assert position[1] == 5  # its steps trained: the resumed run begins with the epoch's validation
    validated_fit(resumed, stopped_dir, position, marker=marker, best_weights=best_weights, monkeypatch=monkeypatch)
    expected, got = state_of(whole), state_of(resumed)
    for key in expected:
        assert np.array_equal(expected[key], got[key]), key
    with open(tmp_path / "whole" / "checkpoint-3.json") as f, open(os.path.join(stopped_dir, "checkpoint-3.json")) as g:
        histories = [[{k: v for k, v in entry.items() if k != "val_seconds"} for entry in json.load(h)["history"]]
                     for h in (f, g)]
    assert histories[0] == histories[1]  # the training loss of the interrupted epoch too; the time aside
    assert not [n for n in os.listdir(stopped_dir) if "-step-" in n]


def test_a_rank_whose_shard_is_done_checks_until_every_rank_is_and_stops_with_them_at_a_notice():
    """Two ranks, this one 3 validation batches, the other 5: without a notice both make 6 checks
    (each after its batches, then until none validates); the other's notice after its batch 4
    stops this one at its 4th check, after its shard, with every rank's epoch logs checkpointed."""
    from pipelines.training.callbacks import DivergenceGuard
    from pipelines.training.preemption import Preempted, PreemptionNotice

    checks, written = [], []

    def run(other_notice_at=None):
        checks.clear()
        written.clear()

        def count(flags):  # the other rank: validating at its checks 1..5, its notice from other_notice_at
            checks.append(flags)
            n = len(checks)
            return flags[0] + (n <= 5), flags[1] + bool(other_notice_at and n >= other_notice_at)

        guard = DivergenceGuard(7, count=count, gather=lambda mine: [mine, {"loss": 2.0}], notice=PreemptionNotice(),
                                on_preempted=lambda *args: written.append(args) or "m.json", agree=lambda v: v)
        guard.on_epoch_begin(1)
        for batch in (1, 2, 3):
            guard.on_validation_batch_end(1, batch, {"loss": 1.0})
        guard.on_validation_shard_end(1, {"loss": 1.0})
        return checks, written

    run()
    assert checks == [(True, False)] * 3 + [(False, False)] * 3 and written == []
    with pytest.raises(Preempted) as raised:
        run(other_notice_at=4)
    assert raised.value.checkpoint == "m.json" and len(checks) == 4
    assert written == [(2, 7, [{"loss": 1.0}, {"loss": 2.0}])]  # epoch 2 (1-based), after its 7 steps


def test_a_second_sigterm_within_the_repeat_window_is_the_same_notice(monkeypatch):
    """A machine's shutdown signals every process and a launching driver passes the signal on: the
    rank counts the two as one notice; a SIGTERM after the window stops it at once."""
    from pipelines.training import preemption

    now = [100.0]
    notice = preemption.PreemptionNotice(rank=1, clock=lambda: now[0])
    stopped = []
    monkeypatch.setattr(notice, "stop_now", lambda: stopped.append(now[0]))
    notice._handle(15, None)
    now[0] += preemption.REPEAT_S / 2
    notice._handle(15, None)
    assert notice.requested and stopped == []
    now[0] += preemption.REPEAT_S
    notice._handle(15, None)
    assert stopped == [now[0]]
