"""What rank 0 writes at the end of a run: ``metrics.json``, the exported model and its contract, the pictures."""
from __future__ import annotations

import logging
import os
import posixpath
import shutil
import socket
from typing import TYPE_CHECKING, Dict, List, Optional

from pipelines.contract import (
    CLASS_NAMES,
    HISTORY,
    MANIFEST,
    METRICS,
    MODEL_CONTRACT,
    MODEL_FILE,
    TEST,
    TRAIN,
    VALIDATION,
)
from pipelines.io.atomic import PUBLIC, write_json
from pipelines.runtime.config import to_dict
from pipelines.runtime.logs import plural
from pipelines.runtime.redact import redact
from pipelines.tracking.pictures import PICTURES, contact_sheet, plot_confusion, plot_history, plot_top_confusions
from pipelines.training.data import OnePassShard
from pipelines.training.model.export import export_model
from pipelines.training.records.segments import interruptions, steps_redone
from pipelines.training.resume import Resume, weights_checksum

if TYPE_CHECKING:
    from pipelines.training.config import TrainConfig
    from pipelines.training.inputpath import InputPath

log = logging.getLogger("pipelines")


def build_report(context, phases: List, resume: Resume) -> Dict:
    """The run's report, gathered on every rank (collective); ``phases``' last is the final model.

    The test split is read once, after training, and never used for a choice."""
    import horovod.tensorflow as hvd_tf

    config, rank, plan = context.config, context.rank, context.plan
    history, steps, data, last = resume.history, plan.steps, plan.data, phases[-1]
    fine_tune = last.report if len(phases) > 1 else None
    resumed = last.resume if resume.phase == 2 else resume  # the phase whose state was restored
    epochs_planned = fine_tune["epochs_planned"] if fine_tune else config.fit.epochs
    totals = last.totals
    best_epoch = last.early_stopping.best_epoch + 1 if history else None
    validation = best_validation(history, best_epoch, data.validation_rows)
    choice = phases[0].head if len(phases) == 1 else None
    if choice and choice["kept"] == "probe":  # the start (epoch 0) was better on validation than every epoch
        best_epoch, validation = 0, {"epoch": 0, **choice["probe"], "expected_count": data.validation_rows}
    return {
        "config": redact(to_dict(config)),
        "run_id": plan.claim.run.run_id if plan.claim else None,  # rank 0's: the training run (train_run.json)
        "world_size": rank.size,
        "batch_size_per_rank": config.fit.batch_size,
        "global_batch_size": steps.global_batch,
        "data_world_size": plan.world.size,  # the run's arithmetic: pipelines/training/dataworld.py
        "per_rank_batches": plan.world.per_rank_batches(rank.size),
        "segments": list(plan.segments),
        "interruptions": interruptions(list(plan.segments)),
        "steps_redone": steps_redone(list(plan.segments)),  # steps trained twice: pipelines/training/records/progress.py
        "steps_per_epoch": steps.steps_per_epoch,
        "validation_steps": steps.validation_steps,
        "learning_rate": plan.lr,
        "image_size": plan.input_size,  # metrics.json's name for the model's input side
        "num_classes": data.num_classes,
        "class_names": data.class_names,
        "input_path": last.inputs.name,
        "feature_cache": phases[0].inputs.directory,
        "precision": rank.precision,
        "resumed_after_epoch": resume.initial_epoch if resume.marker else None,
        "resumed_after_step": resume.initial_step if resume.marker else None,  # of the next epoch: a step checkpoint
        "resumed_in_phase": resume.phase if resume.marker else None,
        "resumed_weights_checksum_per_rank": resumed.checksums,
        "resumed_optimizer_checksum_per_rank": resumed.optimizer_checksums,
        "attempts": rank.handed.attempts,
        "epochs_run": len(history),
        "best_epoch": best_epoch,
        "selected_on": "validation",
        "stopped_early": bool(history) and len(history) < epochs_planned,
        "stopping": stopping_report(config, last.early_stopping, steps.steps_per_epoch),
        "history": history,
        "validation": validation,
        "head": choice,
        "test": {"loss": totals.loss, "accuracy": totals.accuracy, "count": totals.count,
                 "expected_count": data.test_rows},
        "fine_tune": fine_tune,
        "train_images_per_second": _steady_state(history),
        "weights_checksum_per_rank": hvd_tf.allgather_object(weights_checksum(last.inputs.model),
                                                             name="weights_checksums"),
        "epochs_run_per_rank": hvd_tf.allgather_object(sum(p.epochs_run for p in phases), name="epochs_run"),
        "host_per_rank": hvd_tf.allgather_object(socket.gethostname(), name="hosts"),
    }


