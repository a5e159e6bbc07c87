"""MLflow tracking, one run per job: the only package importing ``mlflow``, besides `pipelines.tune.runners`."""
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
