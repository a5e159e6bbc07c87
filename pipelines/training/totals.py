"""Exact sums over a split's examples: ``Totals``, what every evaluation adds up and allreduces."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _no_labels() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass(frozen=True, eq=False)
class Totals:
    """Sums over examples: ``loss_sum`` (float64, nats), ``correct``, ``count``, and the label pairs ``true``,
    ``predicted`` (int64 ``(count,)``, unordered; empty when ``num_classes`` is 0: confusion not counted)."""

    loss_sum: float
    correct: int
    count: int
    num_classes: int = 0
    true: np.ndarray = field(default_factory=_no_labels)
    predicted: np.ndarray = field(default_factory=_no_labels)

    @classmethod
    def of_confusion(cls, loss_sum: float, confusion) -> "Totals":
        """The totals of int ``(k, k)`` ``[true][predicted]`` counts ``confusion`` (k > 0)."""
        matrix = np.asarray(confusion, np.int64)
        k = matrix.shape[0]
        cells = np.repeat(np.arange(k * k, dtype=np.int64), matrix.ravel())
        return cls(float(loss_sum), int(np.trace(matrix)), int(matrix.sum()), k, cells // k, cells % k)

    def confusion_matrix(self, num_classes: int = 0) -> np.ndarray:
        """int64 ``(k, k)``: ``[t][p]`` examples of true ``t`` predicted ``p``; zeros
        ``(num_classes, num_classes)`` when the confusion was not counted."""
        k = self.num_classes
        if not k:
            return np.zeros((num_classes, num_classes), np.int64)
        return np.bincount(self.true * k + self.predicted, minlength=k * k).astype(np.int64, copy=False).reshape(k, k)

    @property
    def loss(self) -> float:
        """Mean sparse categorical cross-entropy per example."""
        return self.loss_sum / self.count if self.count else float("nan")

    @property
    def accuracy(self) -> float:
        """Share of examples whose argmax is the label."""
        return self.correct / self.count if self.count else float("nan")
