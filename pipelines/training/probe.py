"""The linear probe: a logistic regression on the head's frozen features, a baseline for every result.

A head that trails it has not converged or its recipe is wrong."""
from __future__ import annotations

import math
import time
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from pipelines.runtime.logs import plural

#: ``C`` values tried, strongest regularisation first (the warm-start path's order).
DEFAULT_GRID = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
#: At most this many train rows are fitted (a stratified sample beyond it).
DEFAULT_MAX_ROWS = 20000
#: L-BFGS iterations per ``C`` (warm-started: later values need fewer).
DEFAULT_MAX_ITER = 200


class ProbeRefused(ValueError):
    """The probe cannot be fitted on these arrays (one line naming why)."""


def check_grid(grid: Sequence[float]) -> tuple:
    """The grid sorted ascending (strongest regularisation first).

    Raises:
        ProbeRefused: empty, or a value not finite and > 0."""
    values = tuple(sorted(float(c) for c in grid))
    if not values or not all(math.isfinite(c) and c > 0 for c in values):
        raise ProbeRefused(f"the probe's C grid must be finite numbers > 0, got {list(grid)}")
    return values


def stratified_rows(labels: np.ndarray, max_rows: int, seed: int) -> np.ndarray:
    """Sorted indices of at most ``max_rows`` rows of int ``(n,)`` ``labels``, each class keeping its share."""
    n = len(labels)
    if n <= max_rows:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    chosen = []
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label)
        take = max(1, int(round(len(rows) * max_rows / n)))
        chosen.append(rng.choice(rows, size=min(take, len(rows)), replace=False))
    return np.sort(np.concatenate(chosen))


def _check_split(name: str, x: np.ndarray, y: np.ndarray, width: Optional[int] = None) -> None:
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
        raise ProbeRefused(f"the probe's {name} split: features (n, d) and labels (n,) expected, got {x.shape} and "
                           f"{y.shape}")
    if width is not None and x.shape[1] != width:
        raise ProbeRefused(f"the probe's {name} split has {x.shape[1]} features, the train split {width}")
    if not np.isfinite(x).all():
        raise ProbeRefused(f"the probe's {name} split holds non-finite features")


def fit_probe(train_x: np.ndarray, train_y: np.ndarray, val_x: np.ndarray, val_y: np.ndarray,
              test_x: Optional[np.ndarray] = None, test_y: Optional[np.ndarray] = None,
              grid: Sequence[float] = DEFAULT_GRID, max_rows: int = DEFAULT_MAX_ROWS,
              max_iter: int = DEFAULT_MAX_ITER, seed: int = 0, threads: Optional[int] = 1) -> Dict:
    """Fit the probe on the train split, choose ``C`` on validation, score the test split once.

    Args:
        train_x, val_x, test_x: float features ``(n, d)``, one ``d``; labels int ``(n,)``; test optional.
        grid, max_rows, max_iter, seed: ``C`` values (> 0), train rows fitted (stratified), L-BFGS iterations.
        threads: BLAS/OpenMP threads (``None``: the libraries' own).

    Returns:
        dict: ``C``, accuracies, ``seconds``, sizes, ``converged``, the ``grid`` path (ties go to lower log-loss),
        and ``head``, the chosen probe as ``fold`` gives it (not JSON: pop it before writing the dict).

    Raises:
        ProbeRefused: bad shapes or grid, non-finite features, under two train classes, no validation rows,
            ``max_rows`` or ``max_iter`` < 1."""
    import sklearn.linear_model  # noqa: F401  (loaded before the limit: it limits the libraries loaded)
    from threadpoolctl import threadpool_limits

    values = check_grid(grid)
    if max_rows < 1 or max_iter < 1:
        raise ProbeRefused(f"the probe's max_rows and max_iter must be >= 1, got {max_rows} and {max_iter}")
    train_x, val_x = np.asarray(train_x), np.asarray(val_x)
    train_y, val_y = np.asarray(train_y).astype(np.int64), np.asarray(val_y).astype(np.int64)
    _check_split("train", train_x, train_y)
    _check_split("validation", val_x, val_y, train_x.shape[1])
    if len(np.unique(train_y)) < 2 or not len(val_y):
        raise ProbeRefused(f"the probe needs two classes in the train split and a validation split, got "
                           f"{plural(len(np.unique(train_y)), 'class')} and {plural(len(val_y), 'validation row')}")
    with threadpool_limits(limits=threads):
        return _fit(values, train_x, train_y, val_x, val_y, test_x, test_y, max_rows, max_iter, seed)


