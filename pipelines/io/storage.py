"""Storage: every path a URI, resolved once into a filesystem and a path (the one place that does).

``resolve("s3://bucket/runs/etl")``, ``resolve("/data/etl")`` and ``resolve("file:///data/etl")``
each give a :class:`Location`: a ``pyarrow.fs`` filesystem and the path on it. pyarrow's native
filesystems serve ``file``, ``s3``, ``gs``/``gcs`` and ``hdfs``; any other scheme fsspec knows
(``abfs``/``az`` with adlfs, ``memory``, ...) is wrapped with ``pyarrow.fs.FSSpecHandler``. There is
no S3 client code of ours: credentials, region and endpoint come the standard way (``AWS_*``
environment variables, ``~/.aws`` files, ``AWS_ENDPOINT_URL``), and ``--storage-option KEY=VALUE``
passes what a backend needs beyond that to its constructor (``pyarrow.fs.S3FileSystem(**options)``,
``GcsFileSystem``, ``HadoopFileSystem``, or ``fsspec.filesystem(scheme, **options)``), gathered
by :mod:`pipelines.io.options`.

A :class:`Location` pickles (Spark closures, Horovod ranks) and is rebuilt nowhere else.

Object stores have no rename and no folders: a single object written in one call appears whole or
not at all (S3, GCS, Azure: a PUT is atomic), which is what :meth:`Location.write_bytes` relies on
there; on local disks it writes a temporary file and renames it (:mod:`pipelines.io.atomic`). A folder
on an object store is a key prefix: it "exists" when an object lies under it.
"""
from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Tuple
from urllib.parse import urlparse

import pyarrow.fs as pafs

from pipelines.io.atomic import replacing_file
from pipelines.runtime.errors import Refused

# pyarrow 14's threaded copy_files hangs for good copying a folder of some twenty files to S3 (5 went
# through, 20 never did, against moto_server): one file after another is slower but finishes.
COPY_THREADS = False

# Schemes served by pyarrow's own filesystems; the rest go through fsspec.
PYARROW_SCHEMES = ("file", "s3", "gs", "hdfs", "viewfs")  # gcs:// is read as gs:// (split_uri)


class StorageError(Refused):
    """A path or URI that cannot be used: unknown scheme, missing bucket, refused credentials, a
    backend that is not installed, a malformed ``--storage-option``. The message says which and why."""


def _typed(value: str) -> Any:
    """Option values arrive as strings; backends want booleans and numbers for some keys."""
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return float(value) if "." in value else int(value)
    except ValueError:
        return value


def scheme_of(uri: str) -> str:
    """``"s3"`` for ``s3://b/k``; ``"file"`` for a local path or a ``file://`` URL. A Windows-style
    drive letter never occurs here (POSIX only), so ``x:`` with one letter is not special-cased."""
    parsed = urlparse(uri)
    return parsed.scheme.lower() if parsed.scheme and "://" in uri else "file"


def is_local(uri: str) -> bool:
    """True for a local path or a ``file://`` URL (what Spark tasks on other hosts cannot reach,
    unless the folder is a shared mount)."""
    return scheme_of(uri) == "file"


