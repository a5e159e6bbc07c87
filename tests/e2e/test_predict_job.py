"""Batch inference end to end, on one tiny model trained once for the whole module: one spark-submit
run on a raw tree with bad files, notebook 07 on the ETL's test split with a models:/ URI, the
refusals before Spark, the no-Spark command."""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines.etl.config import ETLConfig
from pipelines.etl.job import run_etl
from pipelines.predict.infer import PREDICTED, UNREADABLE, make_decoder, predict_columns
from pipelines.predict.job import CONFUSION, SKIPPED_LIST, SUMMARY
from pipelines.predict.model import resolve_model
from tests.support.datagen import write_dataset
from tests.support.env import BIN, REPO, subprocess_env
from tests.support.imagegen import encode, folder_name, make_tree, random_photo, write
from tests.support.notebooks import execute, has_image, outputs
from tests.support.outputs import etl_parts, read_metrics
from tests.support.training import SIZE, train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory, spark):
    """An image tree, its ETL output and one single-process training run on it (tiny backbone, 1
    epoch), tracked to its default SQLite store with the model registered as ``m``."""
    base = tmp_path_factory.mktemp("predict")
    tree, etl, run = str(base / "tree"), str(base / "etl"), str(base / "run")
    make_tree(tree, classes=3, per_class=8, bad=False)
    run_etl(ETLConfig(input=tree, output=etl, image_size=SIZE, test_fraction=0.3, min_row_groups=1), spark)
    proc = train(etl, run, "--epochs", "1", "--tracking", "--register-model", "m", np_=0)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {"tree": tree, "etl": etl, "run": run}


def read_output(out):
    with open(os.path.join(out, SUMMARY)) as f:
        return pq.read_table(out).to_pylist(), json.load(f)


def bad_tree(root):
    """make_tree's bad files, plus images in a folder that is no class and loose under the root."""
    expected = make_tree(root, classes=3, per_class=2, seed=1)
    rng = np.random.default_rng(1)
    loose = [write(os.path.join(root, "inbox", "deep", "x.jpg"), encode(random_photo(rng, 30, 20, 0))),
             write(os.path.join(root, "y.png"), encode(random_photo(rng, 20, 30, 1), "PNG"))]
    skipped = {p: r for p, r in expected["skipped"].items() if r != "not inside a class folder"}
    return expected, loose + [p for p, r in expected["skipped"].items() if p not in skipped], skipped


