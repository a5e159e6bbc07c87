"""Batch inference without Spark or TensorFlow: planning, refusals, top k, metrics, the summary."""
import dataclasses
import hashlib
import json
import os

import numpy as np
import pytest

from pipelines.runtime.config import parse_config
from pipelines.etl.images import ImageRejected
from pipelines.predict.config import PredictConfig
from pipelines.predict.infer import PREDICTED, UNREADABLE, predict_columns, top_k
from pipelines.predict.inputs import ETL_SPLIT, TREE, NoImages, folder_class, plan_input, plan_tree
from pipelines.predict.job import (SUMMARY, WRITTEN_BY, arrow_batch_rows, check_paths, format_summary, reconcile,
                                   swap_in)
from pipelines.predict.metrics import classification_report
from pipelines.predict.model import ModelContractError, read_contract, resolve_model
from pipelines.training.model.export import input_contract
from tests.support.datagen import write_dataset
from tests.support.imagegen import encode, random_photo, write

NAMES = ["cat", "dog", "fish"]


def make_run(folder, size=8, names=NAMES, contract=True):
    """A run folder as jobs/train.py leaves it, as far as resolution reads it (no real model)."""
    os.makedirs(folder, exist_ok=True)
    data = b"not loaded by resolve_model"
    write(os.path.join(folder, "model.keras"), data)
    if contract:
        with open(os.path.join(folder, "model.json"), "w") as f:
            json.dump({**input_contract(size, size, names), "model_sha256": hashlib.sha256(data).hexdigest()}, f)
    return str(folder)


def photo(seed=0):
    return encode(random_photo(np.random.default_rng(seed), 20, 16, seed))


def test_top_k_orders_by_probability_and_breaks_ties_by_label():
    labels, probs = top_k(np.array([[0.1, 0.6, 0.3], [0.4, 0.2, 0.4]], np.float32), 2)
    assert labels.tolist() == [[1, 2], [0, 2]] and labels.dtype == np.int32
    assert np.allclose(probs, [[0.6, 0.3], [0.4, 0.4]]) and probs.dtype == np.float32


class FixedModel:
    """Returns one fixed probability row per image; counts the images it was given."""

    def __init__(self, row):
        self.row, self.seen = np.asarray(row, np.float32), 0

    def predict_on_batch(self, images):
        assert images.dtype == np.uint8 and images.shape[1:] == (2, 2, 3)
        self.seen += len(images)
        return np.tile(self.row, (len(images), 1))


def test_predict_columns_keeps_unreadable_rows_with_their_reason_and_clamps_k():
    def decode(value):
        if value == "bad":
            raise ImageRejected("undecodable: boom")
        return np.zeros((2, 2, 3), np.uint8)

    model = FixedModel([0.2, 0.5, 0.3])
    columns = predict_columns(model, ["a", "bad", "known", "b"], [None, None, "empty file (0 bytes)", None], decode,
                              k=5, class_names=NAMES)
    assert model.seen == 2  # the row with a known reason is never decoded, the bad one fails to
    assert columns["reason"].tolist() == [None, "undecodable: boom", "empty file (0 bytes)", None]
    assert columns["top_labels"].tolist() == [[1, 2, 0], [-1, -1, -1], [-1, -1, -1], [1, 2, 0]]
    assert columns["top_names"][0].tolist() == ["dog", "fish", "cat"] and columns["top_names"][1].tolist() == [None] * 3
    assert np.isnan(columns["top_probabilities"][1]).all()


def test_classification_report_precision_recall_and_confusion_of_the_classes_seen():
    report = classification_report([0, 0, 1, 1, 1], [0, 1, 1, 1, 0], ["a", "b", "c", None])
    assert report["count"] == 5 and report["correct"] == 3 and report["accuracy"] == pytest.approx(0.6)
    a, b = report["per_class"]  # c and the unused label occur nowhere
    assert (a["label"], a["support"], a["predicted"]) == (0, 2, 2)
    assert a["precision"] == pytest.approx(0.5) and a["recall"] == pytest.approx(0.5)
    assert b["precision"] == pytest.approx(2 / 3) and b["recall"] == pytest.approx(2 / 3)
    assert report["confusion"] == {"labels": [0, 1], "matrix": [[1, 1], [1, 2]]}
    lone = classification_report([2], [0], ["a", "b", "c"])["per_class"]
    assert [(c["label"], c["precision"], c["recall"]) for c in lone] == [(0, 0.0, None), (2, None, 0.0)]
    assert classification_report([], [], ["a"])["accuracy"] is None