@dataclass(frozen=True)
class Location:
    """A file or folder on some filesystem: ``filesystem`` (``pyarrow.fs.FileSystem``) and ``path``
    on it (absolute for local disks, ``bucket/key`` for object stores, no trailing ``/``).

    ``scheme`` and ``options`` say how it was resolved, so :meth:`join` and :attr:`uri` need no
    second resolution. Equality and hashing use the URI.
    """

    filesystem: pafs.FileSystem = field(compare=False, repr=False)
    path: str
    scheme: str = "file"
    options: Tuple[Tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def local(self) -> bool:
        return self.scheme == "file"

    @property
    def uri(self) -> str:
        """The path for local files (what users typed, made absolute), ``scheme://path`` otherwise."""
        return self.path if self.local else f"{self.scheme}://{self.path}"

    def __str__(self) -> str:
        return self.uri

    def join(self, *parts: str) -> "Location":
        """The location of ``parts`` below this one (``/``-separated on every backend)."""
        return Location(self.filesystem, posixpath.join(self.path, *parts), self.scheme, self.options)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def parent(self) -> "Location":
        return Location(self.filesystem, posixpath.dirname(self.path), self.scheme, self.options)

    def relative_to(self, other: "Location") -> str:
        """This path relative to ``other`` (``a/b.parquet``). Raises ValueError when not below it."""
        prefix = other.path.rstrip("/") + "/"
        if not self.path.startswith(prefix):
            raise ValueError(f"{self.uri} is not below {other.uri}")
        return self.path[len(prefix):]

    def info(self) -> pafs.FileInfo:
        return self.filesystem.get_file_info(self.path)

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self.info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        return self.info().type == pafs.FileType.Directory

    def list(self, recursive: bool = True) -> List[pafs.FileInfo]:
        """Every file and folder below this folder (``FileInfo`` with ``path``, ``type``,
        ``size``), sorted by path; ``[]`` when the folder does not exist."""
        selector = pafs.FileSelector(self.path, recursive=recursive, allow_not_found=True)
        return sorted(self.filesystem.get_file_info(selector), key=lambda i: i.path)

    def files(self, suffix: str = "") -> List["Location"]:
        """The files directly in this folder whose names end with ``suffix`` and do not start with
        ``_`` or ``.`` (Spark's and Hadoop's hidden files), sorted by name."""
        return [self.join(posixpath.basename(i.path)) for i in self.list(recursive=False)
                if i.type == pafs.FileType.File and i.base_name.endswith(suffix)
                and not i.base_name.startswith(("_", "."))]

    def read_bytes(self) -> bytes:
        """The whole file. Raises FileNotFoundError when it does not exist."""
        if not self.is_file():
            raise FileNotFoundError(f"no such file: {self.uri}")
        with self.filesystem.open_input_stream(self.path) as f:
            return f.read()

    def read_json(self) -> Any:
        """The file parsed as UTF-8 JSON. Raises FileNotFoundError, json.JSONDecodeError."""
        return json.loads(self.read_bytes().decode("utf-8"))

    def write_bytes(self, data: bytes) -> None:
        """Write the file whole or not at all: a temporary file renamed on local disks, one PUT on
        object stores (atomic there); parent folders are created as needed."""
        if self.local:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with replacing_file(self.path) as f:
                f.write(data)
            return
        with self.filesystem.open_output_stream(self.path) as f:
            f.write(data)

    def write_json(self, value: Any, indent: int = 2) -> None:
        """Write ``value`` as UTF-8 JSON (non-ASCII kept as is), whole or not at all."""
        self.write_bytes(json.dumps(value, indent=indent, ensure_ascii=False).encode("utf-8"))

    def makedirs(self) -> None:
        """Create the folder (a no-op on object stores, where folders are key prefixes)."""
        if self.local:
            os.makedirs(self.path, exist_ok=True)

    def delete(self) -> None:
        """Remove this file, or this folder and everything below it; nothing when it is missing."""
        kind = self.info().type
        if kind == pafs.FileType.Directory:
            self.filesystem.delete_dir(self.path)
        elif kind == pafs.FileType.File:
            self.filesystem.delete_file(self.path)

    def upload(self, local_path: str) -> None:
        """Copy the local file or folder ``local_path`` to this location (a folder recursively)."""
        if self.local and os.path.abspath(local_path) == self.path:
            return
        if os.path.isdir(local_path):
            self.makedirs()
        else:
            self.parent.makedirs()
        pafs.copy_files(local_path, self.path, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=self.filesystem, use_threads=COPY_THREADS)

    def download(self, local_path: str) -> None:
        """Copy this file or folder to the local ``local_path`` (parents created)."""
        if self.local and os.path.abspath(local_path) == self.path:
            return
        os.makedirs(os.path.dirname(os.path.abspath(local_path)), exist_ok=True)
        if self.is_dir():
            os.makedirs(local_path, exist_ok=True)
        pafs.copy_files(self.path, local_path, source_filesystem=self.filesystem,
                        destination_filesystem=pafs.LocalFileSystem(), use_threads=COPY_THREADS)


def split_uri(uri: str) -> Tuple[str, str]:
    """The one parse of a path or URI: ``(scheme, path)``, whatever ``--storage-option`` says.

    A local path (or ``file://`` URL) gives ``("file", absolute path)`` (``~`` expanded); any other
    URI gives its scheme (lower case, ``gcs`` as ``gs``) and everything after ``scheme://`` taken
    literally, trailing ``/`` dropped: ``s3://bkt/my photos/a%20b#c?d`` is bucket ``bkt``, key
    ``my photos/a%20b#c?d``. Object keys are bytes, not URL parts: nothing is percent-decoded and
    nothing is refused as "not a URL", as the AWS CLI and s3fs read them (pyarrow's own
    ``FileSystem.from_uri`` reads them as RFC 3986 URIs: it refuses a space and decodes ``%20``, so
    one string named two keys depending on whether options were given).
    """
    scheme = scheme_of(uri)
    if scheme == "file":
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        return "file", os.path.abspath(os.path.expanduser(path))
    rest = uri.split("://", 1)[1].rstrip("/")
    return ("gs" if scheme == "gcs" else scheme), rest


def root_refusal(uri: str) -> Optional[str]:
    """Why ``uri`` may not be a job's output folder, or ``None``: a bucket's (or container's, or
    a file system's) root, the local root ``/``, a mount point, a home folder (this user's or any
    account's) or a folder above one. A job's output holds its own files beside whatever else lies there, and replacing or
    cleaning it must never reach another job's or user's files: an output is a folder of its own.
    """
    scheme, path = split_uri(uri)
    if scheme == "file":
        if path == "/":
            return "the file system's root"
        for home in sorted(_home_folders()):
            if home == path or home.startswith(path + "/"):
                return f"a home folder ({home})" if home == path else f"a folder above a home folder ({home})"
        if os.path.ismount(path):
            return "a mount point (a file system's root)"
        return None
    if scheme in ("hdfs", "viewfs"):
        return None if urlparse(f"{scheme}://{path}").path.strip("/") else "the file system's root"
    return None if "/" in path.strip("/") else f"the root of bucket {path.strip('/')!r}"


def _home_folders() -> set:
    """This user's home folder and every account's (``/etc/passwd``), as absolute paths."""
    import pwd

    homes = {os.path.abspath(os.path.expanduser("~"))}
    homes.update(os.path.abspath(p.pw_dir) for p in pwd.getpwall() if p.pw_dir.startswith("/") and p.pw_dir != "/")
    return homes


def check_not_root(uri: str, what: str) -> None:
    """Refuse a root as an output (:func:`root_refusal`), before any work starts.

    Raises:
        StorageError: the message names the option, the URI and which root it is.
    """
    why = root_refusal(uri)
    if why:
        raise StorageError(f"{what} {uri} is {why}: give a folder of its own below it "
                           f"(e.g. {uri.rstrip('/')}/etl); a job replaces and cleans its output folder")


def _pyarrow_filesystem(scheme: str, path: str, options: Mapping[str, str]) -> pafs.FileSystem:
    """pyarrow's filesystem for ``scheme``; ``path`` is :func:`split_uri`'s (bucket or host first)."""
    head = path.split("/", 1)[0]
    if not options:
        # Only the bucket (or host) goes through pyarrow's URI parser: its names are URL-safe, and
        # the key is never parsed there (see split_uri).
        return pafs.FileSystem.from_uri(f"{scheme}://{head}")[0]
    typed = {key: _typed(value) for key, value in options.items()}
    if scheme == "s3":
        return pafs.S3FileSystem(**typed)
    if scheme == "gs":
        return pafs.GcsFileSystem(**typed)
    if scheme in ("hdfs", "viewfs"):
        parsed = urlparse(f"{scheme}://{head}")
        host = f"{scheme}://{parsed.hostname}" if parsed.hostname else "default"
        return pafs.HadoopFileSystem(host, parsed.port or 8020, **typed)
    raise StorageError(f"{scheme}://{path}: --storage-option is not used for local files")


def _fsspec_filesystem(scheme: str, uri: str, options: Mapping[str, str]) -> Tuple[pafs.FileSystem, str]:
    import fsspec

    try:
        cls = fsspec.get_filesystem_class(scheme)
    except ValueError:
        raise StorageError(f"{uri}: unknown scheme {scheme!r} (use a local path, file://, s3://, gs://, "
                           "hdfs://, or a scheme of an installed fsspec backend)") from None
    except ImportError as exc:
        raise StorageError(f"{uri}: scheme {scheme!r} needs a package that is not installed: {exc}") from None
    fs = cls(**{key: _typed(value) for key, value in options.items()})
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), cls._strip_protocol(uri).rstrip("/")


