"""A rank's start: what the launcher handed it, Horovod, logging, its device, cores and threads."""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from pipelines.launch import elastic
from pipelines.launch.rankenv import RankEnvironment, read_rank_environment
from pipelines.runtime.imports import frozen_imports
from pipelines.runtime.logs import plural, setup_logging
from pipelines.runtime.quiet import quiet_by_default, quiet_libraries
from pipelines.training.config import TrainConfig
from pipelines.training.devices import apply_device, bind_to_cores, local_topology, precision_policy, threads_per_rank

log = logging.getLogger("pipelines")


@dataclass(frozen=True)
class Rank:
    """This process in the Horovod world: ``rank`` of ``size``, ``local_rank`` of ``local_size``, its
    intra-op ``threads``, bound ``cores``, and what its launcher ``handed`` it."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    threads: int
    cores: Optional[List[int]] = None
    precision: str = "float32"  # Keras' global dtype policy: float32, or mixed_float16 (--mixed-precision on a GPU)
    handed: RankEnvironment = field(default_factory=RankEnvironment)


#: what setup_rank sets once per process (TensorFlow keeps it): cores, threads, precision
_PROCESS: Dict[str, Any] = {}


def setup_rank(config: TrainConfig, job: str = "train") -> Rank:
    """Start this rank: launcher hand-over, core binding (before any thread), ``hvd.init()``, logging, device.

    Rerun after an elastic reset, it keeps cores, device, threads and precision from the first call."""
    # before TensorFlow loads here: a barrier task's rank inherits its executor's environment, not
    # the driver's set-up, so the rank sets its own noise from its config
    quiet_by_default(config.verbose)
    with frozen_imports():  # TensorFlow's objects kept out of every later collection
        import horovod.tensorflow.keras as hvd

    handed = read_rank_environment()  # Horovod: what this rank's launcher handed it (attempts, its GPUs)
    local_rank, local_size = local_topology()  # Horovod: this rank's place among its host's ranks
    first = not _PROCESS
    if first:
        # Horovod: the host's cores shared among its ranks: with --bind-cores, each rank's own, before any thread
        _PROCESS["cores"] = (bind_to_cores(threads_per_rank(config.compute.threads, local_size), announce=False)
                             if config.compute.bind_cores else None)
        quiet_libraries(config.verbose)
        if handed.fault:  # the tests' hook: a rank that starts late
            from pipelines.training.faults import start_late

            start_late(handed.fault, int(os.environ.get("HOROVOD_RANK", "0")))
    hvd.init()  # Horovod: initialize Horovod: the world of this attempt (under elastic mode, of this reset)
    # Horovod: progress logged by rank 0 only; every rank logs its warnings and errors, with its rank and host
    setup_logging(job, rank=hvd.rank(), level=logging.INFO if hvd.rank() == 0 else logging.WARNING)
    if first:
        _place_process(config, handed, hvd.rank() == 0, local_rank, local_size)
    run = elastic.current()
    if run is not None:  # Horovod: elastic mode's attempts, a collective: after the device is placed
        handed = dataclasses.replace(handed, attempts=run.joined(hvd.rank(), hvd.size()))
    return Rank(hvd.rank(), hvd.size(), local_rank, local_size, _PROCESS["threads"], _PROCESS["cores"],
                _PROCESS["precision"], handed)


def _place_process(config: TrainConfig, handed: RankEnvironment, announce: bool, local_rank: int,
                   local_size: int) -> None:
    """The process's device, precision policy and TensorFlow threads, once, before any tensor exists."""
    import tensorflow as tf

    from pipelines.stack.kerasapi import keras

    cores = _PROCESS["cores"]
    if cores and announce:
        log.info("each rank bound to %s of its own (rank 0: %s)", plural(len(cores), "core"), cores)
    # Horovod: pin the GPU this process uses to its local rank (one GPU per process), or the CPU
    device = apply_device(local_rank, local_size, handed.assigned_gpus, announce=announce)
    policy, why_not = precision_policy(config.compute.mixed_precision, device.kind)
    if policy != "float32":
        keras.mixed_precision.set_global_policy(policy)
    if why_not and announce:
        log.info("%s", why_not)
    # Horovod: TensorFlow's threads: the cores this process may use shared among its host's ranks
    _PROCESS.update(threads=threads_per_rank(config.compute.threads, local_size), precision=policy)
    tf.config.threading.set_intra_op_parallelism_threads(_PROCESS["threads"])
    tf.config.threading.set_inter_op_parallelism_threads(2)
    if config.compute.deterministic_ops:  # deterministic kernels on a GPU; a CPU's are already (docs/training.md)
        tf.config.experimental.enable_op_determinism()