def test_spark_submit_predicts_every_file_of_a_raw_tree(trained, tmp_path):
    root, out = str(tmp_path / "tree"), str(tmp_path / "predictions.parquet")
    expected, unlabelled, skipped = bad_tree(root)
    cmd = [os.path.join(BIN, "spark-submit"), "--master", "local[2]", os.path.join(REPO, "jobs", "predict.py"),
           "--model", trained["run"], "--input", root, "--output", out, "--top-k", "2", "--batch-size", "4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows, summary = read_output(out)
    by_path = {r["path"]: r for r in rows}
    files = summary["files"]
    good = expected["good"] + len(unlabelled)
    assert (files["rows"], files["predicted"], files["unreadable"], files["skipped"]) == (
        good + len(expected["rejected"]), good, len(expected["rejected"]), len(skipped))
    assert files["found"] == files["rows"] + files["skipped"] == sum(len(f) for _, _, f in os.walk(root))
    assert f"found {files['found']} = rows {files['rows']} + skipped {files['skipped']}" in proc.stdout
    # the driver's progress in images, counted by the tasks (4 tasks on 2 cores: Python workers
    # reused, whose cached predict function adds to each later task's own accumulator)
    progress = [line for line in proc.stdout.splitlines() if " INFO predict: " in line]  # spark-submit: the log too
    assert f"predict: 0/{files['rows']} images (0 %), rate not known yet (" in progress[0], progress
    assert re.search(rf"predict: {files['rows']}/{files['rows']} images \(100 %\), [0-9.]+ images/s, done in "
                     r"[0-9a-z ]+$", progress[-1]), progress
    for path, reason in expected["rejected"].items():  # unreadable files are rows with the ETL's reason
        assert by_path[path]["status"] == UNREADABLE and by_path[path]["reason"].startswith(reason), by_path[path]
        assert by_path[path]["top_labels"] is None
    with open(os.path.join(out, SKIPPED_LIST)) as f:
        assert {json.loads(line)["path"] for line in f} == set(skipped)
    names = summary["class_names"]
    for r in rows:
        if r["status"] == PREDICTED:
            assert len(r["top_labels"]) == 2 and r["top_names"] == [names[i] for i in r["top_labels"]]
            assert r["top_probabilities"][0] >= r["top_probabilities"][1] > 0
        folder = os.path.relpath(r["path"], root).split("/")[0]
        label = next((c for c in range(3) if folder == folder_name(c)), None)
        assert (r["label"], r["label_name"]) == ((label, names[label]) if label is not None else (None, None))
    labelled = [r for r in rows if r["label"] is not None and r["status"] == PREDICTED]
    metrics = summary["metrics"]
    assert metrics["count"] == len(labelled) == expected["good"]
    assert metrics["correct"] == sum(r["label"] == r["top_labels"][0] for r in labelled)
    assert sum(c["support"] for c in metrics["per_class"]) == metrics["count"]
    assert os.path.getsize(os.path.join(out, CONFUSION)) > 10_000
    # the Spark path and the no-Spark path give the same figures for the same file
    sample = next(r for r in labelled)
    local = predict_columns(resolve_model(trained["run"]).load(), [sample["path"]], None,
                            make_decoder(True, SIZE, 2**20), 2, names)
    assert np.allclose(local["top_probabilities"][0], sample["top_probabilities"], atol=1e-6)


def test_a_raw_image_and_its_etl_row_give_the_same_probabilities(trained):
    """No train/serve skew: the executors' decoding of a raw file is the ETL row, byte for byte."""
    table = pq.read_table(etl_parts(trained["etl"], "test"), columns=["path", "image"]).to_pylist()
    paths, stored = [r["path"] for r in table], [r["image"] for r in table]
    from_file, from_row = make_decoder(True, SIZE, 2**20), make_decoder(False, SIZE, 0)
    assert all(from_file(p).tobytes() == s for p, s in zip(paths, stored))
    spec = resolve_model(trained["run"])
    model = spec.load()
    raw = predict_columns(model, paths, None, from_file, 3, spec.class_names)
    rows = predict_columns(model, stored, None, from_row, 3, spec.class_names)
    assert np.array_equal(raw["top_probabilities"], rows["top_probabilities"])
    assert np.array_equal(raw["top_labels"], rows["top_labels"])


@pytest.fixture(scope="module")
def registered(trained):
    """``models:/m/1``: the model the training run registered (its class names in the model's
    metadata). ``MLFLOW_TRACKING_URI`` names the run's store, for this process and the processes it
    starts (notebook kernels)."""
    env = pytest.MonkeyPatch()
    env.setenv("MLFLOW_TRACKING_URI", "sqlite:///" + os.path.join(trained["run"], "mlruns.db"))
    yield "models:/m/1"
    env.undo()


@pytest.mark.current
def test_a_models_uri_predicts_as_the_run_folder_does(trained, registered, tmp_path):
    from pipelines.predict.local import predict_files

    spec = resolve_model(registered, download_dir=str(tmp_path / "download"))
    keras = resolve_model(trained["run"])
    assert (spec.flavor, spec.image_size, spec.class_names) == ("mlflow", SIZE, keras.class_names)
    paths = pq.read_table(etl_parts(trained["etl"], "test"), columns=["path"]).column("path").to_pylist()
    ours, theirs = predict_files(paths, spec, top_k=3), predict_files(paths, keras, top_k=3)
    assert [r["top_labels"] for r in ours] == [r["top_labels"] for r in theirs]
    assert np.allclose([r["top_probabilities"] for r in ours], [r["top_probabilities"] for r in theirs], atol=1e-6)


@pytest.mark.current
def test_mlflow_spark_udf_serves_the_registered_model(trained, registered, spark, tmp_path, monkeypatch):
    """MLflow's own Spark serving of the logged model (its uint8 tensor signature: a flat array
    column per image, ``result_type='array<float>'``) gives model.keras's probabilities."""
    import mlflow.pyfunc

    monkeypatch.chdir(tmp_path)  # a plain MLflow client of a SQLite store puts its artifacts in ./mlruns
    table = pq.read_table(etl_parts(trained["etl"], "test"), columns=["image"])
    images = np.stack([np.frombuffer(b, np.uint8).reshape(SIZE, SIZE, 3) for b in table.column("image").to_pylist()])
    expected = resolve_model(trained["run"]).load().predict(images, verbose=0)
    frame = spark.createDataFrame([(i, image.reshape(-1).tolist()) for i, image in enumerate(images)],
                                  "id int, pixels array<int>")
    # (MLflow's code in the Python workers opens the SQLite store too: an empty ./mlruns where Spark runs)
    served = mlflow.pyfunc.spark_udf(spark, registered, result_type="array<float>")
    rows = sorted(frame.select("id", served("pixels").alias("p")).collect())
    np.testing.assert_allclose(np.array([r.p for r in rows]), expected, rtol=1e-5, atol=1e-6)


def test_an_mlflow_model_without_class_names_needs_the_option(registered, tmp_path, monkeypatch):
    import mlflow.tensorflow
    from pipelines.stack.kerasapi import keras

    from pipelines.predict.cli import main
    monkeypatch.chdir(tmp_path)  # a plain MLflow client of a SQLite store puts its artifacts in ./mlruns

    image = keras.Input((4, 4, 3), dtype="uint8")
    # only layers the product's own models are built from: a model load refuses any other
    probabilities = keras.layers.Dense(2, activation="softmax")(keras.layers.GlobalAveragePooling2D()(
        keras.layers.Rescaling(1 / 255)(image)))
    with mlflow.start_run():
        mlflow.tensorflow.log_model(keras.Model(image, probabilities), "model", registered_model_name="tiny",
                                    keras_model_kwargs={"save_format": "h5"}, pip_requirements=[])
    tree = str(tmp_path / "tree")
    write(os.path.join(tree, "a.jpg"), encode(random_photo(np.random.default_rng(0), 8, 8, 0)))
    args = ["--model", "models:/tiny/1", "--input", tree, "--output", str(tmp_path / "out")]
    assert main(args) == 2  # refused before Spark: no class names
    names = write(str(tmp_path / "names.json"), b'["yes", "no"]')
    spec = resolve_model("models:/tiny/1", names, str(tmp_path / "download"))
    assert (spec.flavor, spec.image_size, spec.class_names) == ("mlflow", 4, ("yes", "no"))


@pytest.fixture
def no_spark(monkeypatch):
    """Fails a test whose job would start Spark (the session the job module starts)."""
    import pipelines.predict.job

    def refuse(*args, **kwargs):
        raise AssertionError("Spark started")
    monkeypatch.setattr(pipelines.predict.job, "spark_session", refuse)


def test_bad_input_exits_2_before_spark(trained, tmp_path, no_spark, capsys):
    from pipelines.predict.cli import main

    run, tree, etl = trained["run"], trained["tree"], trained["etl"]
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(os.path.join(run, "model.keras"), bare)
    write(str(tmp_path / "empty" / "a" / "notes.txt"), b"x")
    write_dataset(str(tmp_path / "small"), [1], [1], size=4)
    write(str(tmp_path / "foreign" / "keep.txt"), b"x")
    out = str(tmp_path / "out.parquet")
    cases = [(["--model", str(tmp_path / "none")], "model not found"),
             (["--model", str(bare)], "no model.json beside"),
             (["--input", str(tmp_path / "empty")], "no image file under"),
             (["--output", os.path.join(tree, "out.parquet")], "is the input or inside it"),
             (["--input", etl], "is an ETL output: name one of its splits"),
             (["--input", str(tmp_path / "small" / "test")], "stores 4-pixel images, the model takes 71"),
             (["--output", str(tmp_path / "foreign")], "not an output of this job")]
    for change, message in cases:
        args = dict(zip(["--model", "--input", "--output"], [run, tree, out]))
        args.update(zip(change[::2], change[1::2]))
        assert main([x for pair in args.items() for x in pair]) == 2, change
        error = capsys.readouterr().err
        assert message in error and error.count("\n") == 1, (change, error)  # one line
    assert not os.path.exists(out)


def test_python_m_predict_prints_the_top_k_without_spark_or_horovod(trained, tmp_path):
    files = sorted(os.path.join(trained["tree"], folder_name(0), name)
                   for name in os.listdir(os.path.join(trained["tree"], folder_name(0))))[:2]
    bad = write(str(tmp_path / "bad.jpg"), b"not an image")
    blocker = ("import runpy, sys; sys.modules.update(pyspark=None, horovod=None); "  # importing them would fail
               "sys.argv = ['pipelines.predict', *sys.argv[1:]]; runpy.run_module('pipelines.predict', "
               "run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", blocker, *files, bad, "--model", trained["run"], "--top-k", "2"],
                          capture_output=True, text=True, env=subprocess_env(), timeout=300, cwd=REPO)
    assert proc.returncode == 1, proc.stderr[-3000:]  # one file was unreadable
    lines = proc.stdout.strip().splitlines()
    assert [line.split(": ")[0] for line in lines] == [*files, bad]
    names = json.load(open(os.path.join(trained["run"], "class_names.json")))
    for line in lines[:2]:
        pairs = [p.rsplit(" ", 1) for p in line.split(": ", 1)[1].split(", ")]
        assert len(pairs) == 2 and all(n in names and 0 < float(p) <= 1 for n, p in pairs)
    assert lines[2].startswith(f"{bad}: unreadable: not a supported raster image (Pillow cannot identify it")


