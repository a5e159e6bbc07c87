"""The training job: one function, run by every Horovod rank (``horovodrun`` or Spark tasks).

Steps, in order (each rank runs all of them; side effects are rank 0's):

1. Horovod init, device placement, threads.
2. Dataset from the ETL manifest; refusals (no manifest, fewer row groups than ranks, batch
   too large) happen here, identically on every rank.
3. Steps and learning rate: ``global_batch = batch_size * size``, ``steps = rows // global_batch``,
   ``lr = base_lr * size`` (:mod:`pipelines.training.schedule`).
4. Model: frozen Xception + dropout + softmax, ``Nadam(lr)`` wrapped in ``hvd.DistributedOptimizer``.
5. Resume: rank 0 finds the newest complete checkpoint; epoch, state and weights reach every
   rank by broadcast.
6. ``fit`` on Petastorm readers created once for the whole run (train and validation).
7. Best weights restored on every rank; exact evaluation on the whole test split.
8. Rank 0 writes ``metrics.json``, ``model.keras`` and ``class_names.json``.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from typing import Dict, List, Optional

from pipelines.config import to_dict
from pipelines.training.config import TrainConfig

log = logging.getLogger("pipelines")


def weights_checksum(model) -> str:
    """sha256 of all weights' bytes, in order: equal checksums mean identical weights."""
    digest = hashlib.sha256()
    for array in model.get_weights():
        digest.update(array.tobytes())
    return digest.hexdigest()


