"""Local paths as the ``file://`` URLs that Petastorm opens: made absolute and checked in one place.

Petastorm opens ``urlparse(url).path`` undecoded: ``#``, ``?``, a tab or a line break (another folder) are refused."""
from __future__ import annotations

import os
from urllib.parse import urlparse

from pipelines.runtime.errors import Refused


class UnsafePathError(Refused):
    """A local path that cannot become the URL Petastorm needs; the message names the character."""


def _survives(path: str) -> bool:
    return urlparse("file://" + path).path == path


def url_breakers(path: str) -> list:
    """The characters of ``path`` that a ``file://`` URL would lose, found by round trips through ``urlparse``."""
    found = []
    for ch in dict.fromkeys(path):
        if ch != "/" and not (_survives(f"/a{ch}b/c") and _survives(f"/a/b{ch}c")):
            found.append(ch)
    return found


def check_url_safe(path: str, what: str) -> str:
    """``path`` made absolute (``~`` expanded); `UnsafePathError` naming ``what`` if a URL cannot carry it."""
    absolute = os.path.abspath(os.path.expanduser(path))
    bad = url_breakers(absolute)
    if bad:
        names = ", ".join(repr(ch) for ch in bad)
        raise UnsafePathError(f"{what} {absolute!r} contains {names}, which a file:// URL cannot carry "
                              "(Petastorm opens datasets by URL): rename the folder")
    return absolute


def local_url(path: str) -> str:
    """The ``file:///abs/path`` URL of a local path; raises `UnsafePathError` as `check_url_safe`."""
    return "file://" + check_url_safe(path, "path")


def _store_key(uri: str) -> tuple:
    """``("file", realpath)`` of a local path or ``file://`` URL; ``(scheme, "/bucket/key")`` of a URI."""
    parsed = urlparse(uri)
    if not parsed.scheme or "://" not in uri or parsed.scheme.lower() == "file":
        return "file", os.path.realpath(parsed.path if uri.startswith("file://") else uri)
    return parsed.scheme.lower(), "/" + (parsed.netloc + parsed.path).strip("/")


def check_disjoint(input_path: str, output_path: str) -> None:
    """Refuse (`Refused`) an output that is, lies in or holds the input (links resolved; URIs by scheme and prefix)."""
    (src_scheme, src), (dst_scheme, dst) = _store_key(input_path), _store_key(output_path)
    if src_scheme != dst_scheme:
        return
    if os.path.commonpath([dst, src]) == src:
        raise Refused(f"output {output_path} is the input or inside it: its files would be "
                      "read as input by the next run")
    if os.path.commonpath([src, dst]) == dst:
        raise Refused(f"input {input_path} is inside output {output_path}: overwriting the "
                      "output could destroy the input")
