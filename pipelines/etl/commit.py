"""The ETL's commit protocol: every run writes below its own prefix, the manifest commits it.

Object stores have no atomic rename, so an output is never swapped in folder by folder. Instead::

    OUTPUT/runs/<run id>/...   one run's Parquet files and rejected.jsonl, written by its tasks
    OUTPUT/manifest.json       names the committed run's files; written last, in one PUT (atomic
                               on object stores, a rename on local disks)

A reader reads the manifest, then only the files it names (:mod:`pipelines.contract`), so it sees
one whole run or the previous one, never a mix, whatever a rerun is doing or wherever it died.

Run ids sort by start time (:func:`new_run_id`: UTC time to the microsecond, then a random
suffix). The newest id wins: after its commit a run deletes every run older than itself (a
killed run's leftovers, the run it replaced) and the folders of a format-1 output, never a newer
run (it may be a concurrent run still writing), nor an older run a training still reads (it holds
a live lease on it, :mod:`pipelines.io.leases`: kept until a later commit finds no live lease). A
run that finds a newer committed run when it is about to commit is superseded
(:class:`RunSuperseded`): it deletes its own files and the newer output stands. What remains
open: two runs committing within the same few milliseconds (the check and the PUT are two
requests; S3 offers no compare-and-swap through pyarrow), and hosts whose clocks disagree by more
than the time between two runs (a lease's age is read on the store's clock alone).

On a local disk nothing of the output is followed if it is a link: an output whose ``runs/``, a
run folder or another of its own names is a link is refused before any work
(:func:`check_output`), and every deletion opens its way without following links
(:func:`pipelines.io.nofollow.remove_below`), so a link planted while a run works is deleted
itself, never what it names.
"""
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
# What an output of this job may hold before its first manifest: run prefixes (a run that died
# before committing) and the MLflow files tracking writes before the work starts.
OURS_WITHOUT_MANIFEST = (RUNS, STAGING, STORE_FILE, ARTIFACTS_DIR, RUN_FILE)
FORMAT_1 = (*SPLITS, REJECTED_LIST, STAGING)  # what a format-1 output held beside its manifest


class RunSuperseded(RuntimeError):
    """A newer run committed while this one ran: its output stands, this run's files are deleted."""


def new_run_id(now: Optional[dt.datetime] = None) -> str:
    """``20261130T052000123456Z-3fa9c1``: UTC start time to the microsecond, then 6 random hex
    digits (two runs of one microsecond differ); ids of runs started in order sort in order."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(3)


def run_location(output: Location, run_id: str) -> Location:
    """``OUTPUT/runs/<run id>``."""
    return output.join(RUNS, run_id)


def check_output(output: Location) -> None:
    """Refuse an output that holds data not of this job, before any work starts.

    An output is ours when it does not exist, is empty, holds a ``manifest.json``, or holds only
    what a run writes before its first commit (:data:`OURS_WITHOUT_MANIFEST`, with nothing but run
    ids below ``runs/``). Anything else (``train/`` of some other tool, a user's files) is never
    overwritten or deleted.

    Raises:
        NotADirectoryError: the output is a file. ValueError: foreign data, the names in the message.
        pipelines.io.nofollow.LinkRefused: a local output's ``runs/``, a run folder or another of
            its names is a link (:func:`check_no_links`).
    """
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
    """Refuse a local output holding a link among its own names (:data:`OURS_WITHOUT_MANIFEST`,
    the manifest) or below ``runs/``: its tasks would write, and its commit delete, what the link
    names (another output's runs).

    Raises:
        pipelines.io.nofollow.LinkRefused: naming the link.
    """
    if not output.local or not output.is_dir():
        return
    names = [*OURS_WITHOUT_MANIFEST, MANIFEST, *FORMAT_1]
    names += [f"{RUNS}/{name}" for name in nofollow.list_below(output.path, RUNS)]
    for name in names:
        if nofollow.is_link_below(output.path, name):
            raise nofollow.LinkRefused(f"output {output.uri}: {name} is a symbolic link: refused (an output's "
                                       "runs and files are its own; the link would be written to and deleted)")


def delete_below(output: Location, relative: str) -> bool:
    """Delete ``OUTPUT/relative`` (a file, or a folder and everything below it), on a local disk
    without following any link (:func:`pipelines.io.nofollow.remove_below`). Returns whether
    something was there."""
    if output.local:
        return nofollow.remove_below(output.path, relative)
    target = output.join(*relative.split("/"))
    existed = target.exists()
    target.delete()
    return existed


def run_names(output: Location) -> List[str]:
    """The names below ``OUTPUT/runs/`` (sorted), a local one listed without following a link."""
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
    """Raise :class:`RunSuperseded` (after deleting this run's files) when the output's manifest
    names a run newer than ``run_id``."""
    current = committed_run(output)
    if current is not None and current > run_id:
        delete_below(output, f"{RUNS}/{run_id}")
        raise RunSuperseded(f"run {run_id} was superseded: the newer run {current} committed {output.uri} "
                            "while this one ran; its output stands and this run's files were deleted")


def commit(output: Location, manifest, run_id: str) -> List[str]:
    """Commit run ``run_id``: write ``manifest`` (a :class:`pipelines.manifest.Manifest` naming this
    run's files) as ``OUTPUT/manifest.json``, then delete what it replaced (:func:`clean_up`).

    The order is the protocol: until the manifest's PUT the previous output stays whole; deleting
    first would leave a manifest naming deleted files whenever the PUT fails.

    Returns:
        what was deleted, relative to the output.

    Raises:
        RunSuperseded: a newer run committed first (see :func:`check_not_superseded`).
    """
    check_not_superseded(output, run_id)
    replaced = format_1_files(output)
    manifest.write(output)
    return clean_up(output, run_id, replaced)


def format_1_files(output: Location) -> List[str]:
    """What a format-1 manifest at ``output`` names (its splits' folders, its rejected list) and
    its staging folder, each a plain name directly in the output; ``[]`` when the output holds no
    manifest or a newer one (whose files lie below ``runs/``)."""
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
    """Delete the runs older than ``run_id`` below ``OUTPUT/runs/`` (leftovers of killed runs, the
    run just replaced: the only run prefixes an output of this job holds, :func:`check_output`)
    and ``replaced``, the files of the format-1 manifest this commit replaced
    (:func:`format_1_files`); never a newer run, which may still be writing, never an older run a
    reader holds a live lease on (:mod:`pipelines.io.leases`: a training still reading it; kept, said,
    and deleted by a later commit once no lease on it is live), and nothing else.
    Returns what was deleted, relative to the output."""
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
    """Delete what run ``run_id`` wrote (``OUTPUT/runs/<run id>/``) after it failed before its
    commit, so that a rerun finds the room it took (a full disk) and no leftovers; nothing when
    its manifest was committed (its files are the output now). A failure to delete is logged,
    never raised over the run's own error."""
    try:
        if committed_run(output) == run_id:
            return
        delete_below(output, f"{RUNS}/{run_id}")
    except (OSError, ValueError) as exc:
        log.warning("could not delete the failed run's files in %s: %s", run_location(output, run_id).uri, exc)