@pytest.mark.current
def test_batch_inference_notebook_with_a_models_uri_gives_the_exact_test_accuracy(trained, registered, tmp_path):
    """Notebook 07 on the ETL's test split, the model by its MLflow URI (downloaded by the driver,
    loaded by each Python worker): the accuracy is the training run's exact test accuracy."""
    book = execute("07_batch_inference.ipynb", str(tmp_path), workdir=str(tmp_path), data_dir=trained["etl"],
                   model=registered, metrics_file=os.path.join(trained["run"], "metrics.json"), top_k=2)
    text = outputs(book)
    test = read_metrics(trained["run"])["test"]
    _, summary = read_output(os.path.join(tmp_path, "predictions", "test.parquet"))
    assert summary["model_flavor"] == "mlflow" and summary["input_kind"] == "etl"
    assert summary["files"]["rows"] == summary["files"]["predicted"] == summary["labelled"] == test["count"]
    assert summary["metrics"]["count"] == test["count"]
    assert summary["metrics"]["accuracy"] == test["accuracy"]  # exactly: same rows, same weights
    accuracy = f"{test['accuracy']:.4f} on {test['count']} images"
    assert f"batch inference accuracy {accuracy}; training's exact test accuracy {accuracy}" in text, text[-3000:]
    assert has_image(book) and "found" in text
    assert not [n for n in os.listdir(os.path.join(tmp_path, "predictions")) if n.startswith(".")]  # download gone