def resolve(uri: str, options: Optional[Mapping[str, str]] = None) -> Location:
    """The :class:`Location` of a local path or a URI, parsed once by :func:`split_uri` (the same
    path with or without ``options``).

    Args:
        uri: ``/abs/path``, ``relative/path`` (made absolute, ``~`` expanded), ``file:///abs``,
            ``s3://bucket/key``, ``gs://bucket/key``, ``hdfs://host:port/path``, or any fsspec
            scheme whose package is installed. Keys are taken literally (spaces, ``%``, ``#``,
            ``?`` are part of the key).
        options: backend constructor arguments (``--storage-option``); values ``true``/``false``
            and numbers are converted; refused for a local path.

    Raises:
        StorageError: an unknown scheme, a backend that is not installed, options for a local
            path, or a backend that refuses its arguments.
    """
    options = dict(options or {})
    scheme, path = split_uri(uri)
    if scheme == "file":
        if options:
            raise StorageError(f"{uri}: --storage-option is not used for local files")
        return Location(pafs.LocalFileSystem(), path, "file")
    try:
        if scheme in PYARROW_SCHEMES:
            fs = _pyarrow_filesystem(scheme, path, options)
            if scheme in ("hdfs", "viewfs"):
                path = urlparse(f"{scheme}://{path}").path
        else:
            fs, path = _fsspec_filesystem(scheme, uri, options)
    except StorageError:
        raise
    except (TypeError, ValueError, OSError, ImportError) as exc:
        raise StorageError(f"{uri}: cannot open the {scheme} filesystem: {exc}") from None
    return Location(fs, path.rstrip("/"), scheme, tuple(sorted(options.items())))


