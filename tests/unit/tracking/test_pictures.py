"""Pictures draw class names (folder names anyone chose) as plain text, and a picture that fails
never fails the job whose work it shows. Real matplotlib (Agg), real PNG files."""
import logging
import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.tracking import pictures
from pipelines.predict.config import PredictConfig
from pipelines.predict.infer import PREDICTED
from pipelines.predict.inputs import TREE, InputPlan, Item
from pipelines.predict.job import CONFUSION, SUMMARY, finish
from pipelines.predict.model import KERAS, ModelSpec

# mathtext that fails ($\x$: an unknown symbol), that would be typeset ($\frac..$, a$b$c), a lone
# $, backslashes, a name of 5,000 characters, non-ASCII and an unused label (None)
pytestmark = pytest.mark.filterwarnings("ignore:Glyph")  # the CJK name's glyphs
NAMES = ["$\\frac{a}{b}$", "a$b", "\\x", "$\\x$", "a$b$c", "x" * 5000, "caf\u00e9 \u732b \u0416", None]


def png_size(path):
    """``(width, height)`` in pixels from a PNG's IHDR chunk."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_mathtext_in_a_name_fails_a_picture_unless_it_is_plain_text(tmp_path):
    """The control: matplotlib's default parses ``$\\x$`` as mathtext and cannot draw it."""
    plt = pictures._pyplot()
    fig, ax = plt.subplots()
    ax.set_title("$\\x$")
    with pytest.raises(ValueError, match="x"):
        fig.savefig(str(tmp_path / "default.png"))
    plt.close(fig)


@pytest.mark.parametrize("classes", [len(NAMES), 32])  # cell text; the image view of over 30 classes
def test_every_picture_of_any_names_is_written(tmp_path, classes):
    names = (NAMES * 6)[:classes]
    rng = np.random.default_rng(0)
    matrix = rng.integers(0, 5, (classes, classes))
    paths = [pictures.plot_confusion(matrix, names, str(tmp_path / "confusion.png")),
             pictures.plot_top_confusions(matrix, names, str(tmp_path / "top.png")),
             pictures.contact_sheet(rng.integers(0, 256, (8, 8, 8, 3), dtype=np.uint8), list(range(8)),
                                    list(range(classes))[-8:], names, str(tmp_path / "sheet.png")),
             pictures.plot_history([{"epoch": 1, "loss": 1.0, "accuracy": 0.5, "val_loss": 1.1, "val_accuracy": 0.4}],
                                   str(tmp_path / "curves.png"))]
    for path in paths:
        width, height = png_size(path)
        assert 0 < width <= 2600 and 0 < height <= 2600  # a 5,000-character name stretches nothing


def test_a_name_is_cut_to_its_bound_and_drawn_as_it_is():
    assert pictures._name(NAMES, 5) == "x" * 39 + "\u2026" and len(pictures._name(NAMES, 5)) == pictures.NAME_CHARS
    assert [pictures._name(NAMES, i) for i in (0, 3, 7, 99)] == ["$\\frac{a}{b}$", "$\\x$", "class 7", "class 99"]


def staged_predictions(folder, names):
    """A staging folder as the Spark job leaves it: one Parquet file of two predicted, labelled rows."""
    os.makedirs(folder)
    paths = [f"/in/{i}.jpg" for i in range(2)]
    table = pa.table({"path": paths, "label": pa.array([0, 1], pa.int32()), "label_name": names[:2],
                      "status": [PREDICTED] * 2, "reason": pa.array([None, None], pa.string()),
                      "top_labels": [[0, 1], [0, 1]]})
    pq.write_table(table, os.path.join(folder, "part-0.parquet"))
    plan = InputPlan(TREE, "/in", 2, 2, [Item(p, i, names[i], None) for i, p in enumerate(paths)])
    return plan, ModelSpec("m", "m", KERAS, 4, tuple(names))


