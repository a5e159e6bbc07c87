"""The exact evaluation and predict's report at many classes against few, side by side in one run.

Issue 35's goal: an evaluation over the same images at 1,000 classes within 1.2x of its time at 10
classes, and predict's labelled report likewise. Every width ``k`` of ``--classes`` gets a tiny
real Keras model (a strided convolution, global pooling, a softmax ``Dense(k)``) whose first 10
outputs are the same for every ``k`` and whose other outputs have a bias of -30, so that every
model gives the same images the same predictions and (to 1e-9) the same probabilities: only the
number of classes differs. Timed per ``k``:

* the evaluation: :func:`pipelines.training.evaluate.evaluate_dataset` over a ``tf.data`` dataset
  of the images (``--images``, ``--size`` px, batches of ``--batch-size``), then the confusion
  matrix built once (:meth:`~pipelines.training.evaluate.Totals.confusion_matrix`, what the report
  writes);
* the totals alone: the same bookkeeping (:func:`~pipelines.training.evaluate.batch_totals` a
  batch, their sum, the matrix) on the model's probabilities computed before the clock, the part
  of the evaluation that issue 35 made O(batch) a batch (seconds a batch, the one matrix shared
  out; the argmax still reads ``n x k`` probabilities, so it grows with ``k`` where the model's
  cost hides it; no goal is set on it);
* predict's report: :func:`pipelines.predict.metrics.classification_report` of ``--report-rows``
  labelled predictions (the images' labels and predictions, repeated) against ``k`` class names,
  the mean of ``--report-calls`` calls a run.

Each figure is the fastest of ``--repeats`` runs (the one least disturbed by other processes: the
work is the same every run), the widths taking turns, each model called once before the clock;
the medians are printed beside them.
``--before N`` also times, on the first N batches' probabilities, the per-batch totals of before
issue 35 (:func:`previous_batch_totals`, a ``k x k`` tuple of tuples a batch) and the report of
before (:func:`previous_classification_report`, fastest of 3). Usage::

    python benchmarks/eval_bench.py [--classes 10,1000,3000] [--images 2048] [--size 32]
        [--batch-size 32] [--repeats 7] [--report-rows 100000] [--report-calls 20] [--before 4]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: The classes every model really predicts among; the others' logits are pushed down by -30.
BASE_CLASSES = 10
GOAL = 1.2


def previous_batch_totals(probabilities: np.ndarray, labels: np.ndarray,
                          epsilon: float = 1e-7) -> Tuple[float, int, int, Tuple[Tuple[int, ...], ...]]:
    """The totals of one batch as computed before issue 35: ``(loss_sum, correct, count,
    confusion)``, the confusion a ``k x k`` tuple of tuples of Python ints built every batch
    (the reference the tests compare :func:`pipelines.training.evaluate.batch_totals` with)."""
    p = np.clip(probabilities[np.arange(len(labels)), labels], epsilon, 1 - epsilon).astype(np.float64)
    predicted = probabilities.argmax(axis=1)
    k = probabilities.shape[1]
    confusion = np.zeros((k, k), np.int64)
    np.add.at(confusion, (np.asarray(labels, np.int64), predicted), 1)
    return (float(-np.log(p).sum()), int((predicted == labels).sum()), int(len(labels)),
            tuple(tuple(int(v) for v in row) for row in confusion))


def previous_add(a: Tuple, b: Tuple) -> Tuple:
    """Two :func:`previous_batch_totals` added as before issue 35 (the matrices rebuilt as tuples)."""
    matrix = np.array(a[3], np.int64) + np.array(b[3], np.int64)
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], tuple(tuple(int(v) for v in row) for row in matrix))


def previous_classification_report(true, predicted, class_names) -> Dict:
    """:func:`pipelines.predict.metrics.classification_report` as it was before issue 35: the
    ``len(class_names)`` squared matrix counted, then cut to the classes present."""
    k = len(class_names)
    m = np.zeros((k, k), np.int64)
    np.add.at(m, (np.asarray(true, np.int64), np.asarray(predicted, np.int64)), 1)
    support, predicted_count, correct = m.sum(axis=1), m.sum(axis=0), np.diag(m)
    present = [int(c) for c in np.flatnonzero(support + predicted_count)]

    def ratio(a, b):
        return a / b if b else None

    per_class = [{"label": c, "name": class_names[c], "support": int(support[c]), "predicted": int(predicted_count[c]),
                  "precision": ratio(int(correct[c]), int(predicted_count[c])),
                  "recall": ratio(int(correct[c]), int(support[c]))} for c in present]
    total = int(m.sum())
    return {"count": total, "correct": int(correct.sum()), "accuracy": ratio(int(correct.sum()), total),
            "per_class": per_class, "confusion": {"labels": present, "matrix": m[np.ix_(present, present)].tolist()}}


def tiny_model(num_classes: int, size: int, seed: int = 0):
    """A real Keras model ``(n, size, size, 3)`` float32 -> softmax ``(n, num_classes)`` whose first
    :data:`BASE_CLASSES` logits are the same for every ``num_classes`` (same seed) and the rest -30."""
    from pipelines.stack.kerasapi import keras

    rng = np.random.default_rng(seed)
    model = keras.Sequential([keras.Input((size, size, 3)), keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
                              keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(num_classes, activation="softmax")])
    conv = model.layers[0]
    conv.set_weights([rng.normal(0, 0.1, w.shape).astype(np.float32) for w in conv.get_weights()])
    kernel = np.zeros((8, num_classes), np.float32)
    bias = np.full(num_classes, -30.0, np.float32)
    kernel[:, :BASE_CLASSES] = rng.normal(0, 1.0, (8, BASE_CLASSES))
    bias[:BASE_CLASSES] = 0.0
    model.layers[-1].set_weights([kernel, bias])
    return model


def timed(fn) -> Tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def totals_alone(batches) -> np.ndarray:
    """The evaluation's bookkeeping over ``batches`` of ``(probabilities, labels)``, then the matrix."""
    from pipelines.training.evaluate import batch_totals, sum_totals

    return sum_totals([batch_totals(probs, labels) for probs, labels in batches]).confusion_matrix()