def check_reachable(location: Location, what: str) -> None:
    """Refuse, before any work starts, a location whose store cannot be used: its bucket (or
    container, or root) does not exist, or the credentials are refused.

    Args:
        location: where a stage will read or write.
        what: how the message names it, e.g. ``"--output"``.

    Raises:
        StorageError: the message names the bucket and the store's own reason.
    """
    if location.local:
        return
    bucket = location.path.split("/", 1)[0]
    try:
        kind = location.filesystem.get_file_info(bucket).type
        if kind != pafs.FileType.NotFound:
            location.info()  # the bucket may be visible while listing its keys is refused
    except OSError as exc:
        raise StorageError(f"{what} {location.uri}: the store refused access to {bucket!r}: "
                           f"{str(exc).strip()} (check the credentials: AWS_ACCESS_KEY_ID / "
                           "AWS_SECRET_ACCESS_KEY or --storage-option)") from None
    if kind == pafs.FileType.NotFound:
        raise StorageError(f"{what} {location.uri}: bucket {bucket!r} does not exist on "
                           f"{_endpoint(location)}")


def _endpoint(location: Location) -> str:
    options = dict(location.options)
    endpoint = options.get("endpoint_override") or os.environ.get("AWS_ENDPOINT_URL")
    return f"{location.scheme} at {endpoint}" if endpoint else f"the default {location.scheme} endpoint"
