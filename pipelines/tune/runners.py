"""How a search's trials reach Spark, each trial an MLflow child run of the search's run.

A trial that diverges fails and the search goes on; any other exception ends the search."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from pipelines.tune.space import HeadSettings, SearchSpace

log = logging.getLogger("pipelines")
PARENT_TAG = "mlflow.parentRunId"  # MLflow's tag of a child run (mlflow.utils.mlflow_tags.MLFLOW_PARENT_RUN_ID)
#: The trial function a runner gives each Spark task: settings -> the trial's result as a dict
#: (`TrialResult.to_dict`); raises ``TrainingDiverged`` when it diverges.
TrialFunction = Callable[[HeadSettings], Dict]


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the search saw it; ``result`` is ``None`` and ``error`` says why when it failed."""

    number: int
    run_id: str
    settings: HeadSettings
    result: Optional[Dict]
    error: Optional[str] = None


def has_mlflow_spark_study() -> bool:
    """Whether the installed MLflow ships ``mlflow.pyspark.optuna.study.MlflowSparkStudy`` (MLflow 3)."""
    try:
        from mlflow.pyspark.optuna.study import MlflowSparkStudy  # noqa: F401
    except ImportError:
        return False
    return True


def _sampler(seed: int):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.samplers.TPESampler(seed=seed)


def run_mlflow_spark(space: SearchSpace, trial_fn: TrialFunction, trials: int, parallel: int, seed: int,
                     uri: str, experiment_id: str, name: str) -> tuple:
    """The trials through MLflow 3's ``MlflowSparkStudy``: each Spark task asks, trains and tells on its executor.

    Each task copies and reseeds the sampler, so the settings drawn differ from run to run.

    Returns:
        ``(parent run id, [TrialRecord])`` in trial order."""
    from mlflow.optuna.storage import MlflowStorage
    from mlflow.pyspark.optuna.study import MlflowSparkStudy

    from pipelines.training.divergence import TrainingDiverged

    def objective(trial):
        result = trial_fn(space.suggest(trial))
        for key, value in result.items():
            trial.set_user_attr(key, value)
        return result["val_loss"]

    study = MlflowSparkStudy(name, MlflowStorage(experiment_id=experiment_id), sampler=_sampler(seed),
                             mlflow_tracking_uri=uri, direction="minimize")
    study.optimize(objective, n_trials=trials, n_jobs=parallel, catch=(TrainingDiverged,))
    parent = study._storage.get_study_id_from_name(name)  # the study's MLflow run
    records = []
    for frozen in sorted(study.trials, key=lambda t: t.number):
        complete = frozen.state.name == "COMPLETE"
        settings = space.suggest(_fixed(frozen.params))
        records.append(TrialRecord(frozen.number, str(frozen._trial_id), settings,  # MlflowStorage: the run id
                                   dict(frozen.user_attrs) if complete else None,
                                   None if complete else f"trial {frozen.state.name.lower()}"))
    return parent, records


def _fixed(params: Dict):
    import optuna

    return optuna.trial.FixedTrial(params)


def run_ask_tell(space: SearchSpace, trial_fn: TrialFunction, trials: int, parallel: int, seed: int,
                 client, experiment_id: str, name: str, spark) -> tuple:
    """The trials in rounds of ``parallel``: asked and told on the driver (a seed repeats them), trained in Spark."""
    import optuna

    from pipelines.training.divergence import TrainingDiverged

    def task(settings: HeadSettings):
        try:
            return trial_fn(settings), None
        except TrainingDiverged as exc:
            return None, str(exc)

    study = optuna.create_study(direction="minimize", sampler=_sampler(seed), study_name=name)
    parent = client.create_run(experiment_id, run_name=name).info.run_id
    records: List[TrialRecord] = []
    try:
        while len(records) < trials:
            asked = [study.ask() for _ in range(min(parallel, trials - len(records)))]
            settings = [space.suggest(trial) for trial in asked]
            runs = [client.create_run(experiment_id, run_name=f"trial-{t.number}",
                                      tags={PARENT_TAG: parent}).info.run_id for t in asked]
            for run_id, chosen in zip(runs, settings):
                client.log_batch(run_id, params=_params(chosen))
            outcomes = spark.sparkContext.parallelize(settings, len(settings)).map(task).collect()
            for trial, run_id, chosen, (result, error) in zip(asked, runs, settings, outcomes):
                if result is None:
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    client.set_tag(run_id, "error", error[:5000])
                    client.set_terminated(run_id, "FAILED")
                    log.warning("trial %d failed: %s", trial.number, error)
                else:
                    study.tell(trial, result["val_loss"])
                    client.log_batch(run_id, metrics=_metrics(result, "value"))
                    client.set_terminated(run_id, "FINISHED")
                records.append(TrialRecord(trial.number, run_id, chosen, result, error))
    except BaseException:
        client.set_terminated(parent, "FAILED")
        raise
    client.set_terminated(parent, "FINISHED")
    return parent, records


def _params(settings: HeadSettings) -> list:
    from mlflow.entities import Param

    return [Param(key, str(value)) for key, value in settings.to_dict().items()]


def _metrics(values: Dict, value_key: str = "") -> list:
    """MLflow metrics of the numbers in ``values``, the objective under ``value_key``."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(key, float(v), now, 0) for key, v in values.items() if isinstance(v, (int, float))]
    if value_key:
        metrics.append(Metric(value_key, float(values["val_loss"]), now, 0))
    return metrics


def log_trial_metrics(client, records: List[TrialRecord]) -> None:
    """Log each completed trial's result as metrics of its run (``MlflowSparkStudy`` keeps them as tags only)."""
    for record in records:
        if record.result is not None:
            client.log_batch(record.run_id, metrics=_metrics(record.result))