def stopping_report(config, early_stopping, steps_per_epoch: int) -> Dict:
    """The early-stopping rule and what it came to; ``stopped_epoch`` is 1-based, ``None`` when the epochs ran out."""
    rule = config.fit.rule
    stopped = getattr(early_stopping, "stopped_epoch", 0)  # Keras' 0-based epoch; 0: it did not stop the run
    return {"rule": config.fit.stopping, **rule.to_dict(), "patience": rule.patience(steps_per_epoch),
            "steps_per_epoch": steps_per_epoch, "stopped_epoch": int(stopped) + 1 if stopped else None}


#: Why a run on images has no probe: it fits cached features (docs/training.md, "The linear probe")
PROBE_NEEDS_FEATURES = ("the run trained on images: the probe fits the feature cache's features (--feature-cache); "
                        "computing them here would cost a backbone pass over every split and write into the data's "
                        "folder")
#: The head may trail the probe on validation by at most this much (accuracy) before the run says so
PROBE_MARGIN = 0.02


def linear_probe(config: TrainConfig, inputs: InputPath) -> Dict:
    """Rank 0: the linear probe on the cached features, ``C`` chosen on validation, or ``{"skipped": why}``.

    Returns:
        dict: ``fit_probe``'s, ``head`` included (pop it before the report is written)."""
    from pipelines.training import probe
    from pipelines.training.data import features as feat

    if not config.outputs.probe:
        return {"skipped": "--no-probe"}
    directory = inputs.features
    if directory is None:
        return {"skipped": PROBE_NEEDS_FEATURES}
    train, validation, test = (feat.read_shard(directory, split, 0, 1) for split in (TRAIN, VALIDATION, TEST))
    try:
        return probe.fit_probe(*train, *validation, *test, seed=config.fit.seed)
    except probe.ProbeRefused as exc:
        return {"skipped": str(exc)}


def probe_lines(report: Dict) -> List[str]:
    """The log's last lines on the probe, and one more when the model trails it on validation by over `PROBE_MARGIN`."""
    found, model = report.get("probe"), report["validation"]["accuracy"]
    if not found:  # a report made without the probe's step
        return []
    if "skipped" in found:
        return [f"linear probe: none ({found['skipped']})"]
    test = "?" if found["test_accuracy"] is None else f"{found['test_accuracy']:.4f}"
    lines = [f"linear probe (logistic regression on the same frozen features, C {found['C']:g} chosen on "
             f"validation): validation accuracy {found['validation_accuracy']:.4f}, test accuracy {test}; "
             f"{plural(found['rows'], 'train row')}, {found['seconds']:.1f} s"]
    if model is not None and found["validation_accuracy"] - model > PROBE_MARGIN:
        count = report["validation"]["expected_count"]
        rule = report["stopping"]["rule"]
        tries = ("--stopping converge (the default, on val_loss), " if rule != "converge" else "") + \
            "a larger --patience-steps or --epochs, another --base-lr or --dropout, or the tuning job (jobs/tune.py)"
        lines.append(f"the model's validation accuracy {model:.4f} trails the linear probe's "
                     f"{found['validation_accuracy']:.4f} by {100 * (found['validation_accuracy'] - model):.1f} "
                     f"points (one of {plural(count, 'validation image')} is {100 / max(1, count):.1f}): the head "
                     f"may not have converged or its recipe fits these features less well; try {tries}")
    return lines


