"""Which device a training process uses: one process per GPU, or the CPU.

:func:`choose_device` is a pure function of what the process can see; :func:`apply_device`
makes TensorFlow use it (before any tensor is created).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional, Sequence

log = logging.getLogger("pipelines")


@dataclass(frozen=True)
class DeviceChoice:
    """``kind`` is ``'gpu'`` or ``'cpu'``; ``index`` indexes the visible GPU list; ``why`` says why."""

    kind: str
    index: Optional[int]
    why: str


def choose_device(visible_gpus: Sequence[str], local_rank: int,
                  spark_gpu_addresses: Optional[Sequence[str]] = None) -> DeviceChoice:
    """Pick this process's device.

    Args:
        visible_gpus: GPU names TensorFlow lists (``'/physical_device:GPU:0'``, ...), in order.
        local_rank: rank of this process among those on its host (Horovod's ``local_rank()``).
        spark_gpu_addresses: GPU addresses Spark's resource scheduling assigned to this task
            (``TaskContext.resources()['gpu'].addresses``), when running as a Spark task.

    Returns:
        a :class:`DeviceChoice`: Spark's first assigned address when given (Spark already decided
        which GPU this task owns); else GPU ``local_rank`` on a multi-GPU host; else the CPU.

    Raises:
        ValueError: more local ranks than GPUs (two processes would share a GPU), or a Spark
            address that is not a visible GPU index.
    """
    if not visible_gpus:
        return DeviceChoice("cpu", None, "no GPU visible: training on the CPU")
    if spark_gpu_addresses:
        index = int(spark_gpu_addresses[0])
        if not 0 <= index < len(visible_gpus):
            raise ValueError(f"Spark assigned GPU {index} but only {len(visible_gpus)} are visible")
        return DeviceChoice("gpu", index, f"GPU {index}, assigned by Spark to this task")
    if local_rank >= len(visible_gpus):
        raise ValueError(f"local rank {local_rank} has no GPU of its own ({len(visible_gpus)} visible): "
                         "start at most one process per GPU")
    return DeviceChoice("gpu", local_rank, f"GPU {local_rank} = local rank {local_rank}")


def apply_device(local_rank: int, spark_gpu_addresses: Optional[Sequence[str]] = None,
                 announce: bool = True) -> DeviceChoice:
    """Make TensorFlow see only the chosen GPU (with memory growth), or no GPU at all."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    choice = choose_device([g.name for g in gpus], local_rank, spark_gpu_addresses)
    if choice.kind == "gpu":
        gpu = gpus[choice.index]
        tf.config.set_visible_devices([gpu], "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)
    elif gpus:  # pragma: no cover - only when GPUs exist but are not to be used
        tf.config.set_visible_devices([], "GPU")
    if announce:
        log.info("device: %s", choice.why)
    return choice