def test_a_relative_store_uri_serves_models_and_a_wrong_one_is_one_line_at_once(trained, tmp_path, monkeypatch,
                                                                                 no_spark, capsys):
    """``MLFLOW_TRACKING_URI=sqlite:///run/mlruns.db``, relative to where the job starts: ``models:/``
    resolves (the path is made absolute before the store is opened from its own folder); a relative
    path with no store behind it is one line, exit 2, before Spark and within seconds (MLflow
    retried for 104 s, then printed a traceback), and makes no folder."""
    import time

    from pipelines.predict.cli import main

    monkeypatch.chdir(os.path.dirname(trained["run"]))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{os.path.basename(trained['run'])}/mlruns.db")
    spec = resolve_model("models:/m/1", download_dir=str(tmp_path / "download"))
    assert (spec.flavor, spec.image_size) == ("mlflow", SIZE)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///out/train/mlruns.db")
    began = time.monotonic()
    code = main(["--model", "models:/m/1", "--input", trained["tree"], "--output", str(tmp_path / "out.parquet")])
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1, error
    missing = os.path.join(os.path.dirname(trained["run"]), "out", "train", "mlruns.db")
    assert f"no store file {missing}" in error and "Traceback" not in error, error
    assert time.monotonic() - began < 60 and not os.path.exists("out")
