"""The user's environment variables, read in one place; and variables set for a block of code.

Every ``PIPELINES_*`` variable a user may set is read here, by :func:`read_settings` alone, into a
:class:`Settings`; the entry points and the stages' configs read it where they start (the
launching process) and pass each value down as a parameter. (The variables a launcher hands its
ranks are :mod:`pipelines.launch.rankenv`'s.)

=============================  ===========================================================  ==========================
variable                       meaning                                                      default
=============================  ===========================================================  ==========================
``PIPELINES_WORKDIR``          the launching machine's working folder: the notebooks' and   ``~/pipelines-work``
                               benchmarks' samples and runs, and the MLflow store of an
                               output on an object store (``WORKDIR/mlflow/mlruns.db``)
``PIPELINES_CACHE``            the set-up tools' download cache: Debian packages of the     ``~/.cache/pipelines``
                               samples, the offline Xception weights (``CACHE/weights``)
``PIPELINES_TRACKING``         ``0`` (or ``false``, ``no``, ``off``): no MLflow run when    on
                               neither ``--tracking`` nor ``--no-tracking`` is given
``PIPELINES_VERBOSE``          ``1`` (anything but empty or ``0``): ``--verbose`` when the  off
                               flag is not given: TensorFlow's info lines, Spark's INFO
                               log, the known harmless warnings
``PIPELINES_SPARK_LOG_LEVEL``  the log level of the Spark sessions the jobs start           ``WARN``, ``INFO`` with
                               (``ERROR``, ``INFO``, ``DEBUG``, ...)                        ``--verbose``
``PIPELINES_STORAGE_OPTIONS``  storage options, a JSON object (``{"secret_key": "..."}``):  none
                               a stage's ``--storage-option`` values off its command line,
                               which every local user can read (``ps``); the flags win
                               (:func:`pipelines.io.options.gather_options`)
=============================  ===========================================================  ==========================
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, Mapping, Optional

WORKDIR_ENV = "PIPELINES_WORKDIR"
CACHE_ENV = "PIPELINES_CACHE"
TRACKING_ENV = "PIPELINES_TRACKING"
VERBOSE_ENV = "PIPELINES_VERBOSE"
SPARK_LOG_LEVEL_ENV = "PIPELINES_SPARK_LOG_LEVEL"
STORAGE_OPTIONS_ENV = "PIPELINES_STORAGE_OPTIONS"
DEFAULT_WORKDIR = "~/pipelines-work"
DEFAULT_CACHE = "~/.cache/pipelines"


@dataclass(frozen=True)
class Settings:
    """The user's settings from the environment (the table above), read by :func:`read_settings`."""

    workdir: str  #: absolute path (not created here)
    cache: str  #: absolute path (not created here)
    tracking: bool  #: the default of ``--tracking``
    verbose: bool  #: the default of ``--verbose``
    spark_log_level: str  #: "" when unset: the Spark session's level follows ``--verbose``
    #: the JSON text of storage options ("" when unset); never shown (it may hold secrets)
    storage_options: str = field(default="", repr=False)


def read_settings(environ: Optional[Mapping[str, str]] = None) -> Settings:
    """The :class:`Settings` of ``environ`` (default: this process's environment): the one read of
    the variables in this module's table."""
    env = os.environ if environ is None else environ
    return Settings(
        workdir=os.path.abspath(os.path.expanduser(env.get(WORKDIR_ENV) or DEFAULT_WORKDIR)),
        cache=os.path.abspath(os.path.expanduser(env.get(CACHE_ENV) or DEFAULT_CACHE)),
        tracking=env.get(TRACKING_ENV, "1").strip().lower() not in ("0", "false", "no", "off"),
        verbose=env.get(VERBOSE_ENV, "").strip() not in ("", "0"),
        spark_log_level=env.get(SPARK_LOG_LEVEL_ENV, "").strip(),
        storage_options=env.get(STORAGE_OPTIONS_ENV, "").strip())


@contextmanager
def environment(values: Dict[str, str], keep: Iterable[str] = ()) -> Iterator[None]:
    """Set the environment variables ``values`` for the block (for a child process started in it,
    or a library that reads its settings from there); afterwards each of them, and each variable
    named in ``keep`` (one the block may change), has its former value again, or is unset if it was."""
    saved = {key: os.environ.get(key) for key in (*values, *keep)}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
