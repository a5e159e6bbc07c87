"""One trial: the head trained on cached features in this process alone (no Horovod, no Spark), validated exactly.

It steps as ``jobs/train.py`` on ``ranks`` ranks does: Nadam at ``base_lr x ranks`` on ``batch_size x ranks`` rows."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from pipelines.runtime.imports import frozen_imports
from pipelines.training.divergence import TrainingDiverged, non_finite_logs
from pipelines.training.probe import start_is_better
from pipelines.training.schedule import plan_steps
from pipelines.training.stopping import StoppingRule
from pipelines.tune.space import HeadSettings

#: Rows per batch of the validation and test passes (one pass over the split; any size is exact).
EVAL_BATCH = 512
Split = Tuple[np.ndarray, np.ndarray]  # features float32 (n, feature_dim), labels int32 (n,)


@dataclass(frozen=True)
class TrialPlan:
    """What every trial of a search shares."""

    epochs: int  # at most
    batch_size: int  # rows per step of one rank
    ranks: int  # the training's world size the settings are for
    seed: int  # of weights, dropout and shuffling
    rule: StoppingRule  # its patience_steps is each trial's own
    num_classes: int
    threads: int = 1  # TensorFlow's intra-op threads in this process (0: its default)
    start: Optional[List[np.ndarray]] = None  # the head's first weights: the probe's (--head-init probe), else seeded


@dataclass(frozen=True)
class TrialResult:
    """A finished trial: its best epoch's exact validation totals (epoch 0: the probe's start), and the test totals
    from ``refit_and_test`` only."""

    val_loss: float
    val_accuracy: float
    best_epoch: int
    epochs_run: int
    steps_per_epoch: int
    seconds: float
    test_loss: Optional[float] = None
    test_accuracy: Optional[float] = None

    def to_dict(self) -> Dict[str, Optional[float]]:
        return asdict(self)


def _set_threads(threads: int) -> None:
    """Set TensorFlow's intra-op threads (only before its first op: a worker's later trials keep them)."""
    with frozen_imports():  # TensorFlow's objects kept out of every later collection
        import tensorflow as tf

    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:  # already initialised by an earlier trial in this worker
            pass


def train_head(settings: HeadSettings, plan: TrialPlan, train: Split, validation: Split):
    """Train the head with ``settings`` on ``train``, early stopping on ``validation``.

    Returns ``(model, TrialResult)``: the head with its best epoch's weights, and its exact validation totals.

    Raises:
        TrainingDiverged: a non-finite loss or metric.
        Refused: a global batch larger than the train split."""
    from pipelines.stack.kerasapi import keras
    from pipelines.training.callbacks import BestWeightsEarlyStopping
    from pipelines.training.data.features import feature_dataset
    from pipelines.training.model.build import build_head

    _set_threads(plan.threads)
    steps = plan_steps(len(train[1]), len(validation[1]), plan.batch_size, plan.ranks)
    model = build_head(plan.num_classes, settings.dropout, plan.seed, train[0].shape[1])
    if plan.start is not None:
        model.get_layer("head").set_weights(plan.start)
    model.compile(optimizer=keras.optimizers.Nadam(learning_rate=settings.base_lr * plan.ranks,
                                                   weight_decay=settings.weight_decay or None),
                  loss="sparse_categorical_crossentropy",
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    rule = replace(plan.rule, patience_steps=settings.patience_steps)
    stopping = BestWeightsEarlyStopping(monitor=rule.monitor, mode="min" if rule.monitor.endswith("loss") else "max",
                                        patience=rule.patience(steps.steps_per_epoch), min_delta=rule.min_delta)
    train_ds = feature_dataset(*train, steps.global_batch, shuffle=True, seed=plan.seed, repeat=True)
    start = time.perf_counter()
    history = model.fit(train_ds, epochs=plan.epochs, steps_per_epoch=steps.steps_per_epoch,
                        validation_data=_one_pass(validation), verbose=0,
                        callbacks=[stopping, _stop_on_non_finite(keras)])
    seconds = time.perf_counter() - start
    epochs_run = len(history.history.get("loss", []))
    for epoch in range(epochs_run):
        found = non_finite_logs({name: values[epoch] for name, values in history.history.items()
                                 if epoch < len(values)})
        if found:
            raise TrainingDiverged(f"the trial diverged at epoch {epoch + 1}: {', '.join(found)} "
                                   f"({settings.train_flags()})")
    (loss, accuracy), best_epoch = evaluate(model, validation), int(stopping.best_epoch) + 1
    if plan.start is not None:  # the start is a candidate, as in jobs/train.py
        trained = model.get_layer("head").get_weights()
        model.get_layer("head").set_weights(plan.start)
        start_figures = evaluate(model, validation)
        if start_is_better(start_figures, (loss, accuracy), rule.monitor):
            (loss, accuracy), best_epoch = start_figures, 0
        else:
            model.get_layer("head").set_weights(trained)
    return model, TrialResult(loss, accuracy, best_epoch, epochs_run, steps.steps_per_epoch, round(seconds, 3))


def _stop_on_non_finite(keras: Any) -> Any:
    """A callback that ends training at the first step whose logs hold NaN or an infinity, printing nothing."""
    class StopOnNonFinite(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if non_finite_logs(logs):
                self.model.stop_training = True

    return StopOnNonFinite()


def _one_pass(split: Split):
    from pipelines.training.data.features import feature_dataset

    return feature_dataset(*split, EVAL_BATCH, shuffle=False, seed=0, repeat=False, drop_remainder=False)


def evaluate(model, split: Split) -> Tuple[float, float]:
    """The exact mean loss and accuracy of ``model`` over every row of ``split``; `TrainingDiverged` if not finite."""
    loss, accuracy = (float(v) for v in model.evaluate(_one_pass(split), verbose=0))
    if not math.isfinite(loss):
        raise TrainingDiverged(f"the trained head's loss is {loss}")
    return loss, accuracy


def run_trial(settings: HeadSettings, plan: TrialPlan, train: Split, validation: Split) -> TrialResult:
    """One trial (`train_head`), its validation totals only: the test split is not read."""
    return train_head(settings, plan, train, validation)[1]


def refit_and_test(settings: HeadSettings, plan: TrialPlan, train: Split, validation: Split,
                   test: Split) -> TrialResult:
    """The chosen settings trained again with the same seed, evaluated on ``test``: the search's one test reading."""
    model, result = train_head(settings, plan, train, validation)
    test_loss, test_accuracy = evaluate(model, test)
    return replace(result, test_loss=test_loss, test_accuracy=test_accuracy)
