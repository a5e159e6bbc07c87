"""The training job: ``run_training``, run by every Horovod rank; side effects are rank 0's.

Lines that distribution adds to a single-process Keras job are marked ``# Horovod:``."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from typing import Dict, Iterator, Optional, Tuple

from pipelines import tracking
from pipelines.contract import HISTORY, TENSORBOARD, TEST, VALIDATION
from pipelines.io.storage import is_local
from pipelines.launch import elastic
from pipelines.launch.watchdog import Watchdog, progress, watching
from pipelines.manifest import manifest_sha256
from pipelines.runtime.config import to_dict
from pipelines.runtime.logs import plural
from pipelines.runtime.redact import redact
from pipelines.training import preemption
from pipelines.training.checkpoints.files import frozen_checksum
from pipelines.training.config import TrainConfig
from pipelines.training.context import RankContext
from pipelines.training.data import default_cache_root, verify_total
from pipelines.training.evaluate import allreduce_totals, exact_validation
from pipelines.training.inputpath import InputPath
from pipelines.training.inputs import ImageInputs, make_inputs
from pipelines.training.loop import run_epochs, start_row
from pipelines.training.model.build import build_model, compile_distributed
from pipelines.training.model.finetune import phase2_lr, trainable_parameters, unfreeze
from pipelines.training.phase import Phase, phase1_record
from pipelines.training.plan import RunPlan, hold_data, plan_run
from pipelines.training.probe import head_weights, start_is_better
from pipelines.training.rank import Rank, setup_rank
from pipelines.training.records.report import build_report, linear_probe, save_outputs
from pipelines.training.records.segments import segment_params
from pipelines.training.resized import resized_inputs, with_segments
from pipelines.training.resume import Resume, phase1_best, phase2_resume, restore

log = logging.getLogger("pipelines")


@contextlib.contextmanager
def start_tracking(config: TrainConfig, rank: Rank, plan: RunPlan, resume: Resume) -> Iterator[Optional[tracking.Tracker]]:
    """Rank 0 starts or continues the MLflow run (FAILED if the block raises); yields it, else ``None``.

    Raises:
        pipelines.tracking.TrackingUnavailable: on every rank, when rank 0 cannot use the store."""
    options = config.outputs
    if not options.tracking:
        yield None
        return
    import horovod.tensorflow as hvd_tf

    tracker, error = None, None
    if rank.rank == 0:  # Horovod: one MLflow run per job, rank 0's
        try:
            tracker = tracking.start(options.tracking_uri, options.experiment, plan.output_dir, options.run_name,
                                     run_params(config, rank, plan), {"stage": "train", "output": options.output},
                                     continue_run=bool(resume.marker))
        except tracking.TrackingUnavailable as exc:
            error = str(exc)
    # Horovod: rank 0's verdict on every rank, so that every rank refuses alike
    error = hvd_tf.broadcast_object(error, root_rank=0, name="tracking_error")
    if error:
        raise tracking.TrackingUnavailable(error)
    with tracker or contextlib.nullcontext():
        yield tracker


def run_params(config: TrainConfig, rank: Rank, plan: RunPlan) -> Dict:
    """The MLflow params of a run: the config, the world and its arithmetic, and the data's identity."""
    data = plan.data
    return {**redact(to_dict(config)), "world_size": rank.size, "global_batch_size": plan.steps.global_batch,
            "data_world_size": plan.world.size, **segment_params(list(plan.segments)),
            "learning_rate": plan.lr, "steps_per_epoch": plan.steps.steps_per_epoch,
            "validation_steps": plan.steps.validation_steps, "model_image_size": plan.input_size,
            "data.manifest_sha256": manifest_sha256(data.location), "data.image_size": data.stored_size,
            "data.train_rows": data.train_rows, "data.validation_rows": data.validation_rows,
            "data.test_rows": data.test_rows, "selected_on": "validation",
            "data.num_classes": data.num_classes}


