"""MLflow tracking of the pipeline's runs: the only module that imports ``mlflow`` (on first use).

Each job is one MLflow run, started by one process (training: rank 0; the ETL: its driver):

- **Store**: ``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``, else a local SQLite store in the
  job's output, ``sqlite:///OUTPUT/mlruns.db``, whose experiments keep their artifacts beside it
  in ``OUTPUT/mlruns/<experiment_id>/`` (no server needed; ``mlflow ui --backend-store-uri`` shows it).
- **Off**: ``--no-tracking``, or the environment's default (:mod:`pipelines.environment`) when no flag is given.
- **Resume**: the run's id is kept in ``OUTPUT/mlflow_run.json``; a resumed training run continues
  that MLflow run (:func:`start` with ``continue_run``).

A store that cannot be used is refused before the work starts (:class:`TrackingUnavailable`, a
``ValueError``: exit code 2); a failure while logging per-epoch metrics is reported once and never
stops training; a failure to log the results, which are written to the output first, is a
:class:`TrackingFailed` (exit code 1) whose message says the output is complete.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import inspect
import io
import json
import logging
import os
import sqlite3
import subprocess
import sys
import time
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Optional, Set, Tuple

from pipelines.atomic import replacing
from pipelines.environment import TRACKING_ENV, WORKDIR_ENV, Settings, environment
from pipelines.errors import Refused
from pipelines.quiet import is_verbose
from pipelines.redact import redact, redact_text, redact_uri
from pipelines.storage import Location, is_local, resolve as resolve_location

log = logging.getLogger("pipelines")

STORE_FILE = "mlruns.db"
ARTIFACTS_DIR = "mlruns"  # MLflow's own name for the artifact root of a local store
RUN_FILE = "mlflow_run.json"
# mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH in 2.22 and 3.x (tests/test_tracking.py compares)
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
    """``sqlite:///OUTPUT/mlruns.db``, ``output`` made absolute. An output on an object store (a URI)
    cannot hold a SQLite database: its default store is the launching machine's
    ``WORKDIR/mlflow/mlruns.db`` (``workdir``: :attr:`pipelines.environment.Settings.workdir`), one
    store for all such outputs, each run recorded in its output's ``mlflow_run.json`` as usual. The
    store's folder is made when the store is first opened (:func:`open_store`)."""
    if not is_local(output):
        return SQLITE + os.path.join(workdir, "mlflow", STORE_FILE)
    return SQLITE + os.path.join(os.path.abspath(output), STORE_FILE)


def absolute(uri: str) -> str:
    """A SQLite URI with an absolute path, made against this process's working directory
    (``sqlite:///out/mlruns.db`` -> ``sqlite:////cwd/out/mlruns.db``: ranks, Spark tasks and
    :func:`open_store`, which opens a store from its own folder, start elsewhere); other URIs as
    they are. Applied once where a URI enters: a stage's config (:func:`resolve`), and the stores
    this module opens (``$MLFLOW_TRACKING_URI`` read by batch inference)."""
    if uri.startswith(SQLITE) and not uri.startswith(SQLITE + "/") and uri != SQLITE + ":memory:":
        return SQLITE + os.path.abspath(uri[len(SQLITE):])
    return uri