def best_name(epoch) -> str:
    """The best epoch as the log says it: epoch 0 is the start, the linear probe's head."""
    return "0 (the linear probe's head)" if epoch == 0 else str(epoch)


def best_validation(history: List[Dict], best_epoch: Optional[int], expected_count: int) -> Dict:
    """The exact validation figures of the 1-based ``best_epoch`` in ``history`` (``None`` values when it has none)."""
    entry = next((h for h in history if h.get("epoch") == best_epoch), {})
    count = entry.get("val_count")
    return {"epoch": best_epoch, "loss": entry.get("val_loss"), "accuracy": entry.get("val_accuracy"),
            "count": int(count) if count is not None else None, "expected_count": expected_count}


def save_outputs(context, report: Dict, phase) -> None:
    """Rank 0: write the run's results (each atomically), then the pictures, then log them to the MLflow run.

    A picture's failure is recorded as ``pictures_error``; a failed MLflow log raises `TrackingFailed`."""
    config, data, tracker, totals = context.config, context.plan.data, context.tracker, phase.totals
    class_names, directory = data.class_names, context.output_dir or config.outputs.output
    exported = export_model(phase.inputs.exported_model(), os.path.join(directory, MODEL_FILE), data.stored_size,
                            class_names)
    write_json(os.path.join(directory, CLASS_NAMES), class_names, mode=PUBLIC)
    if totals is not None and totals.num_classes:
        report["test"]["confusion"] = totals.confusion_matrix().tolist()
    report.update(model_contract=MODEL_CONTRACT, pictures={}, mlflow=tracker.describe() if tracker else None)
    write_json(os.path.join(directory, METRICS), report)  # the results, before any picture
    test, validation = report["test"], report["validation"]
    log.info("test accuracy %.4f, loss %.4f on %s (exact, all ranks, read once after training); best epoch %s "
             "of %d, chosen on validation (accuracy %s on %s)", test["accuracy"], test["loss"],
             plural(test["count"], "image"),
             best_name(report["best_epoch"]),
             report["epochs_run"],
             "?" if validation["accuracy"] is None else f"{validation['accuracy']:.4f}",
             plural(validation["expected_count"], "image"))
    for line in probe_lines(report):
        (log.warning if line.startswith("the model's") else log.info)("%s", line)
    try:
        pictures = save_pictures(directory, report, exported, data) if config.outputs.pictures else {}
    except Exception as exc:  # pictures are a view of the results above: never the run's failure
        log.error("the pictures could not be drawn (%s: %s); the results are written", type(exc).__name__, exc)
        pictures, report["pictures_error"] = {}, f"{type(exc).__name__}: {exc}"
    # the report names where they end up: in --output (a URI receives this folder's files)
    report["pictures"] = {name: posixpath.join(config.outputs.output, os.path.basename(path))
                          for name, path in pictures.items()}
    write_json(os.path.join(directory, METRICS), report)
    for path in report["pictures"].values():
        log.info("wrote %s", path)
    if tracker:
        track_outputs(context, report, exported)