def threads_per_rank(config: TrainConfig, local_size: int) -> int:
    """``--threads``, or the cores this process may use (its CPU affinity: a container's or a
    scheduler's cpuset, not the whole machine) shared among the host's ranks."""
    return config.threads or max(1, len(os.sched_getaffinity(0)) // local_size)


def run_training(config: TrainConfig, spark_gpu_addresses: Optional[List[str]] = None) -> Dict:
    """Train on every rank and return the run's report (the content of ``metrics.json``).

    Must be called once per process, by every rank (``horovodrun -np N``, Spark barrier tasks, or
    a single process, which is a world of size 1).

    Raises:
        pipelines.training.data.DataError: the dataset cannot feed this run.
        ValueError: a batch size the data cannot fill.
    """
    import horovod.tensorflow as hvd_tf  # collectives on Python objects and variables
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    from pipelines.logs import setup_logging
    from pipelines.training import callbacks as cb
    from pipelines.training import features as feat
    from pipelines.training.data import default_cache_root, load_dataset, make_dataset, open_reader
    from pipelines.training.devices import apply_device, bind_to_cores
    from pipelines.training.model import build_model, compile_distributed, export_model
    from pipelines.training.schedule import checkpoint_path, newest_complete_checkpoint, plan_steps, scaled_lr

    # 1. processes and devices; cores are bound before any thread starts (threads inherit it)
    cores = None
    if config.bind_cores:
        local_size = int(os.environ.get("HOROVOD_LOCAL_SIZE", "1"))
        cores = bind_to_cores(threads_per_rank(config, local_size), announce=False)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    setup_logging("train", rank=rank, level=logging.INFO if rank == 0 else logging.WARNING)
    if cores and rank == 0:
        log.info("each rank bound to %d core(s) of its own (rank 0: %s)", len(cores), cores)
    if spark_gpu_addresses is None:  # set by HorovodRunner's barrier tasks
        spark_gpu_addresses = [a for a in os.environ.get("PIPELINES_SPARK_GPUS", "").split(",") if a]
    apply_device(hvd.local_rank(), spark_gpu_addresses, announce=rank == 0)
    threads = threads_per_rank(config, hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    start = time.perf_counter()

    # 2-3. data, steps, learning rate: the same on every rank
    data = load_dataset(config.data, size)
    steps = plan_steps(data.train_rows, data.test_rows, config.batch_size, size)
    lr = scaled_lr(config.base_lr, size)
    image_size = config.image_size or data.image_size
    if rank == 0:
        log.info("world size %d, %d threads per rank; batch %d per rank, global batch %d; "
                 "%d steps per epoch, %d validation steps; lr %g = %g x %d",
                 size, threads, config.batch_size, steps.global_batch, steps.steps_per_epoch,
                 steps.validation_steps, lr, config.base_lr, size)
        os.makedirs(config.output, exist_ok=True)

    # 4. model: the whole model, or only its head on cached backbone features
    full_model = build_model(data.num_classes, image_size, config.dropout, config.weights, seed=config.seed)
    not_applicable = feat.inapplicable_reason(config) if config.feature_cache else None
    use_features = config.feature_cache and not_applicable is None
    if not_applicable and rank == 0:
        log.info("feature cache off: %s; training the whole model on images", not_applicable)
    features_at = None
    if use_features:
        features_at = ensure_features(config, data, full_model, image_size, rank, size)
        model = feat.build_head(data.num_classes, config.dropout, config.seed)
        # Start from the whole model's initial head, so both paths train the same function from the same point.
        model.get_layer("head").set_weights(full_model.get_layer("head").get_weights())
    else:
        model = full_model
    compile_distributed(model, lr)

    # 5. resume: rank 0 decides, everyone receives
    marker = newest_complete_checkpoint(config.output) if (config.resume and rank == 0) else None
    marker = hvd_tf.broadcast_object(marker, root_rank=0, name="resume_marker")
    best_weights, resume_checksums = None, None
    initial_epoch, history = 0, []
    if marker:
        initial_epoch, history = marker["epoch"], list(marker["history"])
        if rank == 0:
            model.load_weights(os.path.join(config.output, marker["weights"]))
            best_epoch = marker["early_stopping"]["best_epoch"]
            best_model = tf.keras.models.clone_model(model)
            best_model.load_weights(checkpoint_path(config.output, best_epoch))
            best_weights = best_model.get_weights()
            log.info("resuming after epoch %d (checkpoint %s; best epoch so far %d)",
                     initial_epoch, marker["weights"], best_epoch)
        hvd_tf.broadcast_variables(model.variables, root_rank=0)
        best_weights = hvd_tf.broadcast_object(best_weights, root_rank=0, name="best_weights")
        resume_checksums = hvd_tf.allgather_object(weights_checksum(model), name="resume_checksums")
    elif config.resume and rank == 0:
        log.info("--resume: no complete checkpoint in %s, starting from epoch 1", config.output)

    # 6. fit, on readers that live for the whole run
    early_stopping = cb.BestWeightsEarlyStopping(
        state=marker["early_stopping"] if marker else None, best_weights=best_weights,
        monitor="val_accuracy", patience=config.patience, min_delta=config.min_delta, verbose=0)
    epoch_stats = cb.EpochStats(steps.steps_per_epoch, steps.global_batch)
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        epoch_stats,
        hvd.callbacks.MetricAverageCallback(),
    ]
    if config.warmup_epochs > 0:
        callbacks.append(hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=lr, warmup_epochs=config.warmup_epochs, steps_per_epoch=steps.steps_per_epoch,
            verbose=0))
    callbacks.append(early_stopping)
    if rank == 0:
        callbacks += [
            tf.keras.callbacks.ModelCheckpoint(os.path.join(config.output, "checkpoint-{epoch}.h5"),
                                               save_weights_only=True),
            cb.CheckpointMarker(config.output, early_stopping, history),
            tf.keras.callbacks.CSVLogger(os.path.join(config.output, "history.csv"), append=bool(marker)),
        ]
        if config.tensorboard:
            callbacks.append(tf.keras.callbacks.TensorBoard(os.path.join(config.output, "tensorboard"),
                                                            profile_batch=0))
    callbacks.append(cb.FaultInjection(rank))

    already_done = bool(marker) and (marker["early_stopping"]["stopped"] or initial_epoch >= config.epochs)
    cache_root = config.cache_dir or default_cache_root()
    fit_seconds, seconds_before_fit = 0.0, time.perf_counter() - start
    if not already_done:
        with contextlib.ExitStack() as readers:
            if use_features:
                train_ds = feat.feature_dataset(*feat.read_shard(features_at, "train", rank, size), config.batch_size,
                                                shuffle=True, seed=config.seed + rank, repeat=True)
                val_ds = feat.feature_dataset(*feat.read_shard(features_at, "test", rank, size), config.batch_size,
                                              shuffle=False, seed=0, repeat=True)
            else:
                train_reader = readers.enter_context(open_reader(
                    data, "train", rank, size, cache_root, workers=config.reader_workers, seed=config.seed + rank))
                val_reader = readers.enter_context(open_reader(
                    data, "test", rank, size, cache_root, workers=config.reader_workers, seed=config.seed + rank))
                train_ds = make_dataset(train_reader, data.image_size, config.batch_size, image_size,
                                        config.shuffle_buffer, seed=config.seed + rank, augment=config.augment)
                val_ds = make_dataset(val_reader, data.image_size, config.batch_size, image_size)
            fit_start = time.perf_counter()
            seconds_before_fit = fit_start - start
            model.fit(train_ds, epochs=config.epochs, initial_epoch=initial_epoch,
                      steps_per_epoch=steps.steps_per_epoch, validation_data=val_ds,
                      validation_steps=steps.validation_steps, callbacks=callbacks,
                      verbose=2 if rank == 0 else 0)
            fit_seconds = time.perf_counter() - fit_start
    else:
        model.set_weights(best_weights)
    if not config.cache_dir:
        shutil.rmtree(cache_root, ignore_errors=True)

    # 7. exact evaluation of the best weights on the whole test split
    if use_features:
        # The exported model is the whole one: backbone + the head just trained.
        full_model.get_layer("head").set_weights(model.get_layer("head").get_weights())
    totals = evaluate(model, data, rank, size, config.batch_size, image_size, features_at)
    checksums = hvd_tf.allgather_object(weights_checksum(model), name="weights_checksums")
    epochs_per_rank = hvd_tf.allgather_object(epoch_stats.epochs_run, name="epochs_run")

    # 8. rank 0 reports
    report = {
        "config": to_dict(config),
        "world_size": size,
        "batch_size_per_rank": config.batch_size,
        "global_batch_size": steps.global_batch,
        "steps_per_epoch": steps.steps_per_epoch,
        "validation_steps": steps.validation_steps,
        "learning_rate": lr,
        "image_size": image_size,
        "num_classes": data.num_classes,
        "class_names": data.class_names,
        "feature_cache": features_at,
        "resumed_after_epoch": initial_epoch if marker else None,
        "resumed_weights_checksum_per_rank": resume_checksums,
        "epochs_run": len(history),
        "best_epoch": early_stopping.best_epoch + 1 if history else None,
        "stopped_early": bool(history) and len(history) < config.epochs,
        "history": history,
        "test": {"loss": totals.loss, "accuracy": totals.accuracy, "count": totals.count,
                 "expected_count": data.test_rows},
        "train_images_per_second": _steady_state(history),
        "seconds_before_fit": seconds_before_fit,
        "fit_seconds": fit_seconds,
        "total_seconds": time.perf_counter() - start,
        "weights_checksum_per_rank": checksums,
        "epochs_run_per_rank": epochs_per_rank,
    }
    if rank == 0:
        export_model(full_model, os.path.join(config.output, "model.keras"))
        with open(os.path.join(config.output, "class_names.json"), "w") as f:
            json.dump(data.class_names, f)
        tmp = os.path.join(config.output, "metrics.json.tmp")
        with open(tmp, "w") as f:
            json.dump(report, f, indent=2)
        os.replace(tmp, os.path.join(config.output, "metrics.json"))
        log.info("test accuracy %.4f, loss %.4f on %d images (exact, all ranks); best epoch %s of %d",
                 totals.accuracy, totals.loss, totals.count, report["best_epoch"], len(history))
    return report


