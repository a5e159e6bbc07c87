"""Local paths as the ``file://`` URLs that Petastorm opens: made absolute and checked in one place.

Petastorm 0.13.1 splits a dataset URL with :func:`urllib.parse.urlparse` and opens
``parsed.path`` as it is, without percent-decoding. So percent-encoding cannot carry a character
that ``urlparse`` treats specially (``#`` starts a fragment, ``?`` a query, and Python drops tabs
and line breaks from URLs): such a path would silently name another folder (``runs/etl#v2`` ->
``runs/etl``). Every other character a file name may hold passes through literally, ``%`` and
spaces included. A relative path must be made absolute first: ``file://data/train`` names the
host ``data``.
"""
from __future__ import annotations

import os
from urllib.parse import urlparse

from pipelines.runtime.errors import Refused


class UnsafePathError(Refused):
    """A local path that cannot become the URL Petastorm needs; the message names the character."""


def _survives(path: str) -> bool:
    return urlparse("file://" + path).path == path


def url_breakers(path: str) -> list:
    """The characters of ``path`` that a ``file://`` URL would lose or reinterpret, in order of
    first appearance (an empty list when the path is safe). Found by round-tripping each character
    through ``urlparse``, so the rule is Python's own, not a list kept by hand."""
    found = []
    for ch in dict.fromkeys(path):
        if ch != "/" and not (_survives(f"/a{ch}b/c") and _survives(f"/a/b{ch}c")):
            found.append(ch)
    return found


def check_url_safe(path: str, what: str) -> str:
    """Return ``path`` made absolute, or raise when Petastorm could not open it by URL.

    Args:
        path: a local path, relative (to the current directory) or absolute, ``~`` expanded.
        what: how the error names it, e.g. ``"--data"``.

    Raises:
        UnsafePathError: the absolute path holds ``#``, ``?``, a tab or a line break; the message
            names the character(s) and asks for a rename.
    """
    absolute = os.path.abspath(os.path.expanduser(path))
    bad = url_breakers(absolute)
    if bad:
        names = ", ".join(repr(ch) for ch in bad)
        raise UnsafePathError(f"{what} {absolute!r} contains {names}, which a file:// URL cannot carry "
                              "(Petastorm opens datasets by URL): rename the folder")
    return absolute


def local_url(path: str) -> str:
    """The ``file://`` URL of a local path, as Petastorm wants it: ``file:///abs/path``.

    Raises:
        UnsafePathError: see :func:`check_url_safe`.
    """
    return "file://" + check_url_safe(path, "path")


def _store_key(uri: str) -> tuple:
    """``(scheme, path)`` of a path or URI: ``("file", realpath)`` for local paths and ``file://``
    URLs (symlinks resolved), ``("s3", "/bucket/key")`` for ``s3://bucket/key/``."""
    parsed = urlparse(uri)
    if not parsed.scheme or "://" not in uri or parsed.scheme.lower() == "file":
        return "file", os.path.realpath(parsed.path if uri.startswith("file://") else uri)
    return parsed.scheme.lower(), "/" + (parsed.netloc + parsed.path).strip("/")


def check_disjoint(input_path: str, output_path: str) -> None:
    """Refuse an output that is the input, lies inside it or holds it: local paths with symlinks
    resolved, two URIs of one store by key prefix (``s3://b/in`` and ``s3://b/in/out`` overlap,
    ``s3://b/in2`` does not); a local path and a URI, or URIs of two schemes, never overlap.

    Raises:
        ValueError: output equal to or inside the input (a rerun would read its own output as
            input), or input inside the output (overwriting the output could destroy the input).
    """
    (src_scheme, src), (dst_scheme, dst) = _store_key(input_path), _store_key(output_path)
    if src_scheme != dst_scheme:
        return
    if os.path.commonpath([dst, src]) == src:
        raise Refused(f"output {output_path} is the input or inside it: its files would be "
                      "read as input by the next run")
    if os.path.commonpath([src, dst]) == dst:
        raise Refused(f"input {input_path} is inside output {output_path}: overwriting the "
                      "output could destroy the input")
