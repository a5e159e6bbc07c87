"""Counts in what users read: one helper (pipelines.runtime.logs.plural) says "1 class", "3 classes"; its
members across the stages, and a scan of the sources for a count followed by a plural noun."""
import ast
import os
import re

import pytest

from pipelines.runtime.logs import plural
from tests.support.env import REPO


@pytest.mark.parametrize("count, noun, expected", [
    (1, "class", "1 class"), (2, "class", "2 classes"), (0, "class", "0 classes"),
    (1, "row group", "1 row group"), (3, "row group", "3 row groups"), (1, "epoch", "1 epoch"),
    (2, "box", "2 boxes"), (2, "epoch", "2 epochs"), (2, "GPU", "2 GPUs"), (1.5, "epoch", "1.5 epochs"),
])
def test_plural_says_the_noun_in_the_singular_for_one_only(count, noun, expected):
    assert plural(count, noun) == expected


def test_plural_takes_an_irregular_plural():
    assert plural(1, "child", "children") == "1 child" and plural(2, "child", "children") == "2 children"
    assert plural(2, "batch", "batches") == "2 batches"


def test_the_etl_summary_counts_one_class_one_row_and_one_row_group():
    from pipelines.etl.summary import format_summary
    split = {"rows": 1, "row_groups": 1, "mean_row_group_bytes": 0, "mean_row_group_bytes_compressed": 0}
    manifest = {"image": {"height": 8}, "num_classes": 1, "layout": "folders", "max_world_size": 1,
                "min_row_groups": 1, "splits": {"train": split, "test": split}, "images_per_second": 1.0,
                "seconds": 1.0, "files": {"found": 2, "written": 2, "rejected": 0, "skipped": 0, "reasons": {}},
                "classes_not_in_every_split": [{"label": 0, "name": "a", "train": 1, "validation": 0, "test": 0}]}
    text = format_summary(manifest)
    assert "(8 px, 1 class, folders layout)" in text and "train     : 1 row in 1 row group " in text
    assert "WARNING: 1 class is not in every split" in text


def test_the_etl_refusal_of_a_tree_without_images_counts_one_file(tmp_path):
    from pipelines.etl.config import ETLConfig
    from pipelines.etl.plan import plan
    (tmp_path / "cats").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match=r"\(1 file listed: 1 not inside a class folder\)"):
        plan(ETLConfig(input=str(tmp_path), output=str(tmp_path.parent / "out"), image_size=8))


def test_a_mix_of_layouts_counts_one_folder_of_each_kind():
    from pipelines.etl.labels import decide_layout
    with pytest.raises(ValueError, match=r"1 folder named NNN.name \(e.g. '001.birds'\) and 1 plain name \(e.g. "):
        decide_layout(["001.birds", "misc"])


def test_training_refusals_count_one_rank_one_row_and_one_core():
    from pipelines.training.devices import rank_cores
    from pipelines.training.schedule import plan_steps
    with pytest.raises(ValueError, match=r"\(--batch-size 4 x 1 rank\) is larger than the train split \(1 row\)"):
        plan_steps(train_rows=1, validation_rows=8, batch_size=4, world_size=1)
    with pytest.raises(ValueError, match="1 rank x 2 threads: need 2 cores to bind; this process may use 1 core "):
        rank_cores(0, 1, 2, [0])


def test_the_training_result_line_counts_one_image_and_one_epoch():
    from pipelines.training.cli import result_line
    report = {"test": {"accuracy": 1.0, "loss": 0.1, "count": 1}, "epochs_run": 1, "best_epoch": 1,
              "world_size": 1, "global_batch_size": 1}
    assert result_line(report, "out").startswith("test accuracy 1.0000 (loss 0.1000) on 1 image; 1 epoch, best 1;")