def resolve(tracking: Optional[bool], uri: str, output: str, experiment: str, settings: Settings) -> Tuple[bool, str]:
    """A stage config's tracking options, settled once where the config is made (the launching
    process: ranks on other hosts may not have its environment).

    Returns ``(enabled, uri)``: ``tracking`` if given, else ``settings.tracking`` (the environment's
    default, :func:`pipelines.environment.read_settings`); the URI ``uri``, else
    ``$MLFLOW_TRACKING_URI``, else :func:`default_uri` (in ``settings.workdir`` for a URI output), a
    SQLite path made absolute (the URI as given when disabled).

    Raises:
        ValueError: while tracking, an empty experiment name, one longer than
            :data:`MAX_EXPERIMENT_NAME`, or a file store the installed MLflow refuses.
    """
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
    """Refuse a file store where the installed MLflow refuses one when the job starts logging:
    MLflow 3's ``FileStore`` ("maintenance mode") unless ``$MLFLOW_ALLOW_FILE_STORE`` is true,
    read through its own ``mlflow.environment_variables``; 2.22 has no such variable and takes it."""
    _mlflow()
    import mlflow.environment_variables as variables

    allowed = getattr(variables, "MLFLOW_ALLOW_FILE_STORE", None)
    if allowed is not None and not allowed.get():
        raise Refused(f"--tracking-uri {redact_uri(uri)}: MLflow {_mlflow().__version__} refuses a file store "
                      "(a folder of runs); give a database such as sqlite:///PATH/mlruns.db (the default), "
                      "or set MLFLOW_ALLOW_FILE_STORE=true")


def check_model_name(name: str, uri: str) -> None:
    """Refuse, before any work or rank starts, a ``--register-model`` name that the installed
    MLflow's registry would refuse at the end of the run, by that MLflow's own rule:
    ``mlflow.utils.validation._validate_model_name`` (2.22 refuses only an empty name; 3.x also a
    blank one, ``/``, ``:``, and a name that is not a normalised relative path, such as ``..``),
    or, for a file store (``uri`` a path or ``file:``), ``mlflow.store.model_registry.file_store``'s
    (no path separator, no ``%``). A tracking server applies its own MLflow's rule, known only
    there. Imports MLflow (seconds): call it only when the option is given. An MLflow without that
    private function is not asked: its registry judges the name at the end, as before.

    Raises:
        Refused: naming the option, the name, MLflow's version and its reason.
    """
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


def check_store(uri: str) -> None:
    """Refuse, in seconds and before any work or rank starts, a store that cannot be used: a
    tracking server that does not answer (one request through MLflow's client, without its
    retries: by default minutes of back-off), or a SQLite store that could not be made or opened
    (checked without MLflow, which retried such a store for about 100 s; nothing is made here), or
    one of another MLflow schema (:mod:`pipelines.storeschema`: another stack's).
    Other stores (files, databases) are opened by :func:`start`, before the job's work too.

    Raises:
        TrackingUnavailable: the server cannot be reached or refuses the request; the SQLite file
            could not be made or opened, or is of another MLflow schema.
    """
    path = _sqlite_path(absolute(uri))
    if path is not None:
        _check_makeable(uri, path)
        if os.path.exists(path):
            _check_readable(uri, path)
            _check_schema(uri, path)
        return
    if not _is_remote(uri):
        return
    try:
        mlflow = _mlflow()
        with environment({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(PROBE_TIMEOUT_S)}):
            mlflow.MlflowClient(uri).search_experiments(max_results=1)
    except Exception as exc:  # MLflow wraps connection errors in its own exception types
        raise TrackingUnavailable(_unavailable(uri, exc)) from None


def _unavailable(uri: str, exc: BaseException, advice: str = "") -> str:
    """The one-line refusal for the store ``uri``, credentials masked (the URI's userinfo, and any
    secret the cause quotes)."""
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


@contextlib.contextmanager
def _quiet_store() -> Iterator[None]:
    """Hide INFO records while a store is opened: creating a SQLite store runs alembic's
    migrations, which configure its logger at INFO and print a dozen lines (unless verbose)."""
    if is_verbose():
        yield
        return
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def artifact_root(uri: str) -> Optional[str]:
    """Where the experiments of a SQLite store keep their artifacts, ``<experiment_id>/`` each:
    beside it (``DIR/mlruns`` for ``sqlite:///DIR/x.db``); ``None`` for other stores (the
    server's ``--default-artifact-root``, or MLflow's default)."""
    path = _sqlite_path(uri)
    return os.path.join(os.path.dirname(path), ARTIFACTS_DIR) if path else None


