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
from tests.support.env import REPO, subprocess_env
from tests.support.imagegen import encode, write

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
        named = {p.location.path for s in SPLITS for p in Manifest.read(output).part_locations(output, s)}
        run = os.path.join(output, "runs", manifest["run_id"])
        on_disk = {os.path.join(d, n) for d, _, names in os.walk(run) for n in names}
        assert on_disk == named | {os.path.join(output, files["list"])}
