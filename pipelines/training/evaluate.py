"""Exact evaluation over a whole split: every row counted once across all ranks.

The confusion matrix is never built per batch: a batch adds its (true, predicted) label pairs, and
the ``(k, k)`` matrix is counted from all of them once (:meth:`Totals.confusion_matrix`), so a
batch costs O(batch) whatever the number of classes ``k`` (what the per-batch ``k x k`` matrix
cost at 1,000 classes: docs/benchmarks.md, Figures behind the code's constants; ``benchmarks/eval_bench.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from pipelines.contract import VALIDATION
from pipelines.training.data import verify_total


def _no_labels() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass(frozen=True, eq=False)
class Totals:
    """Sums over examples: ``loss_sum`` (float64, nats), ``correct`` and ``count`` (int), and, when
    the confusion is counted (``num_classes`` > 0), every example's label pair: ``true`` and
    ``predicted``, int64 arrays ``(count,)`` in ``[0, num_classes)``, in no particular order (a
    multiset: :func:`allreduce_totals` may return them sorted). :meth:`confusion_matrix` counts
    them. ``num_classes`` 0: the confusion was not counted and both arrays are empty."""

    loss_sum: float
    correct: int
    count: int
    num_classes: int = 0
    true: np.ndarray = field(default_factory=_no_labels)
    predicted: np.ndarray = field(default_factory=_no_labels)

    @classmethod
    def of_confusion(cls, loss_sum: float, confusion) -> "Totals":
        """The totals whose confusion is ``confusion`` (int ``(k, k)``, ``[true][predicted]``
        counts, k > 0): ``count`` its sum, ``correct`` its trace, the pairs its cells repeated."""
        matrix = np.asarray(confusion, np.int64)
        k = matrix.shape[0]
        cells = np.repeat(np.arange(k * k, dtype=np.int64), matrix.ravel())
        return cls(float(loss_sum), int(np.trace(matrix)), int(matrix.sum()), k, cells // k, cells % k)

    def confusion_matrix(self, num_classes: int = 0) -> np.ndarray:
        """int64 ``(k, k)``: ``[t][p]`` examples of true label ``t`` predicted ``p`` (one
        ``np.bincount`` over ``true * k + predicted``); zeros ``(num_classes, num_classes)`` when
        the confusion was not counted."""
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


def batch_totals(probabilities: np.ndarray, labels: np.ndarray, epsilon: float = 1e-7) -> Totals:
    """Loss sum, correct count, count and label pairs of one batch; O(n * num_classes) for the
    argmax, nothing of size num_classes squared.

    Args:
        probabilities: float array ``(n, num_classes)``, rows summing to 1 (softmax output).
        labels: int array ``(n,)`` in ``[0, num_classes)``.
        epsilon: probabilities are clipped to ``[epsilon, 1 - epsilon]``, as Keras's
            ``sparse_categorical_crossentropy`` does, so that the loss matches Keras's.

    Raises:
        ValueError: a label outside ``[0, num_classes)``.
    """
    labels = np.asarray(labels, np.int64).reshape(-1)
    k = probabilities.shape[1]
    if labels.size and (labels.min() < 0 or labels.max() >= k):
        raise ValueError(f"labels must lie in [0, {k}), the model's classes; "
                         f"got {int(labels.min())}..{int(labels.max())}")
    p = np.clip(probabilities[np.arange(len(labels)), labels], epsilon, 1 - epsilon).astype(np.float64)
    predicted = probabilities.argmax(axis=1).astype(np.int64)
    # the sum of the negated logs, not the negated sum: the same value, and 0.0 (not -0.0) when empty
    return Totals(float((-np.log(p)).sum()), int((predicted == labels).sum()), int(len(labels)), k, labels,
                  predicted)


def add(a: Totals, b: Totals) -> Totals:
    """Sum of two :class:`Totals`; the label pairs joined when both counted them (of the same
    number of classes), else those of the one that did. O(a.count + b.count): to sum many batches
    use :func:`sum_totals` once, not ``add`` in a loop.

    Raises:
        ValueError: both counted the confusion, of different numbers of classes.
    """
    return sum_totals([a, b])


def sum_totals(parts: List[Totals]) -> Totals:
    """Sum of ``parts``, in one pass: the sums and counts added, the label pairs of those that
    counted the confusion concatenated once.

    Raises:
        ValueError: parts counted the confusion of different numbers of classes.
    """
    counted = [t for t in parts if t.num_classes]
    sizes = {t.num_classes for t in counted}
    if len(sizes) > 1:
        raise ValueError(f"cannot add confusions counted over different numbers of classes: {sorted(sizes)}")
    pairs: Dict[str, Any] = {}
    if counted:
        pairs = dict(num_classes=counted[0].num_classes, true=np.concatenate([t.true for t in counted]),
                     predicted=np.concatenate([t.predicted for t in counted]))
    return Totals(float(sum(t.loss_sum for t in parts)), sum(t.correct for t in parts),
                  sum(t.count for t in parts), **pairs)


def evaluate_dataset(model, dataset, after_batch: Optional[Callable[[int], None]] = None) -> Totals:
    """Totals of ``model`` over every batch of a finite ``tf.data`` dataset of (images, labels),
    with the label pairs (``model``'s outputs give the number of classes): O(batch) bookkeeping a
    batch, the pairs joined once at the end. ``after_batch(n)`` runs after the n-th batch
    (1-based): the watchdog's tick, the preemption notice's check (it may raise)."""
    k = model.output_shape[-1]
    parts = [Totals(0.0, 0, 0, k)]
    for images, labels in dataset:
        parts.append(batch_totals(model(images, training=False).numpy(), labels.numpy()))
        if after_batch is not None:
            after_batch(len(parts) - 1)
    return sum_totals(parts)


def gathers_pairs(rows: int, num_classes: int) -> bool:
    """Whether :func:`allreduce_totals` allgathers the label pairs rather than allreducing the
    matrix: when ``2 * rows < num_classes ** 2``, i.e. when every rank receiving all ``rows`` pairs
    (two int64, 16 bytes a row) moves less than a ``k x k`` float64 allreduce (8 bytes a cell), as
    at many classes and few rows (100,000 classes: an 80 GB matrix against 16 bytes a test image)."""
    return 2 * rows < num_classes * num_classes


def allreduce_totals(totals: Totals) -> Totals:
    """Sum :class:`Totals` over all Horovod ranks (sums and counts, not an average of means), the
    confusion too: first the sums and counts, then, by :func:`gathers_pairs` of the total rows,
    either every rank's label pairs allgathered or the ``(k, k)`` matrices summed (float64, exact
    below 2**53 examples) and turned back into pairs. Every rank must have counted the confusion of
    the same number of classes, or none. Collective: every rank must call it."""
    import horovod.tensorflow as hvd

    k = totals.num_classes
    summed = hvd.allreduce(np.array([totals.loss_sum, totals.correct, totals.count, k, k * k], np.float64),
                           op=hvd.Sum, name="exact_eval_totals")
    loss_sum, correct, count, k_sum, k2_sum = np.asarray(summed, np.float64).tolist()
    if k_sum * k_sum != k2_sum * hvd.size():  # (sum k)^2 = n sum k^2 only when every k is the same
        raise ValueError(f"every rank must count the confusion of the same number of classes ({k} here)")
    if not k:
        return Totals(loss_sum, int(round(correct)), int(round(count)))
    if gathers_pairs(int(round(count)), k):
        pairs = np.asarray(hvd.allgather(np.stack([totals.true, totals.predicted], axis=1),
                                         name="exact_eval_pairs"), np.int64).reshape(-1, 2)
        return Totals(loss_sum, int(round(correct)), int(round(count)), k, pairs[:, 0].copy(), pairs[:, 1].copy())
    matrix = hvd.allreduce(totals.confusion_matrix().astype(np.float64), op=hvd.Sum, name="exact_eval_confusion")
    return Totals.of_confusion(loss_sum, np.rint(np.asarray(matrix, np.float64)).astype(np.int64))


def exact_validation(inputs, data, listeners: Sequence = ()):
    """A Keras callback that makes each epoch's ``val_loss``, ``val_accuracy`` and ``val_count`` the
    exact evaluation of the whole validation split: every rank evaluates its one-pass shard
    (``inputs.evaluate_shard``, each row once, its count checked), the sums are added over ranks
    (:func:`allreduce_totals`) and the total checked against the manifest
    (:func:`pipelines.training.data.onepass.verify_total`). Early stopping, the best weights, the
    checkpoints' records, fine-tuning's start and ``curves.png`` all read it; the test split is never
    read here (only once, after training: :func:`pipelines.training.train.evaluate`). It also logs
    ``val_seconds``. Every rank must run it (it is collective); ``fit`` then needs no
    ``validation_data``.

    After each batch it ticks the rank's watchdog (:func:`pipelines.launch.watchdog.progress`) and
    calls ``on_validation_batch_end(epoch, batch, logs)`` of each of ``listeners`` that has it
    (the preemption notice's check, collective: :class:`pipelines.training.callbacks.DivergenceGuard`;
    a test's fault), then, its shard done, ``on_validation_shard_end(epoch, logs)`` (``epoch``
    0-based as Keras', ``batch`` 1-based, ``logs`` the epoch's training logs).

    Place it after the callback that times the training part of the epoch and before those that
    read the validation metrics (early stopping, checkpoints, loggers): :func:`with_exact_validation`.
    """
    import time

    import tensorflow as tf

    from pipelines.launch.watchdog import progress

    batch_hooks = [c.on_validation_batch_end for c in listeners if hasattr(c, "on_validation_batch_end")]
    end_hooks = [c.on_validation_shard_end for c in listeners if hasattr(c, "on_validation_shard_end")]

    class ExactValidation(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            start = time.perf_counter()

            def after_batch(batch: int) -> None:
                progress(f"the rank's own work after validation batch {batch} of epoch {epoch + 1}")
                for hook in batch_hooks:
                    hook(epoch, batch, logs)
                progress(f"validation batch {batch + 1} of epoch {epoch + 1}")

            progress(f"validation batch 1 of epoch {epoch + 1}")
            shard = inputs.evaluate_shard(self.model, VALIDATION, after_batch)
            for hook in end_hooks:
                hook(epoch, logs)
            progress(f"the validation's sums over the ranks, epoch {epoch + 1}", waits=True)
            totals = allreduce_totals(shard)
            verify_total(totals.count, data, VALIDATION)
            if logs is not None:
                logs.update(val_loss=totals.loss, val_accuracy=totals.accuracy, val_count=totals.count,
                            val_seconds=time.perf_counter() - start)

    return ExactValidation()


def with_exact_validation(callbacks: list, inputs, data) -> list:
    """``callbacks`` with :func:`exact_validation` inserted after the epoch timing
    (:class:`pipelines.training.callbacks.EpochStats`, so that the training images/s exclude the
    evaluation), or first when there is none, and Keras' progress printer after it (Keras would
    put its own first, printing each epoch's line before the validation metrics exist). The
    callbacks are its listeners (:func:`exact_validation`)."""
    import tensorflow as tf

    from pipelines.training.callbacks import EpochStats

    after = next((i + 1 for i, c in enumerate(callbacks) if isinstance(c, EpochStats)), 0)
    added = [exact_validation(inputs, data, list(callbacks)), tf.keras.callbacks.ProgbarLogger(count_mode="steps")]
    return callbacks[:after] + added + callbacks[after:]