def _sqlite_path(uri: str) -> Optional[str]:
    """The absolute file of a SQLite store URI (``None``: not a SQLite file store)."""
    if not uri.startswith(SQLITE) or uri == SQLITE + ":memory:":
        return None
    return os.path.abspath(uri[len(SQLITE):].split("?", 1)[0])


# SQLite stores this process has opened: MLflow keeps each open for the process (one store object
# and engine per URI, no public API drops them), so a store whose file was deleted since (a
# notebook removed a job's output and runs the job again) is made again in a child (open_store).
_opened: Set[str] = set()


def open_store(uri: str, create: bool = False):
    """An ``mlflow.MlflowClient`` of the store ``uri`` (made absolute: :func:`absolute`), which
    becomes this process's tracking URI: the fluent API, ``runs:/`` and ``models:/`` URIs and a
    server's proxied artifacts resolve through it.

    A SQLite store (``create``: made when missing, with its folder, owner-only) is set up once
    across processes: jobs starting together on a new store wait on a lock file in its artifact
    folder while the first one creates the schema (MLflow's set-up has no lock of its own: three
    jobs at once broke a new store for good). A store left half-made (a set-up killed midway) is
    refused by name, and so is a store of another MLflow schema, before MLflow would migrate it
    silently (:mod:`pipelines.storeschema`). Its artifact root is the folder beside it
    (:func:`artifact_root`; MLflow gives a new SQLite store ``./mlruns``, so it is opened from its
    own folder), and its connections are not pooled (:data:`POOL_ENV`), so a store deleted and
    made again is seen anew.

    ``mlflow.set_tracking_uri`` also exports ``$MLFLOW_TRACKING_URI``; that is undone, or a later
    job of this process (a notebook's training after its ETL) or its children would take this
    store for the user's choice.

    Raises:
        TrackingUnavailable: no store at the SQLite path (``create`` false), or one that cannot be
            opened or read (at once: MLflow would retry for about 100 s), a half-made store, or one
            of another MLflow schema.
    """
    uri = absolute(uri)
    mlflow = _mlflow()
    _set_process_tracking_uri(uri)
    path = _sqlite_path(uri)
    if path is None:
        return mlflow.MlflowClient(uri)
    _make_or_find(uri, path, create)
    with _setup_lock(uri, path), _quiet_store(), _in_folder(os.path.dirname(path)), \
            environment({POOL_ENV: os.environ.get(POOL_ENV) or "NullPool"}):
        _check_readable(uri, path)
        _check_schema(uri, path)  # before MLflow, which would migrate another stack's store
        if uri in _opened and os.path.getsize(path) == 0:
            _make_in_child(uri, path)
        try:
            client = mlflow.MlflowClient(uri)
            client.search_experiments(max_results=1)  # opens the tracking store: its schema made now
            client.search_registered_models(max_results=1)  # and the registry's, under this lock
        except Exception as exc:
            raise TrackingUnavailable(_unavailable(uri, exc, _half_made_advice(uri, path))) from None
    _opened.add(uri)
    return client


def _make_or_find(uri: str, path: str, create: bool) -> None:
    """``create``: make the store's folder (owner-only when made here) and an empty owner-only
    store file (SQLite gives its journals the file's mode); else refuse a missing file at once
    (MLflow would make a new empty store, or retry for about 100 s where the folder is missing)."""
    if create:
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        except OSError as exc:
            raise TrackingUnavailable(_unavailable(uri, exc, "choose a folder this user can write")) from None
    elif not os.path.isfile(path):
        raise TrackingUnavailable(_unavailable(uri, FileNotFoundError(f"no store file {path}"),
                                               "give the store the job logged to (its output's mlflow_run.json "
                                               "names it), absolute or relative to here"))


def _check_makeable(uri: str, path: str) -> None:
    """Refuse a store path that is a folder, or whose nearest existing folder this user cannot
    write (the file, or the folders down to it, could not be made)."""
    folder = os.path.dirname(path)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    problem = (f"{path} is a folder" if os.path.isdir(path) else
               f"{folder} is not a folder" if not os.path.isdir(folder) else
               f"{folder} is not writable by this user" if not os.access(folder, os.W_OK | os.X_OK)
               and not os.path.isfile(path) else "")
    if problem:
        raise TrackingUnavailable(_unavailable(uri, OSError(problem), "choose a folder this user can write"))


