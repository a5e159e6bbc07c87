"""Which training run an output folder belongs to, so that no run adopts or deletes another's files."""
from __future__ import annotations

import datetime
import hashlib
import json
import secrets
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional

from pipelines.contract import (
    CHECKPOINT_NAME,
    CHECKPOINT_WEIGHTS,
    CLASS_NAMES,
    HISTORY,
    MANIFEST,
    METRICS,
    MODEL_CONTRACT,
    MODEL_FILE,
    PROGRESS,
    TENSORBOARD,
    TRAIN_RUN,
    plain_name,
)
from pipelines.io.storage import resolve
from pipelines.manifest import manifest_sha256
from pipelines.runtime.config import to_dict
from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural
from pipelines.tracking import RUN_FILE
from pipelines.tracking.pictures import PICTURES
from pipelines.training.checkpoints.choose import checkpoint_markers, sound_checkpoint
from pipelines.training.records.shapes import record_problem
from pipelines.training.schedule import global_batch_size, scaled_lr

#: The settings that decide what a run computes: a checkpoint continues only a run with the same.
FINGERPRINT_FIELDS = ("backbone", "weights", "image_size", "dropout", "seed", "batch_size", "base_lr",
                      "warmup_epochs", "min_delta", "shuffle_buffer", "augment", "feature_cache",
                      "fine_tune_blocks", "fine_tune_lr", "fp16_allreduce", "mixed_precision")
#: What a run writes in its output besides checkpoints (named in its record; ``--overwrite`` of a
#: later run deletes these and nothing else). A folder: TENSORBOARD.
RUN_FILES = (MODEL_FILE, MODEL_CONTRACT, METRICS, HISTORY, CLASS_NAMES, *PICTURES.values(), RUN_FILE, TENSORBOARD,
             PROGRESS)


class RunRefused(Refused):
    """The output belongs to another run (or another run's settings or data): a one-line refusal."""


def new_run_id() -> str:
    """A new run id: UTC time to the second, then 8 random hex digits (ids sort by start time)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + secrets.token_hex(4)


@dataclass(frozen=True)
class RunIdentity:
    """A training run as records keep it."""

    run_id: str
    config: Dict = field(hash=False)  # the FINGERPRINT_FIELDS values
    data_sha256: str  # of the data's manifest.json
    world: Optional[Dict] = field(default=None, hash=False)  # world_of; None in a record from before worlds
    data_run_id: Optional[str] = None  # the ETL run id the manifest names

    @property
    def config_sha256(self) -> str:
        """sha256 of ``config`` as sorted, compact JSON."""
        return hashlib.sha256(json.dumps(self.config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def record(self) -> Dict:
        """What records keep: ``{"id", "config", "config_sha256", "data_sha256", "data_run_id", "world"}``."""
        return {"id": self.run_id, "config": dict(self.config), "config_sha256": self.config_sha256,
                "data_sha256": self.data_sha256, "data_run_id": self.data_run_id,
                "world": dict(self.world) if self.world is not None else None}


def world_of(batch_size: int, base_lr: float, world_size: int) -> Dict:
    """The world a run trains in: ``{"world_size", "batch_size" (per rank), "global_batch_size", "learning_rate"}``."""
    return {"world_size": world_size, "batch_size": batch_size,
            "global_batch_size": global_batch_size(batch_size, world_size),
            "learning_rate": scaled_lr(base_lr, world_size)}


def identify(config, world_size: int, run_id: Optional[str] = None) -> RunIdentity:
    """The identity of a run of ``config`` on ``world_size`` ranks; raises if the data has no readable manifest."""
    options = to_dict(config)  # flat, as the flags name them: records written before the option groups match
    values = {name: options[name] for name in FINGERPRINT_FIELDS}
    # --augment was a switch (flips): a run of the same ops keeps the record of before
    values["augment"] = {"": False, "flip": True}.get(values["augment"], values["augment"])
    data = resolve(config.loader.data, config.storage_options)
    return RunIdentity(run_id or new_run_id(), values, manifest_sha256(data),
                       world_of(config.fit.batch_size, config.fit.base_lr, world_size), manifest_run_id(data))


def manifest_run_id(data) -> Optional[str]:
    """The ETL run id the manifest of the `Location` ``data`` names, or ``None``; `FileNotFoundError` without one."""
    try:
        manifest = data.join(MANIFEST).read_json()
    except ValueError:  # not JSON: its sha256 still identifies it
        return None
    found = manifest.get("run_id") if isinstance(manifest, dict) else None
    return found if isinstance(found, str) else None


@dataclass
class OutputState:
    """What an output holds of training runs: its record, readable markers newest first, the sound one, the damage."""

    record: Optional[Dict]
    markers: List[Dict]
    newest_complete: Optional[Dict]
    damaged: List[str] = field(default_factory=list)  # checkpoint files passed over, with why

    @property
    def owner(self) -> Optional[Dict]:
        """The run the output belongs to: the record's, else the newest marker's (``{}``: none), else ``None``."""
        if self.record is not None:
            return self.record.get("run") or {}
        return (self.markers[0].get("run") or {}) if self.markers else None


def read_state(folder) -> OutputState:
    """The `OutputState` of ``folder``; `RunRefused` for a malformed ``train_run.json`` (nothing acts on its word)."""
    place = folder.join(TRAIN_RUN)
    try:
        record = place.read_json()
    except FileNotFoundError:
        record = None
    except (OSError, ValueError) as exc:
        raise RunRefused(f"{place.uri} cannot be read as a training run record ({type(exc).__name__}): "
                         f"remove it if it is not this job's, or give another --output") from None
    problem = None if record is None else record_problem(record)
    if problem:
        raise RunRefused(f"{place.uri} is not a training run record of this job ({problem}): remove it if it "
                         f"is not this job's, or give another --output")
    markers = checkpoint_markers(folder)
    return OutputState(record, markers, *sound_checkpoint(folder, markers))


@dataclass
class Claim:
    """`claim`'s verdict: the ``run`` this is (a kept or a new id) and what it does with the output."""

    run: RunIdentity
    marker: Optional[Dict] = None  # the checkpoint marker to continue from (None: epoch 1)
    delete: List[str] = field(default_factory=list)  # names to delete first (--overwrite)
    new: bool = False  # the run record must be written
    warnings: List[str] = field(default_factory=list)  # accepted unchecked; rank 0 logs them, the driver does not