def make_callbacks(context: RankContext, inputs: InputPath, resume: Resume, marker: Optional[Dict] = None):
    """``(callbacks, early_stopping, epoch_stats)``: the phase's Keras callbacks, in the order their hooks run.

    Each step, each validation batch and each epoch's end call the hooks in this list's order
    (``loop.run_epochs``)."""
    import horovod.tensorflow.keras as hvd

    from pipelines.stack.kerasapi import keras
    from pipelines.training import callbacks as cb
    from pipelines.training.faults import FaultInjection

    config, plan, steps, handed = context.config, context.plan, context.plan.steps, context.rank.handed
    # the rule's patience in steps, as whole epochs of this run's steps (pipelines/training/stopping.py)
    early_stopping = cb.BestWeightsEarlyStopping.of_rule(
        config.fit.rule, steps.steps_per_epoch, state=resume.marker["early_stopping"] if resume.marker else None,
        best_weights=resume.best_weights)
    epoch_stats = cb.EpochStats(steps.steps_per_epoch, steps.global_batch)
    checkpoints = checkpointer(context, resume, early_stopping, marker)
    # Horovod: one allreduce after each step and validation batch, so that a non-finite loss or a preemption
    # notice on any rank stops every rank at the same point (a preempted step: rank 0 checkpoints it first)
    guard = cb.DivergenceGuard(steps.steps_per_epoch, notice=preemption.current(),
                               on_preempted=checkpoints.write_step if checkpoints else None)
    output = config.outputs.output
    fault = FaultInjection.requested(handed.fault, context.rank.rank, output if is_local(output) else "")
    # Horovod: a rank whose peer is gone waits in a collective for good: its watchdog ticks first and last
    first, last = cb.WatchdogTicks.around(Watchdog(handed.stall_timeout_s)) if handed.stall_timeout_s else (None, None)
    callbacks = [
        first,
        # Horovod: broadcast the variables' initial states from rank 0 to every other rank, so that all
        # start alike, from random weights or from rank 0's checkpoint
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        epoch_stats,  # the epoch's training time, before validation
        # Horovod: each epoch's validation over every rank's shard, summed by allreduce (exact, not averaged);
        # the guard's check after each of its batches
        exact_validation(inputs, plan.data, [c for c in (guard, fault) if c is not None]),
        keras.callbacks.ProgbarLogger(count_mode="steps"),  # Keras' epoch line, with the exact validation
        # Horovod: average each epoch's metrics over the ranks, before any callback reads them
        hvd.callbacks.MetricAverageCallback(),
        # Horovod: the rate ramps from base_lr to base_lr x world size over the warmup epochs (Goyal et
        # al. 2017, arXiv:1706.02677), with the data world's size for hvd.size()
        warmup(config, plan),
        guard,  # before early stopping and the checkpoints, which then never keep a diverged epoch
        early_stopping,
        # Horovod: rank 0 alone writes, so that no rank writes over another's files
        *(rank0_callbacks(context, resume, checkpoints) if context.rank.rank == 0 else []),
        cb.PreemptAtEpochEnd(guard),  # after rank 0's checkpoint and its upload
        # Horovod: elastic mode: slots added join after the epoch's checkpoint
        cb.HostsUpdateCheck(elastic.current().state) if elastic.current() is not None else None,
        last,
        fault,
    ]
    return [c for c in callbacks if c is not None], early_stopping, epoch_stats


def warmup(config: TrainConfig, plan: RunPlan):
    """The learning rate's warmup callback over ``--warmup-epochs``, or ``None`` without warmup."""
    if config.fit.warmup_epochs <= 0:
        return None
    from pipelines.training.warmup import DataWorldWarmup

    return DataWorldWarmup(plan.lr, config.fit.warmup_epochs, plan.steps.steps_per_epoch, plan.world.size)


def checkpointer(context: RankContext, resume: Resume, early_stopping, marker: Optional[Dict] = None):
    """Rank 0's ``CheckpointMarker`` (markers hold ``marker``'s items, default phase 1); ``None`` elsewhere."""
    from pipelines.training.checkpoints.writer import CheckpointMarker, Interval

    config, plan = context.config, context.plan
    if context.rank.rank != 0:  # Horovod: checkpoints on rank 0 only, so that no other rank corrupts them
        return None
    return CheckpointMarker(
        plan.output_dir, early_stopping, resume.history, context.frozen_sha256,
        {**(marker or {"phase": 1}), "run": plan.claim.run.record(), "segments": list(plan.segments)},
        Interval(config.fit.checkpoint_every_steps, config.fit.checkpoint_every_minutes, plan.steps.steps_per_epoch),
        plan.outputs)