def _check_readable(uri: str, path: str) -> None:
    """Refuse at once a file SQLite cannot read or write (MLflow retries for about 100 s)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=60)) as db:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        raise TrackingUnavailable(_unavailable(uri, exc, f"{path} is not a SQLite database this user can "
                                                         "write")) from None


def _check_schema(uri: str, path: str) -> None:
    """Refuse a store of another MLflow schema by name (:func:`pipelines.storeschema.schema_refusal`)."""
    from pipelines.storeschema import schema_refusal

    refusal = schema_refusal(path, redact_uri(uri))
    if refusal:
        raise TrackingUnavailable(redact_text(refusal))


def _half_made_advice(uri: str, path: str) -> str:
    return (f"if {path} is a store whose first set-up was interrupted, or of another MLflow version, move it "
            f"aside (or run `mlflow db upgrade {redact_uri(uri)}` if it holds runs you keep) and run again; "
            "or pass --no-tracking")


@contextlib.contextmanager
def _setup_lock(uri: str, path: str) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``ARTIFACT_ROOT/.<store file>.lock`` (a folder the ETL's
    output check knows as ours; the lock file is never deleted: deleting a lock file races)."""
    root = artifact_root(uri)
    os.makedirs(root, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(root, f".{os.path.basename(path)}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + SETUP_LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    raise TrackingUnavailable(_unavailable(uri, exc, "another process holds the store's set-up "
                                                                     "lock: is a job stuck?")) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def _make_in_child(uri: str, path: str) -> None:
    """Set up the store ``uri`` again in a fresh interpreter: its file was deleted after this
    process opened it, and MLflow keeps the first set-up's store object for the process (it would
    find no tables). Through MLflow's public client; the child's working directory is the store's
    folder, as for :func:`open_store`."""
    script = "import sys, mlflow; mlflow.MlflowClient(sys.argv[1]).search_experiments(max_results=1)"
    done = subprocess.run([sys.executable, "-c", script, uri], cwd=os.path.dirname(path), capture_output=True,
                          text=True)
    if is_verbose():  # its migrations' lines, as an in-process set-up shows them
        sys.stderr.write(done.stdout + done.stderr)
    if done.returncode:
        raise TrackingUnavailable(_unavailable(uri, RuntimeError(done.stderr.strip().splitlines()[-1:]),
                                               "the store could not be made again"))


@contextlib.contextmanager
def using_store(uri: str) -> Iterator[Any]:
    """:func:`open_store` (an existing store) for the block only: afterwards this process's
    tracking URI is what it was before (``mlflow.set_tracking_uri`` is process-wide, so a job's
    store would otherwise stay the default of every later job in the process: a notebook's
    predictions after its ETL would look for ``models:/`` in the ETL's store). Yields the client.

    Raises:
        TrackingUnavailable: as :func:`open_store`.
    """
    previous = _process_tracking_uri()
    try:
        yield open_store(uri)
    finally:
        _set_process_tracking_uri(previous)


def _process_tracking_uri() -> Optional[str]:
    """The URI this process set with ``mlflow.set_tracking_uri`` (``None``: none; then
    ``$MLFLOW_TRACKING_URI`` or MLflow's default applies), told apart from the environment's by
    asking MLflow's public ``is_tracking_uri_set`` with that variable hidden."""
    mlflow = _mlflow()
    with environment({}, keep=("MLFLOW_TRACKING_URI",)):
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        return mlflow.get_tracking_uri() if mlflow.tracking.is_tracking_uri_set() else None


def _set_process_tracking_uri(uri: Optional[str]) -> None:
    """Set (``None``: unset) this process's tracking URI, leaving ``$MLFLOW_TRACKING_URI`` as it is."""
    with environment({}, keep=("MLFLOW_TRACKING_URI",)):
        _mlflow().set_tracking_uri(uri)


