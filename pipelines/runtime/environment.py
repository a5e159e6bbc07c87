"""The user's environment variables, read in one place; and variables set for a block of code.

Every ``PIPELINES_*`` variable a user may set is read by ``read_settings`` alone, where a process starts:

- ``PIPELINES_WORKDIR`` (``~/pipelines-work``): the launching machine's working folder.
- ``PIPELINES_CACHE`` (``~/.cache/pipelines``): the set-up tools' download cache.
- ``PIPELINES_TRACKING`` (on): ``0``, ``false``, ``no`` or ``off``: no MLflow run unless ``--tracking``.
- ``PIPELINES_VERBOSE`` (off): anything but empty or ``0``: ``--verbose`` unless the flag is given.
- ``PIPELINES_SPARK_LOG_LEVEL`` (``WARN``, ``INFO`` with ``--verbose``): the jobs' Spark log level.
- ``PIPELINES_STORAGE_OPTIONS`` (none): storage options as a JSON object, off the command line; the flags win."""
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
    """The user's settings from the environment, read by ``read_settings``."""

    workdir: str  #: absolute path (not created here)
    cache: str  #: absolute path (not created here)
    tracking: bool  #: the default of ``--tracking``
    verbose: bool  #: the default of ``--verbose``
    spark_log_level: str  #: "" when unset: the Spark session's level follows ``--verbose``
    #: the JSON text of storage options ("" when unset); never shown (it may hold secrets)
    storage_options: str = field(default="", repr=False)


def read_settings(environ: Optional[Mapping[str, str]] = None) -> Settings:
    """The ``Settings`` of ``environ`` (default ``os.environ``): the one read of this module's variables."""
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
    """Set the variables ``values`` for the block; afterwards they and those named in ``keep`` are restored (or unset)."""
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
