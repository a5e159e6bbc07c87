"""The launching machine's working folder: ``$PIPELINES_WORKDIR``, else ``~/pipelines-work``.

Stated here, below every stage, because two layers need it: the notebooks' tools write their
samples and outputs there (:mod:`pipelines.tools.workspace`), and tracking keeps there the default
MLflow store of an output on an object store (:func:`pipelines.tracking.default_uri`).
"""
from __future__ import annotations

import os

WORKDIR_ENV = "PIPELINES_WORKDIR"


def default_workdir() -> str:
    """``$PIPELINES_WORKDIR``, or ``~/pipelines-work``, as an absolute path (not created here)."""
    return os.path.abspath(os.path.expanduser(os.environ.get(WORKDIR_ENV, "~/pipelines-work")))