def rank0_callbacks(context: RankContext, resume: Resume, checkpoints) -> list:
    """Rank 0's writers in order, the upload to a URI ``--output`` last."""
    from pipelines.stack.kerasapi import keras
    from pipelines.training import callbacks as cb
    from pipelines.training.epochprogress import EpochProgress

    options, plan = context.config.outputs, context.plan
    written = [cb.ProgressMark(plan.output_dir, plan.claim.run.run_id, plan.outputs),  # the newest step: steps redone
               EpochProgress(plan.steps.steps_per_epoch, plan.steps.global_batch, context.config.fit.epochs,
                             resume.initial_epoch, resume.initial_step), checkpoints,
               cb.EpochCSVLogger(os.path.join(plan.output_dir, HISTORY), append=bool(resume.marker))]
    if options.tensorboard:
        written.append(keras.callbacks.TensorBoard(os.path.join(plan.output_dir, TENSORBOARD),
                                                   profile_batch=options.profile_batch))
    if context.tracker is not None:
        written.append(cb.TrackEpochs(context.tracker))
    return written + [cb.SyncOutputs(plan.outputs)]


def train(context: RankContext, inputs: InputPath, resume: Resume, callbacks, first_epoch: int = 0) -> float:
    """Train from ``resume``'s position, each rank's stream opened there; returns the seconds in the loop."""
    from pipelines.training.callbacks import stop_watchdogs

    config, rank, plan = context.config, context.rank, context.plan
    if resume.finished(config.fit.epochs):
        inputs.model.set_weights(resume.best_weights)
        return 0.0
    spe = plan.steps.steps_per_epoch
    epochs_done, steps_done = resume.initial_epoch, resume.initial_step
    row = start_row(epochs_done, steps_done, spe, config.fit.batch_size, first_epoch)
    if resume.marker and not inputs.exact_positions and rank.rank == 0:  # Horovod: warnings on rank 0 only
        log.warning("--reader petastorm cannot open its stream at the checkpoint's position: the resumed run "
                    "reads other batches than the interrupted one would have (--reader own resumes exactly)")
    trained_logs = resume.epoch_logs(rank) if steps_done == spe else None  # trained, its validation interrupted
    cache_root = config.loader.cache_dir or default_cache_root()
    try:
        # Horovod: each rank reads its own shard of the training split
        with inputs.fit_datasets(cache_root, start_row=row) as (train_ds, _):
            start = time.perf_counter()
            run_epochs(inputs.model, train_ds, callbacks, epochs_done, steps_done, config.fit.epochs, spe,
                       verbose=2 if rank.rank == 0 else 0, trained_logs=trained_logs)  # Horovod: rank 0 prints
            return time.perf_counter() - start
    except BaseException:  # the loop calls no on_train_end when it raises: its watchdog would outlive it
        stop_watchdogs(callbacks)
        raise
    finally:
        if not config.loader.cache_dir:
            shutil.rmtree(cache_root, ignore_errors=True)


def evaluate(context: RankContext, inputs: InputPath, split: str = TEST):
    """Exact totals over the whole ``split``, the same on every rank; a short read fails the run.

    Raises:
        pipelines.training.data.errors.ShardCountError: a count differs from the metadata or manifest."""
    def tick(batch: int) -> None:
        progress(f"{split} batch {batch + 1}")

    with watching(context.rank.handed.stall_timeout_s, f"{split} batch 1"):  # ticked by each batch
        shard = inputs.evaluate_shard(inputs.model, split, tick)
        progress(f"the {split} split's sums over the ranks", waits=True)
        # Horovod: each rank evaluates its own shard; the sums (and label pairs) are added over ranks
        totals = allreduce_totals(shard)
    verify_total(totals.count, context.plan.data, split)
    return totals


