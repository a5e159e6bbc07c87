"""Per-file outcomes at scale: they never reach the driver as one collected Spark result.

Spark aborts a job whose tasks' results add up to more than ``spark.driver.maxResultSize`` (1 GiB
by default: about ten million outcome rows), after all the tasks' work is done. Here that limit
is scaled down to 32 KiB, which 500 files' rows (hash pass and main pass: about 65 KiB each)
exceed; the tasks write their rows beside their output and return one small row each.
"""
import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from pipelines.contract import SPLITS
from pipelines.manifest import Manifest
from tests.conftest import subprocess_env
from tests.imagegen import encode, write

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_RESULT = "32k"
CLASSES, PER_CLASS, COPIES, UNDECODABLE, NOT_IMAGES = 4, 125, 6, 5, 3

# Two runs in one Spark session whose maxResultSize is 32 KiB: with the duplicate check (its hash
# pass collects a row per candidate too) and without it (the main pass alone).
RUNS = '''
import json, sys
from pipelines.etl.config import ETLConfig
from pipelines.etl.job import run_etl
from pipelines.runtime.spark import spark_session

root, out, limit = sys.argv[1:4]
spark = spark_session("etl-outcomes", "local[2]", {"spark.driver.maxResultSize": limit})
assert spark.sparkContext.getConf().get("spark.driver.maxResultSize") == limit
manifests = {}
for dedupe in (True, False):
    config = ETLConfig(input=root, output=f"{out}-{dedupe}", image_size=8, min_row_groups=1, dedupe=dedupe,
                       num_partitions=4)
    manifests[str(dedupe)] = run_etl(config, spark)
print("MANIFESTS " + json.dumps(manifests))
'''


def tiny_tree(root: str) -> None:
    """``CLASSES * PER_CLASS`` distinct 4x4 PNGs, then byte copies, undecodable files and files
    without an image extension."""
    for c in range(CLASSES):
        for i in range(PER_CLASS):
            write(os.path.join(root, f"{c + 1:03d}.c{c}", f"{i:04d}.png"),
                  encode(Image.new("RGB", (4, 4), (i % 256, i // 256, c)), "PNG"))
    first = os.path.join(root, "001.c0")
    for i in range(COPIES):
        with open(os.path.join(first, f"{i:04d}.png"), "rb") as f:
            write(os.path.join(first, f"copy-{i}.png"), f.read())
    for i in range(UNDECODABLE):
        write(os.path.join(root, "002.c1", f"bad-{i}.png"), f"not a PNG {i}\n".encode())
    for i in range(NOT_IMAGES):
        write(os.path.join(root, "003.c2", f"notes-{i}.txt"), b"text")


@pytest.mark.slow
def test_outcomes_of_many_files_exceed_max_result_size_and_the_run_still_reconciles(tmp_path):
    root, out = str(tmp_path / "tree"), str(tmp_path / "out")
    tiny_tree(root)
    proc = subprocess.run([sys.executable, "-c", RUNS, root, out, MAX_RESULT], capture_output=True, text=True,
                          env=subprocess_env(PYTHONPATH=REPO), timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifests = json.loads(proc.stdout.split("MANIFESTS ", 1)[1])
    images = CLASSES * PER_CLASS
    found = images + COPIES + UNDECODABLE + NOT_IMAGES
    expected = {"True": (found, images, COPIES + UNDECODABLE, NOT_IMAGES),
                "False": (found, images + COPIES, UNDECODABLE, NOT_IMAGES)}
    for dedupe, manifest in manifests.items():
        output = f"{out}-{dedupe}"
        files = manifest["files"]
        assert (files["found"], files["written"], files["rejected"], files["skipped"]) == expected[dedupe]
        assert files["reasons"].get("rejected: duplicate", 0) == (COPIES if dedupe == "True" else 0)
        assert files["reasons"]["rejected: not a supported raster image"] == UNDECODABLE
        assert sum(manifest["splits"][s]["rows"] for s in SPLITS) == files["written"]
        with open(os.path.join(output, files["list"]), encoding="utf-8") as f:
            ledger = [json.loads(line) for line in f]
        assert len(ledger) == len({e["path"] for e in ledger}) == files["rejected"] + files["skipped"]
        assert {os.path.basename(e["path"]) for e in ledger if e["status"] == "rejected"} == (
            {f"bad-{i}.png" for i in range(UNDECODABLE)} | ({f"copy-{i}.png" for i in range(COPIES)}
                                                           if dedupe == "True" else set()))
        # the run folder holds what the manifest names and nothing else: no task's outcome file
        named = {p.path for s in SPLITS for p in Manifest.read(output).part_locations(output, s)}
        run = os.path.join(output, "runs", manifest["run_id"])
        on_disk = {os.path.join(d, n) for d, _, names in os.walk(run) for n in names}
        assert on_disk == named | {os.path.join(output, files["list"])}


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
