"""The search as a job: run the trials as Spark tasks, choose on validation, refit, test once, record."""
from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from pipelines import tracking as trk
from pipelines.contract import TEST, TRAIN, VALIDATION
from pipelines.io.atomic import replacing
from pipelines.runtime.config import to_dict
from pipelines.runtime.redact import redact, redact_uri
from pipelines.runtime.spark import spark_session
from pipelines.training.stopping import RULES
from pipelines.tune.cache import FeatureSet, find_feature_set, read_splits
from pipelines.tune.config import TuneConfig
from pipelines.tune.runners import (
    TrialRecord,
    has_mlflow_spark_study,
    log_trial_metrics,
    run_ask_tell,
    run_mlflow_spark,
)
from pipelines.tune.space import HeadSettings
from pipelines.tune.trial import TrialPlan

log = logging.getLogger("pipelines")
RECORD = "tune.json"  # OUTPUT/tune.json: the search's result


class NoTrialFinished(RuntimeError):
    """Every trial of the search failed (diverged): nothing to choose (exit 1)."""


@dataclass(frozen=True)
class SearchResult:
    """A finished search: its run, the trials, the ``chosen`` one, the refit's ``final`` result, the record's path."""

    run_id: str
    runner: str
    trials: List[TrialRecord]
    chosen: TrialRecord
    final: Dict
    seconds: float
    record: str


def trial_function(features: FeatureSet, plan: TrialPlan, storage_options: Dict[str, str], test: bool = False):
    """The function a Spark task runs: settings -> the trial's result dict (with ``test``, the refit's)."""
    def run(settings: HeadSettings) -> Dict:
        from pipelines.tune.trial import refit_and_test, run_trial

        splits = read_splits(features.uri, (TRAIN, VALIDATION, TEST) if test else (TRAIN, VALIDATION), storage_options)
        if test:
            return refit_and_test(settings, plan, splits[TRAIN], splits[VALIDATION], splits[TEST]).to_dict()
        return run_trial(settings, plan, splits[TRAIN], splits[VALIDATION]).to_dict()
    return run


def choose(records: List[TrialRecord]) -> TrialRecord:
    """The completed trial of the lowest validation loss, the earliest of equals; `NoTrialFinished` if none."""
    done = [r for r in records if r.result is not None and math.isfinite(r.result["val_loss"])]
    if not done:
        raise NoTrialFinished(f"all {len(records)} trials failed (diverged): narrow --base-lr-range")
    return min(done, key=lambda r: (r.result["val_loss"], r.number))


def probe_start(config: TuneConfig, features: FeatureSet) -> Optional[List]:
    """The linear probe as every trial's first head weights (fitted once, here), or ``None`` (``--head-init random``,
    or a probe that cannot be fitted: said in one line)."""
    from pipelines.training.probe import ProbeRefused, fit_probe, head_weights

    if config.head_init != "probe":
        return None
    splits = read_splits(features.uri, (TRAIN, VALIDATION), config.storage_options)
    try:
        (train_x, train_y), (val_x, val_y) = splits[TRAIN], splits[VALIDATION]
        found = fit_probe(train_x, train_y, val_x, val_y, seed=config.seed)
    except ProbeRefused as exc:
        log.warning("tune: trials start from a random head: %s", exc)
        return None
    log.info("tune: every trial's head starts from the linear probe (C %g chosen on validation, validation "
             "accuracy %.4f) and keeps it unless training beats it on validation", found["C"],
             found["validation_accuracy"])
    return head_weights(found["head"], features.num_classes)