def differences(recorded: Dict, run: RunIdentity) -> List[str]:
    """How a recorded run differs from ``run``, one phrase per setting (``base_lr 0.001 there, 0.02 here``) and data."""
    theirs = recorded.get("config") or {}
    found = [f"{name} {theirs.get(name)!r} there, {value!r} here" for name, value in run.config.items()
             if theirs.get(name) != value]
    if recorded.get("data_sha256") != run.data_sha256:
        found.append(f"data: {_data(recorded.get('data_run_id'), recorded.get('data_sha256'))} there, "
                     f"{_data(run.data_run_id, run.data_sha256)} here")
    return found


def _data(run_id, sha256) -> str:
    return f"ETL run {run_id or '(unrecorded)'} (manifest sha256 {str(sha256)[:12]})"


def describe_world(world: Dict) -> str:
    """``world size 4, batch 32 per rank (global batch 128, lr 0.004)`` for a `world_of` dict."""
    lr = world.get("learning_rate")
    lr = f"{lr:g}" if isinstance(lr, (int, float)) else repr(lr)
    return (f"world size {world.get('world_size')}, batch {world.get('batch_size')} per rank "
            f"(global batch {world.get('global_batch_size')}, lr {lr})")


def world_refusal(recorded: Dict, run: RunIdentity, how: str, source: str) -> Optional[str]:
    """Why ``run`` may not continue the ``recorded`` run in its world (same per-rank batch, a row a rank), or ``None``.

    Args:
        how: ``--resume`` or ``a relaunch``.
        source: what holds the record (``checkpoint checkpoint-2.json in OUT``)."""
    theirs, ours = recorded.get("world"), run.world or {}
    if not isinstance(theirs, dict):
        return None
    batch, size, global_batch = ours.get("batch_size"), ours.get("world_size"), theirs.get("global_batch_size")
    if batch == theirs.get("batch_size") and isinstance(size, int) and isinstance(global_batch, int) \
            and 1 <= size <= global_batch:
        return None
    why = (f"this launch has {describe_world(ours)}" if batch != theirs.get("batch_size") else
           f"this launch has world size {size}, more ranks than its global batch has rows")
    bound = plural(global_batch, "rank") if isinstance(global_batch, int) else "as many ranks as its global batch has rows"
    return (f"{how}: {source} is of training run {recorded.get('id')}, trained with {describe_world(theirs)}; {why}: "
            f"it continues with --batch-size {theirs.get('batch_size')} on 1 to {bound} (its global batch and "
            f"learning rate kept), or start afresh with --overwrite or another --output")


def continued_world(recorded: Dict, run: RunIdentity) -> RunIdentity:
    """``run`` with the world of the ``recorded`` run it continues (its data world), when the record has one."""
    theirs = recorded.get("world")
    return replace(run, world=dict(theirs)) if isinstance(theirs, dict) else run