def run_training(config: TrainConfig, run_id: Optional[str] = None) -> Dict:
    """Train on every rank (once per process) and return the run's report (``metrics.json``).

    ``run_id``: a launching driver's (every relaunch is the same run); ``None``: rank 0 makes or resumes one.

    Raises:
        pipelines.training.data.errors.DataError: the dataset cannot feed this run.
        ValueError: a batch size the data cannot fill."""
    # Horovod: hvd.init(), one GPU (or cores) per local rank, logs on rank 0 (rank.py)
    rank = setup_rank(config)
    start = time.perf_counter()
    # Horovod: the global batch and the learning rate scaled by the world size; rank 0 claims --output (plan.py)
    plan = plan_run(config, rank, run_id)
    # Horovod: a SIGTERM (a preemption notice) to any rank stops every rank at one step, after rank 0's
    # checkpoint; rank 0 leases the data for every rank (hold_data: pipelines/io/leases.py)
    with preemption.PreemptionNotice(rank.rank), hold_data(rank, plan):
        full_model = build_model(plan.data.num_classes, plan.input_size, config.model.dropout, config.model.weights,
                                 seed=config.fit.seed, backbone=config.model.backbone,
                                 stored_size=plan.data.stored_size)
        # Horovod: this rank's shard of each split (on another world size: the data world's rows it computes)
        inputs = make_inputs(config, plan.data, rank, full_model, plan.input_size)
        inputs = resized_inputs(inputs, plan.world, rank, announce=rank.rank == 0)
        # Horovod: the optimizer wrapped in hvd.DistributedOptimizer: each step's gradients averaged by allreduce
        compile_distributed(inputs.model, plan.lr, config.compute.fp16_allreduce, config.compute.xla_on,
                            config.fit.weight_decay)
        frozen_sha256 = frozen_checksum(full_model)
        # Horovod: rank 0 loads the checkpoint a run continues and broadcasts it to every rank
        resume = restore(config, rank, plan, inputs.model, frozen_sha256)
        plan = with_segments(config, rank, plan, resume)  # this launch's world and where it begins
        with start_tracking(config, rank, plan, resume) as tracker:  # rank 0's MLflow run, ended on leaving
            context = RankContext(config, rank, plan, frozen_sha256, tracker)
            # Horovod: rank 0 fits the linear probe; a fresh run's head starts from it on every rank
            probe_found, probe_head, head_init = start_from_probe(context, inputs, resume)
            seconds_before_fit = time.perf_counter() - start
            phases = [head_phase(context, inputs, resume, probe_head)]
            if config.model.fine_tune_blocks:
                phases.append(fine_tune(context, phases[0], resume))
            report = build_report(context, phases, resume)  # Horovod: every rank's checksums and hosts gathered
            report.update(head_init=head_init, seconds_before_fit=seconds_before_fit,
                          fit_seconds=sum(p.fit_seconds for p in phases), total_seconds=time.perf_counter() - start)
            if rank.rank == 0:  # Horovod: rank 0 alone writes the model and the report
                report["probe"] = probe_found
                save_outputs(context, report, phases[-1])
    if rank.rank == 0:
        plan.outputs.finish()  # a URI --output: the rest uploaded, metrics.json last
    return report


def start_from_probe(context: RankContext, inputs: InputPath, resume: Resume) -> Tuple[Optional[Dict], Optional[list], str]:
    """Rank 0 fits the linear probe on the cached features; with ``--head-init probe`` a fresh head starts from it.

    Returns:
        the probe's report on rank 0 (``None`` elsewhere); the probe as the head's weights on every rank (``None``:
        no probe, or ``--head-init random``); where the head started: ``probe``, ``random`` or ``checkpoint``."""
    import horovod.tensorflow as hvd_tf

    found = linear_probe(context.config, inputs) if context.rank.rank == 0 else None
    head = found.pop("head", None) if found else None
    if context.config.model.head_init != "probe":
        return found, None, "checkpoint" if resume.marker else "random"
    weights = None if head is None else head_weights(head, context.plan.data.num_classes)
    # Horovod: the probe as the head's weights, rank 0's on every rank (None: each keeps the same seeded head)
    weights = hvd_tf.broadcast_object(weights, root_rank=0, name="probe_head")
    if resume.marker:
        return found, weights, "checkpoint"
    if weights is None:
        return found, None, "random"
    inputs.model.get_layer("head").set_weights(weights)
    return found, weights, "probe"