def run_search(config: TuneConfig) -> SearchResult:
    """Run the search ``config`` describes.

    Raises:
        Refused: no complete feature set (before Spark starts), or a tracking store that cannot be used.
        NoTrialFinished: every trial diverged."""
    features = find_feature_set(config.data, config.backbone, config.weights, config.image_size, config.seed,
                                config.storage_options)
    trk.check_store(config.tracking_uri)
    plan = TrialPlan(config.epochs, config.batch_size, config.ranks, config.seed, RULES[config.stopping],
                     features.num_classes, config.threads, probe_start(config, features))
    client = trk.open_store(config.tracking_uri, create=True)
    experiment = client.get_experiment_by_name(config.experiment)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(config.experiment)
    name = config.run_name or time.strftime("tune-%Y%m%d-%H%M%S")
    runner = config.runner if config.runner != "auto" else ("mlflow-spark" if has_mlflow_spark_study() else "ask-tell")
    spark = spark_session("pipelines-tune", master=config.master, verbose=config.verbose)
    parallel = config.parallel or spark.sparkContext.defaultParallelism
    log.info("tune: %d trials, %d at a time (%s), on %s (%s)", config.trials, parallel, runner, features.uri,
             ", ".join(f"{split} {n}" for split, n in features.counts.items()))
    start, fn = time.perf_counter(), trial_function(features, plan, config.storage_options)
    if runner == "mlflow-spark":
        parent, records = run_mlflow_spark(config.space(), fn, config.trials, parallel, config.seed,
                                           config.tracking_uri, experiment_id, name)
    else:
        parent, records = run_ask_tell(config.space(), fn, config.trials, parallel, config.seed, client,
                                       experiment_id, name, spark)
    seconds = time.perf_counter() - start
    log_trial_metrics(client, records)
    chosen = choose(records)
    refit = trial_function(features, plan, config.storage_options, test=True)
    final = spark.sparkContext.parallelize([chosen.settings], 1).map(refit).collect()[0]
    record = _record(config, features, runner, parent, records, chosen, final, seconds)
    _log_parent(client, parent, config, chosen, final, record)
    return SearchResult(parent, runner, records, chosen, final, seconds, record)


def _record(config: TuneConfig, features: FeatureSet, runner: str, parent: str, records: List[TrialRecord],
            chosen: TrialRecord, final: Dict, seconds: float) -> str:
    """Write ``OUTPUT/tune.json``: the settings, every trial, the chosen one, its refit; returns its path."""
    body = {"run_id": parent, "tracking_uri": redact_uri(config.tracking_uri), "runner": runner,
            "features": features.uri, "counts": features.counts, "trials_seconds": round(seconds, 3),
            "config": redact(to_dict(config)),
            "trials": [{"number": r.number, "run_id": r.run_id, "settings": r.settings.to_dict(),
                        "result": r.result, "error": r.error} for r in records],
            "chosen": {"number": chosen.number, "settings": chosen.settings.to_dict(),
                       "train_flags": chosen.settings.train_flags(), "trial": chosen.result, "refit": final}}
    os.makedirs(config.output, exist_ok=True)
    path = os.path.join(config.output, RECORD)
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(body, f, indent=2)
    return path


def _log_parent(client, parent: str, config: TuneConfig, chosen: TrialRecord, final: Dict, record: str) -> None:
    """Log the search's run: settings, the chosen trial, the refit's validation and test totals, the record."""
    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000)
    params = {f"search.{k}": v for k, v in redact(to_dict(config)).items() if k not in ("storage_options",)}
    params.update({f"best.{k}": v for k, v in chosen.settings.to_dict().items()})
    metrics = {f"best.{k}": v for k, v in final.items() if isinstance(v, (int, float))}
    client.log_batch(parent, params=[Param(k, str(v)[:6000]) for k, v in params.items()],
                     metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()])
    client.set_tag(parent, "best.trial", str(chosen.number))
    client.set_tag(parent, "best.train_flags", chosen.settings.train_flags())
    client.log_artifact(parent, record)


def summary(result: SearchResult) -> str:
    """The lines ``jobs/tune.py`` prints: the trials, the chosen one, its test accuracy, its ``jobs/train.py`` flags."""
    failed = sum(r.result is None for r in result.trials)
    c, f = result.chosen, result.final
    lines = [f"tune: {len(result.trials)} trials ({failed} failed) in {result.seconds:.1f} s via {result.runner}; "
             f"MLflow run {result.run_id}; record {result.record}",
             f"chosen on validation: trial {c.number}, val_loss {c.result['val_loss']:.4f}, "
             f"val_accuracy {c.result['val_accuracy']:.4f} (best epoch {c.result['best_epoch']} of "
             f"{c.result['epochs_run']})",
             f"refit with the same seed: val_accuracy {f['val_accuracy']:.4f}; test_accuracy {f['test_accuracy']:.4f}, "
             f"test_loss {f['test_loss']:.4f} (the test split read once, for the chosen settings only)",
             f"jobs/train.py flags: {c.settings.train_flags()}"]
    return "\n".join(lines)
