"""Where rank 0 writes a training run's outputs: ``--output`` itself, or a local folder mirrored to it.

For a local ``--output`` rank 0 writes there and nothing here does anything. For a URI
(``s3://bucket/run``) rank 0 writes in a local temporary folder, as it would in a local output, and
:class:`Outputs` uploads it:

* after every epoch (:meth:`Outputs.push` from the ``SyncOutputs`` callback): the files that
  changed (the checkpoint's weights, ``history.csv``, TensorBoard's events, ``mlflow_run.json``),
  the checkpoint's completion marker last, then the remote checkpoints pruned locally are deleted,
  markers before weights. An object store has no rename, but a single PUT appears whole: a marker
  that exists names weights already uploaded, so ``--resume`` (:meth:`Outputs.pull_resume_state`,
  :func:`pipelines.training.schedule.newest_complete_checkpoint`) never picks a partial one;
* at the end (:meth:`Outputs.finish`): everything else, ``metrics.json`` last, then the local
  folder is removed.
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import tempfile
from typing import Dict, Mapping, Optional, Tuple

from pipelines.storage import Location, check_reachable, resolve

log = logging.getLogger("pipelines")
_CHECKPOINT_FILE = re.compile(r"^checkpoint-(\d+)\.(npz|json)$")
RESUME_FILES = ("history.csv", "mlflow_run.json")  # what a resumed run appends to or continues


def check_output(output: str, storage_options: Optional[Mapping[str, str]] = None) -> Location:
    """``--output`` resolved, refused when its store cannot be used.

    Raises:
        pipelines.storage.StorageError: unknown scheme, missing bucket, refused credentials.
    """
    location = resolve(output, storage_options)
    check_reachable(location, "--output")
    return location


class Outputs:
    """Rank 0's output folder: :attr:`local` is where it writes; :attr:`remote` the URI's
    :class:`~pipelines.storage.Location` it is mirrored to, ``None`` for a local output."""

    def __init__(self, target: Location):
        self.target = target
        self.remote: Optional[Location] = None if target.local else target
        if self.remote is None:
            self.local = target.path
            os.makedirs(self.local, exist_ok=True)
        else:
            self.local = tempfile.mkdtemp(prefix="pipelines-output-")
            atexit.register(shutil.rmtree, self.local, ignore_errors=True)  # a failed run's too
        self._pushed: Dict[str, Tuple[int, int]] = {}  # relative path -> (size, mtime_ns) uploaded

    def pull_resume_state(self) -> Optional[int]:
        """Download what ``--resume`` reads from a remote output: the newest complete checkpoint
        (marker and weights), the best epoch's weights and :data:`RESUME_FILES`. Returns the
        checkpoint's epoch, or ``None`` (a local output, or no complete checkpoint)."""
        from pipelines.training.schedule import checkpoint_path, marker_path, newest_complete_checkpoint

        if self.remote is None:
            return None
        marker = newest_complete_checkpoint(self.remote)
        if not marker:
            return None
        names = [os.path.basename(checkpoint_path("", marker["early_stopping"]["best_epoch"])), marker["weights"],
                 *(name for name in RESUME_FILES if self.remote.join(name).exists()),
                 os.path.basename(marker_path("", marker["epoch"]))]  # the marker last, as it was written
        for name in dict.fromkeys(names):
            self.remote.join(name).download(os.path.join(self.local, name))
            self._remember(name)
        log.info("--resume: downloaded checkpoint %d from %s", marker["epoch"], self.remote.uri)
        return marker["epoch"]

    def push(self, last: Optional[str] = None) -> None:
        """Upload every file of :attr:`local` that changed since its last upload, ``last`` (a
        name relative to it) after all others; then delete the remote checkpoints that are no
        longer local (pruned), markers first. Nothing for a local output."""
        if self.remote is None:
            return
        changed = [name for name in self._local_files() if self._pushed.get(name) != self._stat(name)]
        changed.sort(key=lambda name: name == last)
        for name in changed:
            self.remote.join(*name.split("/")).upload(os.path.join(self.local, name))
            self._remember(name)
        self._prune_remote()

    def finish(self, last: str = "metrics.json") -> str:
        """Upload what is left (``last`` last) and remove the local folder. Returns the output's URI."""
        if self.remote is not None:
            self.push(last=last)
            shutil.rmtree(self.local, ignore_errors=True)
        return self.target.uri

    def _local_files(self):
        for folder, _, files in os.walk(self.local):
            for name in files:
                yield os.path.relpath(os.path.join(folder, name), self.local).replace(os.sep, "/")

    def _stat(self, name: str) -> Tuple[int, int]:
        st = os.stat(os.path.join(self.local, name))
        return st.st_size, st.st_mtime_ns

    def _remember(self, name: str) -> None:
        self._pushed[name] = self._stat(name)

    def _prune_remote(self) -> None:
        local = set(os.listdir(self.local))
        stale = [info.base_name for info in self.remote.list(recursive=False)
                 if _CHECKPOINT_FILE.match(info.base_name) and info.base_name not in local]
        for name in sorted(stale, key=lambda n: not n.endswith(".json")):  # markers first
            self.remote.join(name).delete()
            self._pushed.pop(name, None)


def open_outputs(output: str, storage_options: Optional[Mapping[str, str]] = None) -> Outputs:
    """Rank 0's :class:`Outputs` of ``--output`` (checked with :func:`check_output`)."""
    return Outputs(check_output(output, storage_options))
