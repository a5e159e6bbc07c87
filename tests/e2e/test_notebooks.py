"""Every notebook runs top to bottom (nbclient), with small parameters injected papermill-style."""
import json
import os

import nbformat
import pytest

from tests.support.imagegen import make_tree
from tests.support.notebooks import NOTEBOOKS, execute, has_image, outputs
from tests.support.outputs import assert_exact_test_count, read_metrics

pytestmark = pytest.mark.slow
SMALL_TRAINING = dict(weights="none", backbone="tiny", epochs=2, batch_size=4, patience=5)


@pytest.fixture(scope="module")
def etl_notebook(tmp_path_factory):
    work = tmp_path_factory.mktemp("notebooks")
    make_tree(str(work / "tree"), classes=3, per_class=20, bad=False)
    book = execute("01_etl_to_parquet.ipynb", str(work), workdir=str(work), input_dir=str(work / "tree"),
                   output_dir=str(work / "etl"), image_size=71, test_fraction=0.3)
    return str(work), str(work / "etl"), book


def test_notebooks_are_committed_without_outputs():
    for name in sorted(os.listdir(NOTEBOOKS)):
        if name.endswith(".ipynb"):
            book = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
            assert all(not c.get("outputs") for c in book.cells if c.cell_type == "code"), name
            assert any("parameters" in c.metadata.get("tags", []) for c in book.cells), name


@pytest.mark.current
def test_etl_notebook(etl_notebook):
    _, etl, book = etl_notebook
    assert os.path.exists(os.path.join(etl, "manifest.json"))
    assert "found 60 = written 60" in outputs(book) and has_image(book)


@pytest.mark.parametrize("name, extra", [
    ("02_single_process_early_stopping.ipynb", {}),
    ("03_bigger_batch_scaled_lr.ipynb", {"scale": 2}),
    ("04_petastorm_local_cache.ipynb", {}),
    # 2 local ranks only: its world of 1 is 02's run again (nb.train np=-1, the same settings), and 03 draws
    # and tabulates two runs
    pytest.param("05_horovod_one_node.ipynb", {"world_sizes": [2]}, marks=pytest.mark.current),
    ("06_horovod_spark_workers.ipynb", {"np_tasks": 2}),
])
def test_training_notebooks(etl_notebook, name, extra):
    work, etl, _ = etl_notebook
    book = execute(name, work, workdir=work, data_dir=etl, **SMALL_TRAINING, **extra)
    text = outputs(book)
    assert has_image(book), "no training-curve plot"
    assert "test accuracy" in text and "images/s" in text, text[-2000:]
    # The runs' own reports: the world each ran on, every test row evaluated once.
    with open(os.path.join(etl, "manifest.json")) as f:
        manifest = json.load(f)
    reports = {run: read_metrics(os.path.join(work, "runs", run)) for run in RUNS[name]}
    for run, world in RUNS[name].items():
        assert reports[run]["world_size"] == world, run
        assert reports[run]["global_batch_size"] == world * reports[run]["batch_size_per_rank"], run
        assert_exact_test_count(reports[run], etl)
    if name.startswith("03_"):
        big, small = reports["batch-big"], reports["batch-small"]
        assert big["global_batch_size"] == 2 * small["global_batch_size"] == 2 * 4
        assert big["learning_rate"] == pytest.approx(2 * small["learning_rate"])


RUNS = {  # notebook -> {its run folder under workdir/runs: world size}
    "02_single_process_early_stopping.ipynb": {"single": 1},
    "03_bigger_batch_scaled_lr.ipynb": {"batch-small": 1, "batch-big": 1},
    "04_petastorm_local_cache.ipynb": {"petastorm": 1},
    "05_horovod_one_node.ipynb": {"node-np2": 2},
    "06_horovod_spark_workers.ipynb": {"spark-np2": 2},
}


def test_tune_notebook(etl_notebook):
    """The search notebook on the tiny backbone: the feature cache made, two trials through Spark, the flags printed."""
    work, etl, _ = etl_notebook
    book = execute("08_tune_on_cached_features.ipynb", work, workdir=work, data_dir=etl, weights="none",
                   backbone="tiny", batch_size=4, trials=2, parallel=2, epochs=3)
    text = outputs(book)
    assert "tune: 2 trials" in text and "jobs/train.py flags: --base-lr " in text, text[-2000:]
    with open(os.path.join(work, "tune", "tune.json")) as f:
        record = json.load(f)
    assert len(record["trials"]) == 2 and record["chosen"]["refit"]["test_accuracy"] is not None
