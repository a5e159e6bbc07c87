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
