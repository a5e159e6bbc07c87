"""Exact evaluation over a whole split: every row counted once across all ranks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np


@dataclass(frozen=True)
class Totals:
    """Sums over examples: ``loss_sum`` (float64, nats), ``correct`` and ``count`` (int), and the
    ``confusion`` matrix (``confusion[true][predicted]`` counts, a tuple of tuples; empty when
    not counted)."""

    loss_sum: float
    correct: int
    count: int
    confusion: Tuple[Tuple[int, ...], ...] = ()

    def confusion_matrix(self, num_classes: int = 0) -> np.ndarray:
        """``confusion`` as an int64 array ``(k, k)``; zeros of ``num_classes`` when not counted."""
        if self.confusion:
            return np.array(self.confusion, np.int64)
        return np.zeros((num_classes, num_classes), np.int64)

    @property
    def loss(self) -> float:
        """Mean sparse categorical cross-entropy per example."""
        return self.loss_sum / self.count if self.count else float("nan")

    @property
    def accuracy(self) -> float:
        """Share of examples whose argmax is the label."""
        return self.correct / self.count if self.count else float("nan")


def batch_totals(probabilities: np.ndarray, labels: np.ndarray, epsilon: float = 1e-7) -> Totals:
    """Loss sum, correct count and count of one batch.

    Args:
        probabilities: float array ``(n, num_classes)``, rows summing to 1 (softmax output).
        labels: int array ``(n,)``.
        epsilon: probabilities are clipped to ``[epsilon, 1 - epsilon]``, as Keras's
            ``sparse_categorical_crossentropy`` does, so that the loss matches Keras's.
    """
    p = np.clip(probabilities[np.arange(len(labels)), labels], epsilon, 1 - epsilon).astype(np.float64)
    predicted = probabilities.argmax(axis=1)
    k = probabilities.shape[1]
    confusion = np.zeros((k, k), np.int64)
    np.add.at(confusion, (np.asarray(labels, np.int64), predicted), 1)
    return Totals(float(-np.log(p).sum()), int((predicted == labels).sum()), int(len(labels)), _tuples(confusion))


def _tuples(matrix: np.ndarray) -> Tuple[Tuple[int, ...], ...]:
    return tuple(tuple(int(v) for v in row) for row in matrix)


def add(a: Totals, b: Totals) -> Totals:
    """Sum of two :class:`Totals` (confusion matrices added when both are counted)."""
    if a.confusion and b.confusion:
        confusion = _tuples(a.confusion_matrix() + b.confusion_matrix())
    else:
        confusion = a.confusion or b.confusion
    return Totals(a.loss_sum + b.loss_sum, a.correct + b.correct, a.count + b.count, confusion)


def evaluate_dataset(model, dataset) -> Totals:
    """Totals of ``model`` over every batch of a finite ``tf.data`` dataset of (images, labels),
    with the confusion matrix (``model``'s outputs give the number of classes)."""
    k = model.output_shape[-1]
    totals = Totals(0.0, 0, 0, _tuples(np.zeros((k, k), np.int64)))
    for images, labels in dataset:
        probs = model(images, training=False).numpy()
        totals = add(totals, batch_totals(probs, labels.numpy()))
    return totals


def allreduce_totals(totals: Totals) -> Totals:
    """Sum :class:`Totals` over all Horovod ranks (sums and counts, not an average of means), the
    confusion matrix too (every rank must have counted one of the same shape)."""
    import horovod.tensorflow as hvd

    matrix = totals.confusion_matrix()
    summed = hvd.allreduce(np.concatenate([[totals.loss_sum, totals.correct, totals.count],
                                           matrix.ravel()]).astype(np.float64),
                           op=hvd.Sum, name="exact_eval_totals")
    values = np.asarray(summed, np.float64)
    loss_sum, correct, count = values[:3].tolist()
    confusion = _tuples(np.rint(values[3:]).astype(np.int64).reshape(matrix.shape)) if matrix.size else ()
    return Totals(loss_sum, int(round(correct)), int(round(count)), confusion)


def exact_validation(inputs, data):
    """A Keras callback that makes each epoch's ``val_loss`` and ``val_accuracy`` the exact
    evaluation of the whole test split: every rank evaluates its one-pass shard
    (``inputs.evaluate_shard``, each row once, its count checked), the sums are added over ranks
    (:func:`allreduce_totals`) and the total checked against the manifest
    (:func:`pipelines.training.data.verify_total`), so early stopping, the checkpoints' records and
    ``curves.png`` use the number the report gives as the test accuracy. It also logs
    ``val_seconds``. Every rank must run it (it is collective); ``fit`` then needs no
    ``validation_data``.

    Place it after the callback that times the training part of the epoch and before those that
    read the validation metrics (early stopping, checkpoints, loggers): :func:`with_exact_validation`.
    """
    import time

    import tensorflow as tf

    from pipelines.training.data import verify_total

    class ExactValidation(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            start = time.perf_counter()
            totals = allreduce_totals(inputs.evaluate_shard(self.model))
            verify_total(totals.count, data, "test")
            if logs is not None:
                logs.update(val_loss=totals.loss, val_accuracy=totals.accuracy,
                            val_seconds=time.perf_counter() - start)

    return ExactValidation()


def with_exact_validation(callbacks: list, inputs, data) -> list:
    """``callbacks`` with :func:`exact_validation` inserted after the epoch timing
    (:class:`pipelines.training.callbacks.EpochStats`, so that the training images/s exclude the
    evaluation), or first when there is none, and Keras' progress printer after it (Keras would
    put its own first, printing each epoch's line before the validation metrics exist)."""
    import tensorflow as tf

    from pipelines.training.callbacks import EpochStats

    after = next((i + 1 for i, c in enumerate(callbacks) if isinstance(c, EpochStats)), 0)
    added = [exact_validation(inputs, data), tf.keras.callbacks.ProgbarLogger(count_mode="steps")]
    return callbacks[:after] + added + callbacks[after:]