def ensure_features(config: TrainConfig, data, full_model, image_size: int, rank: int, size: int) -> str:
    """The feature set of this data, backbone and size: reused when complete, else computed, each
    rank its own Petastorm shard of each split, in parallel. Returns its folder."""
    import horovod.tensorflow as hvd_tf

    from pipelines.training import features as feat
    from pipelines.training.data import OnePassShard, verify_total

    key = feat.feature_key(config.weights, image_size, config.seed)
    directory = feat.feature_dir(config.data, key)
    if feat.is_complete(directory, {"train": data.train_rows, "test": data.test_rows}):
        if rank == 0:
            log.info("feature cache: reusing %s", directory)
        return directory
    if rank == 0:
        log.info("feature cache: computing backbone features into %s", directory)
        shutil.rmtree(directory, ignore_errors=True)  # a run interrupted before completion
    hvd_tf.broadcast_object(None, root_rank=0, name="features_cleared")
    backbone = full_model.get_layer("xception")
    start, counts = time.perf_counter(), {}
    for split in ("train", "test"):
        shard = OnePassShard(data, split, rank, size)
        features, labels = feat.compute_shard(backbone, shard.dataset(config.batch_size, image_size))
        shard.verify(len(labels))
        feat.write_shard(directory, split, rank, features, labels)
        counts[split] = sum(hvd_tf.allgather_object(len(labels), name=f"feature_rows_{split}"))
        verify_total(counts[split], data, split)
    if rank == 0:
        feat.mark_complete(directory, counts, key)
        log.info("feature cache: %s rows in %.1f s", counts, time.perf_counter() - start)
    hvd_tf.broadcast_object(None, root_rank=0, name="features_complete")
    return directory


def evaluate(model, data, rank: int, size: int, batch_size: int, image_size: int,
             features_at: Optional[str] = None):
    """Exact totals of ``model`` over the whole test split: each rank reads its shard once, the
    sums are added over ranks, and the rows counted are checked against the Parquet metadata (per
    rank) and the manifest (in total), so a short read fails the run instead of being reported.

    With ``features_at``, ``model`` is the head and reads the cached features of the test split.

    Returns:
        :class:`pipelines.training.evaluate.Totals`, the same on every rank.

    Raises:
        pipelines.training.data.ShardCountError: a count differs from the metadata or manifest.
    """
    from pipelines.training import features as feat
    from pipelines.training.data import OnePassShard, verify_total
    from pipelines.training.evaluate import allreduce_totals, evaluate_dataset

    if features_at:
        test_ds = feat.feature_dataset(*feat.read_shard(features_at, "test", rank, size), batch_size,
                                       shuffle=False, seed=0, repeat=False, drop_remainder=False)
        totals = evaluate_dataset(model, test_ds)
    else:
        shard = OnePassShard(data, "test", rank, size)
        totals = evaluate_dataset(model, shard.dataset(batch_size, image_size))
        shard.verify(totals.count)
    totals = allreduce_totals(totals)
    verify_total(totals.count, data, "test")
    return totals


def _steady_state(history: List[Dict]) -> Optional[float]:
    """Mean training images/s over the epochs after the first (warm-up: graph tracing, cold cache)."""
    rates = [h["train_images_per_second"] for h in history if "train_images_per_second" in h]
    rates = rates[1:] or rates
    return sum(rates) / len(rates) if rates else None