def claim(folder, run: RunIdentity, resume: bool, relaunch: bool, overwrite: bool) -> Claim:
    """What a run may do with the output `Location` ``folder``.

    ``--overwrite`` deletes only the files the other run's records name; ``--resume`` continues only a run with
    this run's settings and data, a relaunch only its own run id.

    Raises:
        RunRefused: the output belongs to another run, and this one may not continue or replace it."""
    state, where = read_state(folder), folder.uri
    owner = state.owner
    if owner is None:
        return Claim(run, new=True)
    if relaunch or resume:
        return _continue(state, run, relaunch, where)
    if not overwrite:
        raise RunRefused(f"--output {where} holds the checkpoints or results of training run "
                         f"{owner.get('id') or '(unrecorded)'}: --resume continues it, --overwrite replaces it "
                         f"(deleting the files it recorded), or give another --output")
    return Claim(run, delete=owned_names(state), new=True)


def _continue(state: OutputState, run: RunIdentity, relaunch: bool, where: str) -> Claim:
    """``--resume`` or a relaunch: the owner must be this run or one like it, a checkpoint sound if any was damaged."""
    owner, marker = state.owner, state.newest_complete
    if marker is None and state.damaged:
        raise RunRefused(f"{'a relaunch' if relaunch else '--resume'}: no sound checkpoint in {where}, every one is "
                         f"damaged: {'; '.join(state.damaged)}. Put back sound copies of them, or start afresh "
                         f"with --overwrite")
    recorded = (marker.get("run") if marker else None) or owner
    what = f"checkpoint {marker['_name']}" if marker else TRAIN_RUN
    if not recorded.get("id"):
        raise RunRefused(f"{'a relaunch' if relaunch else '--resume'}: {what} in {where} is of no recorded training run "
                         f"(written before runs were recorded): start afresh with --overwrite")
    if relaunch and run.run_id and recorded["id"] != run.run_id:
        raise RunRefused(f"a relaunch of training run {run.run_id} found {what} of run {recorded['id']} in {where}: "
                         f"another run writes into this --output")
    if owner.get("id") != recorded["id"]:
        raise RunRefused(f"--resume: {what} in {where} is of run {recorded['id']}, but {TRAIN_RUN} is of run "
                         f"{owner.get('id')}: start afresh with --overwrite")
    how = "a relaunch" if relaunch else "--resume"
    found = differences(recorded, run)
    refusal = world_refusal(recorded, run, how, f"{what} in {where}")
    if refusal:
        also = [phrase for phrase in found if not phrase.startswith("batch_size ")]  # named in the refusal
        raise RunRefused(refusal + (f"; it differs in these too: {'; '.join(also)}" if also else ""))
    if found:
        raise RunRefused(f"{how}: {what} in {where} is of training run {recorded['id']} with other settings or "
                         f"data: {'; '.join(found)}. Give the same values, or start afresh with --overwrite "
                         f"or another --output")
    warnings = [] if isinstance(recorded.get("world"), dict) else [
        f"{how}: {what} in {where} of training run {recorded['id']} records no world size (written before "
        f"worlds were recorded): continuing it with {describe_world(run.world or {})}, unchecked against the "
        f"world it was trained with"]
    return Claim(replace(continued_world(recorded, run), run_id=recorded["id"]), marker, new=state.record is None,
                 warnings=warnings)


def owned_names(state: OutputState) -> List[str]:
    """The plain names an output's earlier run recorded as its own: its `RUN_FILES`, each marker and its checkpoint."""
    names = []
    if state.record is not None:
        for name in state.record.get("files", []):
            plain_name(name, f"{TRAIN_RUN}'s files")
            if name in RUN_FILES:
                names.append(name)
    for marker in state.markers:
        names += [plain_name(marker["_name"], "a marker", CHECKPOINT_NAME), marker["weights"]]
        best = (marker.get("early_stopping") or {}).get("best_epoch")
        if isinstance(best, int) and best >= 1:
            names.append(CHECKPOINT_WEIGHTS.format(epoch=best))  # the best epoch's, kept with the newest
    if state.record is not None:
        names.append(TRAIN_RUN)
    return list(dict.fromkeys(names))


def record(run: RunIdentity, data: str, files=RUN_FILES) -> Dict:
    """The content of ``train_run.json``: the run, its data's location, and the names of the files it writes."""
    return {"run": run.record(), "data": data, "files": list(files)}


def check_output_claim(config, world_size: int, relaunch: bool = False, run_id: Optional[str] = None) -> RunIdentity:
    """The launching driver's `claim` of ``--output`` before any rank starts; deletes nothing, warns nothing."""
    run = identify(config, world_size, run_id)
    folder = resolve(config.outputs.output, config.storage_options)
    return claim(folder, run, config.outputs.resume, relaunch, config.outputs.overwrite).run
