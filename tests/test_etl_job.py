"""The ETL job end to end on real Spark, on a generated tree with every kind of bad file."""
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines.etl.cli import main as etl_main
from pipelines.etl.config import ETLConfig
from pipelines.etl.job import run_etl
from tests.conftest import BIN, subprocess_env
from tests.imagegen import make_tree

pytestmark = pytest.mark.slow
SIZE = 32
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_rows(split_dir):
    return pq.read_table(split_dir).to_pylist()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tree") / "caltech")
    expected = make_tree(root, classes=3, per_class=14)
    return root, expected


@pytest.fixture(scope="module")
def submitted(tree, tmp_path_factory):
    """One run through spark-submit, as a user runs it."""
    root, _ = tree
    out = str(tmp_path_factory.mktemp("etl") / "out")
    cmd = [os.path.join(BIN, "spark-submit"), "--master", "local[2]", os.path.join(REPO, "jobs", "etl.py"),
           "--input", root, "--output", out, "--image-size", str(SIZE), "--test-fraction", "0.3",
           "--min-row-groups", "4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "manifest.json")) as f:
        return out, json.load(f), proc.stdout


def test_counts_reconcile_and_the_summary_says_so(tree, submitted):
    root, expected = tree
    out, manifest, stdout = submitted
    files = manifest["files"]
    all_files = sum(len(fs) for _, _, fs in os.walk(root))
    assert files["found"] == all_files
    assert files["written"] == expected["good"]
    assert files["rejected"] == len(expected["rejected"])
    assert files["skipped"] == len(expected["skipped"])
    assert files["found"] == files["written"] + files["rejected"] + files["skipped"]
    assert f"found {all_files} = written {expected['good']}" in stdout
    assert "images/s" in stdout


def test_rejected_list_names_every_bad_file_with_its_reason(tree, submitted):
    _, expected = tree
    out, _, _ = submitted
    with open(os.path.join(out, "rejected.jsonl")) as f:
        entries = {e["path"]: e for e in map(json.loads, f)}
    for status, wanted in (("rejected", expected["rejected"]), ("skipped", expected["skipped"])):
        for path, reason in wanted.items():
            assert entries[path]["status"] == status, path
            assert reason in entries[path]["reason"], (path, entries[path]["reason"])
    assert len(entries) == len(expected["rejected"]) + len(expected["skipped"])


def test_rows_bytes_labels_and_disjoint_splits(tree, submitted):
    root, expected = tree
    out, manifest, _ = submitted
    train, test = read_rows(os.path.join(out, "train")), read_rows(os.path.join(out, "test"))
    assert len(train) + len(test) == expected["good"]
    assert {r["path"] for r in train}.isdisjoint({r["path"] for r in test})
    assert 0.1 < len(test) / expected["good"] < 0.5
    for row in train + test:
        assert len(row["image"]) == SIZE * SIZE * 3
        folder = os.path.relpath(row["path"], root).split(os.sep)[0]
        assert row["label"] == int(folder[:3]) - 1 and row["label_name"] == folder[4:]
        assert row["height"] > 0 and row["width"] > 0
    assert manifest["class_names"] == ["class0", "class1", "class2"]
    assert manifest["splits"]["train"]["rows"] == len(train)
    assert sum(manifest["splits"]["test"]["per_class"]) == len(test)
    by_name = {os.path.basename(r["path"]): r for r in train + test}
    cmyk = np.frombuffer(by_name["cmyk.jpg"]["image"], np.uint8).reshape(SIZE, SIZE, 3)
    assert np.abs(cmyk[SIZE // 2, SIZE // 2].astype(int) - (255, 0, 0)).max() <= 3
    grey = np.frombuffer(by_name["grey.jpg"]["image"], np.uint8).reshape(SIZE, SIZE, 3)
    assert (grey[..., 0] == grey[..., 2]).all()
    assert "with space é.jpg" in by_name and "x.png" in by_name  # odd names, nested folders


def test_row_groups_are_bounded_and_enough_for_the_declared_world_size(submitted):
    out, manifest, _ = submitted
    rpg = manifest["rows_per_row_group"]
    for split in ("train", "test"):
        split_dir = os.path.join(out, split)
        groups = []
        for name in os.listdir(split_dir):
            if name.endswith(".parquet"):
                meta = pq.ParquetFile(os.path.join(split_dir, name)).metadata
                groups += [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert max(groups) <= rpg
        assert len(groups) == manifest["splits"][split]["row_groups"] >= 4
    assert manifest["max_world_size"] >= manifest["min_row_groups"] == 4


def test_rerun_gives_the_same_split_and_overwrites_cleanly(tree, submitted, spark, tmp_path):
    root, _ = tree
    out, manifest, _ = submitted
    config = ETLConfig(input=root, output=str(tmp_path / "again"), image_size=SIZE, test_fraction=0.3,
                       min_row_groups=4)
    first = run_etl(config, spark=spark)
    second = run_etl(config, spark=spark)
    for split in ("train", "test"):
        paths = lambda d: sorted(pq.read_table(os.path.join(d, split), columns=["path"]).column("path").to_pylist())
        assert paths(config.output) == paths(out)
        assert len(os.listdir(os.path.join(config.output, split))) == first["splits"][split]["files"]
    assert second["files"] == first["files"] == manifest["files"]
    assert not os.path.exists(os.path.join(config.output, "_staging"))


def test_another_seed_gives_another_split(tree, spark, tmp_path):
    root, _ = tree
    a = run_etl(ETLConfig(input=root, output=str(tmp_path / "a"), image_size=8, seed=1, min_row_groups=1), spark)
    b = run_etl(ETLConfig(input=root, output=str(tmp_path / "b"), image_size=8, seed=2, min_row_groups=1), spark)
    paths = lambda m, d: set(pq.read_table(os.path.join(d, "test"), columns=["path"]).column("path").to_pylist())
    assert paths(a, str(tmp_path / "a")) != paths(b, str(tmp_path / "b"))


def test_missing_input_is_a_clear_error_before_spark(tmp_path, capsys):
    code = etl_main(["--input", str(tmp_path / "nope"), "--output", str(tmp_path / "out")])
    assert code == 2 and "input folder does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["same", "inside", "around"])
def test_output_that_would_overwrite_the_input_is_refused(tree, tmp_path, where):
    root, _ = tree
    output = {"same": root, "inside": os.path.join(root, "out"), "around": os.path.dirname(root)}[where]
    before = sorted(os.listdir(root))
    assert etl_main(["--input", root, "--output", output]) == 2
    assert sorted(os.listdir(root)) == before


def test_hostile_names_are_accounted_for(spark, tmp_path):
    """Names that break Hadoop or Spark: ':' (Hadoop's .crc paths), bytes that are not UTF-8, and
    a GIF that calls itself .jpg."""
    from PIL import Image
    from tests.imagegen import encode, write
    root = str(tmp_path / "tree")
    make_tree(root, classes=2, per_class=5, bad=False)
    write(os.path.join(root, "001.class0", "photo:v2.jpg"), encode(Image.new("RGB", (30, 20), (9, 9, 9))))
    write(os.path.join(root, "001.class0", "notes:v2.txt"), b"not input")
    write(os.path.join(root, "001.class0", "disguised.jpg"), encode(Image.new("RGB", (8, 8)), "GIF"))
    with open(os.fsencode(os.path.join(root, "001.class0")) + b"/caf\xe9.jpg", "wb") as f:
        f.write(encode(Image.new("RGB", (8, 8))))
    out = str(tmp_path / "out")
    manifest = run_etl(ETLConfig(input=root, output=out, image_size=16, min_row_groups=1), spark)
    files = manifest["files"]
    assert files["found"] == 14 == files["written"] + files["rejected"] + files["skipped"]
    assert files["written"] == 11 and files["rejected"] == 2 and files["skipped"] == 1
    with open(os.path.join(out, "rejected.jsonl")) as f:
        reasons = {os.path.basename(e["path"]): e["reason"] for e in map(json.loads, f)}
    assert reasons["disguised.jpg"].startswith("not a JPEG or PNG")
    assert reasons["caf\ufffd.jpg"].startswith("file name is not valid UTF-8")
    assert reasons["notes:v2.txt"].startswith("not an image extension")


@pytest.mark.parametrize("make, message", [
    (lambda root: os.symlink(os.path.join(root, "001.class0"), os.path.join(root, "001.class0", "loop")),
     "folder symlink"),
    (lambda root: os.mkfifo(os.path.join(root, "001.class0", "pipe.jpg")), "not a regular file"),
])
def test_trees_spark_cannot_list_safely_are_refused_before_spark(tmp_path, make, message, capsys):
    root = str(tmp_path / "tree")
    make_tree(root, classes=1, per_class=2, bad=False)
    make(root)
    assert etl_main(["--input", root, "--output", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_foreign_output_folders_are_not_overwritten(tree, tmp_path, capsys):
    root, _ = tree
    (tmp_path / "out" / "train").mkdir(parents=True)
    (tmp_path / "out" / "train" / "precious.txt").write_text("keep me")
    assert etl_main(["--input", root, "--output", str(tmp_path / "out")]) == 2
    assert (tmp_path / "out" / "train" / "precious.txt").exists() and "refusing" in capsys.readouterr().err


def test_glob_characters_in_the_input_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        etl_main(["--input", str(tmp_path / "in*"), "--output", str(tmp_path / "out")])
    assert "glob character" in capsys.readouterr().err
