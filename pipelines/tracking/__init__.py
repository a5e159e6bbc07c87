"""MLflow tracking of the pipeline's runs: the only package that imports ``mlflow`` (on first use,
:func:`pipelines.tracking.options._mlflow`), besides the search's Optuna integration (:mod:`pipelines.tune.runners`).

Each job is one MLflow run, started by one process (training: rank 0; the ETL: its driver):

- **Store**: ``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``, else a local SQLite store in the
  job's output, ``sqlite:///OUTPUT/mlruns.db``, whose experiments keep their artifacts beside it
  in ``OUTPUT/mlruns/<experiment_id>/`` (no server needed; ``mlflow ui --backend-store-uri`` shows it).
- **Off**: ``--no-tracking``, or the environment's default (:mod:`pipelines.runtime.environment`) when no flag is given.
- **Resume**: the run's id is kept in ``OUTPUT/mlflow_run.json``; a resumed training run continues
  that MLflow run (:func:`start` with ``continue_run``).

A store that cannot be used is refused before the work starts (:class:`TrackingUnavailable`, a
``ValueError``: exit code 2); a failure while logging per-epoch metrics is reported once and never
stops training; a failure to log the results, which are written to the output first, is a
:class:`TrackingFailed` (exit code 1) whose message says the output is complete.

Modules: :mod:`~pipelines.tracking.options` (the options, their URIs and checks, the errors),
:mod:`~pipelines.tracking.store` (refusing, opening and making a store), :mod:`~pipelines.tracking.storeschema`
(a SQLite store's schema, read before MLflow opens it), :mod:`~pipelines.tracking.runs` (a job's run
and its :class:`Tracker`), and :mod:`~pipelines.tracking.pictures` (the pictures of a run's results,
which training logs with its run: matplotlib, never MLflow). The names below are the package's public ones.
"""
from pipelines.tracking.options import (
                                        ARTIFACTS_DIR,
                                        HELP,
                                        MAX_EXPERIMENT_NAME,
                                        MODEL_ARTIFACT,
                                        RUN_FILE,
                                        STORE_FILE,
                                        TrackingFailed,
                                        TrackingUnavailable,
                                        absolute,
                                        artifact_root,
                                        check_model_name,
                                        default_uri,
                                        resolve,
)
from pipelines.tracking.runs import Tracker, recorded_run, start
from pipelines.tracking.store import check_store, open_store, using_store

__all__ = ["ARTIFACTS_DIR", "HELP", "MAX_EXPERIMENT_NAME", "MODEL_ARTIFACT", "RUN_FILE", "STORE_FILE", "Tracker",
           "TrackingFailed", "TrackingUnavailable", "absolute", "artifact_root", "check_model_name", "check_store",
           "default_uri", "open_store", "recorded_run", "resolve", "start", "using_store"]