def evaluation(model, dataset):
    """What a run's evaluation costs: :func:`evaluate_dataset`, then the matrix built once."""
    from pipelines.training.evaluate import evaluate_dataset

    totals = evaluate_dataset(model, dataset)
    return totals, totals.confusion_matrix()


def measure(widths: List[int], args) -> Dict[int, Dict[str, float]]:
    """Seconds of the evaluation and of the report at each width (fastest and median of the
    runs, the widths taking turns) and, with ``--before``, the totals of before a batch."""
    import tensorflow as tf

    from pipelines.predict.metrics import classification_report

    rng = np.random.default_rng(1)
    images = rng.uniform(0, 1, (args.images, args.size, args.size, 3)).astype(np.float32)
    labels = rng.integers(0, BASE_CLASSES, args.images)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(args.batch_size)
    models = {k: tiny_model(k, args.size) for k in widths}
    first = {k: evaluation(models[k], dataset)[0] for k in widths}  # warm-up, and the same answers
    check_same(first)
    reps = -(-args.report_rows // args.images)
    true = np.tile(first[widths[0]].true, reps)[:args.report_rows]
    predicted = np.tile(first[widths[0]].predicted, reps)[:args.report_rows]
    names = {k: [f"class{i}" for i in range(k)] for k in widths}
    outputs = {k: [(models[k](x, training=False).numpy(), y.numpy()) for x, y in dataset] for k in widths}
    seconds = {k: {"evaluation": [], "totals": [], "report": []} for k in widths}
    for _ in range(args.repeats):
        for k in widths:
            seconds[k]["evaluation"].append(timed(lambda: evaluation(models[k], dataset))[0])
            seconds[k]["totals"].append(timed(lambda: totals_alone(outputs[k]))[0] / len(outputs[k]))
            seconds[k]["report"].append(timed(lambda: [classification_report(true, predicted, names[k])
                                                       for _ in range(args.report_calls)])[0] / args.report_calls)
    figures = {k: {**{what: min(v) for what, v in s.items()},
                   **{f"{what}_median": statistics.median(v) for what, v in s.items()}} for k, s in seconds.items()}
    if args.before:
        for k in widths:
            figures[k]["before_per_batch"] = before_per_batch(models[k], dataset, args.before)
            figures[k]["before_report"] = min(
                timed(lambda: previous_classification_report(true, predicted, names[k]))[0] for _ in range(3))
    return figures


def check_same(totals: Dict) -> None:
    """Every width's evaluation gives the same count, correct count and (to 1e-6) loss."""
    base = next(iter(totals.values()))
    for k, t in totals.items():
        if (t.count, t.correct) != (base.count, base.correct) or abs(t.loss - base.loss) > 1e-6:
            raise SystemExit(f"{k} classes: count {t.count}, correct {t.correct}, loss {t.loss} differ from "
                             f"{base.count}, {base.correct}, {base.loss}: not the same evaluation")


def before_per_batch(model, dataset, batches: int) -> float:
    """Seconds a batch of the totals before issue 35 (probabilities computed before the clock)."""
    inputs = [(model(images, training=False).numpy(), labels.numpy()) for images, labels in dataset.take(batches)]
    k = model.output_shape[-1]
    start = time.perf_counter()
    totals = (0.0, 0, 0, tuple((0,) * k for _ in range(k)))
    for probs, labels in inputs:
        totals = previous_add(totals, previous_batch_totals(probs, labels))
    return (time.perf_counter() - start) / len(inputs)


def report(figures: Dict[int, Dict[str, float]], args) -> List[str]:
    """The table and, for every width after the first, its ratio to the first and the goal."""
    base_k = next(iter(figures))
    batches = -(-args.images // args.batch_size)
    lines = [f"{args.images} images {args.size}x{args.size}, batch {args.batch_size} ({batches} batches); "
             f"report of {args.report_rows} labelled rows; fastest (median) of {args.repeats} runs, "
             "widths taking turns",
             f"{'classes':>8} {'evaluation s':>16} {'ratio':>7} {'totals s/batch':>18} {'ratio':>7} "
             f"{'report s':>16} {'ratio':>7}"
             + (f" {'before: s/batch':>16} {'before: report s':>17}" if args.before else "")]
    for k, m in figures.items():
        cells = " ".join(f"{m[what]:>{w}.{d}f} ({m[what + '_median']:.{d}f}) {m[what] / figures[base_k][what]:>6.2f}x"
                         for what, w, d in (("evaluation", 7, 4), ("totals", 8, 6), ("report", 7, 4)))
        lines.append(f"{k:>8} {cells}"
                     + (f" {m['before_per_batch']:>16.4f} {m['before_report']:>17.4f}" if args.before else ""))
    for k, m in figures.items():
        if k == base_k:
            continue
        for what in ("evaluation", "report"):
            ratio = m[what] / figures[base_k][what]
            lines.append(f"goal ({what} at {k} classes within {GOAL}x of {base_k}): {ratio:.3f}x, "
                         + ("met" if ratio <= GOAL else "NOT met"))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", default="10,1000,3000", help="model widths; the first is the base")
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--size", type=int, default=32, help="image side, px")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--report-rows", type=int, default=100_000)
    parser.add_argument("--report-calls", type=int, default=20,
                        help="reports a run: a report's seconds are their mean (one takes about a millisecond)")
    parser.add_argument("--before", type=int, default=0, metavar="N",
                        help="also time the totals of before issue 35 on N batches per width")
    args = parser.parse_args(argv)
    from pipelines.runtime.environment import read_settings
    from pipelines.runtime.quiet import quiet_by_default

    quiet_by_default(read_settings().verbose)  # before TensorFlow loads (in measure), not on import
    widths = [int(k) for k in args.classes.split(",")]
    if min(widths) < BASE_CLASSES or len(set(widths)) != len(widths):
        parser.error(f"--classes: distinct widths of at least {BASE_CLASSES}")
    for line in report(measure(widths, args), args):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