def test_classification_report_at_a_thousand_classes_counts_only_those_present():
    names = [f"c{i}" for i in range(1000)]
    report = classification_report([999, 0, 0, 500], [999, 5, 0, 0], names)
    assert (report["count"], report["correct"], report["accuracy"]) == (4, 2, 0.5)
    assert report["confusion"] == {"labels": [0, 5, 500, 999], "matrix": [[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0],
                                                                           [0, 0, 0, 1]]}
    never_a_label, never_predicted = report["per_class"][1], report["per_class"][2]
    assert (never_a_label["name"], never_a_label["support"], never_a_label["predicted"]) == ("c5", 0, 1)
    assert (never_a_label["precision"], never_a_label["recall"]) == (0.0, None)
    assert (never_predicted["label"], never_predicted["predicted"], never_predicted["precision"]) == (500, 0, None)
    assert never_predicted["recall"] == 0.0
    empty = classification_report([], [], names)
    assert (empty["count"], empty["correct"], empty["per_class"]) == (0, 0, [])
    assert empty["confusion"] == {"labels": [], "matrix": []}


def test_classification_report_refuses_labels_that_are_not_classes():
    with pytest.raises(ValueError, match=r"true labels must lie in \[0, 3\); got 0..3"):
        classification_report([0, 3], [0, 1], ["a", "b", "c"])
    with pytest.raises(ValueError, match=r"predicted labels must lie in \[0, 3\); got -1..0"):
        classification_report([0, 1], [-1, 0], ["a", "b", "c"])
    with pytest.raises(ValueError, match="2 true labels but 1 predicted label$"):
        classification_report([0, 1], [0], ["a", "b", "c"])


