"""The ETL's plan, made on the driver before the images are written: the paths and the executors'
memory checked (:func:`check_paths`, :func:`check_memory`: exit 2 before Spark's work), the job's
own listing classified and split per class (:func:`plan`, :func:`assign_splits`), and, with
``--dedupe``, a first Spark pass that hashes every candidate's bytes and decoded pixels so that one
file per image is kept, and its look-alikes reported (:func:`hash_candidates`, :func:`drop_duplicates`).
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Dict, Iterable, Iterator, List, Optional, Tuple, Union

from pipelines.contract import SPLITS
from pipelines.etl import commit
from pipelines.etl.config import ETLConfig
from pipelines.etl.dedupe import Hashed, duplicates, look_alikes
from pipelines.etl.images import DEFAULT_MAX_PIXELS
from pipelines.etl.labels import ClassFolder, split_class
from pipelines.etl.layout import TASK_IMAGES, closure_chunks, rows_per_row_group, spread_order, task_count
from pipelines.etl.listing import REJECTED, Excluded, ListedFile, classify, display_path, list_tree, reason_kind
from pipelines.etl.memory import check_task_memory, executor_memory, physical_memory_bytes, task_bytes
from pipelines.etl.outcomes import TASK_DDL, read_hashes
from pipelines.etl.transform import Candidate, hash_chunks
from pipelines.io.paths import check_disjoint
from pipelines.io.storage import check_reachable
from pipelines.runtime.errors import MissingInput, NotAFolder, Refused
from pipelines.runtime.logs import plural
from pipelines.runtime.spark import log_progress


@dataclass
class Plan:
    """What the driver knows before Spark runs.

    ``candidates`` are the files to read, in the order that spreads them over tasks
    (:func:`pipelines.etl.layout.spread_order`), each with its label and split.
    """

    files: List[ListedFile]
    outcomes: Dict[str, Union[ClassFolder, Excluded]]  # path -> ClassFolder (candidate) or Excluded
    classes: Dict[int, str]
    expected_rows: Dict[str, int]
    rows_per_row_group: int
    candidates: List[Candidate] = field(default_factory=list)
    partitions: int = 0
    layout: str = ""  # labels.CALTECH | labels.FOLDERS
    hash_seconds: float = 0.0  # the duplicate check's Spark pass (hash_candidates), 0 when not run
    # the kept files' look-alikes (dedupe.look_alikes: listed pairs, count); None: not checked
    look_alikes: Optional[Tuple[List[Tuple[str, str, int]], int]] = None
    run_id: str = field(default_factory=commit.new_run_id)  # this run's prefix: OUTPUT/runs/<run_id>/


def check_paths(config: ETLConfig) -> None:
    """Refuse, before Spark starts, input/output combinations that cannot work.

    Raises:
        pipelines.io.storage.StorageError (a ValueError): a bucket that does not exist, or refused
            credentials, for the input or the output.
        FileNotFoundError: the input folder is missing (no object under the prefix).
        NotADirectoryError: the input or the output is a file.
        ValueError: output equal to, inside, or containing the input (a rerun would read its own
            output as input, or overwrite the input); an output holding data that is not this
            job's (:func:`pipelines.etl.commit.check_output`).
    """
    source, output = config.location(config.input), config.location(config.output)
    check_reachable(source, "--input")
    check_reachable(output, "--output")
    if not source.exists():
        raise MissingInput(f"input folder does not exist: {config.input}")
    if not source.is_dir():
        raise NotAFolder(f"input is not a folder: {config.input}")
    check_disjoint(config.input, config.output)
    commit.check_output(output)


def assign_splits(files: List[ListedFile], labels: Dict[str, int], seed: int, test_fraction: float,
                  validation_fraction: float) -> Dict[str, str]:
    """The stratified train/validation/test split of the candidate files, decided on the driver.

    Args:
        files: the candidate files. labels: ``{path: label}`` of each.
        seed, test_fraction, validation_fraction: as in ``ETLConfig``.

    Returns:
        ``{path: 'train' | 'validation' | 'test'}``: per class, :func:`pipelines.etl.labels.split_class`
        of the class's relative paths (a class of 1 candidate only trains, of 2 trains and is tested,
        of 3 or more is in every split: :func:`pipelines.etl.labels.split_sizes`). The tasks write
        what this says.
    """
    by_class: Dict[int, List[str]] = {}
    for f in files:
        by_class.setdefault(labels[f.path], []).append(f.relative_path)
    split_of: Dict[str, str] = {}
    for paths in by_class.values():
        split_of.update(split_class(paths, seed, test_fraction, validation_fraction))
    return {f.path: split_of[f.relative_path] for f in files}


def plan(config: ETLConfig) -> Plan:
    """List and classify every file under the input; split; choose rows per row group.

    Returns:
        the :class:`Plan`, its candidates in :func:`pipelines.etl.layout.spread_order` order, each
        with its label and split (:func:`assign_splits`, the same assignment the row-group plan
        counts); byte-identical copies are still candidates here (:func:`drop_duplicates` removes
        them once a Spark pass has hashed them).

    Raises:
        ValueError: no class folder, a mix of ``NNN.name`` and plain folders, two folders with
            the same number, no candidate image at all (nothing to write: committing an empty
            run would replace a previous output with nothing), or a split that would be empty
            (:func:`check_splits`).
    """
    files, layout = list_tree(config.location(config.input))
    if not layout.folders:
        raise Refused(f"no class folder under {config.input} (expected ROOT/CLASS/image files, CLASS either "
                      "NNN.name or a plain name)")
    max_bytes = int(config.max_file_mb * 2**20)
    outcomes = {f.path: classify(f.relative_path, f.size_bytes, max_bytes, layout, unread=f.unread) for f in files}
    the_plan = _split_candidates(config, Plan(files, outcomes, layout.classes, {}, 0, layout=layout.kind))
    if not the_plan.candidates:
        _refuse_no_candidate(config, files, outcomes)
    check_splits(config, the_plan)
    return the_plan


def _split_candidates(config: ETLConfig, the_plan: Plan) -> Plan:
    """The plan with its candidates (the files whose outcome is a ClassFolder), their splits,
    expected rows and rows per row group computed from its ``outcomes``."""
    files, outcomes = the_plan.files, the_plan.outcomes
    folders = {path: outcome for path, outcome in outcomes.items() if isinstance(outcome, ClassFolder)}
    listed = sorted((f for f in files if f.path in folders),
                    key=lambda f: (spread_order(f.relative_path, config.seed), f.relative_path))
    splits = assign_splits(listed, {f.path: folders[f.path].label for f in listed}, config.seed,
                           config.test_fraction, config.validation_fraction)
    candidates = [Candidate(f.path, folders[f.path].label, folders[f.path].name, splits[f.path]) for f in listed]
    expected = Counter(c.split for c in candidates)
    rpg = rows_per_row_group(config.row_bytes, config.row_group_mb * 2**20, dict(expected),
                             config.min_row_groups)
    return replace(the_plan, candidates=candidates, expected_rows={s: expected.get(s, 0) for s in SPLITS},
                   rows_per_row_group=rpg)


def check_splits(config: ETLConfig, the_plan: Plan) -> None:
    """Refuse a plan whose train, validation or test split would hold no file: training refuses
    such an output, so the ETL does not write it. A class of 3 candidates or more is in every split
    whatever the fractions (:func:`pipelines.etl.labels.split_sizes`), so this happens only when no
    class is that large; the message names the split, the fraction flags and the classes.

    Raises:
        Refused: a split without a planned file.
    """
    empty = [split for split in SPLITS if not the_plan.expected_rows.get(split)]
    if not empty:
        return
    sizes = Counter(c.label for c in the_plan.candidates)
    shown = ", ".join(f"{display_path(the_plan.classes.get(label, str(label)))}: {n}"
                      for label, n in sorted(sizes.items())[:10])
    more = f" and {len(sizes) - 10} more" if len(sizes) > 10 else ""
    raise Refused(f"the {' and '.join(empty)} {'split' if len(empty) == 1 else 'splits'} would be empty with "
                  f"--test-fraction {config.test_fraction:g} and --validation-fraction "
                  f"{config.validation_fraction:g}: no class has the 3 candidate images that put it in every "
                  f"split (images per class: {shown}{more}), and training refuses an output with an empty "
                  "split; add images to these classes; the output was not touched")


def hash_candidates(spark, config: ETLConfig, the_plan: Plan) -> Iterator[Tuple[str, str, Optional[str], Optional[str]]]:
    """The sha256 of every candidate's bytes and its decoded image's fingerprint, read by Spark
    tasks over the same chunks as :func:`run_spark` (:func:`pipelines.etl.transform.hash_chunks`:
    at most ``--max-file-mb`` + 1 bytes and ``--max-pixels`` a file, one file held at a time),
    which write them below the run's prefix.

    Returns:
        ``(path, sha256 hex, pixels, dhash)`` of each candidate that could be read (one unreadable
        now is left out: the main pass records why; the last two ``None`` for one that does not
        decode), read back task file by task file (:func:`pipelines.etl.outcomes.read_hashes`).
    """
    partitions = task_partitions(spark, config, len(the_plan.candidates))
    source = config.location(config.input)
    run = commit.run_location(config.location(config.output), the_plan.run_id)
    with log_progress(spark, "duplicate check", len(the_plan.candidates)) as counter:
        mapper = partial(hash_chunks, chunks=closure_chunks(the_plan.candidates, partitions), run=run,
                         max_file_bytes=int(config.max_file_mb * 2**20), source=None if source.local else source,
                         counter=counter, max_pixels=config.max_pixels)
        tasks = spark.range(partitions, numPartitions=partitions).mapInArrow(mapper, TASK_DDL).toArrow().to_pylist()
    return read_hashes(run, tasks)


def drop_duplicates(config: ETLConfig, the_plan: Plan, hashes: Iterable[Tuple]) -> Plan:
    """The plan with one candidate per image: every other copy's outcome becomes a rejection
    (:func:`pipelines.etl.dedupe.duplicates`, which names the kept file) and the kept candidates
    are split again (:func:`assign_splits`), so each image lies in one split only; the kept
    files' look-alikes in ``look_alikes`` (:func:`pipelines.etl.dedupe.look_alikes`, by relative
    path). ``hashes``: ``(path, sha256[, pixels, dhash])`` of the candidates hashed.

    Raises:
        ValueError: the copies removed leave a split empty (:func:`check_splits`).
    """
    by_relative = {f.relative_path: f.path for f in the_plan.files}
    relative = {f.path: f.relative_path for f in the_plan.files}
    candidate = {c.path: c for c in the_plan.candidates}
    hashed = [Hashed(relative[path], candidate[path].label, candidate[path].label_name, *rest)
              for path, *rest in hashes]
    rejected = duplicates(hashed)
    alike = look_alikes((h.relative_path, h.dhash) for h in hashed if h.dhash and h.relative_path not in rejected)
    if not rejected:
        return replace(the_plan, look_alikes=alike)
    outcomes = dict(the_plan.outcomes)
    for relative_path, reason in rejected.items():
        outcomes[by_relative[relative_path]] = Excluded(REJECTED, reason)
    the_plan = _split_candidates(config, replace(the_plan, outcomes=outcomes, look_alikes=alike))
    check_splits(config, the_plan)
    return the_plan


def task_partitions(spark, config: ETLConfig, candidates: int) -> int:
    """The number of Spark tasks (and chunks) for ``candidates`` files: ``--num-partitions``, else
    at least two per core and at most :data:`pipelines.etl.layout.TASK_IMAGES` files a task
    (:func:`pipelines.etl.layout.task_count`); at most one per file."""
    return task_count(candidates, spark.sparkContext.defaultParallelism, TASK_IMAGES, config.num_partitions)


def _refuse_no_candidate(config: ETLConfig, files: List[ListedFile], outcomes: Dict[str, Union[ClassFolder, Excluded]]) -> None:
    """Raise ``ValueError`` for a tree with no candidate image, naming the commonest reasons."""
    reasons = Counter(reason_kind(o.reason) for o in outcomes.values() if isinstance(o, Excluded))
    why = "; ".join(f"{n} {reason}" for reason, n in reasons.most_common(3)) or "no file at all"
    raise Refused(f"no image file to write under {display_path(config.input)} "
                  f"({plural(len(files), 'file')} listed: {why}); the output was not touched")


def check_memory(config: ETLConfig, master: str, conf: Dict[str, str]) -> None:
    """Refuse a ``--max-file-mb``/``--max-pixels`` whose tasks the executors cannot hold.

    One task holds at most one file (``max_file_mb`` MiB) and its decoded pixels
    (``16 bytes * max_pixels``) plus a Python worker and two row-group buffers
    (:func:`pipelines.etl.memory.task_bytes`); ``tasks per worker * that`` must fit in
    ``spark.executor.pyspark.memory`` when set, else, for a local master, in this machine's
    physical memory (:func:`pipelines.etl.memory.executor_memory`).

    Raises:
        ValueError: it does not fit; the message names both figures in GiB.
    """
    # Pillow refuses more than its own limit whatever max_pixels says (pipelines.etl.images).
    pixels = min(config.max_pixels, DEFAULT_MAX_PIXELS)
    need = task_bytes(int(config.max_file_mb * 2**20), pixels, int(config.row_group_mb * 2**20), config.row_bytes)
    check_task_memory(need, executor_memory(master, conf, os.cpu_count() or 1, physical_memory_bytes()))
