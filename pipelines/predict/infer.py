"""Executor side of batch inference: decode with the ETL's own functions (no train/serve skew), predict, top k."""
from __future__ import annotations

from functools import partial
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from pipelines.contract import row_bytes
from pipelines.etl.images import ImageRejected, resize_to_square
from pipelines.etl.transform import read_file
from pipelines.runtime import zipcache
from pipelines.runtime.logs import plural
from pipelines.runtime.quiet import quiet_by_default

PREDICTED, UNREADABLE = "predicted", "unreadable"


def result_type():
    """The Spark struct ``predict_batch_udf`` returns per row: top k labels, names, probabilities, ``reason``."""
    from pyspark.sql.types import ArrayType, FloatType, IntegerType, StringType, StructField, StructType

    return StructType([StructField("top_labels", ArrayType(IntegerType())),
                       StructField("top_names", ArrayType(StringType())),
                       StructField("top_probabilities", ArrayType(FloatType())),
                       StructField("reason", StringType())])


def decode_file(path: str, size: int, max_file_bytes: int) -> np.ndarray:
    """An image file as the ETL stores it, uint8 RGB ``(size, size, 3)``, reading at most ``max_file_bytes`` + 1.

    Raises:
        ImageRejected: unreadable, vanished, grown, empty, not an image, truncated, too large."""
    data = read_file(path, max_file_bytes)
    return np.frombuffer(resize_to_square(data, size).rgb, np.uint8).reshape(size, size, 3)


def decode_stored(image: bytes, size: int) -> np.ndarray:
    """An ETL row's ``image`` bytes as uint8 ``(size, size, 3)``; `ImageRejected` at another length."""
    if len(image) != row_bytes(size):
        raise ImageRejected(f"stored image has {plural(len(image), 'byte')}, not {row_bytes(size)} ({size}x{size}x3)")
    return np.frombuffer(image, np.uint8).reshape(size, size, 3)


def top_k(probabilities: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """The ``k`` most probable labels of each row of float ``(n, C)``, most probable first (ties by label).

    Returns:
        ``(labels, probabilities)``: int32 and float32 arrays ``(n, min(k, C))``."""
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return order.astype(np.int32), np.take_along_axis(probabilities, order, axis=1).astype(np.float32)


def predict_columns(model, values: Union[Sequence, np.ndarray],
                    reasons: Union[Sequence[Optional[str]], np.ndarray, None],
                    decode: Callable[[object], np.ndarray], k: int,
                    class_names: Sequence[Optional[str]]) -> Dict[str, np.ndarray]:
    """Decode a batch, predict the decodable images in one model call, keep the top ``k``.

    Args:
        values: file paths or stored image bytes, one per row.
        reasons: a reason per row already known (that row is not decoded), or ``None``.
        decode: value -> uint8 ``(S, S, 3)``; raises ``ImageRejected``.

    Returns:
        The `result_type` columns, ``(n, k)`` each, and ``reason`` ``(n,)``; -1, None, NaN where not predicted."""
    n = len(values)
    why = np.array(list(reasons) if reasons is not None else [None] * n, dtype=object)
    images, rows = [], []
    for i, value in enumerate(values):
        if why[i] is not None:
            continue
        try:
            images.append(decode(value))
            rows.append(i)
        except ImageRejected as exc:
            why[i] = exc.reason
    k = min(k, len(class_names))
    labels, probabilities = np.full((n, k), -1, np.int32), np.full((n, k), np.nan, np.float32)
    if images:
        labels[rows], probabilities[rows] = top_k(np.asarray(model.predict_on_batch(np.stack(images))), k)
    lookup = np.array(list(class_names) + [None], dtype=object)  # label -1 -> None
    return {"top_labels": labels, "top_names": lookup[labels], "top_probabilities": probabilities, "reason": why}


def set_threads(threads: int) -> None:
    """Set TensorFlow's intra- and inter-op threads of this process (``0`` keeps the default; fixed once TF started)."""
    if threads <= 0:
        return
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        pass


def make_decoder(from_files: bool, image_size: int, max_file_bytes: int) -> Callable[[object], np.ndarray]:
    """`decode_file` (paths) or `decode_stored` (ETL bytes) at the model's size."""
    if from_files:
        return partial(decode_file, size=image_size, max_file_bytes=max_file_bytes)
    return partial(decode_stored, size=image_size)


_CURRENT: list = [None]  # this Python worker's running task's accumulator (TaskCounter)


class TaskCounter:
    """A Spark accumulator that follows the task (a captured one would stay the worker's first task's)."""

    def __init__(self, accumulator):
        self.accumulator = accumulator

    def __reduce__(self):
        return _follow, (self.accumulator,)

    def add(self, n: int) -> None:
        (_CURRENT[0] or self.accumulator).add(n)


def _follow(accumulator) -> TaskCounter:
    _CURRENT[0] = accumulator
    return TaskCounter(accumulator)


def make_predict_fn(spec, k: int, from_files: bool, max_file_bytes: int, threads: int, verbose: bool = False,
                    counter: Optional[TaskCounter] = None):
    """The ``make_predict_fn`` of ``predict_batch_udf``: PySpark calls it once per Python worker to load the model.

    Args:
        from_files: values are file paths (else stored ETL images).
        threads: TensorFlow threads (0: default).
        counter: each batch's rows are added to it (the driver's progress), or ``None``.

    Returns:
        A function of no argument returning ``predict(values, reasons)`` (`predict_columns`)."""
    def make():
        zipcache.install()  # this worker's next tasks start without re-reading pyspark.zip (see zipcache)

        quiet_by_default(verbose)  # before this worker loads TensorFlow
        set_threads(threads)
        model = spec.load()
        decode = make_decoder(from_files, spec.image_size, max_file_bytes)

        def predict(values: np.ndarray, reasons: np.ndarray) -> Dict[str, np.ndarray]:
            columns = predict_columns(model, values, reasons, decode, k, spec.class_names)
            if counter is not None:
                counter.add(len(values))
            return columns

        return predict

    return make
