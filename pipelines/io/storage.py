"""Storage: every path or URI resolved once into a ``pyarrow.fs`` filesystem and a path (`Location`).

pyarrow serves ``file``, ``s3``, ``gs`` and ``hdfs``, fsspec any other scheme. An object store's PUT is atomic."""
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

# pyarrow's threaded copy_files can hang copying a folder to S3: one file after another finishes.
COPY_THREADS = False

PYARROW_SCHEMES = ("file", "s3", "gs", "hdfs", "viewfs")  # gcs:// is read as gs:// (split_uri)


class StorageError(Refused):
    """A path or URI that cannot be used (scheme, bucket, credentials, backend, option); the message says why."""


def _typed(value: str) -> Any:
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return float(value) if "." in value else int(value)
    except ValueError:
        return value


def scheme_of(uri: str) -> str:
    """``"s3"`` for ``s3://b/k``; ``"file"`` for a local path or a ``file://`` URL."""
    parsed = urlparse(uri)
    return parsed.scheme.lower() if parsed.scheme and "://" in uri else "file"


def is_local(uri: str) -> bool:
    return scheme_of(uri) == "file"


@dataclass(frozen=True)
class Location:
    """A file or folder: ``filesystem``, ``path`` on it (absolute, or ``bucket/key``), how it was resolved."""

    filesystem: pafs.FileSystem = field(compare=False, repr=False)
    path: str
    scheme: str = "file"
    options: Tuple[Tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def local(self) -> bool:
        return self.scheme == "file"

    @property
    def uri(self) -> str:
        """The absolute path for local files, ``scheme://path`` otherwise."""
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
        """This path relative to ``other`` (``a/b.parquet``); ValueError when not below it."""
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
        """Every file and folder below this folder, sorted by path; ``[]`` when it does not exist."""
        selector = pafs.FileSelector(self.path, recursive=recursive, allow_not_found=True)
        return sorted(self.filesystem.get_file_info(selector), key=lambda i: i.path)

    def files(self, suffix: str = "") -> List["Location"]:
        """The files directly in this folder ending with ``suffix``, not hidden (``_``, ``.``), sorted."""
        return [self.join(posixpath.basename(i.path)) for i in self.list(recursive=False)
                if i.type == pafs.FileType.File and i.base_name.endswith(suffix)
                and not i.base_name.startswith(("_", "."))]

    def read_bytes(self) -> bytes:
        """The whole file; FileNotFoundError when it does not exist."""
        if not self.is_file():
            raise FileNotFoundError(f"no such file: {self.uri}")
        with self.filesystem.open_input_stream(self.path) as f:
            return f.read()

    def read_json(self) -> Any:
        return json.loads(self.read_bytes().decode("utf-8"))

    def write_bytes(self, data: bytes) -> None:
        """Write the file whole or not at all (a rename on local disks, one PUT on object stores)."""
        if self.local:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with replacing_file(self.path) as f:
                f.write(data)
            return
        with self.filesystem.open_output_stream(self.path) as f:
            f.write(data)

    def write_json(self, value: Any, indent: int = 2) -> None:
        """Write ``value`` as UTF-8 JSON (non-ASCII kept), whole or not at all."""
        self.write_bytes(json.dumps(value, indent=indent, ensure_ascii=False).encode("utf-8"))

    def makedirs(self) -> None:
        """Create the folder (nothing on object stores, where folders are key prefixes)."""
        if self.local:
            os.makedirs(self.path, exist_ok=True)

    def delete(self) -> None:
        """Remove this file, or this folder and everything below it; nothing when missing."""
        kind = self.info().type
        if kind == pafs.FileType.Directory:
            self.filesystem.delete_dir(self.path)
        elif kind == pafs.FileType.File:
            self.filesystem.delete_file(self.path)

    def upload(self, local_path: str) -> None:
        """Copy the local file or folder ``local_path`` here."""
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
    """The one parse of a path or URI: ``(scheme, path)``, a local path made absolute, keys taken literally (as the
    AWS CLI and s3fs read them: ``s3://b/a%20b#c`` is key ``a%20b#c``)."""
    scheme = scheme_of(uri)
    if scheme == "file":
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        return "file", os.path.abspath(os.path.expanduser(path))
    rest = uri.split("://", 1)[1].rstrip("/")
    return ("gs" if scheme == "gcs" else scheme), rest


def root_refusal(uri: str) -> Optional[str]:
    """Why ``uri`` may not be a job's output folder (a root, ``/``, a mount point, a home or above one), or ``None``."""
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
    import pwd

    homes = {os.path.abspath(os.path.expanduser("~"))}
    homes.update(os.path.abspath(p.pw_dir) for p in pwd.getpwall() if p.pw_dir.startswith("/") and p.pw_dir != "/")
    return homes


def check_not_root(uri: str, what: str) -> None:
    """Refuse a root as an output (`root_refusal`) with a `StorageError` naming ``what`` and the root."""
    why = root_refusal(uri)
    if why:
        raise StorageError(f"{what} {uri} is {why}: give a folder of its own below it "
                           f"(e.g. {uri.rstrip('/')}/etl); a job replaces and cleans its output folder")


def _pyarrow_filesystem(scheme: str, path: str, options: Mapping[str, str]) -> pafs.FileSystem:
    head = path.split("/", 1)[0]
    if not options:
        # only the bucket (or host) goes through pyarrow's URI parser: the key is never parsed there
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
    """The `Location` of a local path or a URI; ``options``: the backend's constructor arguments (URIs only).

    Raises:
        StorageError: an unknown scheme, a backend not installed, options for a local path, or refused arguments."""
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
    """Refuse (`StorageError`, naming ``what``) a location whose bucket is missing or credentials refused."""
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
