"""Exact evaluation over a whole split: every row counted once across all ranks."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Totals:
    """Sums over examples: ``loss_sum`` (float64, nats), ``correct`` and ``count`` (int)."""

    loss_sum: float
    correct: int
    count: int

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
    return Totals(float(-np.log(p).sum()), int((probabilities.argmax(axis=1) == labels).sum()), int(len(labels)))


def add(a: Totals, b: Totals) -> Totals:
    """Sum of two :class:`Totals`."""
    return Totals(a.loss_sum + b.loss_sum, a.correct + b.correct, a.count + b.count)


def evaluate_dataset(model, dataset) -> Totals:
    """Totals of ``model`` over every batch of a finite ``tf.data`` dataset of (images, labels)."""
    totals = Totals(0.0, 0, 0)
    for images, labels in dataset:
        probs = model(images, training=False).numpy()
        totals = add(totals, batch_totals(probs, labels.numpy()))
    return totals


def allreduce_totals(totals: Totals) -> Totals:
    """Sum :class:`Totals` over all Horovod ranks (sums and counts, not an average of means)."""
    import horovod.tensorflow as hvd

    summed = hvd.allreduce(np.array([totals.loss_sum, totals.correct, totals.count], np.float64),
                           op=hvd.Sum, name="exact_eval_totals")
    loss_sum, correct, count = np.asarray(summed, np.float64).tolist()
    return Totals(loss_sum, int(round(correct)), int(round(count)))
