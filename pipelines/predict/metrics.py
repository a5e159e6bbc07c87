"""Pure metrics of labelled predictions: accuracy, per-class precision and recall, confusion."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from pipelines.runtime.logs import plural


def confusion_matrix(true: Sequence[int], predicted: Sequence[int], num_classes: int) -> np.ndarray:
    """``m[t][p]``: rows of true ``t`` predicted ``p``, int64 ``(C, C)``; `ValueError` on lengths or labels."""
    t, p = _labels(true, predicted, num_classes)
    return np.bincount(t * num_classes + p, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def _labels(true: Sequence[int], predicted: Sequence[int], num_classes: int):
    t, p = np.asarray(true, np.int64).reshape(-1), np.asarray(predicted, np.int64).reshape(-1)
    if len(t) != len(p):
        raise ValueError(f"{plural(len(t), 'true label')} but {plural(len(p), 'predicted label')}")
    for name, a in (("true", t), ("predicted", p)):
        if a.size and (a.min() < 0 or a.max() >= num_classes):
            raise ValueError(f"{name} labels must lie in [0, {num_classes}); got {int(a.min())}..{int(a.max())}")
    return t, p


def _ratio(numerator: int, denominator: int) -> Optional[float]:
    return numerator / denominator if denominator else None


def classification_report(true: Sequence[int], predicted: Sequence[int],
                          class_names: Sequence[Optional[str]]) -> Dict:
    """Accuracy, per-class precision/recall and the confusion matrix of labelled predictions.

    Returns:
        ``{"count", "correct", "accuracy", "per_class", "confusion": {"labels", "matrix"}}`` over the classes that
        occur (``per_class``: ``label, name, support, predicted, precision, recall``); ``None`` for a ratio over 0.

    Raises:
        ValueError: ``true`` and ``predicted`` differ in length, or a label is not an index of ``class_names``."""
    k = len(class_names)
    t, p = _labels(true, predicted, k)
    # Only the classes that occur are counted: the matrix is len(present) squared, never k squared
    # (80 GB at 100,000 classes); the work O(rows + k + len(present)^2), the classes found and
    # renumbered by counting (no sort).
    classes = np.flatnonzero(np.bincount(t, minlength=k) + np.bincount(p, minlength=k))
    index = np.zeros(k, np.int64)
    index[classes] = np.arange(len(classes))
    m = confusion_matrix(index[t], index[p], len(classes))
    support, predicted_count, correct = m.sum(axis=1), m.sum(axis=0), np.diag(m)
    present = classes.tolist()
    per_class: List[Dict] = [{"label": c, "name": class_names[c], "support": s, "predicted": n,
                              "precision": _ratio(hit, n), "recall": _ratio(hit, s)}
                             for c, s, n, hit in zip(present, support.tolist(), predicted_count.tolist(),
                                                     correct.tolist())]
    total = len(t)
    return {"count": total, "correct": int(correct.sum()), "accuracy": _ratio(int(correct.sum()), total),
            "per_class": per_class, "confusion": {"labels": present, "matrix": m.tolist()}}
