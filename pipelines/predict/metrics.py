"""Pure metrics of labelled predictions: accuracy, per-class precision and recall, confusion."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np


def confusion_matrix(true: Sequence[int], predicted: Sequence[int], num_classes: int) -> np.ndarray:
    """``m[t][p]``: rows with true label ``t`` predicted ``p``; int64 ``(num_classes, num_classes)``."""
    m = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(m, (np.asarray(true, np.int64), np.asarray(predicted, np.int64)), 1)
    return m


def _ratio(numerator: int, denominator: int) -> Optional[float]:
    return numerator / denominator if denominator else None


def classification_report(true: Sequence[int], predicted: Sequence[int],
                          class_names: Sequence[Optional[str]]) -> Dict:
    """Accuracy, per-class precision/recall and the confusion matrix of labelled predictions.

    Args:
        true, predicted: labels (indexes into ``class_names``), one pair per labelled row.
        class_names: the model's classes.

    Returns:
        ``{"count", "correct", "accuracy", "per_class": [...], "confusion": {"labels", "matrix"}}``:
        ``per_class`` holds, for every class that occurs as a true or a predicted label, its
        ``label``, ``name``, ``support`` (true rows), ``predicted`` (rows predicted as it),
        ``precision`` (correct / predicted) and ``recall`` (correct / support), ``None`` where the
        denominator is 0; ``confusion`` is the matrix restricted to those classes (``labels``, in
        label order; rows true, columns predicted). ``accuracy`` is ``None`` when nothing is labelled.
    """
    m = confusion_matrix(true, predicted, len(class_names))
    support, predicted_count, correct = m.sum(axis=1), m.sum(axis=0), np.diag(m)
    present = [int(c) for c in np.flatnonzero(support + predicted_count)]
    per_class: List[Dict] = [{"label": c, "name": class_names[c], "support": int(support[c]),
                              "predicted": int(predicted_count[c]),
                              "precision": _ratio(int(correct[c]), int(predicted_count[c])),
                              "recall": _ratio(int(correct[c]), int(support[c]))} for c in present]
    total = int(m.sum())
    return {"count": total, "correct": int(correct.sum()), "accuracy": _ratio(int(correct.sum()), total),
            "per_class": per_class,
            "confusion": {"labels": present, "matrix": m[np.ix_(present, present)].tolist()}}
