"""One job's MLflow run: started or continued (``OUTPUT/mlflow_run.json``), logged through a `Tracker`."""
from __future__ import annotations

import contextlib
import inspect
import io
import json
import os
import sys
import warnings
from typing import Any, Dict, Iterable, Iterator, Literal, Optional, Sequence, Tuple

from pipelines.io.atomic import replacing_file
from pipelines.io.storage import Location
from pipelines.io.storage import resolve as resolve_location
from pipelines.runtime.quiet import is_verbose
from pipelines.runtime.redact import redact, redact_text, redact_uri
from pipelines.tracking.options import (
    MODEL_ARTIFACT,
    RUN_FILE,
    TrackingFailed,
    TrackingUnavailable,
    _mlflow,
    _unavailable,
    absolute,
    log,
)
from pipelines.tracking.store import _process_tracking_uri, _set_process_tracking_uri, check_store, open_store


def _experiment_id(client, name: str) -> str:
    """The experiment ``name``, made when missing with the store's default artifact location."""
    experiment = client.get_experiment_by_name(name)
    return experiment.experiment_id if experiment is not None else client.create_experiment(name)


def _run_file(output) -> Location:
    """``OUTPUT/mlflow_run.json`` as a `Location` (``output``: a path, URI or Location)."""
    return (output if isinstance(output, Location) else resolve_location(output)).join(RUN_FILE)


def _write_run_file(output, record: Dict[str, str]) -> None:
    """Write ``OUTPUT/mlflow_run.json`` whole: owner-only on a local disk, one PUT on an object store."""
    location = _run_file(output)
    if not location.local:
        location.write_json(record)
        return
    os.makedirs(os.path.dirname(location.path), exist_ok=True)
    with replacing_file(location.path) as f:  # owner-only
        f.write(json.dumps(record, indent=2, ensure_ascii=False).encode("utf-8"))


def recorded_run(output, uri: str) -> Optional[str]:
    """The run id ``OUTPUT/mlflow_run.json`` keeps when it was logged to ``uri`` (compared masked), else ``None``."""
    try:
        record = _run_file(output).read_json()
    except (FileNotFoundError, ValueError):
        return None
    return record.get("run_id") if record.get("tracking_uri") == redact_uri(absolute(uri)) else None


def start(uri: str, experiment: str, output, run_name: str = "", params: Optional[Dict[str, Any]] = None,
          tags: Optional[Dict[str, Any]] = None, continue_run: bool = False) -> "Tracker":
    """Start this job's MLflow run in ``experiment``, log ``params`` and ``tags``, and record it in the output.

    With ``continue_run``, the run recorded for this ``uri`` continues: params it lacks are logged, changed values
    become ``resumed_with.<param>`` tags (MLflow params are immutable). Secrets are masked (`redact`).

    Raises:
        TrackingUnavailable: the store cannot be reached or opened, or refuses the run."""
    uri = absolute(uri)
    check_store(uri)
    previous_uri = _process_tracking_uri()
    try:
        mlflow = _mlflow()
        client = open_store(uri, create=True)
        experiment_id = _experiment_id(client, experiment)
        run_id = recorded_run(output, uri) if continue_run else None
        existing = _params_of(client, run_id) if run_id else None
        if run_id and existing is None:
            log.info("MLflow run %s of %s is no longer in the store: starting a new one", run_id,
                     redact_text(str(getattr(output, "uri", output))))
            run_id = None
        existing = existing or {}
        with _events():
            active = (mlflow.start_run(run_id=run_id) if run_id else
                      mlflow.start_run(experiment_id=experiment_id, run_name=run_name or None))
    except Exception as exc:
        _set_process_tracking_uri(previous_uri)
        if isinstance(exc, TrackingUnavailable):
            raise
        raise TrackingUnavailable(_unavailable(uri, exc)) from None
    tracker = Tracker(mlflow, active, experiment, output, previous_uri)
    try:
        params = {key: str(value) for key, value in redact(params or {}).items()}
        mlflow.log_params({key: value for key, value in params.items() if key not in existing})
        mlflow.set_tags(redact({**(tags or {}), **{f"resumed_with.{key}": value for key, value in params.items()
                                                   if key in existing and existing[key] != value}}))
        _write_run_file(output, tracker.describe())
    except Exception as exc:
        tracker.__exit__(type(exc), exc, None)
        raise TrackingUnavailable(_unavailable(uri, exc)) from None
    log.info("MLflow run %s %s in experiment '%s' at %s", tracker.run_id, "continued" if run_id else "started",
             experiment, redact_uri(uri))
    return tracker


