"""Where rank 0 writes a training run's outputs: ``--output`` itself, or a local folder mirrored to a URI.

A checkpoint's marker is uploaded after its weights and deleted before them."""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from typing import Dict, Mapping, Optional, Tuple

from pipelines.contract import CHECKPOINT_NAME, HISTORY, METRICS, PROGRESS, TRAIN_RUN, plain_name
from pipelines.io import nofollow
from pipelines.io.atomic import write_json
from pipelines.io.storage import Location, check_reachable, resolve
from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural
from pipelines.tracking import RUN_FILE
from pipelines.training.checkpoints.choose import checkpoint_markers
from pipelines.training.checkpoints.names import checkpoint_path, marker_weights
from pipelines.training.records import ownership as runs

log = logging.getLogger("pipelines")
RESUME_FILES = (HISTORY, RUN_FILE, PROGRESS)  # what a resumed run appends to, continues or reads


def check_output(output: str, storage_options: Optional[Mapping[str, str]] = None) -> Location:
    """``--output`` resolved; raises `StorageError` when its store cannot be used."""
    location = resolve(output, storage_options)
    check_reachable(location, "--output")
    return location


class Outputs:
    """Rank 0's output folder: ``local`` is where it writes; ``remote`` the `Location` mirrored to (``None``: local)."""

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
        self.run_id: Optional[str] = None  # the training run writing here (adopt)

    def adopt(self, claim, data: str) -> None:
        """Once `claim` gave this run the output: delete ``claim.delete``, record the run, download its checkpoint."""
        self.run_id = claim.run.run_id
        for name in claim.delete:
            self._delete(name)
        if claim.delete:
            log.info("--overwrite: deleted %s of the earlier run in %s", plural(len(claim.delete), "file or folder"),
                     self.target.uri)
        if claim.new:
            write_json(os.path.join(self.local, TRAIN_RUN), runs.record(claim.run, data))
            self.push()
        if claim.marker:
            self.pull_resume_state(claim.marker)

    def _delete(self, name: str) -> None:
        """Delete the file or folder ``name`` (a plain name, checked) of the output."""
        plain_name(name, "a name to delete")
        if self.remote is not None:
            self.remote.join(name).delete()
            return
        nofollow.remove_below(self.local, name)  # a link is removed itself, never what it names

    def pull_resume_state(self, marker: Dict) -> None:
        """Download ``marker``'s checkpoint, the best epoch's weights and `RESUME_FILES` of a remote output."""
        if self.remote is None:
            return
        best = marker["early_stopping"]["best_epoch"]
        within_first = best == 0 and marker.get("step") and marker.get("epoch") == 0  # no epoch done: no best yet
        if not isinstance(best, int) or (best < 1 and not within_first):
            raise Refused(f"checkpoint marker {marker['_name']}: its best epoch {best!r} is not a number >= 1")
        names = [*([] if within_first else [os.path.basename(checkpoint_path("", best))]),
                 marker_weights(marker, marker["_name"]),
                 *(name for name in RESUME_FILES if self.remote.join(name).exists()),
                 plain_name(marker["_name"], "a marker", CHECKPOINT_NAME)]  # the marker last, as it was written
        for name in dict.fromkeys(names):
            self.remote.join(name).download(os.path.join(self.local, name))
            self._remember(name)
        log.info("--resume: downloaded checkpoint %s from %s", marker["_name"], self.remote.uri)

    def push(self, last: Optional[str] = None) -> None:
        """Upload every changed file of ``local``, ``last`` after all others, then `_prune_remote`."""
        if self.remote is None:
            return
        changed = [name for name in self._local_files() if self._pushed.get(name) != self._stat(name)]
        changed.sort(key=lambda name: name == last)
        for name in changed:
            self.remote.join(*name.split("/")).upload(os.path.join(self.local, name))
            self._remember(name)
        self._prune_remote()

    def upload(self, name: str) -> None:
        """Upload the one file ``name`` of ``local`` (a plain name) now; nothing for a local output."""
        if self.remote is not None:
            self.remote.join(plain_name(name, "a file to upload")).upload(os.path.join(self.local, name))
            self._remember(name)

    def finish(self, last: str = METRICS) -> str:
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
        """Delete this run's remote checkpoints no longer local, markers first; another run's are never touched."""
        local = set(os.listdir(self.local))
        stale = {name for name in self._pushed if CHECKPOINT_NAME.match(name)}
        if self.run_id:
            for marker in checkpoint_markers(self.remote):
                if (marker.get("run") or {}).get("id") == self.run_id:
                    stale |= {marker["_name"], marker["weights"]}
        for name in sorted(stale - local, key=lambda n: (not n.endswith(".json"), n)):  # markers first
            self.remote.join(name).delete()
            self._pushed.pop(name, None)


def open_outputs(output: str, storage_options: Optional[Mapping[str, str]] = None) -> Outputs:
    """Rank 0's `Outputs` of ``--output`` (checked with `check_output`)."""
    return Outputs(check_output(output, storage_options))
