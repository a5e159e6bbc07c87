"""Which device a training process uses: one process per GPU, or the CPU; which cores it runs on.

:func:`choose_device` and :func:`rank_cores` are pure functions of what the process can see;
:func:`apply_device` makes TensorFlow use the device (before any tensor is created) and
:func:`bind_to_cores` binds the process (before any thread is started).
"""
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
    """``(local_rank, local_size)`` of this process from Horovod's launch environment
    (``HOROVOD_LOCAL_RANK``/``HOROVOD_LOCAL_SIZE``), readable before ``hvd.init()``; a lone
    process is rank 0 of 1; a rank on one of this machine's slot names (horovodrun's elastic mode
    on one machine), its slot (:func:`pipelines.launch.discovery.local_slot`)."""
    return local_slot(os.environ) or (int(os.environ.get("HOROVOD_LOCAL_RANK", "0")),
                                      int(os.environ.get("HOROVOD_LOCAL_SIZE", "1")))


def threads_per_rank(threads: int, local_size: int) -> int:
    """``threads`` when set (``--threads``), else the cores this process may use (its CPU affinity:
    a container's or a scheduler's cpuset, not the whole machine) shared among the host's
    ``local_size`` ranks, at least 1."""
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
        visible_gpus: GPU names TensorFlow lists (``'/physical_device:GPU:0'``, ...), in order
            (PCI bus order: the launchers set ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
        local_rank, local_size: this process's rank among the ranks on its host, and their number
            (Horovod's ``local_rank()``, ``local_size()``).
        assigned: GPU addresses a launcher gave this rank as its own (Spark's, for a barrier task:
            :attr:`pipelines.launch.rankenv.RankEnvironment.assigned_gpus`): the
            process then sees only those (``CUDA_VISIBLE_DEVICES``), and takes the first.

    Returns:
        a :class:`DeviceChoice`: GPU 0 when ``assigned``; else GPU ``local_rank`` of a host with
        GPUs (``horovodrun``: one GPU per local rank); else the CPU.

    Raises:
        ValueError: GPUs were assigned but none is visible (a CPU-only TensorFlow, or an isolated
            executor that does not see them); more local ranks than visible GPUs (two ranks would
            share one), naming both numbers.
    """
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
    """Make TensorFlow see only the chosen GPU (:func:`choose_device`), with memory growth (the
    rank allocates what it uses, not the whole GPU), or no GPU at all. Call it before any tensor
    is created. Raises ``ValueError`` as :func:`choose_device` does."""
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
    """Where the input pipeline's last stage puts its batches
    (:func:`pipelines.training.data.tfdata.to_device`): the first GPU TensorFlow lists (``logical_gpus``,
    e.g. ``['/device:GPU:0']``; after :func:`apply_device` a rank sees its own GPU only, as GPU 0),
    where Keras places the model; ``None`` (the host: no copy) when there is none."""
    return logical_gpus[0] if logical_gpus else None


MIXED_FLOAT16 = "mixed_float16"


def precision_policy(mixed_precision: bool, device_kind: str) -> Tuple[str, Optional[str]]:
    """Keras' global dtype policy for this rank and, when ``--mixed-precision`` is asked for but not
    used, why: ``('mixed_float16', None)`` on a GPU (float16 compute on its float16 units, float32
    weights: the Keras mixed-precision guide); ``('float32', reason)`` on the CPU, where float16
    arithmetic is no faster (TensorFlow's CPU kernels convert much of it) and only costs precision;
    ``('float32', None)`` when not asked for. ``device_kind`` is :class:`DeviceChoice`'s ``kind``."""
    if not mixed_precision:
        return "float32", None
    if device_kind == "gpu":
        return MIXED_FLOAT16, None
    return "float32", ("--mixed-precision: not used on the CPU (mixed_float16 speeds up GPUs with float16 units; "
                       "a CPU computes float16 no faster): training in float32")


def rank_cores(local_rank: int, local_size: int, threads: int, available: Collection[int]) -> List[int]:
    """The cores of local rank ``local_rank`` when each of the ``local_size`` ranks of a host gets
    ``threads`` cores of its own: items ``local_rank * threads .. (local_rank + 1) * threads - 1``
    of ``available`` (the cores this process may use, sorted), as MPI's ``--bind-to core`` does.

    Raises:
        ValueError: ``threads < 1``, ``local_rank`` outside ``0 .. local_size - 1``, or
            ``local_size * threads`` exceeding the available cores.
    """
    if threads < 1 or not 0 <= local_rank < local_size:
        raise Refused(f"cannot bind local rank {local_rank} of {local_size} to {plural(threads, 'thread')}")
    cores = sorted(available)
    if local_size * threads > len(cores):
        raise Refused(f"{plural(local_size, 'rank')} x {plural(threads, 'thread')}: need "
                      f"{plural(local_size * threads, 'core')} to bind; this process may use "
                      f"{plural(len(cores), 'core')} (lower --threads or the number of ranks, or do not bind)")
    return cores[local_rank * threads:(local_rank + 1) * threads]


def bind_to_cores(threads: int, announce: bool = True) -> List[int]:
    """Bind this process to its own ``threads`` cores (:func:`rank_cores`), from Horovod's
    ``HOROVOD_LOCAL_RANK``/``HOROVOD_LOCAL_SIZE`` (a lone process: rank 0 of 1). Call it before
    ``hvd.init()`` and before TensorFlow starts its thread pools: only threads started afterwards
    inherit the binding. Without it, on a CPU host that the ranks fill, every rank's helper threads
    (TensorFlow's inter-op pool, readers, Horovod's) roam over the other ranks' cores, and the
    synchronous allreduce makes every rank wait for the one that was preempted last.

    Returns the cores. Raises ``ValueError`` as :func:`rank_cores` does.
    """
    local_rank, local_size = local_topology()
    cores = rank_cores(local_rank, local_size, threads, os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores)
    if announce:
        log.info("local rank %d of %d bound to cores %s", local_rank, local_size, cores)
    return cores
