"""Per-file outcomes at scale: tasks write them beside their output, the driver reads them file by file.

Collected results would pass ``spark.driver.maxResultSize`` (1 GiB, ~10 million rows): each task writes its rows
in ``OUTPUT/runs/<run id>/_tasks/`` (`RowFile`), returns one `TASK_SCHEMA` row; ``_tasks/`` goes before the commit."""
from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.contract import SPLITS
from pipelines.etl.listing import REJECTED, SKIPPED, display_path, reason_kind
from pipelines.io.atomic import replacing_file
from pipelines.io.storage import Location
from pipelines.runtime.logs import plural

WRITTEN = "written"
TASKS = "_tasks"  # the run's folder of task row files ('_': never taken for a split's part)
BATCH_ROWS = 4096  # rows per Arrow batch of a row file: what the driver holds of one at a time

# The main pass's rows: one per candidate.
OUTCOME_SCHEMA = pa.schema([
    ("path", pa.string()),
    ("status", pa.string()),  # written | rejected
    ("split", pa.string()),   # train | validation | test, for written rows
    ("label", pa.int32()),
    ("file", pa.string()),    # the Parquet file (relative to the run's prefix), for written rows
    ("reason", pa.string()),  # why not written
])
# The hash pass's rows (hash_chunks): one per candidate, sha256 null when unreadable.
HASH_SCHEMA = pa.schema([("path", pa.string()), ("sha256", pa.string()),  # of the bytes
                         ("pixels", pa.string()), ("dhash", pa.string())])  # pipelines.etl.images.Fingerprint
# What Spark gets back: one row per task.
TASK_SCHEMA = pa.schema([("rows_file", pa.string()),         # relative to the run's prefix
                         ("chunks", pa.list_(pa.int64())),    # the chunk numbers it processed
                         ("files", pa.list_(pa.string())),    # the Parquet files it wrote, relative
                         ("rows", pa.int64())])               # rows in rows_file
TASK_DDL = "rows_file STRING, chunks ARRAY<BIGINT>, files ARRAY<STRING>, rows BIGINT"


class RowFile:
    """One task's rows, written to ``run/_tasks/<kind>-<task>.arrow`` in batches of `BATCH_ROWS`."""

    def __init__(self, run: Location, kind: str, task: str, schema: pa.Schema):
        self.name = f"{TASKS}/{kind}-{task}.arrow"
        self.schema, self.rows = schema, 0
        target = run.join(self.name)
        target.parent.makedirs()
        self.stream = target.filesystem.open_output_stream(target.path)
        self.writer = pa.ipc.new_stream(self.stream, schema)
        self.buffer: Dict[str, list] = {name: [] for name in schema.names}

    def append(self, *values) -> None:
        for name, value in zip(self.schema.names, values):
            self.buffer[name].append(value)
        if len(self.buffer[self.schema.names[0]]) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        n = len(self.buffer[self.schema.names[0]])
        if n:
            self.writer.write_batch(pa.RecordBatch.from_pydict(self.buffer, schema=self.schema))
            self.rows += n
            self.buffer = {name: [] for name in self.schema.names}

    def close(self, chunks: Sequence[int], files: Sequence[str] = ()) -> pa.RecordBatch:
        """Write what is buffered, close the file, and return the task's one `TASK_SCHEMA` row."""
        self.flush()
        self.writer.close()
        self.stream.close()
        return pa.RecordBatch.from_pydict({"rows_file": [self.name], "chunks": [list(chunks)],
                                           "files": [list(files)], "rows": [self.rows]}, schema=TASK_SCHEMA)


def read_rows(run: Location, task: dict) -> Iterator[dict]:
    """The rows of one task's row file, one Arrow batch at a time; RuntimeError if their count is not the task's."""
    target = run.join(task["rows_file"])
    n = 0
    with target.filesystem.open_input_stream(target.path) as f:
        for batch in pa.ipc.open_stream(f):
            n += batch.num_rows
            yield from batch.to_pylist()
    if n != task["rows"]:
        raise RuntimeError(f"{target.uri} holds {plural(n, 'row')}, its task reported {task['rows']}")


def read_hashes(run: Location, tasks: List[dict]) -> Iterator[Tuple[str, str, Optional[str], Optional[str]]]:
    """``(path, sha256, pixels, dhash)`` of each candidate the hash pass read; then deletes ``run/_tasks/``."""
    for task in tasks:
        for row in read_rows(run, task):
            if row["sha256"] is not None:
                yield row["path"], row["sha256"], row.get("pixels"), row.get("dhash")
    run.join(TASKS).delete()


@dataclass
class SplitStats:
    """One split's counts, read back from the written Parquet footers, not assumed."""

    rows: int = 0
    files: int = 0
    row_groups: int = 0
    bytes_uncompressed: int = 0
    bytes_compressed: int = 0
    per_class: Counter = field(default_factory=Counter)
    parts: List[Location] = field(default_factory=list)  # the split's Parquet files, in order

    def add(self, part: Location) -> List[str]:
        """Count one Parquet file of the split; returns its ``path`` column."""
        with part.filesystem.open_input_file(part.path) as f:
            parquet = pq.ParquetFile(f)
            meta = parquet.metadata
            self.files += 1
            self.rows += meta.num_rows
            self.row_groups += meta.num_row_groups
            for i in range(meta.num_row_groups):
                group = meta.row_group(i)
                self.bytes_uncompressed += group.total_byte_size
                self.bytes_compressed += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
            table = parquet.read(columns=["path", "label"])
        self.parts.append(part)
        self.per_class.update(table.column("label").to_pylist())
        return table.column("path").to_pylist()


