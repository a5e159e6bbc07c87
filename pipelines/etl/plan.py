"""The ETL's plan, made on the driver before any image is written.

Paths and memory checked (exit 2 before Spark works), the listing classified and split per class; ``--dedupe``
first hashes every candidate in Spark, to keep one file per image."""
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
    """What the driver knows before Spark runs; ``candidates`` in the order that spreads them over tasks."""

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
    """Refuse, before Spark starts, an input and output that cannot work.

    Raises:
        Refused: a missing bucket, input or folder, refused credentials, overlapping paths, or a foreign output."""
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
    """The stratified split of the candidates (``labels``: by path): ``{path: split}``, `split_class` per class."""
    by_class: Dict[int, List[str]] = {}
    for f in files:
        by_class.setdefault(labels[f.path], []).append(f.relative_path)
    split_of: Dict[str, str] = {}
    for paths in by_class.values():
        split_of.update(split_class(paths, seed, test_fraction, validation_fraction))
    return {f.path: split_of[f.relative_path] for f in files}


def plan(config: ETLConfig) -> Plan:
    """List and classify every file under the input, split the candidates, choose rows per row group.

    Raises:
        Refused: no class folder, mixed layouts, no candidate at all (an empty run would replace the previous output
            with nothing), or an empty split."""
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
    """The plan with its candidates, their splits, expected rows and rows per row group, from its ``outcomes``."""
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
    """Refuse (`Refused`) a plan with an empty split, which training refuses: no class has 3 candidates."""
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
    """``(path, sha256, pixels, dhash)`` of every candidate read, by Spark tasks over `run_spark`'s chunks."""
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
    """The plan with one candidate per image, the other copies rejected, the kept ones split again.

    ``hashes``: ``(path, sha256[, pixels, dhash])``; raises `Refused` when a split is left empty."""
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
    """Spark tasks (and chunks) for ``candidates`` files: ``--num-partitions``, else `task_count`'s."""
    return task_count(candidates, spark.sparkContext.defaultParallelism, TASK_IMAGES, config.num_partitions)


def _refuse_no_candidate(config: ETLConfig, files: List[ListedFile], outcomes: Dict[str, Union[ClassFolder, Excluded]]) -> None:
    """Refuse a tree with no candidate image, naming the commonest reasons."""
    reasons = Counter(reason_kind(o.reason) for o in outcomes.values() if isinstance(o, Excluded))
    why = "; ".join(f"{n} {reason}" for reason, n in reasons.most_common(3)) or "no file at all"
    raise Refused(f"no image file to write under {display_path(config.input)} "
                  f"({plural(len(files), 'file')} listed: {why}); the output was not touched")


def check_memory(config: ETLConfig, master: str, conf: Dict[str, str]) -> None:
    """Refuse (`Refused`) a ``--max-file-mb``/``--max-pixels`` whose tasks the executors cannot hold."""
    # Pillow refuses more than its own limit whatever max_pixels says (pipelines.etl.images).
    pixels = min(config.max_pixels, DEFAULT_MAX_PIXELS)
    need = task_bytes(int(config.max_file_mb * 2**20), pixels, int(config.row_group_mb * 2**20), config.row_bytes)
    check_task_memory(need, executor_memory(master, conf, os.cpu_count() or 1, physical_memory_bytes()))
