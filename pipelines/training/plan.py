"""What every rank computes identically before training (``RunPlan``), and the data lease held meanwhile."""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Tuple

from pipelines.io import leases
from pipelines.io.storage import resolve
from pipelines.launch import elastic
from pipelines.runtime.logs import plural
from pipelines.training.config import TrainConfig
from pipelines.training.data import Dataset, load_dataset
from pipelines.training.rank import Rank
from pipelines.training.records import ownership as runs
from pipelines.training.records.mirror import check_output, open_outputs
from pipelines.training.resized import agree_data_world
from pipelines.training.schedule import plan_steps, scaled_lr

if TYPE_CHECKING:
    from pipelines.training.dataworld import DataWorld
    from pipelines.training.records.mirror import Outputs
    from pipelines.training.records.ownership import Claim
    from pipelines.training.schedule import Steps

log = logging.getLogger("pipelines")


@dataclass(frozen=True)
class RunPlan:
    """What every rank computes identically before training: data, steps, learning rate."""

    data: Dataset
    steps: Steps
    lr: float
    input_size: int  # side of the model's input, px: TrainConfig.input_size(data.stored_size)
    outputs: Optional[Outputs] = None  # rank 0: where it writes; None elsewhere
    claim: Optional[Claim] = None  # rank 0: this run, the checkpoint it continues; None elsewhere
    world: Optional[DataWorld] = None  # the run's arithmetic, whatever rank.size is
    segments: Tuple[Dict[str, Any], ...] = ()  # the run's segments, this launch's last (records/segments.py)

    @property
    def output_dir(self) -> Optional[str]:
        """Rank 0's local output folder: ``--output``, or the one mirrored to a URI ``--output``."""
        return self.outputs.local if self.outputs else None


def check_run(root: str, batch_size: int, world_size: int, storage_options: Optional[Dict[str, str]] = None) -> Dataset:
    """The data refusals of ``plan_run``, made once by a launching process before any rank starts.

    Raises:
        pipelines.training.data.errors.DataError, pipelines.io.storage.StorageError: as ``load_dataset``.
        ValueError: a global batch larger than the train split."""
    data = load_dataset(root, world_size, storage_options)
    plan_steps(data.train_rows, data.validation_rows, batch_size, world_size)
    return data


def plan_run(config: TrainConfig, rank: Rank, run_id: Optional[str] = None) -> RunPlan:
    """The run's dataset, steps and learning rate; refusals the same on every rank; rank 0 claims its output."""
    # Horovod: refused unless every rank's shard has rows
    data = load_dataset(config.loader.data, rank.size, config.storage_options)
    check_output(config.outputs.output, config.storage_options)
    # Horovod: rank 0 alone writes: its local folder, mirrored to a URI --output
    outputs = open_outputs(config.outputs.output, config.storage_options) if rank.rank == 0 else None
    claim = _claim_output(config, rank, outputs, run_id)
    world = agree_data_world(config, rank, claim)  # Horovod: the run's data world, rank 0's, on every rank
    # Horovod: the global batch is the per-rank batch x the world size, and the steps of an epoch follow from it
    steps = plan_steps(data.train_rows, data.validation_rows, config.fit.batch_size, world.size)
    # Horovod: the learning rate scaled by the world size (Goyal et al. 2017, arXiv:1706.02677)
    lr = scaled_lr(config.fit.base_lr, world.size)
    plan = RunPlan(data, steps, lr, config.model.input_size(data.stored_size), outputs, claim, world)
    if rank.rank == 0:  # Horovod: logs on rank 0 only
        s = plan.steps
        log.info("world size %d, %s per rank; batch %d per rank, global batch %d; %s per epoch, %s; "
                 "lr %g = %g x %d; training run %s", rank.size, plural(rank.threads, "thread"), config.fit.batch_size,
                 s.global_batch, plural(s.steps_per_epoch, "step"), plural(s.validation_steps, "validation step"),
                 plan.lr, config.fit.base_lr, world.size, claim.run.run_id)
        outputs.adopt(claim, config.loader.data)
    return plan


@contextlib.contextmanager
def hold_data(rank: Rank, plan: RunPlan) -> Iterator[None]:
    """Rank 0 leases the ETL run ``plan.data`` reads for the block, so that a rerun keeps its files.

    Raises:
        pipelines.io.leases.InputReplaced: on every rank, when the ETL committed another run meanwhile."""
    import horovod.tensorflow as hvd_tf

    lease, error = None, None
    if rank.rank == 0 and plan.data.run_id is not None:  # Horovod: one lease for the job, rank 0's
        try:
            lease = leases.hold(plan.data.location, plan.data.run_id, plan.claim.run.run_id)
        except leases.InputReplaced as exc:
            error = str(exc)
        except OSError as exc:  # read-only data: training still runs, unprotected from an ETL rerun
            log.warning("could not lease ETL run %s of %s (%s): an ETL rerun committing meanwhile may delete "
                        "its files under this run", plan.data.run_id, plan.data.root, exc)
    # Horovod: every rank's manifest's run id gathered, rank 0's verdict on the lease on every rank
    seen = sorted(set(map(str, hvd_tf.allgather_object(plan.data.run_id, name="data_run_ids"))))
    error = hvd_tf.broadcast_object(error, root_rank=0, name="lease_error")
    if not error and len(seen) > 1:
        error = f"the ranks read manifests of different ETL runs ({', '.join(seen)}): {plan.data.root} was " \
                "committed anew while this run started; start it again"
    try:
        if error:
            raise leases.InputReplaced(error)
        yield
    finally:
        if lease is not None:
            lease.stop()


def _claim_output(config: TrainConfig, rank: Rank, outputs, run_id: Optional[str]):
    """Rank 0's claim of its output, its refusal raised on every rank; ``None`` off rank 0."""
    import horovod.tensorflow as hvd_tf

    claim, error = None, None
    if rank.rank == 0:  # Horovod: rank 0 alone reads and writes the output's records
        target = outputs.remote or resolve(outputs.local)
        try:
            claim = runs.claim(target, runs.identify(config, rank.size, run_id), config.outputs.resume,
                               rank.handed.relaunched, config.outputs.overwrite)
        except runs.RunRefused as exc:
            error = str(exc)
        for warning in claim.warnings if claim else ():
            log.warning("%s", warning)
    error, run_id = hvd_tf.broadcast_object((error, claim.run.run_id if claim else None), root_rank=0,
                                            name="output_claim")  # Horovod: rank 0's verdict on every rank
    if error:
        raise runs.RunRefused(error)
    if elastic.current() is not None:  # Horovod: elastic mode: every rank keeps it, any survivor may be next rank 0
        elastic.current().run_id = run_id
    return claim
