"""Which device a training process uses (one GPU per rank, or the CPU) and which cores it runs on.

``apply_device`` must run before any tensor is created, ``bind_to_cores`` before any thread starts."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Collection, List, Optional, Sequence, Tuple

from pipelines.launch.discovery import local_slot
from pipelines.launch.gpus import check_local_gpus
from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural

log = logging.getLogger("pipelines")

def local_topology() -> Tuple[int, int]:
    """``(local_rank, local_size)`` from Horovod's launch environment (before ``hvd.init()``); alone: ``(0, 1)``."""
    return local_slot(os.environ) or (int(os.environ.get("HOROVOD_LOCAL_RANK", "0")),
                                      int(os.environ.get("HOROVOD_LOCAL_SIZE", "1")))


def threads_per_rank(threads: int, local_size: int) -> int:
    """``threads`` when set, else this process's CPU affinity shared among ``local_size`` ranks (>= 1)."""
    return threads or max(1, len(os.sched_getaffinity(0)) // local_size)


@dataclass(frozen=True)
class DeviceChoice:
    """``kind`` is ``'gpu'`` or ``'cpu'``; ``index`` indexes the visible GPU list; ``why`` says why."""

    kind: str
    index: Optional[int]
    why: str


def choose_device(visible_gpus: Sequence[str], local_rank: int, local_size: int,
                  assigned: Sequence[str] = ()) -> DeviceChoice:
    """Pick this process's device: one GPU per rank, or the CPU.

    Args:
        visible_gpus: GPU names TensorFlow lists, in PCI bus order.
        assigned: GPU addresses a launcher (Spark) gave this rank, then its only visible ones.

    Returns:
        DeviceChoice: GPU 0 when ``assigned``; else GPU ``local_rank`` when GPUs are visible; else the CPU.

    Raises:
        ValueError: GPUs assigned but none visible; more local ranks than visible GPUs."""
    if assigned:
        if not visible_gpus:
            raise Refused(f"this rank was given GPU {','.join(assigned)} but TensorFlow sees no GPU "
                          f"(a CPU-only TensorFlow, or an executor that does not see that GPU)")
        return DeviceChoice("gpu", 0, f"GPU {assigned[0]}, assigned by Spark to this task (its only visible GPU)")
    if not visible_gpus:
        return DeviceChoice("cpu", None, "no GPU visible: training on the CPU")
    check_local_gpus(local_size, len(visible_gpus))
    return DeviceChoice("gpu", local_rank, f"GPU {local_rank} = local rank {local_rank}")


def apply_device(local_rank: int, local_size: int, assigned: Sequence[str] = (),
                 announce: bool = True) -> DeviceChoice:
    """Make TensorFlow see only the chosen GPU (memory growth on) or none, before any tensor.

    Raises ``ValueError`` as ``choose_device``."""
    import tensorflow as tf  # in the function: `import pipelines` stays free of TensorFlow

    gpus = tf.config.list_physical_devices("GPU")
    choice = choose_device([g.name for g in gpus], local_rank, local_size, assigned)
    if choice.kind == "gpu":
        gpu = gpus[choice.index]
        tf.config.set_visible_devices([gpu], "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)
    elif gpus:  # pragma: no cover - only when GPUs exist but are not to be used
        tf.config.set_visible_devices([], "GPU")
    if announce:
        log.info("device: %s", choice.why)
    return choice


def prefetch_device(logical_gpus: Sequence[str]) -> Optional[str]:
    """Where the input pipeline puts its batches: the first of ``logical_gpus``, else ``None`` (the host)."""
    return logical_gpus[0] if logical_gpus else None


MIXED_FLOAT16 = "mixed_float16"


def precision_policy(mixed_precision: bool, device_kind: str) -> Tuple[str, Optional[str]]:
    """Keras' dtype policy (``mixed_float16`` on a GPU only), and why not ``--mixed-precision`` (or ``None``)."""
    if not mixed_precision:
        return "float32", None
    if device_kind == "gpu":
        return MIXED_FLOAT16, None
    return "float32", ("--mixed-precision: not used on the CPU (mixed_float16 speeds up GPUs with float16 units; "
                       "a CPU computes float16 no faster): training in float32")


def rank_cores(local_rank: int, local_size: int, threads: int, available: Collection[int]) -> List[int]:
    """The ``threads`` cores of local rank ``local_rank``: its own slice of sorted ``available``.

    Raises:
        ValueError: ``threads < 1``, ``local_rank`` out of range, or ``local_size * threads`` above the cores."""
    if threads < 1 or not 0 <= local_rank < local_size:
        raise Refused(f"cannot bind local rank {local_rank} of {local_size} to {plural(threads, 'thread')}")
    cores = sorted(available)
    if local_size * threads > len(cores):
        raise Refused(f"{plural(local_size, 'rank')} x {plural(threads, 'thread')}: need "
                      f"{plural(local_size * threads, 'core')} to bind; this process may use "
                      f"{plural(len(cores), 'core')} (lower --threads or the number of ranks, or do not bind)")
    return cores[local_rank * threads:(local_rank + 1) * threads]


def bind_to_cores(threads: int, announce: bool = True) -> List[int]:
    """Bind this process to its own ``threads`` cores, before ``hvd.init()`` and any thread; returns them.

    Raises ``ValueError`` as ``rank_cores``."""
    local_rank, local_size = local_topology()
    cores = rank_cores(local_rank, local_size, threads, os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores)
    if announce:
        log.info("local rank %d of %d bound to cores %s", local_rank, local_size, cores)
    return cores
