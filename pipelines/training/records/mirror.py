"""Where rank 0 writes a training run's outputs: ``--output`` itself, or a local folder mirrored to it.

For a local ``--output`` rank 0 writes there and nothing here does anything. For a URI
(``s3://bucket/run``) rank 0 writes in a local temporary folder, as it would in a local output, and
:class:`Outputs` uploads it:

* after every epoch (:meth:`Outputs.push` from the ``SyncOutputs`` callback): the files that
  changed (the checkpoint's weights, ``history.csv``, TensorBoard's events, ``mlflow_run.json``),
  the checkpoint's completion marker last, then the remote checkpoints this run pruned locally are
  deleted, markers before weights (only names this run uploaded or downloaded: another run's
  checkpoints are never touched). An object store has no rename, but a single PUT appears whole: a marker
  that exists names weights already uploaded, so ``--resume`` (:meth:`Outputs.adopt`,
  :func:`pipelines.training.schedule.newest_complete_checkpoint`) never picks a partial one;
* at the end (:meth:`Outputs.finish`): everything else, ``metrics.json`` last, then the local
  folder is removed.
"""
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
from pipelines.training.records import ownership as runs
from pipelines.training.schedule import checkpoint_markers, checkpoint_path, marker_weights

log = logging.getLogger("pipelines")
RESUME_FILES = (HISTORY, RUN_FILE, PROGRESS)  # what a resumed run appends to, continues or reads


def check_output(output: str, storage_options: Optional[Mapping[str, str]] = None) -> Location:
    """``--output`` resolved, refused when its store cannot be used.

    Raises:
        pipelines.io.storage.StorageError: unknown scheme, missing bucket, refused credentials.
    """
    location = resolve(output, storage_options)
    check_reachable(location, "--output")
    return location


class Outputs:
    """Rank 0's output folder: :attr:`local` is where it writes; :attr:`remote` the URI's
    :class:`~pipelines.io.storage.Location` it is mirrored to, ``None`` for a local output."""

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
        """Rank 0, once :func:`pipelines.training.records.ownership.claim` gave this run the output: delete the
        names ``claim.delete`` (an earlier run's own files, ``--overwrite``), record a new run in
        :data:`~pipelines.contract.TRAIN_RUN` (uploaded at once to a URI output, so a second run
        sees it), and download the checkpoint it continues (:meth:`pull_resume_state`)."""
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
        """Download what ``--resume`` (or a relaunch) reads from a remote output: the checkpoint
        of ``marker`` (a complete one, :func:`pipelines.training.schedule.newest_complete_checkpoint`)
        with the marker, the best epoch's weights and :data:`RESUME_FILES`; nothing for a local
        output.

        Raises:
            ValueError: the marker names a best epoch that is not a number >= 1.
        """
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

    def upload(self, name: str) -> None:
        """Upload the one file ``name`` of :attr:`local` (a plain name) now; nothing for a local output."""
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
        """Delete the remote checkpoints of this run that are no longer local (pruned), markers
        first: those this process uploaded or downloaded, and those whose markers name this run
        (:attr:`run_id`, once :meth:`adopt` set it). Another run's checkpoints in a shared prefix
        are never touched."""
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
    """Rank 0's :class:`Outputs` of ``--output`` (checked with :func:`check_output`)."""
    return Outputs(check_output(output, storage_options))
