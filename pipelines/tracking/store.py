"""The MLflow store of a job: refused before the work when unusable, opened or made once per process under a lock."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import sqlite3
import subprocess
import sys
import time
from typing import Any, Iterator, Optional, Set

from pipelines.runtime.environment import environment
from pipelines.runtime.quiet import is_verbose
from pipelines.runtime.redact import redact_text, redact_uri
from pipelines.tracking.options import (
    POOL_ENV,
    PROBE_TIMEOUT_S,
    SETUP_LOCK_TIMEOUT_S,
    TrackingUnavailable,
    _is_remote,
    _mlflow,
    _sqlite_path,
    _unavailable,
    absolute,
    artifact_root,
)
from pipelines.tracking.storeschema import schema_refusal


def check_store(uri: str) -> None:
    """Refuse (`TrackingUnavailable`), in seconds, a server that does not answer or an unusable SQLite store.

    A server gets one request without MLflow's retries (minutes of back-off); a SQLite store is checked, not made."""
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


@contextlib.contextmanager
def _quiet_store() -> Iterator[None]:
    """Hide INFO records while a store is opened (alembic's migrations log a dozen lines), unless verbose."""
    if is_verbose():
        yield
        return
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


# SQLite stores this process has opened: MLflow keeps each open for the process (one store object
# and engine per URI, no public API drops them), so a store whose file was deleted since (a
# notebook removed a job's output and runs the job again) is made again in a child (open_store).
_opened: Set[str] = set()


def open_store(uri: str, create: bool = False):
    """An ``mlflow.MlflowClient`` of the store ``uri`` (made absolute), which becomes this process's tracking URI.

    A SQLite store (``create``: made when missing, owner-only) is set up under a lock file (MLflow's has none), from
    its own folder (artifact root `artifact_root`), unpooled (`POOL_ENV`) so a store made again is seen anew. The
    ``$MLFLOW_TRACKING_URI`` that MLflow exports is put back, or a later job or child would take it for the user's.

    Raises:
        TrackingUnavailable: no store (``create`` false), an unreadable, half-made or foreign-schema one."""
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
    """``create``: make the store's folder and an empty owner-only store file (SQLite gives its journals the file's
    mode); else refuse a missing file at once (MLflow would make a new empty store, or retry)."""
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
    """Refuse a store path that is a folder, or whose nearest existing folder this user cannot write."""
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
    """Refuse a store of another MLflow schema by name (`schema_refusal`)."""
    refusal = schema_refusal(path, redact_uri(uri))
    if refusal:
        raise TrackingUnavailable(redact_text(refusal))


def _half_made_advice(uri: str, path: str) -> str:
    return (f"if {path} is a store whose first set-up was interrupted, or of another MLflow version, move it "
            f"aside (or run `mlflow db upgrade {redact_uri(uri)}` if it holds runs you keep) and run again; "
            "or pass --no-tracking")


@contextlib.contextmanager
def _setup_lock(uri: str, path: str) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``ARTIFACT_ROOT/.<store file>.lock``, a file never deleted (that races)."""
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
    """Set up the store ``uri`` again in a fresh interpreter, from the store's folder: its file was deleted after this
    process opened it, and MLflow keeps the first set-up's store object."""
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
    """Yield `open_store`'s client (an existing store) for the block, then put back the process-wide tracking URI
    (else a notebook's predictions after its ETL would look for ``models:/`` in the ETL's store)."""
    previous = _process_tracking_uri()
    try:
        yield open_store(uri)
    finally:
        _set_process_tracking_uri(previous)


def _process_tracking_uri() -> Optional[str]:
    """The URI this process set with ``mlflow.set_tracking_uri`` (``None``: none), told apart from the environment's."""
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