def keep_the_better_head(context: RankContext, inputs: InputPath, probe_head: list) -> Dict:
    """Phase 1's end: the probe's head replaces the trained one when its exact validation is better.

    Compared as ``start_is_better`` says, on the whole validation split.

    Returns:
        dict: ``kept`` (``trained`` or ``probe``) and each candidate's validation ``loss`` and ``accuracy``."""
    head = inputs.model.get_layer("head")
    trained_weights = head.get_weights()
    trained = evaluate(context, inputs, VALIDATION)
    head.set_weights(probe_head)
    probe = evaluate(context, inputs, VALIDATION)
    kept = "probe" if start_is_better((probe.loss, probe.accuracy), (trained.loss, trained.accuracy),
                                      context.config.fit.rule.monitor) else "trained"
    if kept == "trained":
        head.set_weights(trained_weights)
    figures = {name: {"loss": t.loss, "accuracy": t.accuracy, "count": t.count}
               for name, t in (("trained", trained), ("probe", probe))}
    return {"kept": kept, **figures}


def head_phase(context: RankContext, inputs: InputPath, resume: Resume, probe_head: Optional[list] = None):
    """Phase 1, the head on the frozen backbone: fit, the better of it and the probe's head, exact evaluation.

    Skipped when resuming phase 2; the probe's head is a candidate only without fine-tuning."""
    if resume.phase == 2:
        return Phase(inputs, None, 0, 0.0, None, resume)
    callbacks, early_stopping, epoch_stats = make_callbacks(context, inputs, resume)
    fit_seconds = train(context, inputs, resume, callbacks)
    fine_tuned = bool(context.config.model.fine_tune_blocks)
    choice = keep_the_better_head(context, inputs, probe_head) if probe_head is not None and not fine_tuned else None
    totals = evaluate(context, inputs, VALIDATION if fine_tuned else TEST)
    return Phase(inputs, early_stopping, epoch_stats.epochs_run, fit_seconds, totals, resume, head=choice)


def fine_tune(context: RankContext, first, resume: Resume):
    """Phase 2 on every rank: the top ``--fine-tune-blocks`` unfrozen from phase 1's best, on images.

    Returns:
        Phase: with ``report`` for ``metrics.json``'s ``fine_tune``."""
    import horovod.tensorflow as hvd_tf

    config, rank, plan = context.config, context.rank, context.plan
    record = phase1_record(first, resume)
    lr = phase2_lr(plan.lr, config.model.fine_tune_lr)
    model = phase1_best(context, first, resume)
    layers = unfreeze(model, config.model.backbone, config.model.fine_tune_blocks)
    # Horovod: recompiled with a new hvd.DistributedOptimizer over the unfrozen weights
    compile_distributed(model, lr, config.compute.fp16_allreduce, config.compute.xla_on,
                        config.fit.weight_decay)
    second = phase2_resume(context, model, resume, record)  # Horovod: rank 0's phase 2 state broadcast
    if rank.rank == 0:  # Horovod: logs on rank 0 only
        log.info("fine-tuning: top %s of %s unfrozen (%s with weights, %s), on images; lr %g = %g x %g; "
                 "epochs %d..%d", plural(config.model.fine_tune_blocks, "block"), config.model.backbone,
                 plural(len(layers), "layer"), plural(trainable_parameters(model), "trainable parameter"), lr,
                 config.model.fine_tune_lr, plan.lr,
                 record["epochs"] + 1, record["epochs"] + config.fine_tune_max_epochs)
    phase = context.for_phase(record["epochs"] + config.fine_tune_max_epochs, lr)
    inputs = resized_inputs(ImageInputs(config, plan.data, rank, model, plan.input_size), plan.world, rank)
    marker = {"phase": 2, "blocks": config.model.fine_tune_blocks, "phase1": record}
    callbacks, early_stopping, epoch_stats = make_callbacks(phase, inputs, second, marker=marker)
    seconds = train(phase, inputs, second, callbacks, first_epoch=record["epochs"])
    totals = evaluate(context, inputs)
    report = {"blocks": config.model.fine_tune_blocks, "layers": layers,
              "trainable_parameters": trainable_parameters(model),
              "learning_rate": lr, "lr_factor": config.model.fine_tune_lr, "first_epoch": record["epochs"] + 1,
              "phase1": record, "epochs_planned": phase.config.fit.epochs,
              "resumed_in_phase_2": resume.phase == 2,
              # Horovod: every rank's frozen weights, to show that they stayed the same on all
              "non_trainable_sha256_per_rank": hvd_tf.allgather_object(frozen_checksum(model), name="phase2_frozen")}
    return Phase(inputs, early_stopping, epoch_stats.epochs_run, seconds, totals, second, report)