def _params_of(client, run_id: str) -> Optional[Dict[str, str]]:
    """The params of the live run ``run_id``; ``None`` when the store has no such run."""
    from mlflow.exceptions import MlflowException  # in-function: keeps `import pipelines` free of MLflow

    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    return run.data.params if run.info.lifecycle_stage == "active" else None


class Tracker:
    """This process's MLflow run until its ``with`` block ends: FINISHED, FAILED on an exception (or the class's
    ``run_status``), KILLED on Ctrl-C; a killed process leaves it RUNNING, for a resume to continue."""

    def __init__(self, mlflow, active_run, experiment: str, output: str, previous_uri: Optional[str] = None):
        self._mlflow = mlflow
        self._previous_uri = previous_uri  # the process's tracking URI before this job's
        self._active = active_run
        self.run_id: str = active_run.info.run_id
        self.experiment = experiment
        self.output = output
        self.epoch_error: Optional[str] = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, traceback) -> Literal[False]:
        status = "FINISHED" if exc_type is None else "KILLED" if issubclass(exc_type, KeyboardInterrupt) else \
            getattr(exc_type, "run_status", "FAILED")  # a job's own stop names its status (a preemption: KILLED)
        try:
            with _events():
                self._mlflow.end_run(status)
        except Exception as error:  # the job's own outcome matters more than the run's status
            log.warning("MLflow: could not end run %s as %s (%s)", self.run_id, status, redact_text(str(error)))
        _set_process_tracking_uri(self._previous_uri)  # this job's store is no later job's default
        return False

    def describe(self) -> Dict[str, str]:
        """``run_id``, ``experiment_id``, ``experiment``, ``tracking_uri``, ``artifact_uri``, credentials masked."""
        info = self._active.info
        return {"run_id": self.run_id, "experiment_id": info.experiment_id, "experiment": self.experiment,
                "tracking_uri": redact_uri(self._mlflow.get_tracking_uri()),
                "artifact_uri": redact_uri(info.artifact_uri)}

    def log_epoch(self, epoch: int, logs: Dict[str, float]) -> None:
        """Log one epoch's metrics at ``step=epoch``; never raises (the first failure reported, later ones skipped)."""
        if self.epoch_error:
            return
        try:
            self._mlflow.log_metrics({key: float(value) for key, value in logs.items()}, step=epoch)
        except Exception as exc:
            self.epoch_error = redact_text(f"{type(exc).__name__}: {exc}")
            log.warning("MLflow: could not log epoch %d (%s); training goes on, the epochs are logged with the "
                        "results", epoch, self.epoch_error[:300])

    def log_results(self, metrics: Dict[str, Optional[float]], tags: Optional[Dict[str, Any]] = None,
                    artifacts: Iterable[Tuple[str, Optional[str]]] = (), history: Sequence[Dict] = ()) -> None:
        """Log the epochs of ``history`` the run lacks, ``metrics`` (``None`` left out), ``tags`` and ``artifacts``.

        ``artifacts`` are ``(path, folder in the run's artifacts or None)``, missing files left out.

        Raises:
            TrackingFailed: any of it failed (the job's output was written before)."""
        try:
            self._log_missing_epochs(history)
            self._mlflow.log_metrics({key: float(value) for key, value in metrics.items() if value is not None})
            self._mlflow.set_tags(redact(tags or {}))
            for path, folder in artifacts:
                if os.path.isfile(path):
                    self._mlflow.log_artifact(path, folder)
        except Exception as exc:
            raise TrackingFailed(self._failed("the results", exc)) from exc

    def _log_missing_epochs(self, history: Sequence[Dict]) -> None:
        """Epochs logged by no process (a failure, or a kill between checkpoint and log), by step."""
        if not history:
            return
        probe = next(key for key in history[0] if key != "epoch")
        logged = {m.step for m in self._mlflow.MlflowClient().get_metric_history(self.run_id, probe)}
        for entry in history:
            if entry["epoch"] not in logged:
                self._mlflow.log_metrics({k: float(v) for k, v in entry.items() if k != "epoch"}, step=entry["epoch"])

    def log_model(self, model, example, registered_name: str = "",
                  version_tags: Optional[Dict[str, str]] = None,
                  metadata: Optional[Dict] = None) -> Tuple[str, Optional[str]]:
        """Log a tf.keras ``model`` as HDF5 with MLflow's ``tensorflow`` flavour at ``model/``, and maybe register it.

        Args:
            example: a batch as the model takes it: the input example and the signature's source.
            metadata: for the MLmodel file (``class_names``, which batch inference reads).

        Returns:
            ``(model_uri, version)``: ``runs:/<run_id>/model`` and the registered version, or ``None``.

        Raises:
            TrackingFailed: logging or registering failed (the job's output was written before)."""
        try:
            import mlflow.tensorflow  # in-function, as the next two: `import pipelines` without TF or MLflow
            import tensorflow as tf
            from mlflow.models import infer_signature

            signature = infer_signature(example, model(example, training=False).numpy())
            # MLflow 3 names a logged model `name` (its `artifact_path` is deprecated, with a warning)
            where = "name" if "name" in inspect.signature(mlflow.tensorflow.log_model).parameters else "artifact_path"
            with _quiet_keras(), _events():
                info = mlflow.tensorflow.log_model(
                    model, **{where: MODEL_ARTIFACT}, signature=signature, input_example=example,
                    keras_model_kwargs={"save_format": "h5"}, metadata=metadata,
                    # named, so that MLflow does not reload the model in a subprocess to infer them
                    pip_requirements=[f"tensorflow=={tf.__version__}", f"mlflow=={mlflow.__version__}"])
            version = None
            if registered_name:
                with _events(quiet=True):
                    version = mlflow.register_model(info.model_uri, registered_name, tags=version_tags).version
        except Exception as exc:
            raise TrackingFailed(self._failed("the model", exc)) from exc
        return info.model_uri, version

    def _failed(self, what: str, exc: BaseException) -> str:
        return redact_text(f"MLflow run {self.run_id} at {redact_uri(self._mlflow.get_tracking_uri())}: could not log "
                           f"{what} ({type(exc).__name__}: {' '.join(str(exc).split())[:300]}); the output in "
                           f"{getattr(self.output, 'uri', self.output)} is complete")


@contextlib.contextmanager
def _quiet_keras() -> Iterator[None]:
    """Unless verbose, no Keras progress bars on stdout (MLflow predicts the input example) and no HDF5 warning."""
    from pipelines.stack.kerasapi import keras  # in-function: keeps `import pipelines` free of TensorFlow

    if is_verbose():
        yield
        return
    was = keras.utils.is_interactive_logging_enabled()
    keras.utils.disable_interactive_logging()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="You are saving your model as an HDF5 file")
            yield
    finally:
        if was:
            keras.utils.enable_interactive_logging()


@contextlib.contextmanager
def _events(quiet: bool = False) -> Iterator[None]:
    """MLflow's print-outs in the block, credentials masked (run URLs); ``quiet``: dropped unless verbose."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        if is_verbose() or not quiet:
            sys.stdout.write(redact_text(out.getvalue()))
            sys.stderr.write(redact_text(err.getvalue()))