@dataclass
class Reconciled:
    """Every listed file's fate counted: per split, per status, per ``"<status>: <kind>"``, per task reason."""

    stats: Dict[str, SplitStats]
    counts: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)
    task_reasons: Counter = field(default_factory=Counter)

    @property
    def written(self) -> int:
        return self.counts[WRITTEN]


def check_tasks(tasks: List[dict], chunks: int) -> None:
    """RuntimeError unless each of ``chunks`` chunk numbers was processed once and no file named twice."""
    seen = Counter(c for task in tasks for c in task["chunks"])
    wrong = sorted(set(range(chunks)) ^ {c for c, n in seen.items() if n == 1})
    if wrong:
        raise RuntimeError(f"chunks {wrong[:5]} were processed {[seen.get(c, 0) for c in wrong[:5]]} times, not once")
    files = Counter(f for task in tasks for f in task["files"])
    if any(n > 1 for n in files.values()):
        raise RuntimeError(f"{[f for f, n in files.items() if n > 1][:3]} named by two tasks")


def keep_committed(run: Location, tasks: List[dict]) -> None:
    """Delete the run's Parquet files no task summary names (a failed or speculative attempt's)."""
    named = {f for task in tasks for f in task["files"]}
    for split in SPLITS:
        for part in run.join(split).files():
            if f"{split}/{part.name}" not in named:
                part.delete()


def reconcile(run: Location, found: int, exclusions: Iterable[Tuple[str, str, str]],
              chunks: Sequence[Sequence[tuple]], tasks: List[dict], ledger: Location) -> Reconciled:
    """Match every listed file with exactly one fate, and write ``ledger`` (``rejected.jsonl``) of those not written.

    ``exclusions``: ``(path, status, reason)`` excluded before Spark; ``chunks``: the candidates as cut for the tasks.

    Raises:
        RuntimeError: outcomes disagreeing with the chunks or rows, or ``found != written + rejected + skipped``."""
    check_tasks(tasks, len(chunks))
    keep_committed(run, tasks)
    result = Reconciled({split: SplitStats() for split in SPLITS})
    with _ledger_stream(ledger) as out:
        for path, status, reason in exclusions:
            _record(out, result, path, status, reason)
        for task in sorted(tasks, key=lambda t: t["chunks"]):
            _reconcile_task(run, task, chunks, result, out)
    run.join(TASKS).delete()
    counts = result.counts
    if found != counts[WRITTEN] + counts[REJECTED] + counts[SKIPPED]:
        raise RuntimeError(f"counts do not reconcile: found {found} != written {counts[WRITTEN]} + "
                           f"rejected {counts[REJECTED]} + skipped {counts[SKIPPED]}")
    return result


def _reconcile_task(run: Location, task: dict, chunks: Sequence[Sequence[tuple]], result: Reconciled, out) -> None:
    """One task's rows against its chunks' candidates and its Parquet files' rows."""
    expected = {c[0] for chunk in task["chunks"] for c in chunks[chunk]}
    rows: Counter = Counter()
    for name in sorted(task["files"]):
        rows.update(result.stats[name.split("/", 1)[0]].add(run.join(name)))
    twice = [p for p, n in rows.items() if n > 1]
    if twice:
        raise RuntimeError(f"{display_path(twice[0])} was written twice")
    seen, written = set(), set()
    for row in read_rows(run, task):
        path = row["path"]
        if path not in expected or path in seen:
            raise RuntimeError(f"a task reported {display_path(path)} "
                               f"{'twice' if path in seen else 'which its chunks do not hold'}")
        seen.add(path)
        if row["status"] == WRITTEN:
            written.add(path)
            result.counts[WRITTEN] += 1
        else:
            result.task_reasons[reason_kind(row["reason"])] += 1
            _record(out, result, path, row["status"], row["reason"])
    if seen != expected:
        lost = sorted(expected - seen)
        raise RuntimeError(f"candidate {display_path(lost[0])} has no outcome: a Spark task lost it")
    if written != set(rows):
        raise RuntimeError(f"the Parquet files of {task['rows_file']} hold {plural(len(rows), 'row')} but "
                           f"its task reported {len(written)}")


def _record(out, result: Reconciled, path: str, status: str, reason: str) -> None:
    out.write(json.dumps({"path": display_path(path), "status": status, "reason": reason},
                         ensure_ascii=False).encode("utf-8") + b"\n")
    result.counts[status] += 1
    result.reasons[f"{status}: {reason_kind(reason)}"] += 1


@contextlib.contextmanager
def _ledger_stream(target: Location):
    """A binary stream onto ``target``, whole or not at all (a rename locally, one upload on object stores)."""
    if target.local:
        os.makedirs(os.path.dirname(target.path), exist_ok=True)
        with replacing_file(target.path) as f:
            yield f
        return
    with target.filesystem.open_output_stream(target.path) as f:
        yield f
