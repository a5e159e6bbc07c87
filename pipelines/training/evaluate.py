"""Exact evaluation over a whole split: every row counted once across all ranks.

Batches keep (true, predicted) label pairs; the ``(k, k)`` confusion matrix is counted from them once."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from pipelines.contract import VALIDATION
from pipelines.training.data import Dataset, verify_total
from pipelines.training.totals import Totals

if TYPE_CHECKING:
    from pipelines.training.inputpath import InputPath


def batch_totals(probabilities: np.ndarray, labels: np.ndarray, epsilon: float = 1e-7) -> Totals:
    """Totals of one batch (``probabilities``: float ``(n, k)`` softmax rows; ``labels``: int ``(n,)``).

    ``epsilon`` clips probabilities as Keras' loss does.

    Raises:
        ValueError: a label outside ``[0, k)``."""
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
    """Sum of two ``Totals``; O(a.count + b.count), so sum many with ``sum_totals`` once.

    Raises:
        ValueError: both counted the confusion, of different numbers of classes."""
    return sum_totals([a, b])


def sum_totals(parts: List[Totals]) -> Totals:
    """Sum of ``parts`` in one pass, the label pairs concatenated once.

    Raises:
        ValueError: parts counted the confusion of different numbers of classes."""
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
    """Totals of ``model`` over a finite dataset of (images, labels); ``after_batch(n)`` after 1-based batch n."""
    k = model.output_shape[-1]
    parts = [Totals(0.0, 0, 0, k)]
    for images, labels in dataset:
        parts.append(batch_totals(model(images, training=False).numpy(), labels.numpy()))
        if after_batch is not None:
            after_batch(len(parts) - 1)
    return sum_totals(parts)


def gathers_pairs(rows: int, num_classes: int) -> bool:
    """Whether ``allreduce_totals`` allgathers label pairs (16 bytes a row) rather than allreducing the
    float64 ``k x k`` matrix: when ``2 * rows < num_classes ** 2``."""
    return 2 * rows < num_classes * num_classes


def allreduce_totals(totals: Totals) -> Totals:
    """Sum ``Totals`` over all Horovod ranks, the confusion too (float64, exact below 2**53 examples).

    Collective: every rank calls it, all having counted the confusion of the same number of classes, or none."""
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


def exact_validation(inputs: InputPath, data: Dataset, listeners: Sequence = ()):
    """A collective Keras callback making each epoch's ``val_loss``, ``val_accuracy``, ``val_count`` exact.

    ``listeners`` get ``on_validation_batch_end(epoch, batch, logs)`` then ``on_validation_shard_end(epoch, logs)``."""
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
