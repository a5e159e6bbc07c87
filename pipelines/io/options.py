"""Storage options (endpoint, region, credentials) and the ``storage_options`` field of every stage.

A later source wins per key: the environment's JSON, ``--storage-options-file`` (owner-only), ``--storage-option``."""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat
from typing import Any, Dict, Optional, Sequence

from pipelines.io.storage import StorageError
from pipelines.runtime.environment import STORAGE_OPTIONS_ENV, read_settings

STORAGE_OPTION_HELP = ("KEY=VALUE passed to the storage backend of every URI of this stage (repeatable), "
                       "beyond the standard AWS_*/GOOGLE_* environment and config files, e.g. "
                       "endpoint_override=http://host:9000 or region=eu-west-1 for s3:// "
                       "(pyarrow.fs.S3FileSystem's arguments); see pipelines/io/storage.py. A command line is "
                       "visible to every local user: give secrets in --storage-options-file or the environment")
STORAGE_OPTIONS_FILE_HELP = ("a JSON object of storage options, {\"KEY\": \"VALUE\"}, in a file of yours that only "
                             "you may read (chmod 600; refused otherwise): credentials off the command line; "
                             "--storage-option wins for its keys")


def storage_options_field() -> Any:
    """The ``storage_options`` field every stage has: ``{key: value}``, gathered by `gather_given`."""
    return dataclasses.field(default_factory=dict, metadata={
        "help": STORAGE_OPTION_HELP, "flag": "--storage-option", "key_values": True,
        "file_flag": "--storage-options-file", "file_help": STORAGE_OPTIONS_FILE_HELP, "gather": gather_given})


def gather_given(pairs: Sequence[str], path: Optional[str]) -> Dict[str, str]:
    """`gather_options` of a command line's ``pairs``, its options file ``path`` and the environment."""
    return gather_options(pairs, path, read_settings().storage_options)


def parse_options(pairs: Sequence[str]) -> Dict[str, str]:
    """``["region=eu-west-1"]`` -> ``{"region": "eu-west-1"}``; `StorageError` for a bad or repeated key."""
    options: Dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise StorageError(f"--storage-option {pair!r}: expected KEY=VALUE")
        if key in options:
            raise StorageError(f"--storage-option {key} given twice")
        options[key] = value
    return options


def _option_values(given: Any, source: str) -> Dict[str, str]:
    """``{key: str}`` of a JSON object of options from ``source``; messages name keys, never values."""
    if not isinstance(given, dict):
        raise StorageError(f"{source}: expected a JSON object of storage options, {{\"KEY\": \"VALUE\"}}")
    options = {}
    for key, value in given.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif not isinstance(value, (str, int, float)):
            raise StorageError(f"{source}: the value of {key!r} must be a string, number or boolean")
        options[str(key)] = str(value)
    return options


def read_options_file(path: str) -> Dict[str, str]:
    """The storage options in the JSON file ``path`` (links followed), which must be this user's, mode 0600 or 0400."""
    final = os.path.realpath(path)
    shown = path if final == os.path.abspath(path) else f"{path} (-> {final})"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        why = "a dangling link" if os.path.islink(path) and exc.errno == errno.ENOENT else exc.strerror
        raise StorageError(f"--storage-options-file {shown}: {why}") from None
    status = os.fstat(fd)  # the file opened, whatever links led to it
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise StorageError(f"--storage-options-file {shown}: not a regular file")
    with os.fdopen(fd, "rb") as f:
        mode = f"{stat.S_IMODE(status.st_mode):04o}"
        if status.st_uid != os.getuid():
            raise StorageError(f"--storage-options-file {shown}: another user's file (uid {status.st_uid}, "
                               f"mode {mode}); it must be yours, mode 0600 or 0400")
        if status.st_mode & 0o077:
            raise StorageError(f"--storage-options-file {shown}: others may read it (mode "
                               f"{mode}); run chmod 600 {final} first")
        text = f.read()
    try:
        given = json.loads(text)
    except ValueError:
        raise StorageError(f"--storage-options-file {shown}: not JSON") from None
    return _option_values(given, f"--storage-options-file {path}")


def gather_options(pairs: Sequence[str], path: Optional[str] = None, environment: str = "") -> Dict[str, str]:
    """Storage options from ``environment`` (JSON), the file ``path``, then ``pairs``; `StorageError` if malformed."""
    options: Dict[str, str] = {}
    if environment:
        try:
            given = json.loads(environment)
        except ValueError:
            raise StorageError(f"{STORAGE_OPTIONS_ENV}: not JSON") from None
        options.update(_option_values(given, STORAGE_OPTIONS_ENV))
    if path:
        options.update(read_options_file(path))
    options.update(parse_options(pairs))
    return options
