"""The ETL job end to end on real Spark, on a generated tree with every kind of bad file."""
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines.contract import SPLITS
from pipelines.manifest import Manifest, manifest_sha256
from pipelines.etl.cli import main as etl_main
from pipelines.etl.config import ETLConfig
from pipelines.etl.images import ACCEPTED_FORMATS as ETL_FORMATS
from pipelines.etl.job import run_etl
from pipelines.etl.plan import plan
from tests.support.env import BIN, REPO, subprocess_env
from tests.support.imagegen import make_tree
from tests.support.outputs import mlflow_run

pytestmark = pytest.mark.slow
SIZE = 32


def split_files(out, split):
    """The Parquet files of ``split`` that the output's manifest names (local paths)."""
    return [part.location.path for part in Manifest.read(out).part_locations(out, split)]


def read_rows(out, split, columns=None):
    """The rows of ``split`` in the files the manifest names."""
    files = split_files(out, split)
    return pq.read_table(files, columns=columns).to_pylist() if files else []


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tree") / "caltech")
    expected = make_tree(root, classes=3, per_class=14)
    return root, expected


@pytest.fixture(scope="module")
def submitted(tree, tmp_path_factory):
    """One run through spark-submit, as a user runs it, tracked to the default MLflow store: its
    output, manifest and stdout (where spark-submit also sends the Python driver's log)."""
    root, _ = tree
    out = str(tmp_path_factory.mktemp("etl") / "out")
    cmd = [os.path.join(BIN, "spark-submit"), "--master", "local[2]", os.path.join(REPO, "jobs", "etl.py"),
           "--input", root, "--output", out, "--image-size", str(SIZE), "--test-fraction", "0.3",
           "--validation-fraction", "0.25",
           "--min-row-groups", "4", "--tracking"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "manifest.json")) as f:
        return out, json.load(f), proc.stdout


@pytest.mark.current
def test_counts_reconcile_and_the_summary_says_so(tree, submitted):
    root, expected = tree
    out, manifest, stdout = submitted
    files = manifest["files"]
    all_files = sum(len(fs) for _, _, fs in os.walk(root))
    assert files["found"] == all_files
    assert files["written"] == expected["good"]
    assert files["rejected"] == len(expected["rejected"])
    assert files["skipped"] == len(expected["skipped"])
    assert f"found {all_files} = written {expected['good']}" in stdout
    assert "images/s" in stdout


def test_the_driver_logs_each_pass_in_images_done_out_of_the_total(tree, submitted):
    root, _ = tree
    out, manifest, terminal = submitted
    candidates = len(plan(ETLConfig(input=root, output=out, image_size=SIZE)).candidates)
    kept = candidates - manifest["files"]["reasons"].get("rejected: duplicate", 0)
    for what, total in (("duplicate check", candidates), ("decode and write", kept)):
        lines = [line for line in terminal.splitlines() if re.search(rf" INFO {what}: [0-9,]+/", line)]
        assert f"{what}: 0/{total} images (0 %), rate not known yet (" in lines[0], lines
        assert re.search(rf"{what}: {total}/{total} images \(100 %\), [0-9.]+ images/s, done in [0-9a-z ]+$",
                         lines[-1]), lines
    assert kept >= manifest["files"]["written"] > 0


@pytest.mark.current
def test_the_etl_is_one_mlflow_run_with_its_counts(submitted):
    out, manifest, _ = submitted
    client, run = mlflow_run(out)
    assert run.info.status == "FINISHED" and client.get_experiment(run.info.experiment_id).name == "pipelines-etl"
    logged, files, splits = run.data.metrics, manifest["files"], manifest["splits"]
    assert {key: logged[f"files.{key}"] for key in ("found", "written", "rejected", "skipped")} == \
        {key: files[key] for key in ("found", "written", "rejected", "skipped")}
    assert {key: logged[key] for key in ("train.rows", "test.rows", "train.row_groups", "num_classes")} == {
        "train.rows": splits["train"]["rows"], "test.rows": splits["test"]["rows"],
        "train.row_groups": splits["train"]["row_groups"], "num_classes": 3}
    assert run.data.tags["manifest_sha256"] == manifest_sha256(out) and run.data.tags["stage"] == "etl"
    assert (run.data.params["image_size"], run.data.params["test_fraction"]) == (str(SIZE), "0.3")
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["manifest.json", "rejected.jsonl"]
    assert run.info.artifact_uri.startswith(os.path.join(out, "mlruns", run.info.experiment_id))


def test_rejected_list_names_every_bad_file_with_its_reason(tree, submitted):
    _, expected = tree
    out, _, _ = submitted
    with open(Manifest.read(out).rejected_location(out).path) as f:
        entries = {e["path"]: e for e in map(json.loads, f)}
    for status, wanted in (("rejected", expected["rejected"]), ("skipped", expected["skipped"])):
        for path, reason in wanted.items():
            assert entries[path]["status"] == status, path
            assert reason in entries[path]["reason"], (path, entries[path]["reason"])
    assert len(entries) == len(expected["rejected"]) + len(expected["skipped"])


