"""Where training starts: fresh, or from the checkpoint a run continues (rank 0 loads it, then broadcasts)."""
from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional

from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural
from pipelines.training.checkpoints.files import broadcast_state, build_optimizer, load_checkpoint, optimizer_checksum
from pipelines.training.checkpoints.names import checkpoint_path, marker_weights
from pipelines.training.config import TrainConfig

if TYPE_CHECKING:
    import numpy as np

    from pipelines.training.rank import Rank

log = logging.getLogger("pipelines")


@dataclass
class Resume:
    """Where training starts: the checkpoint's marker (``None``: fresh), its history and the best weights."""

    marker: Optional[Dict] = None
    best_weights: Optional[List[np.ndarray]] = None  # the model's get_weights()
    checksums: Optional[List[str]] = None
    history: List[Dict] = field(default_factory=list)
    optimizer_checksums: Optional[List[str]] = None

    @property
    def initial_epoch(self) -> int:
        """Epochs done at the checkpoint (0 = fresh)."""
        return self.marker["epoch"] if self.marker else 0

    @property
    def initial_step(self) -> int:
        """Steps done within the next epoch: a step checkpoint's, else 0."""
        return int(self.marker.get("step") or 0) if self.marker else 0

    @property
    def phase(self) -> int:
        """The checkpoint's phase: 1, or 2 (fine-tuning); 1 without one."""
        return self.marker.get("phase", 1) if self.marker else 1

    def epoch_logs(self, rank: Rank) -> Dict[str, float]:
        """``rank``'s logs of the epoch whose validation the checkpoint left to this run (another world: the
        mean); ``{}`` without."""
        logs = (self.marker or {}).get("epoch_logs") or []
        if len(logs) == rank.size:
            return dict(logs[rank.rank])
        keys = set.intersection(*(set(entry) for entry in logs)) if logs else set()
        return {key: sum(entry[key] for entry in logs) / len(logs) for key in sorted(keys)}

    def finished(self, epochs: int) -> bool:
        """Whether the resumed run had already stopped early or run all ``epochs``."""
        return bool(self.marker) and (self.marker["early_stopping"]["stopped"] or self.initial_epoch >= epochs)


def weights_checksum(model) -> str:
    """sha256 of all weights' bytes, in order: equal checksums mean identical weights."""
    digest = hashlib.sha256()
    for array in model.get_weights():
        digest.update(array.tobytes())
    return digest.hexdigest()


def restore(config: TrainConfig, rank, plan, model, frozen_sha256: Optional[str] = None) -> Resume:
    """With ``--resume`` or in a relaunch, rank 0 loads the run's checkpoint and broadcasts it; else fresh.

    Raises:
        ValueError: on every rank, a checkpoint of other frozen weights, another metric or fine-tuning depth."""
    import horovod.tensorflow as hvd_tf

    resuming = config.outputs.resume or rank.handed.relaunched
    directory, claim = plan.output_dir, plan.claim
    marker = claim.marker if (claim is not None and resuming) else None  # only this run's own (runs.claim)
    marker = hvd_tf.broadcast_object(marker, root_rank=0, name="resume_marker")  # Horovod: rank 0's, on every rank
    if not marker:
        if resuming and rank.rank == 0:  # a warning: a mistyped --output starts afresh (restart scripts pass --resume always)
            (log.warning if config.outputs.resume else log.info)(
                "%s: no complete checkpoint in %s, starting from epoch 1",
                "--resume" if config.outputs.resume else "a relaunch", config.outputs.output)
        return Resume()
    if marker.get("frozen_sha256") != frozen_sha256:
        raise Refused(f"--resume: checkpoint {marker['weights']} in {config.outputs.output} was trained on other "
                      f"frozen weights (sha256 {str(marker.get('frozen_sha256'))[:12]}, these are "
                      f"{frozen_sha256[:12]}): use the same --weights, or start afresh without --resume")
    check_monitor(marker, config.fit.rule.monitor, config.outputs.output)
    if marker.get("phase", 1) == 2:  # phase 1 is over: fine-tuning loads its own state (fine_tune)
        if marker.get("blocks") != config.model.fine_tune_blocks:
            raise Refused(f"--resume: checkpoint {marker['weights']} in {config.outputs.output} is of the fine-tuning "
                          f"phase with --fine-tune-blocks {marker.get('blocks')}, this run has "
                          f"{config.model.fine_tune_blocks}: give the same value, or start afresh without --resume")
        return Resume(marker, history=list(marker["history"]))
    build_optimizer(model)
    best_weights = None
    if rank.rank == 0:
        best_epoch = marker["early_stopping"]["best_epoch"]
        if best_epoch:  # 0: a step checkpoint of the first epoch, no best yet
            load_checkpoint(model, checkpoint_path(directory, best_epoch), optimizer=False)
            best_weights = model.get_weights()
        load_checkpoint(model, os.path.join(directory, marker_weights(marker, marker["_name"])))
        log.info("resuming %s (checkpoint %s, %s; best epoch so far %s)", resumed_at(marker), marker["weights"],
                 plural(marker["weights_bytes"], "byte"), best_epoch or "none")
    # Horovod: rank 0's weights, optimizer state and best weights on every rank; every rank's checksums gathered
    hvd_tf.broadcast_variables(broadcast_state(model), root_rank=0)
    best_weights = hvd_tf.broadcast_object(best_weights, root_rank=0, name="best_weights")
    checksums = hvd_tf.allgather_object(weights_checksum(model), name="resume_checksums")
    optimizer = hvd_tf.allgather_object(optimizer_checksum(model.optimizer), name="resume_optimizer_checksums")
    return Resume(marker, best_weights, checksums, list(marker["history"]), optimizer)