@pytest.mark.parametrize("k, rows", [(3, 50), (40, 30), (1000, 200)])
def test_classification_report_equals_that_of_before_on_random_labels(k, rows):
    from benchmarks.eval_bench import previous_classification_report

    rng = np.random.default_rng(k)
    names = [None if i % 7 == 0 else f"c{i}" for i in range(k)]
    true, predicted = rng.integers(0, k, rows), rng.integers(0, k, rows)
    predicted[: rows // 2] = true[: rows // 2]
    assert classification_report(true, predicted, names) == previous_classification_report(true, predicted, names)
    assert classification_report(true.tolist(), tuple(predicted), names) == \
        previous_classification_report(true, predicted, names)


@pytest.mark.parametrize("path, name", [("001.ak47/x.jpg", "ak47"), ("birds/deep/er/x.png", "birds"),
                                        ("x.jpg", None), ("000.zero/x.jpg", "000.zero")])
def test_folder_class(path, name):
    assert folder_class(path) == name


def test_plan_tree_rows_reasons_labels_by_name_and_skips(tmp_path):
    root = str(tmp_path / "tree")
    write(os.path.join(root, "002.dog", "a.jpg"), photo())           # NNN.name: by name, not by number
    write(os.path.join(root, "cat", "deep", "b.JPG"), photo(1))      # a plain folder named after a class
    write(os.path.join(root, "inbox", "c.png"), photo(2))            # a folder that is no class
    write(os.path.join(root, "loose.jpg"), photo(3))                 # directly under the root
    write(os.path.join(root, "cat", "empty.jpg"), b"")
    write(os.path.join(root, "cat", "notes.txt"), b"x")
    write(os.path.join(root, "_hidden", "d.jpg"), photo(4))
    write(os.path.join(root, "cat", "big.jpg"), b"x" * 5000)
    plan = plan_tree(root, ["cat", "dog", None], max_file_bytes=4000)
    rows = {os.path.relpath(i.path, root): (i.label, i.label_name, i.reason) for i in plan.items}
    assert rows == {"002.dog/a.jpg": (1, "dog", None), "cat/deep/b.JPG": (0, "cat", None),
                    "inbox/c.png": (None, None, None), "loose.jpg": (None, None, None),
                    "cat/empty.jpg": (0, "cat", "empty file (0 bytes)"),
                    "cat/big.jpg": (0, "cat", "file too large: 5000 bytes > 4000 bytes (--max-file-mb)")}
    assert sorted(os.path.relpath(p, root) for p, _ in plan.skipped) == ["_hidden/d.jpg", "cat/notes.txt"]
    assert (plan.kind, plan.found, plan.rows) == (TREE, 8, 6)


def test_plan_input_refuses_what_holds_no_image_and_an_etl_root(tmp_path):
    empty = tmp_path / "empty"
    write(str(empty / "a" / "readme.txt"), b"x")
    with pytest.raises(NoImages, match="1 file found, 1 skipped"):
        plan_input(str(empty), NAMES, 8, 100)
    etl = str(tmp_path / "etl")
    write_dataset(etl, [1, 1], [1, 1], size=4)
    with pytest.raises(ValueError, match="is an ETL output: name one of its splits"):
        plan_input(etl, NAMES, 4, 100)
    with pytest.raises(ValueError, match="stores 4-pixel images, the model takes 8"):
        plan_input(os.path.join(etl, "test"), NAMES, 8, 100)
    plan = plan_input(os.path.join(etl, "test") + "/", NAMES, 4, 100)
    assert (plan.kind, plan.found, plan.rows, plan.root) == (ETL_SPLIT, 2, 2, os.path.join(etl, "test"))
    with pytest.raises(FileNotFoundError):
        plan_input(str(tmp_path / "nothing"), NAMES, 4, 100)


def test_an_etl_split_is_the_files_its_manifest_names_not_a_folder(tmp_path):
    """Format 2: ``ETL/test`` is a split's name; its files lie under ``runs/<run id>/`` and only
    those the manifest names are input (a stray file of another run is not)."""
    import json
    import shutil
    etl = str(tmp_path / "etl")
    write_dataset(etl, [1, 1], [1, 1], size=4)
    run = "20261201T000000000000Z-abcdef"
    os.makedirs(os.path.join(etl, "runs", run))
    shutil.move(os.path.join(etl, "test"), os.path.join(etl, "runs", run, "test"))
    names = sorted(os.listdir(os.path.join(etl, "runs", run, "test")))
    shutil.copy(os.path.join(etl, "runs", run, "test", names[0]), os.path.join(etl, "runs", run, "test", "part-stray.parquet"))
    with open(os.path.join(etl, "manifest.json")) as f:
        manifest = json.load(f)
    manifest["splits"]["test"]["parts"] = [f"runs/{run}/test/{name}" for name in names]
    manifest["run_id"] = run
    with open(os.path.join(etl, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    plan = plan_input(os.path.join(etl, "test"), NAMES, 4, 100)
    assert (plan.kind, plan.rows) == (ETL_SPLIT, 2)
    assert [part.location.path for part in plan.parts] == [os.path.join(etl, "runs", run, "test", name) for name in names]


def test_resolve_model_reads_the_contract_and_refuses_a_model_without_one(tmp_path):
    run = make_run(tmp_path / "run", size=8)
    spec = resolve_model(run)
    assert (spec.path, spec.flavor, spec.image_size, spec.class_names) == (
        os.path.join(run, "model.keras"), "keras", 8, tuple(NAMES))
    assert resolve_model(os.path.join(run, "model.keras")).path == spec.path
    assert spec.sha256 == hashlib.sha256(b"not loaded by resolve_model").hexdigest()
    bare = make_run(tmp_path / "bare", contract=False)
    with pytest.raises(ModelContractError, match="no model.json beside"):
        resolve_model(bare)
    unhashed = make_run(tmp_path / "unhashed")
    contract = json.loads((tmp_path / "unhashed" / "model.json").read_text())
    del contract["model_sha256"]
    (tmp_path / "unhashed" / "model.json").write_text(json.dumps(contract))
    with pytest.raises(ModelContractError, match="no model_sha256 .the sha256 of model.keras"):
        resolve_model(unhashed)
    with pytest.raises(FileNotFoundError, match="a run's output folder holds model.keras"):
        resolve_model(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        resolve_model(str(tmp_path / "missing.keras"))
    names = write(str(tmp_path / "names.json"), json.dumps(["a", "b"]).encode())
    with pytest.raises(ModelContractError, match="lists 2 names, the model has 3 classes"):
        resolve_model(run, names)


def test_read_contract_refuses_a_float_input(tmp_path):
    contract = input_contract(8, 8, NAMES)
    contract["input"]["dtype"] = "float32"
    write(str(tmp_path / "model.json"), json.dumps(contract).encode())
    with pytest.raises(ModelContractError, match="must be uint8"):
        read_contract(str(tmp_path / "model.keras"))


def test_config_refuses_bad_values():
    with pytest.raises(SystemExit) as exit_info:
        parse_config(PredictConfig, ["--model", "m", "--input", "i", "--output", "o", "--top-k", "0"])
    assert exit_info.value.code == 2
    config = PredictConfig(model="models:/m/1", input="in", output="out.parquet")
    assert config.model == "models:/m/1" and os.path.isabs(config.input) and os.path.isabs(config.output)


def test_check_paths_refuses_overlaps_and_foreign_folders(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for output, message in ((tree / "out.parquet", "is the input or inside it"), (tmp_path, "is inside output")):
        with pytest.raises(ValueError, match=message):
            check_paths(PredictConfig(model="m", input=str(tree), output=str(output)))
    foreign = tmp_path / "foreign"
    write(str(foreign / "keep.txt"), b"x")
    with pytest.raises(ValueError, match="not an output of this job"):
        check_paths(PredictConfig(model="m", input=str(tree), output=str(foreign)))
    for summary in (b"{}", b"[]", b"not json", json.dumps({"output_files": ["keep.txt", SUMMARY]}).encode()):
        write(str(foreign / SUMMARY), summary)  # a summary, but not one this job wrote
        with pytest.raises(ValueError, match=f"no {SUMMARY} of this job"):
            check_paths(PredictConfig(model="m", input=str(tree), output=str(foreign)))
    ours = tmp_path / "ours"
    write(str(ours / "part-0.parquet"), b"x")
    write(str(ours / SUMMARY), json.dumps({"written_by": WRITTEN_BY,
                                           "output_files": ["part-0.parquet", SUMMARY]}).encode())
    check_paths(PredictConfig(model="m", input=str(tree), output=str(ours)))  # ours: replaced
    write(str(ours / "notes.txt"), b"mine")  # a user's file put there since
    with pytest.raises(ValueError, match=f"holds notes.txt, which its {SUMMARY} does not list"):
        check_paths(PredictConfig(model="m", input=str(tree), output=str(ours)))


def test_swap_in_replaces_only_a_folder_of_this_job_and_deletes_only_what_it_listed(tmp_path):
    out, staging = tmp_path / "out.parquet", tmp_path / ".out.parquet.staging"
    write(str(out / "part-old.parquet"), b"old")
    write(str(out / SUMMARY), json.dumps({"written_by": WRITTEN_BY,
                                          "output_files": ["part-old.parquet", SUMMARY]}).encode())
    write(str(staging / "part-new.parquet"), b"new")
    write(str(staging / SUMMARY), b"{}")
    swap_in(str(staging), str(out))
    assert sorted(os.listdir(out)) == ["_summary.json", "part-new.parquet"] and not staging.exists()
    assert sorted(os.listdir(tmp_path)) == ["out.parquet"]  # the previous output is gone, nothing else
    write(str(staging / "part-3.parquet"), b"x")
    with pytest.raises(ValueError, match="no _summary.json of this job"):  # out's summary now is "{}"
        swap_in(str(staging), str(out))
    assert (out / "part-new.parquet").read_bytes() == b"new"


@pytest.mark.parametrize("output", ["/", "~", "~/", "//"])
def test_a_root_output_is_refused(tmp_path, output, capsys):
    from pipelines.predict.cli import main

    with pytest.raises(ValueError, match="give a folder of its own below it"):
        PredictConfig(model="m", input=str(tmp_path), output=output)
    with pytest.raises(SystemExit) as exit_info:  # refused while parsing: before the model or Spark
        main(["--model", "m", "--input", str(tmp_path), "--output", output])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--output /" in error and "give a folder of its own below it" in error


@pytest.mark.parametrize("batch_size, image_bytes, rows", [
    (8, 268_203, 24),      # 299 px: 3 model batches in 8 MiB (3 * 8 * 268,203 = 6,436,872 bytes)
    (32, 268_203, 32),     # one model batch is over 8 MiB: one model batch per Arrow batch
    (1, 8 * 2**20 + 1, 1),  # one image over the budget: still one row
    (32, 192, 9_984),      # 8 px rows: Spark's 10,000 rows, cut to whole batches (312 * 32)
    (20_000, 10, 20_000),  # a model batch above Spark's default: one model batch
])
def test_arrow_batches_hold_whole_model_batches_of_at_most_8_mib(batch_size, image_bytes, rows):
    assert arrow_batch_rows(batch_size, image_bytes) == rows


def test_reconcile_counts_and_refuses_lost_rows(tmp_path):
    import pyarrow as pa

    root = str(tmp_path / "tree")
    for name in ("a/1.jpg", "a/2.jpg", "a/x.txt"):
        write(os.path.join(root, name), photo())
    plan = plan_tree(root, ["a"], 100)
    table = pa.table({"path": [i.path for i in plan.items], "status": [PREDICTED, UNREADABLE],
                      "reason": [None, "undecodable: x"]})
    assert reconcile(plan, table) == {"found": 3, "rows": 2, "predicted": 1, "unreadable": 1, "skipped": 1,
                                      "reasons": {"undecodable": 1}}
    with pytest.raises(RuntimeError, match="the output holds 1 row, the input 2"):
        reconcile(plan, table.slice(0, 1))
    twice = pa.table({"path": [plan.items[0].path] * 2, "status": [PREDICTED] * 2, "reason": [None, None]})
    with pytest.raises(RuntimeError, match="each once"):
        reconcile(plan, twice)
    # found 3 = rows 2 + skipped 1: a skipped file the plan lost (or one too many) does not reconcile
    for skipped in ([], plan.skipped * 2):
        lost = dataclasses.replace(plan, skipped=skipped)
        with pytest.raises(RuntimeError, match=f"counts do not reconcile: found 3, rows 2, skipped {len(skipped)}"):
            reconcile(lost, table)
    wrong_status = table.set_column(1, "status", pa.array([PREDICTED, "lost"]))
    with pytest.raises(RuntimeError, match="predicted 1, unreadable 0"):
        reconcile(plan, wrong_status)


def test_format_summary_reconciles_and_lists_classes():
    summary = {"model": "m", "class_names": NAMES, "image_size": 8, "top_k": 2, "input_kind": TREE,
               "files": {"found": 5, "rows": 4, "skipped": 1, "predicted": 3, "unreadable": 1,
                         "reasons": {"undecodable": 1}},
               "metrics": classification_report([0, 1, 1], [0, 1, 0], NAMES) | {"picture": "_confusion.png"},
               "labelled": 3, "images_per_second": 2.0, "seconds": 2.0, "output": "o"}
    text = format_summary(summary)
    assert "found 5 = rows 4 + skipped 1; rows 4 = predicted 3 + unreadable 1" in text
    assert "accuracy 0.6667 (2/3 labelled images)" in text and "1 unreadable: undecodable" in text
    assert "precision 0.500, recall 1.000, support 1" in text