@contextlib.contextmanager
def _in_folder(folder: Optional[str]) -> Iterator[None]:
    """Run the block with ``folder`` as the working directory (``None``: where it is)."""
    if folder is None:
        yield
        return
    previous = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def _experiment_id(client, name: str) -> str:
    """The experiment ``name``, made when missing with the store's default artifact location."""
    experiment = client.get_experiment_by_name(name)
    return experiment.experiment_id if experiment is not None else client.create_experiment(name)


def _run_file(output) -> Location:
    """``OUTPUT/mlflow_run.json`` as a :class:`pipelines.storage.Location` (``output``: a path, URI
    or Location)."""
    return (output if isinstance(output, Location) else resolve_location(output)).join(RUN_FILE)


def _write_run_file(output, record: Dict[str, str]) -> None:
    """Write ``OUTPUT/mlflow_run.json`` whole: owner-only on a local disk (it says where the run's
    store is), one PUT on an object store (whose access rules apply)."""
    location = _run_file(output)
    if not location.local:
        location.write_json(record)
        return
    os.makedirs(os.path.dirname(location.path), exist_ok=True)
    with replacing(location.path) as tmp:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2, ensure_ascii=False)
        os.chmod(tmp, 0o600)  # a temporary file made before this open keeps its own mode


def recorded_run(output, uri: str) -> Optional[str]:
    """The run id kept in ``OUTPUT/mlflow_run.json`` (``output``: a path, URI or
    :class:`pipelines.storage.Location`) when it was logged to ``uri``, else ``None`` (the file
    keeps the URI with its credentials masked: :func:`pipelines.redact.redact_uri`)."""
    try:
        record = _run_file(output).read_json()
    except (FileNotFoundError, ValueError):
        return None
    return record.get("run_id") if record.get("tracking_uri") == redact_uri(absolute(uri)) else None


def start(uri: str, experiment: str, output, run_name: str = "", params: Optional[Dict[str, Any]] = None,
          tags: Optional[Dict[str, Any]] = None, continue_run: bool = False) -> "Tracker":
    """Start this job's MLflow run in ``experiment`` (made when missing, its artifacts beside a
    SQLite store: :func:`artifact_root`), log ``params`` and ``tags``, and record the run in
    ``OUTPUT/mlflow_run.json`` (``output``: a path, URI or :class:`pipelines.storage.Location`).
    With ``continue_run``, the run recorded there for this ``uri`` continues (a resumed training
    run): only params it lacks are logged, changed values become ``resumed_with.<param>`` tags
    (MLflow params are immutable). Use the result in a ``with`` block, which ends the run.

    Params, tags, the run file and every message have secrets masked (:func:`pipelines.redact.redact`:
    values of secret-looking keys such as ``storage_options.secret_key``, a URI's userinfo).

    Raises:
        TrackingUnavailable: the store cannot be reached or opened, or refuses the run.
    """
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
    """The params of the live run ``run_id``; ``None`` when the store has no such run (deleted
    ones included)."""
    from mlflow.exceptions import MlflowException  # in-function: keeps `import pipelines` free of MLflow

    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    return run.data.params if run.info.lifecycle_stage == "active" else None


