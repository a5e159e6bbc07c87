"""The ETL's commit protocol: each run writes below ``OUTPUT/runs/<run id>/``, its manifest (last, one PUT) commits it.

After its commit a run deletes every older run (run ids sort by start time) no reader leases, never a newer one; two
commits within milliseconds stay unordered (no compare-and-swap on S3)."""
from __future__ import annotations

import datetime as dt
import logging
import secrets
from typing import List, Optional, Sequence

from pipelines.contract import MANIFEST, REJECTED_LIST, RUN_ID, RUNS, SPLITS
from pipelines.io import nofollow
from pipelines.io.leases import TTL_S, leases_on
from pipelines.io.storage import Location
from pipelines.runtime.errors import NotAFolder, Refused
from pipelines.tracking import ARTIFACTS_DIR, RUN_FILE, STORE_FILE

log = logging.getLogger("pipelines")

STAGING = "_staging"  # format 1's staging folder: a killed format-1 run may have left it
# what an output of this job may hold before its first manifest: runs that died, tracking's MLflow files
OURS_WITHOUT_MANIFEST = (RUNS, STAGING, STORE_FILE, ARTIFACTS_DIR, RUN_FILE)
FORMAT_1 = (*SPLITS, REJECTED_LIST, STAGING)  # what a format-1 output held beside its manifest


class RunSuperseded(RuntimeError):
    """A newer run committed while this one ran: its output stands, this run's files are deleted."""


def new_run_id(now: Optional[dt.datetime] = None) -> str:
    """``20261130T052000123456Z-3fa9c1``: UTC start time to the microsecond, 6 random hex digits."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(3)


def run_location(output: Location, run_id: str) -> Location:
    return output.join(RUNS, run_id)


def check_output(output: Location) -> None:
    """Refuse (`Refused`), before any work, an output holding data not of this job or a link among its own names.
    Ours: missing, empty, holding a ``manifest.json``, or only `OURS_WITHOUT_MANIFEST` (run ids below ``runs/``)."""
    import pyarrow.fs as pafs

    check_no_links(output)
    kind = output.info().type
    if kind == pafs.FileType.File:
        raise NotAFolder(f"output exists and is not a folder: {output.uri}")
    if kind == pafs.FileType.NotFound or output.join(MANIFEST).is_file():
        return
    foreign = [i.base_name for i in output.list(recursive=False) if i.base_name not in OURS_WITHOUT_MANIFEST]
    foreign += [f"{RUNS}/{i.base_name}" for i in output.join(RUNS).list(recursive=False)
                if not RUN_ID.match(i.base_name)]
    if foreign:
        shown = ", ".join(sorted(foreign)[:5]) + (" ..." if len(foreign) > 5 else "")
        raise Refused(f"output {output.uri} holds {shown} but no {MANIFEST}: not an output of this job, "
                      "refusing to overwrite it")


def check_no_links(output: Location) -> None:
    """Refuse a local output with a link among its names: its commit would delete what the link names."""
    if not output.local or not output.is_dir():
        return
    names = [*OURS_WITHOUT_MANIFEST, MANIFEST, *FORMAT_1]
    names += [f"{RUNS}/{name}" for name in nofollow.list_below(output.path, RUNS)]
    for name in names:
        if nofollow.is_link_below(output.path, name):
            raise nofollow.LinkRefused(f"output {output.uri}: {name} is a symbolic link: refused (an output's "
                                       "runs and files are its own; the link would be written to and deleted)")


def delete_below(output: Location, relative: str) -> bool:
    """Delete ``OUTPUT/relative`` (a folder recursively), locally following no link; returns whether it was there."""
    if output.local:
        return nofollow.remove_below(output.path, relative)
    target = output.join(*relative.split("/"))
    existed = target.exists()
    target.delete()
    return existed


def run_names(output: Location) -> List[str]:
    """The names below ``OUTPUT/runs/``, sorted, a local one listed without following a link."""
    if output.local:
        return nofollow.list_below(output.path, RUNS)
    return [info.base_name for info in output.join(RUNS).list(recursive=False)]


def committed_run(output: Location) -> Optional[str]:
    """The run id the output's manifest names (``None``: no manifest, or a format-1 one)."""
    try:
        return output.join(MANIFEST).read_json().get("run_id")
    except FileNotFoundError:
        return None


def check_not_superseded(output: Location, run_id: str) -> None:
    """Raise `RunSuperseded`, this run's files deleted, when the manifest names a newer run."""
    current = committed_run(output)
    if current is not None and current > run_id:
        delete_below(output, f"{RUNS}/{run_id}")
        raise RunSuperseded(f"run {run_id} was superseded: the newer run {current} committed {output.uri} "
                            "while this one ran; its output stands and this run's files were deleted")


def commit(output: Location, manifest, run_id: str) -> List[str]:
    """Write ``manifest`` as ``OUTPUT/manifest.json``, then (never before: the PUT may fail) delete and return what
    it replaced.

    Raises:
        RunSuperseded: a newer run committed first."""
    check_not_superseded(output, run_id)
    replaced = format_1_files(output)
    manifest.write(output)
    return clean_up(output, run_id, replaced)


def format_1_files(output: Location) -> List[str]:
    """The names a format-1 manifest at ``output`` names, and its staging folder; ``[]`` for other manifests."""
    try:
        previous = output.join(MANIFEST).read_json()
    except FileNotFoundError:
        return []
    if not isinstance(previous, dict) or previous.get("format_version", 1) != 1:
        return []
    named = [(previous.get("splits", {}).get(split) or {}).get("path", split) for split in SPLITS]
    named += [(previous.get("files") or {}).get("list", REJECTED_LIST), STAGING]
    # A name is deleted only when it is one of format 1's own names: a manifest is read, not obeyed.
    return [name for name in FORMAT_1 if name in named]


def clean_up(output: Location, run_id: str, replaced: Sequence[str] = ()) -> List[str]:
    """Delete the runs older than ``run_id`` but those leased, and the format-1 files ``replaced``."""
    deleted = []
    for name in run_names(output):
        if RUN_ID.match(name) and name < run_id:
            leases = leases_on(output.join(RUNS, name))
            readers = [lease.reader for lease in leases if lease.live]
            if readers:
                log.info("kept run %s: still read by training run %s (its lease expires %.0f s after its last "
                         "refresh); a later commit deletes it", name, ", ".join(readers), TTL_S)
                continue
            if delete_below(output, f"{RUNS}/{name}"):
                deleted.append(f"{RUNS}/{name}")
    deleted += [name for name in replaced if delete_below(output, name)]
    if deleted:
        log.info("deleted what run %s replaced: %s", run_id, ", ".join(deleted))
    return deleted


def remove_failed_run(output: Location, run_id: str) -> None:
    """Delete what a run that failed before its commit wrote, so a rerun finds the room; failures logged."""
    try:
        if committed_run(output) == run_id:
            return
        delete_below(output, f"{RUNS}/{run_id}")
    except (OSError, ValueError) as exc:
        log.warning("could not delete the failed run's files in %s: %s", run_location(output, run_id).uri, exc)
