"""The tracking options of every stage: help, defaults, URI resolution, the checks that need no store, the package's
errors and its one import of ``mlflow`` (`_mlflow`)."""
from __future__ import annotations

import logging
import os
from typing import Optional, Tuple

from pipelines.io.storage import is_local
from pipelines.runtime.environment import TRACKING_ENV, WORKDIR_ENV, Settings
from pipelines.runtime.errors import Refused
from pipelines.runtime.quiet import is_verbose
from pipelines.runtime.redact import redact_text, redact_uri

log = logging.getLogger("pipelines")
STORE_FILE = "mlruns.db"
ARTIFACTS_DIR = "mlruns"  # MLflow's own name for the artifact root of a local store
RUN_FILE = "mlflow_run.json"
# mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH in 2.22 and 3.x (tests/unit/tracking/test_tracking.py compares)
MAX_EXPERIMENT_NAME = 500
MODEL_ARTIFACT = "model"  # runs:/<run_id>/model
PROBE_TIMEOUT_S = 10
SETUP_LOCK_TIMEOUT_S = 300  # a first set-up takes seconds; a holder this slow is stuck
POOL_ENV = "MLFLOW_SQLALCHEMYSTORE_POOLCLASS"  # MLflow's public setting (mlflow.environment_variables)


# Help of the tracking options, the same in every stage's config.
HELP = {
    "tracking": f"log the run to MLflow (default: on, unless {TRACKING_ENV}=0; --no-tracking turns it off)",
    "tracking_uri": f"MLflow tracking URI, e.g. http://HOST:5000 (default: $MLFLOW_TRACKING_URI, else "
                    f"sqlite:///OUTPUT/{STORE_FILE} with the artifacts in OUTPUT/{ARTIFACTS_DIR}; for an s3:// "
                    f"(or other URI) OUTPUT, sqlite:///WORKDIR/mlflow/{STORE_FILE} on this machine, WORKDIR = ${WORKDIR_ENV} or "
                    f"~/pipelines-work)",
    "experiment": "MLflow experiment of the run (made when missing)",
    "run_name": "MLflow run name (default: one MLflow makes up)",
}


class TrackingUnavailable(Refused):
    """The tracking store cannot be used; raised before the job's work starts (exit code 2)."""


class TrackingFailed(RuntimeError):
    """Logging the results failed after the job wrote its output, which is complete (exit code 1)."""


SQLITE = "sqlite:///"


def default_uri(output: str, workdir: str) -> str:
    """``sqlite:///OUTPUT/mlruns.db``, ``output`` made absolute; ``WORKDIR/mlflow/mlruns.db`` for a URI output."""
    if not is_local(output):
        return SQLITE + os.path.join(workdir, "mlflow", STORE_FILE)
    return SQLITE + os.path.join(os.path.abspath(output), STORE_FILE)


def absolute(uri: str) -> str:
    """A SQLite URI's path made absolute (ranks, Spark tasks, `open_store` start elsewhere); other URIs as they are."""
    if uri.startswith(SQLITE) and not uri.startswith(SQLITE + "/") and uri != SQLITE + ":memory:":
        return SQLITE + os.path.abspath(uri[len(SQLITE):])
    return uri


def resolve(tracking: Optional[bool], uri: str, output: str, experiment: str, settings: Settings) -> Tuple[bool, str]:
    """A stage config's ``(enabled, uri)``, settled once in the launching process (ranks may lack its environment).

    ``enabled``: ``tracking`` if given, else ``settings.tracking``. ``uri``: ``uri``, else ``$MLFLOW_TRACKING_URI``,
    else `default_uri`; a SQLite path made absolute.

    Raises:
        ValueError: while tracking, an empty experiment name, one longer than `MAX_EXPERIMENT_NAME`, or a file
            store the installed MLflow refuses."""
    if tracking is None:
        tracking = settings.tracking
    if not tracking:
        return False, uri
    if not experiment:
        raise Refused("--experiment must not be empty (or pass --no-tracking)")
    if len(experiment) > MAX_EXPERIMENT_NAME:  # MLflow would refuse it only when the job logs
        raise Refused(f"--experiment is {len(experiment)} characters long: MLflow takes at most {MAX_EXPERIMENT_NAME}")
    uri = absolute(uri or os.environ.get("MLFLOW_TRACKING_URI", "") or default_uri(output, settings.workdir))
    if _is_file_store(uri):
        _check_file_store(uri)
    return True, uri


def _is_file_store(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file:")


def _check_file_store(uri: str) -> None:
    """Refuse a file store the installed MLflow refuses: MLflow 3's unless ``$MLFLOW_ALLOW_FILE_STORE`` is true."""
    _mlflow()
    import mlflow.environment_variables as variables

    allowed = getattr(variables, "MLFLOW_ALLOW_FILE_STORE", None)
    if allowed is not None and not allowed.get():
        raise Refused(f"--tracking-uri {redact_uri(uri)}: MLflow {_mlflow().__version__} refuses a file store "
                      "(a folder of runs); give a database such as sqlite:///PATH/mlruns.db (the default), "
                      "or set MLFLOW_ALLOW_FILE_STORE=true")


def check_model_name(name: str, uri: str) -> None:
    """Refuse (`Refused`) before any work a ``--register-model`` name MLflow's registry refuses (imports MLflow)."""
    _mlflow()  # its logging quieted before its modules load
    from mlflow.exceptions import MlflowException

    try:
        if _is_file_store(uri):
            from mlflow.store.model_registry.file_store import _validate_model_name
        else:
            from mlflow.utils.validation import _validate_model_name
    except ImportError:
        return
    try:
        _validate_model_name(name)
    except MlflowException as exc:
        raise Refused(f"--register-model {name!r}: MLflow {_mlflow().__version__}'s registry refuses the name: "
                      f"{exc.message}") from None


def _is_remote(uri: str) -> bool:
    return uri.split(":", 1)[0].lower() in ("http", "https")


def _unavailable(uri: str, exc: BaseException, advice: str = "") -> str:
    """The one-line refusal for the store ``uri``, credentials masked (the URI's and any the cause quotes)."""
    cause = " ".join(str(exc).split())
    if len(cause) > 300:
        cause = cause[:300] + " ..."
    advice = advice or "start the server or fix --tracking-uri / MLFLOW_TRACKING_URI, or pass --no-tracking"
    return redact_text(f"MLflow tracking store {redact_uri(uri)} cannot be used ({type(exc).__name__}: {cause}): "
                       f"{advice}")


def _mlflow():
    """``mlflow``, imported on first use, its INFO lines hidden unless ``--verbose``."""
    import mlflow  # in-function: keeps `import pipelines` free of MLflow

    if not is_verbose():
        logging.getLogger("mlflow").setLevel(logging.WARNING)
    return mlflow


def artifact_root(uri: str) -> Optional[str]:
    """Where a SQLite store's experiments keep artifacts (``DIR/mlruns`` for ``sqlite:///DIR/x.db``) or ``None``."""
    path = _sqlite_path(uri)
    return os.path.join(os.path.dirname(path), ARTIFACTS_DIR) if path else None


def _sqlite_path(uri: str) -> Optional[str]:
    """The absolute file of a SQLite store URI (``None``: not a SQLite file store)."""
    if not uri.startswith(SQLITE) or uri == SQLITE + ":memory:":
        return None
    return os.path.abspath(uri[len(SQLITE):].split("?", 1)[0])