def _fit(values, train_x, train_y, val_x, val_y, test_x, test_y, max_rows, max_iter, seed) -> Dict:
    """``fit_probe``'s work, on checked arrays and grid."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    start = time.perf_counter()
    rows = stratified_rows(train_y, max_rows, seed)
    scaler = StandardScaler().fit(train_x[rows])
    fitted_x, scored_val = scaler.transform(train_x[rows]), scaler.transform(val_x)
    model = LogisticRegression(C=values[0], max_iter=max_iter, warm_start=True, random_state=seed)
    path, best, best_key = [], None, None
    for c in values:
        model.set_params(C=c)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # bounded on purpose: reported as "converged"
            model.fit(fitted_x, train_y[rows])
        probabilities = model.predict_proba(scored_val)
        accuracy = float(np.mean(model.classes_[probabilities.argmax(axis=1)] == val_y))
        loss = log_loss(val_y, probabilities, model.classes_)
        iterations = int(np.max(model.n_iter_))
        path.append({"C": c, "validation_accuracy": accuracy, "validation_loss": loss, "iterations": iterations})
        key = (-accuracy, loss, c)
        if best_key is None or key < best_key:
            best_key, best = key, (c, model.coef_.copy(), model.intercept_.copy(), iterations)
    chosen, model.coef_, model.intercept_, iterations = best
    head = fold(scaler.mean_, scaler.scale_, model.coef_, model.intercept_, model.classes_)
    test_accuracy = None
    if test_x is not None and test_y is not None:
        test_x, test_y = np.asarray(test_x), np.asarray(test_y).astype(np.int64)
        _check_split("test", test_x, test_y, train_x.shape[1])
        test_accuracy = float(np.mean(model.predict(scaler.transform(test_x)) == test_y)) if len(test_y) else None
    chosen_row = next(p for p in path if p["C"] == chosen)
    return {"C": chosen, "validation_accuracy": chosen_row["validation_accuracy"], "test_accuracy": test_accuracy,
            "seconds": time.perf_counter() - start, "rows": int(len(rows)), "train_rows": int(len(train_y)),
            "features": int(train_x.shape[1]), "classes": int(len(model.classes_)), "max_iter": max_iter,
            "converged": iterations < max_iter, "grid": path, "head": head}


def log_loss(labels: np.ndarray, probabilities: np.ndarray, classes: np.ndarray) -> float:
    """Mean cross-entropy of int ``(n,)`` ``labels`` under ``(n, len(classes))`` probabilities, clipped at 1e-15.

    A label no column names (a class the train split lacks) has probability 0: its row costs ``-log(1e-15)``."""
    columns = {int(label): j for j, label in enumerate(classes)}
    found = np.array([probabilities[i, columns[int(label)]] if int(label) in columns else 0.0
                      for i, label in enumerate(labels)])
    return float(-np.mean(np.log(np.clip(found, 1e-15, 1.0))))


def fold(mean: np.ndarray, scale: np.ndarray, coef: np.ndarray, intercept: np.ndarray,
         classes: np.ndarray) -> Dict[int, tuple]:
    """The probe as a softmax layer on raw features: per class, ``(kernel (d,), bias)`` with the scaler folded in.

    ``z = (x - mean) / scale`` and logits ``z @ coef.T + intercept`` become ``x @ kernel + bias``. A binary
    probe has one row of ``coef``: the logit of ``classes[1]`` over a logit of 0 for ``classes[0]``."""
    if len(coef) == 1 and len(classes) == 2:
        coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
    kernels = coef / scale
    return {int(label): (kernels[j], float(intercept[j] - kernels[j] @ mean)) for j, label in enumerate(classes)}


def start_is_better(start: Tuple[float, float], trained: Tuple[float, float], monitor: str) -> bool:
    """Whether the probe's head (the start) beats the trained head on validation ``(loss, accuracy)``.

    Compared on early stopping's ``monitor`` (``val_loss``: lower; else accuracy: higher); ties keep the trained
    head. The start is a candidate of early stopping's choice, as every epoch is."""
    if monitor == "val_loss":
        return start[0] < trained[0]
    return start[1] > trained[1]


def head_weights(head: Dict[int, tuple], num_classes: int) -> List[np.ndarray]:
    """``Dense(num_classes)``'s ``[kernel (d, num_classes), bias (num_classes,)]``, float32, from ``fold``'s head.

    A class with no train rows gets a zero kernel and a bias 10 below the lowest fitted one (probability ~0)."""
    width = len(next(iter(head.values()))[0])
    kernel, bias = np.zeros((width, num_classes), np.float32), np.zeros(num_classes, np.float32)
    bias[:] = min(b for _, b in head.values()) - 10.0
    for label, (column, b) in head.items():
        kernel[:, label], bias[label] = column, b
    return [kernel, bias]