def test_the_predict_summary_counts_one_class_and_one_labelled_image():
    from pipelines.predict.inputs import TREE
    from pipelines.predict.job import format_summary
    from pipelines.predict.metrics import classification_report
    summary = {"model": "m", "class_names": ["cat"], "image_size": 8, "top_k": 1, "input_kind": TREE,
               "files": {"found": 1, "rows": 1, "skipped": 0, "predicted": 1, "unreadable": 0, "reasons": {}},
               "metrics": classification_report([0], [0], ["cat"]) | {"picture": "_confusion.png"},
               "labelled": 1, "images_per_second": 2.0, "seconds": 2.0, "output": "o"}
    text = format_summary(summary)
    assert "(m: 1 class, 8 px" in text and "(1/1 labelled image)" in text


# A count placeholder followed by one of these nouns in the plural (a unit of a rate, "images/s",
# is no count), or by "noun(s)": the fault this file is about ("1 classes", "1 epochs", "1 rank(s)").
# plural() is the way to say a count.
NOUNS = ("classes|epochs|images|ranks|row groups|rows|files|folders|cores|threads|tasks|slots|steps|workers|"
         "blocks|layers|names|parameters|variables|bytes|attempts|GPUs|candidates|pixels")
QUALIFIERS = "candidate|class|labelled|test|cached test|validation|trainable|optimizer|concurrent|barrier|task|" \
             "weighted|data|top|decoded"
COUNTED = rf"((?:(?:{QUALIFIERS}) )?(?:{NOUNS})(?![\w/])|[a-z]+\(s\))"
PLURAL_AFTER_COUNT = re.compile(rf"^ {COUNTED}")
PERCENT_COUNT = re.compile(rf"%d {COUNTED}")
# Where a plural after a count stays, and why.
ALLOWED = {
    ("pipelines/etl/memory.py", "bytes"): "DECODE_BYTES_PER_PIXEL, a constant (16)",
    ("pipelines/tools/weights.py", "weighted layers"): "a backbone row's weighted_layers, a constant (80 for xception)",
    ("pipelines/etl/listing.py", "bytes"): "file too large: both sizes exceed --max-file-mb's bytes",
    ("pipelines/etl/transform.py", "bytes"): "--max-file-mb in bytes, a limit (never 1)",
    ("pipelines/etl/images.py", "pixels"): "a decompression bomb: more pixels than --max-pixels (never 1)",
}


def counted_plurals(source):
    """``(line, words)`` of each f-string of the Python ``source`` where a ``{count}`` is followed by
    a plural noun of :data:`COUNTED`, and of each ``%d`` format followed by one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            for value, after in zip(node.values, node.values[1:]):
                if isinstance(value, ast.FormattedValue) and isinstance(after, ast.Constant):
                    match = PLURAL_AFTER_COUNT.match(after.value)
                    if match:
                        found.append((node.lineno, match.group(1)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, m.group(1)) for m in PERCENT_COUNT.finditer(node.value)]
    return found


def test_the_scan_finds_the_faults_it_is_for():
    source = ('f"{n} classes, {k} epochs, {r} row groups"; f"{n} rank(s)"; log("%d candidate images", n)\n'
              'f"{plural(n, \'class\')}; {rate} images/s; {path} holds files"')
    assert [words for _, words in counted_plurals(source)] == ["classes", "epochs", "row groups", "rank(s)",
                                                               "candidate images"]


def test_no_message_puts_a_count_before_a_plural_noun_itself():
    sources = [os.path.relpath(os.path.join(d, f), REPO) for folder in ("pipelines", "jobs")
               for d, _, files in os.walk(os.path.join(REPO, folder)) for f in files if f.endswith(".py")]
    faults = [f"{path}:{line}: ... {words}" for path in sorted(sources)
              for line, words in counted_plurals(open(os.path.join(REPO, path)).read())
              if (path, words) not in ALLOWED]
    assert faults == [], "say counts with pipelines.runtime.logs.plural:\n" + "\n".join(faults)