def test_a_predict_job_draws_its_confusion_picture_of_any_names(tmp_path):
    staging = str(tmp_path / "staging")
    plan, spec = staged_predictions(staging, ["$\\x$", "a$b"])
    summary = finish(PredictConfig(model="m", input="/in", output=str(tmp_path / "out")), spec, plan, staging, 1.0)
    assert summary["metrics"]["picture"] == CONFUSION and png_size(os.path.join(staging, CONFUSION))[0] > 0


def test_a_picture_that_fails_never_fails_the_job_after_its_work(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("no picture today")

    monkeypatch.setattr(pictures, "plot_confusion", broken)
    staging = str(tmp_path / "staging")
    plan, spec = staged_predictions(staging, ["a", "b"])
    with caplog.at_level(logging.ERROR, logger="pipelines"):
        summary = finish(PredictConfig(model="m", input="/in", output=str(tmp_path / "out")), spec, plan, staging, 1.0)
    assert summary["metrics"]["picture"] is None
    assert summary["metrics"]["picture_error"] == "RuntimeError: no picture today"
    assert summary["metrics"]["accuracy"] == 0.5 and summary["files"]["predicted"] == 2  # the work stands
    assert "the confusion picture could not be drawn (RuntimeError: no picture today)" in caplog.text
    assert sorted(os.listdir(staging)) == ["_skipped.jsonl", SUMMARY, "part-0.parquet"] and CONFUSION not in \
        summary["output_files"]


def test_the_notebooks_pictures_show_any_names_as_plain_text(tmp_path):
    """``show_samples`` (a folder's name over each image) and ``plot_curves`` (a run's label in the
    legend), drawn as a notebook draws them: after the call has returned, outside its settings."""
    from pipelines import notebook
    from tests.support.datagen import write_dataset

    names = [n for n in NAMES if n is not None]
    write_dataset(str(tmp_path / "etl"), [len(names)], [1], size=4, names=names)
    plt = pictures._pyplot()
    fig = notebook.show_samples(str(tmp_path / "etl"), n=len(names))
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [pictures.cut_name(n) for n in names] and titles[0] == "$\\frac{a}{b}$", titles
    fig.savefig(str(tmp_path / "samples.png"))  # the default settings again: mathtext would fail here
    plt.close(fig)
    history = [{"epoch": 1, "loss": 1.0, "val_loss": 1.1, "val_accuracy": 0.4},
               {"epoch": 2, "loss": 0.8, "val_loss": 1.0, "val_accuracy": 0.5}]
    fig = notebook.plot_curves({name: {"history": history} for name in names[:4]})
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == names[:4]
    fig.savefig(str(tmp_path / "curves.png"))
    plt.close(fig)
    assert png_size(str(tmp_path / "samples.png"))[0] > 0 and png_size(str(tmp_path / "curves.png"))[0] > 0


def test_the_curves_mark_the_best_and_the_stopping_epoch_and_the_probe(tmp_path, monkeypatch):
    """Both panels show where early stopping chose and where it ended the run, the accuracy panel
    the linear probe's validation accuracy; without them, no marks."""
    drawn = []
    save = pictures._save
    monkeypatch.setattr(pictures, "_save", lambda fig, path: (drawn.append(
        [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes]), save(fig, path))[1])
    history = [{"epoch": e, "loss": 1.0 / e, "accuracy": 0.5, "val_loss": 1.1 / e, "val_accuracy": 0.4}
               for e in range(1, 31)]
    path = pictures.plot_history(history, str(tmp_path / "curves.png"), best_epoch=5, stopped_epoch=25,
                                 monitor="val_loss", probe_accuracy=0.7667)
    assert png_size(path)[0] > 0
    marks = ["best: epoch 5 (val_loss)", "stopped after epoch 25"]
    assert drawn[0] == [["train", "validation", *marks], ["train", "validation", *marks, "linear probe 0.767"]]
    pictures.plot_history(history, str(tmp_path / "plain.png"))
    assert drawn[1] == [["train", "validation"]] * 2
    pictures.plot_history(history, str(tmp_path / "start.png"), best_epoch=0, monitor="val_loss")
    assert drawn[2][0] == ["train", "validation", "best: the start (the linear probe's head) (val_loss)"]