def track_outputs(context, report: Dict, exported) -> None:
    """Rank 0: log the missing epochs, test metrics, outputs and the model; `TrackingFailed` if logging fails."""
    import tempfile

    config, data, tracker = context.config, context.plan.data, context.tracker
    test, directory = report["test"], context.output_dir or config.outputs.output
    manifest = data.location.join(MANIFEST)
    copy = None if manifest.local else tempfile.mkdtemp(prefix="pipelines-manifest-")
    if copy:  # MLflow logs local files: a copy of a remote manifest
        manifest.download(os.path.join(copy, MANIFEST))
    try:
        tracker.log_results(
            metrics={"test_loss": test["loss"], "test_accuracy": test["accuracy"], "test_count": test["count"],
                     **{f"best_val_{k}": v for k, v in report["validation"].items()
                        if k in ("loss", "accuracy", "count") and v is not None},
                     "epochs_run": report["epochs_run"], "best_epoch": report["best_epoch"],
                     "stopped_early": int(report["stopped_early"]), "attempts": len(report["attempts"]),
                     "interruptions": report["interruptions"], "steps_redone": report["steps_redone"],
                     "steady_train_images_per_second": report["train_images_per_second"],
                     "fit_seconds": report["fit_seconds"], "total_seconds": report["total_seconds"],
                     **probe_metrics(report.get("probe"))},
            artifacts=[(os.path.join(directory, name), None) for name in OUTPUT_ARTIFACTS]
            + [(os.path.join(directory, os.path.basename(path)), None) for path in report["pictures"].values()]
            + [(os.path.join(copy, MANIFEST) if copy else manifest.path, "data")],
            history=report["history"])
    finally:
        if copy:
            shutil.rmtree(copy, ignore_errors=True)
    example, _ = first_test_rows(data, 1)
    uri, version = tracker.log_model(exported, example, config.outputs.register_model,
                                     {"test_accuracy": str(test["accuracy"])}, {"class_names": data.class_names})
    log.info("MLflow: logged run %s with model %s%s", tracker.run_id, uri,
             f", registered as {config.outputs.register_model} version {version}" if version else "")


def probe_metrics(found: Optional[Dict]) -> Dict:
    """The MLflow metrics of the linear probe (``probe_*``); none when it was skipped."""
    if not found or "skipped" in found:
        return {}
    return {f"probe_{key}": found[key] for key in ("C", "validation_accuracy", "test_accuracy", "seconds", "rows")}


OUTPUT_ARTIFACTS = (METRICS, HISTORY, CLASS_NAMES, MODEL_CONTRACT)


CONTACT_SHEET_IMAGES = 32


def save_pictures(output: str, report: Dict, exported, data) -> Dict[str, str]:
    """Rank 0: curves, confusion pictures, and test images as the ``exported`` model predicts them; ``{name: path}``."""
    where = {name: os.path.join(output, file) for name, file in PICTURES.items()}
    probe, stopping = report.get("probe") or {}, report.get("stopping") or {}
    paths = {"curves": plot_history(report["history"], where["curves"], report["best_epoch"],
                                    stopping.get("stopped_epoch"), stopping.get("monitor", ""),
                                    probe.get("validation_accuracy"))}
    if "confusion" in report["test"]:
        matrix = report["test"]["confusion"]
        paths["confusion"] = plot_confusion(matrix, data.class_names, where["confusion"])
        paths["top_confusions"] = plot_top_confusions(matrix, data.class_names, where["top_confusions"])
    images, labels = first_test_rows(data, CONTACT_SHEET_IMAGES)
    if len(images):
        predicted = exported.predict(images, batch_size=8, verbose=0).argmax(axis=1)
        paths["contact_sheet"] = contact_sheet(images, labels, predicted, data.class_names, where["contact_sheet"])
    return paths


def first_test_rows(data, count: int):
    """The first ``count`` test rows in file order: ``(images uint8 (n, S, S, 3), labels int32 (n,))``."""
    import numpy as np

    images, labels = [], []
    for batch_images, batch_labels in OnePassShard(data, "test", 0, 1).batches():  # the whole split, in order
        images.append(batch_images)
        labels.append(batch_labels)
        if sum(map(len, labels)) >= count:
            break
    if not images:
        return np.zeros((0, data.stored_size, data.stored_size, 3), np.uint8), np.zeros((0,), np.int32)
    return np.concatenate(images)[:count], np.concatenate(labels)[:count]


def _steady_state(history: List[Dict]) -> Optional[float]:
    """Mean training images/s over the epochs after the first (warm-up: graph tracing, cold cache)."""
    rates = [h["train_images_per_second"] for h in history if "train_images_per_second" in h]
    rates = rates[1:] or rates
    return sum(rates) / len(rates) if rates else None