#: What a checkpoint that records no monitor watched: the only rule there was before it was recorded
MONITOR_BEFORE_RULES = "val_accuracy"


def watched(marker: Dict) -> str:
    """The metric the checkpoint's early stopping watched (its best value is of it)."""
    return marker["early_stopping"].get("monitor") or MONITOR_BEFORE_RULES


def check_monitor(marker: Dict, monitor: str, output: str) -> None:
    """Refuse to continue a checkpoint whose early stopping watched another metric than ``monitor``.

    Raises:
        pipelines.runtime.errors.Refused: naming both metrics and the flags that give the checkpoint's."""
    if watched(marker) != monitor:
        raise Refused(f"--resume: checkpoint {marker['weights']} in {output} stopped on {watched(marker)}, this run's "
                      f"early stopping watches {monitor}: give --monitor {watched(marker)} (with that run's "
                      f"--stopping, --patience, --patience-steps and --min-delta), or start afresh without --resume")


def resumed_at(marker: Dict) -> str:
    """Where a marker resumes, for the log: ``after epoch 3``, ``within epoch 4, after step 20``..."""
    if marker.get("step") and marker.get("epoch_logs"):
        return f"after the steps of epoch {marker['epoch'] + 1}, at its validation"
    if marker.get("step"):
        return f"within epoch {marker['epoch'] + 1}, after step {marker['step']}"
    return f"after epoch {marker['epoch']}"


def phase1_best(context, first, resume: Resume):
    """The whole model with phase 1's best weights (rank 0 loads them when resuming in phase 2)."""
    if resume.phase == 2 and context.rank.rank == 0:
        best = resume.marker["early_stopping"]["best_epoch"]
        if best <= resume.marker["phase1"]["epochs"]:
            load_checkpoint(first.inputs.model, checkpoint_path(context.output_dir, best), optimizer=False)
    return first.inputs.exported_model()


def phase2_resume(context, model, resume: Resume, record: Dict):
    """Where phase 2 starts: fresh after phase 1 (its best to beat), or from a phase 2 checkpoint (broadcast)."""
    import horovod.tensorflow as hvd_tf

    if resume.phase != 2:
        # phase 1's best, of the metric it watched (a record from before monitors were recorded: val_accuracy)
        best = record["best"] if "best" in record else record["best_val_accuracy"]
        state = {"best": best, "wait": 0, "best_epoch": record["best_epoch"], "stopped": False,
                 "monitor": record.get("monitor") or MONITOR_BEFORE_RULES}
        marker = {"epoch": record["epochs"], "early_stopping": state, "phase": 2}
        return Resume(marker, model.get_weights(), None, resume.history, None)
    marker, directory = resume.marker, context.output_dir
    build_optimizer(model)
    best_weights = None
    if context.rank.rank == 0:
        best = marker["early_stopping"]["best_epoch"]
        if best > record["epochs"]:
            load_checkpoint(model, checkpoint_path(directory, best), optimizer=False)
        best_weights = model.get_weights()
        load_checkpoint(model, os.path.join(directory, marker_weights(marker, marker["_name"])))
        log.info("fine-tuning: resuming phase 2 %s (best epoch so far %d)", resumed_at(marker), best)
    hvd_tf.broadcast_variables(broadcast_state(model), root_rank=0)
    best_weights = hvd_tf.broadcast_object(best_weights, root_rank=0, name="phase2_best_weights")
    checksums = hvd_tf.allgather_object(weights_checksum(model), name="phase2_resume_checksums")
    optimizer = hvd_tf.allgather_object(optimizer_checksum(model.optimizer), name="phase2_resume_optimizer")
    return Resume(marker, best_weights, checksums, resume.history, optimizer)