class Tracker:
    """This process's MLflow run, from :func:`start` to the end of its ``with`` block: FINISHED,
    or FAILED when the block raises (KILLED on Ctrl-C). A killed process leaves it RUNNING, for a
    resumed run to continue."""

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

    def __exit__(self, exc_type, exc, traceback) -> bool:
        status = "FINISHED" if exc_type is None else "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
        try:
            with _events():
                self._mlflow.end_run(status)
        except Exception as error:  # the job's own outcome matters more than the run's status
            log.warning("MLflow: could not end run %s as %s (%s)", self.run_id, status, redact_text(str(error)))
        _set_process_tracking_uri(self._previous_uri)  # this job's store is no later job's default
        return False

    def describe(self) -> Dict[str, str]:
        """Where the run is: ``run_id``, ``experiment_id``, ``experiment``, ``tracking_uri``, ``artifact_uri``
        (credentials masked: this goes into files)."""
        info = self._active.info
        return {"run_id": self.run_id, "experiment_id": info.experiment_id, "experiment": self.experiment,
                "tracking_uri": redact_uri(self._mlflow.get_tracking_uri()),
                "artifact_uri": redact_uri(info.artifact_uri)}

    def log_epoch(self, epoch: int, logs: Dict[str, float]) -> None:
        """Log one epoch's metrics at ``step=epoch``. Never raises: the first failure is reported
        and later epochs are skipped (:meth:`log_results` logs the epochs the run lacks)."""
        if self.epoch_error:
            return
        try:
            self._mlflow.log_metrics({key: float(value) for key, value in logs.items()}, step=epoch)
        except Exception as exc:
            self.epoch_error = redact_text(f"{type(exc).__name__}: {exc}")
            log.warning("MLflow: could not log epoch %d (%s); training goes on, the epochs are logged with the "
                        "results", epoch, self.epoch_error[:300])

    def log_results(self, metrics: Dict[str, Optional[float]], tags: Optional[Dict[str, Any]] = None,
                    artifacts: Iterable[Tuple[str, Optional[str]]] = (), history: List[Dict] = ()) -> None:
        """Log the job's results: the epochs of ``history`` (``{"epoch": n, metric: value}``) the
        run lacks, ``metrics`` (``None`` values left out), ``tags``, and each existing file of
        ``artifacts`` as ``(path, folder in the run's artifacts, None = top)``.

        Raises:
            TrackingFailed: any of it failed (the job's output was written before).
        """
        try:
            self._log_missing_epochs(history)
            self._mlflow.log_metrics({key: float(value) for key, value in metrics.items() if value is not None})
            self._mlflow.set_tags(redact(tags or {}))
            for path, folder in artifacts:
                if os.path.isfile(path):
                    self._mlflow.log_artifact(path, folder)
        except Exception as exc:
            raise TrackingFailed(self._failed("the results", exc)) from exc

    def _log_missing_epochs(self, history: List[Dict]) -> None:
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
        """Log a tf.keras (Keras 2) ``model`` with MLflow's ``tensorflow`` flavour at ``model/``,
        in HDF5 (SavedModel takes ~30 s more to write), with the signature inferred from
        ``example`` (a batch as the model takes it) and the model's output on it, ``example``
        as the input example, and ``metadata`` in its MLmodel file (training puts ``class_names``
        there: ``jobs/predict.py`` reads them); with ``registered_name``, register it as a new version tagged
        ``version_tags``. ``mlflow.tensorflow.load_model(uri)`` gives the Keras model back,
        ``mlflow.pyfunc.load_model(uri)`` a pyfunc model.

        Returns:
            ``(model_uri, version)``: ``runs:/<run_id>/model`` and the registered version (``None``
            when not registered).

        Raises:
            TrackingFailed: logging or registering failed (the job's output was written before).
        """
        mlflow = self._mlflow
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
    """Unless verbose: no Keras progress bars (MLflow predicts the input example to validate it,
    and they would print to stdout) and no warning that HDF5 is a legacy format (chosen here)."""
    from pipelines.kerasapi import keras  # in-function: keeps `import pipelines` free of TensorFlow

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
    """MLflow's event lines in the block, credentials masked: MLflow prints them to ``sys.stdout``
    and ``sys.stderr`` as they are at the time of each line (ending a run on a server prints
    "View run ... at: http://user:password@host/..." to stdout), so the block's are caught and
    written on, each to its stream, redacted (:func:`pipelines.redact.redact_text`); with
    ``quiet``, unless verbose, dropped (registering prints two lines, which our log says).
    Logging handlers keep the stream they were made with."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        if is_verbose() or not quiet:
            sys.stdout.write(redact_text(out.getvalue()))
            sys.stderr.write(redact_text(err.getvalue()))
