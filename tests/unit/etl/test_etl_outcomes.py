"""Per-file outcomes reconciled without Spark (pipelines/etl/outcomes.py): task files read file
by file, refused when they do not reconcile (the run at scale:
tests/e2e/test_etl_outcomes.py)."""
import json

import pytest


def task_files(tmp_path, outcomes, parquet, chunks=(0,), task="00000-1"):
    """A run holding one task's outcome rows (``(path, status, reason)``) and its Parquet files
    (``{relative name: [(path, label)]}``); returns ``(run, summary row)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.etl.outcomes import OUTCOME_SCHEMA, RowFile
    from pipelines.io.storage import resolve
    run = resolve(str(tmp_path / "run"))
    rows = RowFile(run, "outcomes", task, OUTCOME_SCHEMA)
    for path, status, reason in outcomes:
        rows.append(path, status, "train" if status == "written" else None, 0, None, reason)
    for name, written in parquet.items():
        run.join(name).parent.makedirs()
        pq.write_table(pa.table({"path": [p for p, _ in written], "label": pa.array([c for _, c in written],
                                                                                  pa.int32())}), run.join(name).path)
    return run, rows.close(list(chunks), sorted(parquet)).to_pylist()[0]


CHUNKS = [[("/t/a/1.png", 0, "a", "train"), ("/t/a/2.png", 0, "a", "train"), ("/t/b/3.png", 1, "b", "test")]]
GOOD = [("/t/a/1.png", "written", None), ("/t/b/3.png", "written", None), ("/t/a/2.png", "rejected", "empty file")]
PARTS = {"train/part-00000-1.parquet": [("/t/a/1.png", 0)], "test/part-00000-1.parquet": [("/t/b/3.png", 1)]}


def test_outcomes_are_reconciled_file_by_file_and_the_ledger_written_through(tmp_path):
    from pipelines.etl.outcomes import reconcile
    run, task = task_files(tmp_path, GOOD, PARTS)
    stray = run.join("train", "part-00000-7.parquet")  # a failed attempt's file: no summary names it
    stray.write_bytes(b"partial")
    ledger = run.join("rejected.jsonl")
    result = reconcile(run, 4, [("/t/a/x.txt", "skipped", "not an image extension (.jpg)")], CHUNKS, [task], ledger)
    assert dict(result.counts) == {"written": 2, "rejected": 1, "skipped": 1}
    assert dict(result.reasons) == {"rejected: empty file": 1, "skipped: not an image extension": 1}
    assert dict(result.task_reasons) == {"empty file": 1}
    assert {s: (st.rows, st.files, dict(st.per_class)) for s, st in result.stats.items()} == {
        "train": (1, 1, {0: 1}), "validation": (0, 0, {}), "test": (1, 1, {1: 1})}
    lines = [json.loads(line) for line in ledger.read_bytes().decode().splitlines()]
    assert [(e["path"], e["status"]) for e in lines] == [("/t/a/x.txt", "skipped"), ("/t/a/2.png", "rejected")]
    assert not stray.exists() and not run.join("_tasks").exists()


@pytest.mark.parametrize("outcomes, parts, chunks, found, message", [
    (GOOD, PARTS, (0,), 5, "counts do not reconcile: found 5 != written 2 \\+ rejected 1 \\+ skipped 0"),
    (GOOD[:2], PARTS, (0,), 3, "candidate /t/a/2.png has no outcome: a Spark task lost it"),
    (GOOD + [("/t/c/9.png", "rejected", "empty file")], PARTS, (0,), 4, "reported /t/c/9.png which its chunks"),
    (GOOD + [GOOD[2]], PARTS, (0,), 3, "reported /t/a/2.png twice"),
    (GOOD, {**PARTS, "validation/part-00000-1.parquet": [("/t/a/1.png", 0)]}, (0,), 3, "/t/a/1.png was written twice"),
    (GOOD, {"train/part-00000-1.parquet": [("/t/a/1.png", 0)]}, (0,), 3, "hold 1 row but its task reported 2"),
    (GOOD, PARTS, (0, 0), 3, "chunks \\[0\\] were processed \\[2\\] times"),
    (GOOD, PARTS, (), 3, "chunks \\[0\\] were processed \\[0\\] times"),
])
def test_outcomes_that_do_not_reconcile_are_refused(tmp_path, outcomes, parts, chunks, found, message):
    from pipelines.etl.outcomes import reconcile
    run, task = task_files(tmp_path, outcomes, parts, chunks)
    with pytest.raises(RuntimeError, match=message):
        reconcile(run, found, [], CHUNKS, [task], run.join("rejected.jsonl"))


def test_a_row_file_shorter_than_its_task_says_is_refused(tmp_path):
    from pipelines.etl.outcomes import read_rows
    run, task = task_files(tmp_path, GOOD, PARTS)
    with pytest.raises(RuntimeError, match="holds 3 rows, its task reported 4"):
        list(read_rows(run, {**task, "rows": 4}))