@pytest.mark.current
def test_rows_bytes_labels_and_disjoint_splits(tree, submitted):
    root, expected = tree
    out, manifest, _ = submitted
    train, test = read_rows(out, "train"), read_rows(out, "test")
    assert len(train) + len(test) + manifest["splits"]["validation"]["rows"] == expected["good"]
    assert {r["path"] for r in train}.isdisjoint({r["path"] for r in test})
    assert 0.1 < len(test) / expected["good"] < 0.5
    for row in train + test:
        assert len(row["image"]) == SIZE * SIZE * 3
        folder = os.path.relpath(row["path"], root).split(os.sep)[0]
        assert row["label"] == int(folder[:3]) - 1 and row["label_name"] == folder[4:]
        assert row["height"] > 0 and row["width"] > 0
    assert manifest["class_names"] == ["class0", "class1", "class2"] and manifest["layout"] == "caltech"
    assert manifest["classes_not_in_every_split"] == []
    validation = read_rows(out, "validation")
    assert {r["label"] for r in validation} == {0, 1, 2}  # every class chooses the epoch
    assert not {r["path"] for r in validation} & {r["path"] for r in train + test}
    assert (manifest["validation_fraction"], manifest["format_version"]) == (0.25, 3)
    assert {r["label"] for r in test} == {0, 1, 2}  # stratified: every class is evaluated
    assert manifest["splits"]["train"]["rows"] == len(train)
    assert sum(manifest["splits"]["test"]["per_class"]) == len(test)
    by_name = {os.path.basename(r["path"]): r for r in train + validation + test}
    cmyk = np.frombuffer(by_name["cmyk.jpg"]["image"], np.uint8).reshape(SIZE, SIZE, 3)
    assert np.abs(cmyk[SIZE // 2, SIZE // 2].astype(int) - (255, 0, 0)).max() <= 3
    grey = np.frombuffer(by_name["grey.jpg"]["image"], np.uint8).reshape(SIZE, SIZE, 3)
    assert (grey[..., 0] == grey[..., 2]).all()
    assert "with space é.jpg" in by_name and "x.png" in by_name  # odd names, nested folders


def test_row_groups_are_bounded_and_enough_for_the_declared_world_size(submitted):
    out, manifest, _ = submitted
    rpg = manifest["rows_per_row_group"]
    counted = {}
    for split in SPLITS:
        groups = []
        for name in split_files(out, split):
            meta = pq.ParquetFile(name).metadata
            sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            assert sizes[:-1] == [rpg] * (len(sizes) - 1) and 1 <= sizes[-1] <= rpg, (name, sizes)
            groups += sizes
        assert len(groups) == manifest["splits"][split]["row_groups"] >= 4
        counted[split] = len(groups)
    # the train split's row groups, counted in the files: the test split is sharded by rows when
    # ranks outnumber its row groups (here it has fewer, so a min of both would differ)
    assert counted["test"] < counted["train"] == manifest["max_world_size"]
    assert manifest["min_row_groups"] == 4


def test_rerun_gives_the_same_split_and_overwrites_cleanly(tree, submitted, spark, tmp_path):
    root, _ = tree
    out, manifest, _ = submitted
    config = ETLConfig(input=root, output=str(tmp_path / "again"), image_size=SIZE, test_fraction=0.3,
                       validation_fraction=0.25, min_row_groups=4)
    first = run_etl(config, spark=spark)
    # the rerun reads a copy of the tree elsewhere, cut into another number of tasks: the split
    # depends on the seed and each file's path relative to the root, nothing else
    copy = shutil.copytree(root, str(tmp_path / "copy" / "caltech"), symlinks=True)
    second = run_etl(dataclasses.replace(config, input=copy, num_partitions=3), spark=spark)
    assert first["run_id"] < second["run_id"]
    assert first["config"]["num_partitions"] == 0 and second["config"]["num_partitions"] == 3
    for split in SPLITS:
        paths = lambda d: sorted(r["path"] for r in read_rows(d, split, ["path"]))
        assert paths(config.output) == [os.path.join(copy, os.path.relpath(p, root)) for p in paths(out)]
        # one per task that has rows of the split (the small validation split may miss a task)
        assert len(split_files(config.output, split)) == second["splits"][split]["files"] <= 3
        assert split != "train" or second["splits"][split]["files"] == 3
        assert all(p.startswith(f"runs/{second['run_id']}/{split}/") for p in second["splits"][split]["parts"])
    assert {k: v for k, v in second["files"].items() if k != "list"} == \
        {k: v for k, v in first["files"].items() if k != "list"} == \
        {k: v for k, v in manifest["files"].items() if k != "list"}
    # the first run was deleted once the second committed: only the committed run's files remain
    assert sorted(os.listdir(config.output)) == ["manifest.json", "runs"]
    assert os.listdir(os.path.join(config.output, "runs")) == [second["run_id"]]


def test_a_format_1_output_is_replaced_and_its_folders_removed(spark, tmp_path):
    from tests.support.datagen import write_dataset
    root, out = str(tmp_path / "tree"), str(tmp_path / "out")
    make_tree(root, classes=2, per_class=3, bad=False)
    write_dataset(out, [1, 1], [1], size=8)  # format 1: manifest.json beside train/ and test/
    open(os.path.join(out, "rejected.jsonl"), "w").close()
    manifest = run_etl(ETLConfig(input=root, output=out, image_size=8, min_row_groups=1), spark)
    assert sorted(os.listdir(out)) == ["manifest.json", "runs"]
    assert sum(len(read_rows(out, split)) for split in SPLITS) == manifest["files"]["written"] == 6


def test_another_seed_gives_another_split(tree, spark, tmp_path):
    root, _ = tree
    a = run_etl(ETLConfig(input=root, output=str(tmp_path / "a"), image_size=8, seed=1, min_row_groups=1), spark)
    b = run_etl(ETLConfig(input=root, output=str(tmp_path / "b"), image_size=8, seed=2, min_row_groups=1), spark)
    paths = lambda d: {r["path"] for r in read_rows(d, "test", ["path"])}
    assert paths(str(tmp_path / "a")) != paths(str(tmp_path / "b"))


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


def read_ledger(out):
    with open(Manifest.read(out).rejected_location(out).path, encoding="utf-8") as f:
        return {os.path.basename(e["path"]): e for e in map(json.loads, f)}


def test_hostile_names_are_accounted_for(spark, tmp_path):
    """Names that break Hadoop or Spark: ':' (Hadoop's .crc paths), bytes that are not UTF-8 (two
    that differ only there), a valid name holding U+FFFD, and a GIF that calls itself .jpg; and
    files that cannot be read whole: a broken symlink, one above --max-file-mb."""
    from PIL import Image
    from tests.support.imagegen import encode, write
    root = str(tmp_path / "tree")
    make_tree(root, classes=2, per_class=5, bad=False)
    write(os.path.join(root, "001.class0", "photo:v2.jpg"), encode(Image.new("RGB", (30, 20), (9, 9, 9))))
    write(os.path.join(root, "001.class0", "notes:v2.txt"), b"not input")
    write(os.path.join(root, "001.class0", "disguised.jpg"), encode(Image.new("RGB", (8, 8), (0, 0, 255)), "GIF"))
    write(os.path.join(root, "001.class0", "replacement\ufffd.jpg"), encode(Image.new("RGB", (8, 8), (0, 255, 0))))
    for shade, byte in ((64, b"\xe9"), (128, b"\xe8")):
        with open(os.fsencode(os.path.join(root, "001.class0")) + b"/caf" + byte + b".jpg", "wb") as f:
            f.write(encode(Image.new("RGB", (8, 8), (shade, shade, shade))))
    os.symlink(os.path.join(root, "nowhere.jpg"), os.path.join(root, "001.class0", "gone.jpg"))
    write(os.path.join(root, "001.class0", "huge.jpg"), os.urandom(1024 * 1024 + 1))  # 1 MiB + 1 byte
    out = str(tmp_path / "out")
    manifest = run_etl(ETLConfig(input=root, output=out, image_size=16, min_row_groups=1, max_file_mb=1), spark)
    files = manifest["files"]
    assert files["found"] == 18 == sum(len(names) for _, _, names in os.walk(root))  # 10 + 8 written above
    assert files["written"] == 13 and files["rejected"] == 4 and files["skipped"] == 1
    reasons = {name: e["reason"] for name, e in read_ledger(out).items()}
    assert reasons["gone.jpg"] == "unreadable (broken link or permission denied)"
    assert reasons["huge.jpg"] == "file too large: 1048577 bytes > 1048576 bytes (--max-file-mb)"
    assert "disguised.jpg" not in reasons and "replacement\ufffd.jpg" not in reasons
    assert reasons["caf\\xe9.jpg"].startswith("file name is not valid UTF-8")
    assert reasons["caf\\xe8.jpg"].startswith("file name is not valid UTF-8")
    assert reasons["notes:v2.txt"].startswith("not an image extension")


def test_copies_links_fifos_and_foreign_formats_are_recorded_and_each_content_is_in_one_split(spark, tmp_path):
    """One run over a tree holding byte-identical copies (in one class; across two classes), a file
    link into the tree (followed), links out of it, a folder link, a FIFO (which must not block the
    job), a PSD named .jpg and an NFD class folder: each recorded with its reason, and the counts
    reconcile."""
    from PIL import Image
    from tests.support.imagegen import encode, write
    root = tmp_path / "tree"
    make_tree(str(root), classes=2, per_class=5, bad=False)
    nfd = "003.nai\u0308ve"
    for i in range(3):
        write(str(root / nfd / f"{i}.png"), encode(Image.new("RGB", (9, 7 + i), (30, 60, 90)), "PNG"))
    a, b = root / "001.class0", root / "002.class1"
    photo = (a / "0002.jpg").read_bytes()
    write(str(a / "copy of 0002.jpg"), photo)
    write(str(a / "deep" / "0002.jpg"), photo)
    os.symlink("0002.jpg", a / "link to 0002.jpg")  # into the tree: followed, so one more copy
    write(str(b / "0003-relabelled.jpg"), (a / "0003.jpg").read_bytes())  # same bytes, other class
    write(str(root / "_pool" / "p.jpg"), encode(Image.new("RGB", (11, 11), (250, 0, 0))))
    os.symlink("../_pool/p.jpg", b / "pooled.jpg")  # into a hidden folder of the tree: followed
    write(str(tmp_path / "outside.jpg"), encode(Image.new("RGB", (8, 8), (1, 2, 3))))
    os.symlink(tmp_path / "outside.jpg", b / "outside.jpg")
    os.symlink(tmp_path, b / "elsewhere")
    os.mkfifo(a / "pipe.jpg")
    write(str(b / "layers.jpg"), b"8BPS\x00\x01" + bytes(64))
    out = str(tmp_path / "out")
    manifest = run_etl(ETLConfig(input=str(root), output=out, image_size=8, min_row_groups=1), spark)
    reasons = {os.path.relpath(e["path"], root): e["reason"] for e in read_ledger_entries(out)}
    assert {k: v for k, v in reasons.items() if not k.startswith("_pool")} == {
        "001.class0/copy of 0002.jpg": "duplicate: same bytes as 001.class0/0002.jpg",
        "001.class0/deep/0002.jpg": "duplicate: same bytes as 001.class0/0002.jpg",
        "001.class0/link to 0002.jpg": "duplicate: same bytes as 001.class0/0002.jpg",
        "002.class1/0003-relabelled.jpg": "label conflict: same bytes as 001.class0/0003.jpg in class class0",
        "001.class0/pipe.jpg": "not a regular file (FIFO, socket or device): unread, reading it would block",
        "002.class1/outside.jpg": "symlink to a file outside the input tree: unread",
        "002.class1/elsewhere": "folder symlink: not followed (loops, duplicates), its files are not input; "
                                "copy or move the data",
        "002.class1/layers.jpg": "not a supported raster image (a Photoshop document (PSD); accepted: "
                                 + ", ".join(ETL_FORMATS) + ")",
    }
    files = manifest["files"]
    assert (files["found"], files["written"], files["rejected"], files["skipped"]) == (23, 14, 8, 1)
    assert files["reasons"]["rejected: duplicate"] == 3 and files["reasons"]["rejected: label conflict"] == 1
    rows = {os.path.relpath(r["path"], root): (split, r["label"], r["label_name"])
            for split in SPLITS for r in read_rows(out, split)}
    assert rows["002.class1/pooled.jpg"][1:] == (1, "class1") and rows["001.class0/0003.jpg"][1] == 0
    assert {rel: v[2] for rel, v in rows.items() if rel.startswith("003.")} == {f"{nfd}/{i}.png": nfd[4:] for i in range(3)}
    assert manifest["class_names"] == ["class0", "class1", nfd[4:]]
    contents = [hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in rows]
    assert len(set(contents)) == len(contents) == 14  # no content twice, so none in two splits
    assert manifest["hash_seconds"] > 0 and manifest["config"]["dedupe"] is True


def read_ledger_entries(out):
    with open(Manifest.read(out).rejected_location(out).path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_foreign_output_folders_are_not_overwritten(tree, tmp_path, capsys):
    root, _ = tree
    (tmp_path / "out" / "train").mkdir(parents=True)
    (tmp_path / "out" / "train" / "precious.txt").write_text("keep me")
    assert etl_main(["--input", root, "--output", str(tmp_path / "out")]) == 2
    assert (tmp_path / "out" / "train" / "precious.txt").exists() and "refusing" in capsys.readouterr().err


def test_glob_characters_in_the_input_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        etl_main(["--input", str(tmp_path / "in*"), "--output", str(tmp_path / "out")])
    assert info.value.code == 2
    assert "glob character" in capsys.readouterr().err


def test_formats_are_read_by_content_whatever_the_extension(spark, tmp_path):
    """GIF named .jpg, WebP named .png, BMP, TIFF and an animated GIF are written with the right
    pixels; EPS and PDF named .jpg are rejected with what Pillow saw; .eps is not input."""
    from PIL import Image
    from tests.support.imagegen import EPS, PDF, animated, encode, write
    root = str(tmp_path / "tree")
    make_tree(root, classes=2, per_class=2, bad=False)
    # one colour per file: equal pixels in two containers are copies, and all but one would be rejected
    colours = {"gif-named.jpg": (200, 30, 20), "webp-named.png": (30, 200, 20), "plain.BMP": (20, 30, 200),
               "scan.tif": (200, 200, 20), "moving.gif": (200, 20, 200), "tiff-named.jpeg": (20, 200, 200)}
    fill = {name: Image.new("RGB", (20, 10), colour) for name, colour in colours.items()}
    folder = os.path.join(root, "002.class1")
    good = {"gif-named.jpg": encode(fill["gif-named.jpg"], "GIF"),
            "webp-named.png": encode(fill["webp-named.png"], "WEBP", lossless=True),
            "plain.BMP": encode(fill["plain.BMP"], "BMP"),
            "scan.tif": encode(fill["scan.tif"], "TIFF", compression="tiff_lzw"),
            "moving.gif": animated("GIF", colours=(colours["moving.gif"], (0, 0, 255)), size=(20, 10)),
            "tiff-named.jpeg": encode(fill["tiff-named.jpeg"], "TIFF")}
    for name, data in good.items():
        write(os.path.join(folder, name), data)
    write(os.path.join(folder, "drawing-named.jpg"), EPS)
    write(os.path.join(folder, "paper-named.jpg"), PDF)
    write(os.path.join(folder, "drawing.eps"), EPS)
    out = str(tmp_path / "out")
    manifest = run_etl(ETLConfig(input=root, output=out, image_size=16, min_row_groups=1), spark)
    rows = {os.path.basename(r["path"]): r for split in SPLITS for r in read_rows(out, split)}
    assert set(good) < set(rows) and manifest["files"]["written"] == 4 + len(good)
    for name in good:
        image = np.frombuffer(rows[name]["image"], np.uint8).reshape(16, 16, 3)
        assert rows[name]["label"] == 1 and (rows[name]["height"], rows[name]["width"]) == (10, 20), name
        assert np.abs(image[8, 8].astype(int) - colours[name]).max() <= 12, name
        assert (image[0] == 255).all(), name  # white band above the 16x8 image
    ledger = read_ledger(out)
    assert ledger["drawing-named.jpg"]["reason"].startswith("not a supported raster image (EPS")
    assert ledger["paper-named.jpg"]["reason"].startswith("not a supported raster image (a PDF document")
    assert ledger["drawing.eps"]["status"] == "skipped"
    assert manifest["files"]["reasons"]["rejected: not a supported raster image"] == 2


UNICODE_TREE = {
    "001.café": ["été.jpg", "naïve.png", "crème brûlée.gif"],
    "002.日本": ["写真.png", "東京.jpg", "富士山.bmp"],
    "003.Ελληνικά": ["φωτογραφία.jpg", "Αθήνα.webp", "ΘΆΛΑΣΣΑ.JPG"],
    "004.nai\u0308ve": ["e\u0301te\u0301.jpg", "n\u0303.tif"],  # combining accents (NFD)
    "005.😀": ["🙂.jpg", "Ω.png"],
}


@pytest.fixture(scope="module")
def unicode_tree(tmp_path_factory):
    from PIL import Image
    from tests.support.imagegen import encode, write
    root = str(tmp_path_factory.mktemp("unicode") / "tree")
    formats = {".jpg": "JPEG", ".png": "PNG", ".gif": "GIF", ".bmp": "BMP", ".webp": "WEBP", ".tif": "TIFF"}
    for k, (folder, names) in enumerate(UNICODE_TREE.items()):
        for i, name in enumerate(names):  # distinct bytes: the same bytes twice would be a duplicate
            fmt = formats[os.path.splitext(name)[1].lower()]
            write(os.path.join(root, folder, name), encode(Image.new("RGB", (12 + i, 9), (i * 60, 40 * k, 200)), fmt))
    return root


@pytest.mark.parametrize("launcher", ["python", "spark-submit"])
def test_non_ascii_names_are_all_written_under_the_c_locale(unicode_tree, tmp_path, launcher):
    """Under LC_ALL=C the JVM would encode names as ASCII; the job reads every file anyway."""
    out = str(tmp_path / "out")
    entry = [sys.executable] if launcher == "python" else [os.path.join(BIN, "spark-submit"), "--master", "local[2]"]
    master = ["--master", "local[2]"] if launcher == "python" else []
    cmd = entry + [os.path.join(REPO, "jobs", "etl.py"), "--input", unicode_tree, "--output", out,
                   "--image-size", "8", "--min-row-groups", "1", "--test-fraction", "0.3"] + master
    env = subprocess_env(LC_ALL="C", LANG="C")
    env.pop("LC_CTYPE", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, encoding="utf-8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    total = sum(len(names) for names in UNICODE_TREE.values())
    assert f"found {total} = written {total} + rejected 0 + skipped 0" in proc.stdout
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["class_names"] == [folder[4:] for folder in UNICODE_TREE]
    rows = [r for split in SPLITS for r in read_rows(out, split)]
    assert sorted(os.path.relpath(r["path"], unicode_tree) for r in rows) == \
        sorted(f"{folder}/{name}" for folder, names in UNICODE_TREE.items() for name in names)
    for row in rows:
        folder = os.path.relpath(row["path"], unicode_tree).split("/")[0]
        assert (row["label"], row["label_name"]) == (int(folder[:3]) - 1, folder[4:])


def test_a_session_we_start_is_utf8_whatever_the_callers_locale():
    """The JVM's file-name encoding and the Python workers' file-system encoding, under LC_ALL=C."""
    code = ("from pipelines.runtime.spark import spark_session\n"
            "s = spark_session('locale', 'local[1]')\n"
            "jvm = s.sparkContext._jvm.System\n"
            "enc = s.sparkContext.parallelize([0], 1)"
            ".map(lambda _: __import__('sys').getfilesystemencoding()).collect()\n"
            "print(jvm.getProperty('sun.jnu.encoding'), jvm.getProperty('file.encoding'), enc[0])\n"
            "s.stop()\n")
    env = subprocess_env(LC_ALL="C", LANG="C")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ["UTF-8", "UTF-8", "utf-8"]


def snapshot(folder):
    """Every file under ``folder`` with its bytes."""
    found = {}
    for dirpath, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                found[os.path.relpath(os.path.join(dirpath, name), folder)] = f.read()
    return found


def test_a_run_that_writes_nothing_keeps_the_previous_output(spark, tmp_path, capsys):
    root, out = str(tmp_path / "tree"), str(tmp_path / "out")
    make_tree(root, classes=2, per_class=3, bad=False)
    args = ["--input", root, "--output", out, "--image-size", "8", "--min-row-groups", "1"]
    assert etl_main(args) == 0
    before = snapshot(out)
    assert "manifest.json" in before and any("/train/" in name for name in before)
    for dirpath, _, names in os.walk(root):  # every candidate becomes undecodable
        for name in names:
            with open(os.path.join(dirpath, name), "wb") as f:
                f.write(b"not an image any more: " + os.path.join(dirpath, name).encode())  # distinct: no copies
    capsys.readouterr()
    assert etl_main(args) == 1
    err = capsys.readouterr().err
    assert "no image written: 6 candidate images, all rejected (6 not a supported raster image)" in err
    assert "was left as it was" in err
    (failed,) = set(os.listdir(os.path.join(out, "runs"))) - {json.loads(before["manifest.json"])["run_id"]}
    assert {k: v for k, v in snapshot(out).items() if not k.startswith(f"runs/{failed}/")} == before
    assert f"runs/{failed}/rejected.jsonl" in err
    with open(os.path.join(out, "runs", failed, "rejected.jsonl")) as f:
        assert len(f.readlines()) == 6


@pytest.mark.parametrize("classes, per_class, empty", [(1000, 2, "validation split"), (3, 1, "validation and test splits")])
def test_classes_too_small_for_every_split_are_refused_before_spark(tmp_path, capsys, classes, per_class, empty):
    """Training refuses an output with an empty split: the ETL refuses to write one (exit 2, no
    Spark, the output untouched), naming the split, the fraction flags and the classes."""
    root, out = tmp_path / "tree", tmp_path / "out"
    for c in range(classes):
        for i in range(per_class):
            (root / f"{c + 1:04d}.k{c}").mkdir(parents=True, exist_ok=True)
            (root / f"{c + 1:04d}.k{c}" / f"{i}.jpg").write_bytes(f"{c}/{i}".encode())
    assert etl_main(["--input", str(root), "--output", str(out), "--test-fraction", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"the {empty} would be empty with --test-fraction 0.5 and --validation-fraction 0.1" in err
    assert f"0001.k0: {per_class}, 0002.k1: {per_class}" in err and "the output was not touched" in err
    assert not out.exists()


def test_every_class_of_three_is_in_every_split_and_a_split_read_as_nothing_is_not_committed(spark, tmp_path, capsys):
    """--test-fraction 0.5 on classes of 3 files: one file per split each (exit 0). Then every
    validation file becomes undecodable: no validation row, so exit 1 and the output kept."""
    from pipelines.etl.labels import split_class
    root, out = str(tmp_path / "tree"), str(tmp_path / "out")
    make_tree(root, classes=6, per_class=3, bad=False)
    args = ["--input", root, "--output", out, "--image-size", "8", "--min-row-groups", "1", "--test-fraction", "0.5"]
    assert etl_main(args) == 0
    manifest = json.loads(open(os.path.join(out, "manifest.json")).read())
    assert all(manifest["splits"][split]["per_class"] == [1] * 6 for split in SPLITS)
    assert manifest["classes_not_in_every_split"] == []
    before = snapshot(out)
    for c in range(6):
        folder = f"{c + 1:03d}.class{c}"
        names = [f"{folder}/{name}" for name in os.listdir(os.path.join(root, folder))]
        (validation,) = [p for p, split in split_class(names, 42, 0.5, 0.1).items() if split == "validation"]
        with open(os.path.join(root, validation), "wb") as f:
            f.write(b"not an image any more: " + validation.encode())
    capsys.readouterr()
    assert etl_main(args) == 1
    err = capsys.readouterr().err
    assert ("no image written to the validation split (validation: 6 candidates, all rejected on read: "
            "6 not a supported raster image), which training refuses") in err, err
    (failed,) = set(os.listdir(os.path.join(out, "runs"))) - {manifest["run_id"]}
    assert {k: v for k, v in snapshot(out).items() if not k.startswith(f"runs/{failed}/")} == before


def test_a_huge_file_is_rejected_and_never_stops_the_job(spark, tmp_path):
    """200 MB named .jpg inside --max-file-mb 250: read by its task in Python (no JVM heap), and
    rejected with a reason; a JPEG padded to 200 MB is read within the bound and written."""
    from PIL import Image
    from tests.support.imagegen import encode
    root, out = str(tmp_path / "tree"), str(tmp_path / "out")
    make_tree(root, classes=2, per_class=4, bad=False)
    size = 200 * 2**20
    with open(os.path.join(root, "001.class0", "huge.jpg"), "wb") as f:
        f.write(b"garbage, not an image")
        f.truncate(size)  # sparse: fast to make, read as 200 MB of bytes
    with open(os.path.join(root, "002.class1", "padded.jpg"), "wb") as f:
        f.write(encode(Image.new("RGB", (16, 12), (0, 200, 0))))
        f.truncate(size)
    assert etl_main(["--input", root, "--output", out, "--image-size", "8", "--min-row-groups", "1",
                     "--max-file-mb", "250"]) == 0
    with open(os.path.join(out, "manifest.json")) as f:
        files = json.load(f)["files"]
    assert (files["found"], files["written"], files["rejected"]) == (10, 9, 1)
    assert read_ledger(out)["huge.jpg"]["reason"].startswith("not a supported raster image")
    paths = {os.path.relpath(r["path"], root) for split in SPLITS for r in read_rows(out, split)}
    assert "002.class1/padded.jpg" in paths and len(paths) == 9


def test_max_file_mb_the_executors_cannot_hold_is_refused_before_spark(tree, tmp_path):
    root, _ = tree
    out = str(tmp_path / "out")
    cmd = [sys.executable, os.path.join(REPO, "jobs", "etl.py"), "--input", root, "--output", out,
           "--max-file-mb", "10000000", "--master", "local[2]"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "not enough memory" in proc.stderr and "GiB" in proc.stderr
    assert "physical memory of this machine (local[2])" in proc.stderr
    assert "SparkContext" not in proc.stderr and not os.path.exists(out)


def test_max_file_mb_is_checked_against_a_running_session_too(spark, tree, tmp_path, capsys):
    root, _ = tree
    code = etl_main(["--input", root, "--output", str(tmp_path / "out"), "--max-file-mb", "10000000"])
    assert code == 2 and "not enough memory" in capsys.readouterr().err


def test_a_file_that_vanishes_after_listing_is_a_recorded_rejection(spark, tmp_path):
    from pipelines.etl.job import finish, run_spark
    from pipelines.etl.plan import plan
    root, out = str(tmp_path / "tree"), str(tmp_path / "out")
    make_tree(root, classes=2, per_class=3, bad=False)
    config = ETLConfig(input=root, output=out, image_size=8, min_row_groups=1)
    the_plan = plan(config)
    gone = the_plan.candidates[0].path
    os.remove(gone)
    os.makedirs(out)
    manifest = finish(config, the_plan, run_spark(spark, config, the_plan), spark.version, 1.0)
    assert (manifest["files"]["found"], manifest["files"]["written"], manifest["files"]["rejected"]) == (6, 5, 1)
    with open(Manifest.read(out).rejected_location(out).path) as f:
        (entry,) = map(json.loads, f)
    assert entry["path"] == gone and entry["reason"].startswith("vanished after listing")


def test_candidates_are_spread_deterministically_and_row_groups_mix_classes(tree, submitted):
    from pipelines.etl.plan import plan
    from pipelines.etl.labels import split_class
    root, _ = tree
    out, manifest, _ = submitted
    config = ETLConfig(input=root, output=out, image_size=SIZE, test_fraction=0.3, validation_fraction=0.25,
                       min_row_groups=4)
    first, second = plan(config), plan(config)
    assert first.candidates == second.candidates
    assert [c.path for c in first.candidates] != sorted(c.path for c in first.candidates)
    for label in {c.label for c in first.candidates}:
        mine = [c for c in first.candidates if c.label == label]
        splits = split_class([os.path.relpath(c.path, root) for c in mine], 42, 0.3, 0.25)
        assert {c.path: c.split for c in mine} == {os.path.join(root, p): s for p, s in splits.items()}
    assert first.expected_rows["test"] == sum(c.split == "test" for c in first.candidates)
    mixed = 0
    for split in SPLITS:
        for name in split_files(out, split):
            parquet = pq.ParquetFile(name)
            for i in range(parquet.metadata.num_row_groups):
                mixed += len(set(parquet.read_row_group(i, columns=["label"]).column("label").to_pylist())) > 1
    assert mixed > 0


@pytest.fixture(scope="module")
def plain_tree(tmp_path_factory):
    """Keras/torchvision layout: class0..class2 with 5 images each, every kind of bad file, and a
    class 'zebra' with a single image."""
    from tests.support.imagegen import encode, random_photo, write
    root = str(tmp_path_factory.mktemp("plain") / "tree")
    expected = make_tree(root, classes=3, per_class=5, plain=True)
    write(os.path.join(root, "zebra", "only.jpg"), encode(random_photo(np.random.default_rng(1), 30, 30, 3)))
    return root, expected


def test_plain_folders_get_labels_by_sorted_name_and_every_class_a_test_row(plain_tree, spark, tmp_path):
    from pipelines.etl.summary import format_summary
    root, expected = plain_tree
    runs = {}
    for partitions in (1, 3):
        config = ETLConfig(input=root, output=str(tmp_path / f"p{partitions}"), image_size=8, test_fraction=0.1,
                           min_row_groups=1, num_partitions=partitions)
        runs[partitions] = (run_etl(config, spark), {split: read_rows(config.output, split)
                                                     for split in SPLITS})
    manifest, rows = runs[1]
    assert manifest["layout"] == "folders" and manifest["class_names"] == ["class0", "class1", "class2", "zebra"]
    files = manifest["files"]
    assert files["written"] == expected["good"] + 1
    assert files["found"] == sum(len(names) for _, _, names in os.walk(root))  # counted apart from the job
    assert (files["rejected"], files["skipped"]) == (len(expected["rejected"]), len(expected["skipped"]))
    for row in rows["train"] + rows["validation"] + rows["test"]:
        folder = os.path.relpath(row["path"], root).split("/")[0]
        assert (row["label"], row["label_name"]) == (["class0", "class1", "class2", "zebra"].index(folder), folder)
    assert {r["label"] for r in rows["test"]} == {0, 1, 2}  # every class with >= 2 images
    assert [r["label_name"] for r in rows["train"] + rows["validation"] + rows["test"] if r["label"] == 3] == ["zebra"]
    assert manifest["classes_not_in_every_split"] == [
        {"label": 3, "name": "zebra", "train": 1, "validation": 0, "test": 0}]
    assert "WARNING: 1 class is not in every split (a class of 1 file only trains" in format_summary(manifest)
    assert "'zebra' (1 train, 0 validation, 0 test)" in format_summary(manifest)
    # the split is the driver's: another partitioning writes exactly the same rows to each split
    other, other_rows = runs[3]
    for split in SPLITS:
        assert sorted(r["path"] for r in other_rows[split]) == sorted(r["path"] for r in rows[split])
        assert other["splits"][split]["per_class"] == manifest["splits"][split]["per_class"]


@pytest.mark.parametrize("files, reason", [
    # a new user's first try: one loose file, reported for its place, counted in the singular
    ({"notes.txt": b"hello", "001.empty/": None}, "(1 file listed: 1 not inside a class folder)"),
    ({"001.a/readme.md": b"x", "002.b/.hidden.jpg": b"x", "002.b/data.csv": b"1,2"}, "2 not an image extension"),
    ({"cats/": None, "dogs/": None}, "no file at all"),
])
def test_a_tree_without_any_image_file_is_refused_and_the_output_kept(tmp_path, capsys, files, reason):
    """Nothing to write: exit 2 before Spark, and a previous output stays byte for byte (committing
    an empty run would have replaced it with nothing)."""
    root = tmp_path / "tree"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            (root / name).mkdir()
        else:
            (root / name).write_bytes(data)
    out = tmp_path / "out"
    (out / "runs" / "r1" / "train").mkdir(parents=True)
    (out / "runs" / "r1" / "train" / "part-0.parquet").write_bytes(b"previous rows")
    (out / "manifest.json").write_text('{"run_id": "r1"}')
    assert etl_main(["--input", str(root), "--output", str(out), "--no-tracking"]) == 2
    err = capsys.readouterr().err
    assert "no image file to write under" in err and reason in err and "the output was not touched" in err, err
    assert (out / "manifest.json").read_text() == '{"run_id": "r1"}'
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == \
        ["manifest.json", "runs", "runs/r1", "runs/r1/train", "runs/r1/train/part-0.parquet"]


def test_a_mix_of_layouts_is_refused_before_spark(tmp_path, capsys):
    root = str(tmp_path / "tree")
    make_tree(root, classes=2, per_class=1, bad=False, plain=True)
    os.makedirs(os.path.join(root, "001.birds"))
    assert etl_main(["--input", root, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "mixed class folder layouts" in err and "'001.birds'" in err and "'class0'" in err
    assert not (tmp_path / "out").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB file system (tmpfs) mounted for the test; skipped, saying why, where mount is refused."""
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here (root needed): {proc.stderr.strip()}")
    try:
        yield str(disk)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_run_that_fills_the_disk_removes_its_files_so_a_rerun_that_fits_commits(spark, small_disk):
    """Run 1 (16 px, ~40 KiB) commits; run 2 (128 px, ~1.8 MiB) fills the 1 MiB disk and fails: run
    1's output is whole and run 2's partial files are gone, so run 3 (64 px, ~0.5 MiB), which fits
    beside run 1 but not beside run 2's leftovers, commits."""
    from tests.support.imagegen import encode, folder_name, random_photo, write

    rng, root = np.random.default_rng(0), os.path.join(os.path.dirname(small_disk), "photos")
    for i in range(36):  # 160 px noisy photos: every size below fills its whole square
        write(os.path.join(root, folder_name(i % 3), f"{i}.jpg"), encode(random_photo(rng, 160, 160, i % 3)))
    expected = {"good": 36}
    out = os.path.join(small_disk, "etl")
    cfg = lambda size: ETLConfig(input=root, output=out, image_size=size, test_fraction=0.3, min_row_groups=1)
    first = run_etl(cfg(16), spark)
    committed = open(os.path.join(out, "manifest.json"), "rb").read()
    with pytest.raises(Exception, match="No space left on device"):
        run_etl(cfg(128), spark)
    assert open(os.path.join(out, "manifest.json"), "rb").read() == committed
    assert os.listdir(os.path.join(out, "runs")) == [first["run_id"]]  # the failed run's prefix is gone
    assert sum(len(read_rows(out, split)) for split in SPLITS) == expected["good"]
    free = shutil.disk_usage(small_disk).free
    assert free > 0.9 * 2**20, free
    third = run_etl(cfg(64), spark)
    assert third["files"]["written"] == expected["good"] and third["image"]["height"] == 64
    assert os.listdir(os.path.join(out, "runs")) == [third["run_id"]]
    assert all(len(r["image"]) == 64 * 64 * 3 for r in read_rows(out, "test"))


FAIL_FIRST_ATTEMPT = '''
import os
if os.environ.get("FAILED_ATTEMPT_RECORD"):
    from pyspark import TaskContext
    from pipelines.etl import transform

    close = transform.SplitWriter.close

    def close_then_fail(self):
        """Close the file whole, then fail the first attempt of partition 0 (as a lost executor would)."""
        close(self)
        context = TaskContext.get()
        if context is not None and context.partitionId() == 0 and context.attemptNumber() == 0:
            with open(os.environ["FAILED_ATTEMPT_RECORD"], "a") as f:
                f.write(self.target.path + "\\n")
            raise RuntimeError("the first attempt of partition 0 fails after writing its file")

    transform.SplitWriter.close = close_then_fail
'''


def test_only_the_files_of_successful_task_attempts_are_kept(tree, tmp_path):
    """Spark retries a failed task (master local[2,2]: 2 attempts per task). The first attempt of
    partition 0 writes its Parquet files whole, then fails (a hook installed in the Python workers
    by sitecustomize); the second attempt writes its own. The manifest names only the second
    attempt's files, the run prefix holds nothing else, and every image is written once."""
    root, expected = tree
    hooks, out, record = tmp_path / "hooks", str(tmp_path / "out"), str(tmp_path / "failed.txt")
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(FAIL_FIRST_ATTEMPT)
    env = subprocess_env(PYTHONPATH=os.pathsep.join([str(hooks), REPO]), FAILED_ATTEMPT_RECORD=record)
    cmd = [sys.executable, os.path.join(REPO, "jobs", "etl.py"), "--input", root, "--output", out, "--image-size",
           str(SIZE), "--test-fraction", "0.3", "--min-row-groups", "1", "--master", "local[2,2]",
           "--num-partitions", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(record) as f:
        failed = f.read().split()
    assert failed, "no attempt failed: the hook did not run"
    manifest = Manifest.read(out)
    named = {p.location.path for split in SPLITS for p in manifest.part_locations(out, split)}
    on_disk = {os.path.join(folder, name) for folder, _, names in os.walk(os.path.join(out, "runs"))
               for name in names if name.endswith(".parquet")}
    assert on_disk == named and not set(failed) & on_disk
    assert any(os.path.basename(p).startswith("part-00000-") for p in named)  # partition 0's retry
    paths = [r["path"] for split in SPLITS for r in read_rows(out, split, ["path"])]
    assert len(paths) == len(set(paths)) == expected["good"] == manifest.extra["files"]["written"]
