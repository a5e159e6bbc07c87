"""What rank 0 leaves at the end of a run, in one process without Horovod: results before pictures,
pictures of bounded size at 257 and 1,000 classes, a float32 model with its hash whatever the
training policy, the loss scale in checkpoints, the feature cache keyed by precision, no import
circle between the training config and the job."""
import ast
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.support.env import REPO


# --- pictures ------------------------------------------------------------------------------------

# The drawing process's peak RSS is its own memory's high-water mark, VmHWM (KiB): getrusage's
# ru_maxrss would not do, as Linux carries the forking parent's high-water mark (this pytest process,
# which may hold TensorFlow and a model: 1.2 GB seen) across fork and exec into the child's.
DRAW = textwrap.dedent("""
    import json, sys
    import numpy as np
    from pipelines.tracking import pictures

    def peak_kib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

    k, out = int(sys.argv[1]), sys.argv[2]
    rng = np.random.default_rng(0)
    m = rng.integers(0, 3, (k, k)) + np.diag(rng.integers(20, 40, k))
    names = [f"{i:03d}.class-name-{i}" for i in range(k)]
    before = peak_kib()
    pictures.plot_confusion(m.tolist(), names, out + "/confusion.png")
    pictures.plot_top_confusions(m.tolist(), names, out + "/top_confusions.png")
    print(json.dumps({"before_kib": before, "peak_kib": peak_kib()}))
""")


def png_size(path):
    """(width, height) in pixels, from the PNG's IHDR chunk."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


@pytest.mark.parametrize("classes", [257, 1000])
def test_confusion_pictures_of_many_classes_stay_small_in_pixels_and_memory(classes, tmp_path):
    """257 classes took 14,431 x 13,198 px and 7,380 MiB before; now a fixed figure: the peak RSS of
    the drawing process (imports included) stays under 400 MiB, the PNGs under 1,300 x 1,100 px."""
    proc = subprocess.run([sys.executable, "-c", DRAW, str(classes), str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    usage = json.loads(proc.stdout.strip().splitlines()[-1])
    assert usage["peak_kib"] < 400 * 1024, usage
    width, height = png_size(tmp_path / "confusion.png")
    assert width <= 1300 and height <= 1100, (width, height)
    width, height = png_size(tmp_path / "top_confusions.png")
    assert width <= 1100 and height <= 700, (width, height)


def test_few_classes_keep_every_count_and_the_top_confusions_are_the_largest_off_diagonal_cells(tmp_path):
    from pipelines.tracking import pictures
    m = [[5, 1, 0], [2, 7, 4], [0, 4, 9]]
    assert pictures.top_confusions(m) == [(1, 2, 4), (2, 1, 4), (1, 0, 2), (0, 1, 1)]
    assert pictures.top_confusions(m, top=1) == [(1, 2, 4)]
    assert pictures.top_confusions([[3, 0], [0, 2]]) == []
    width, height = png_size(pictures.plot_confusion(m, ["a", "b", None], str(tmp_path / "c.png")))
    assert 300 < width < 800 and 300 < height < 800  # 0.7 in a class at 3 classes
    width, _ = png_size(pictures.plot_confusion(np.eye(30, dtype=int) * 3, [str(i) for i in range(30)],
                                                str(tmp_path / "c30.png")))
    assert width <= 2500  # the largest figure with counts in the cells: 30 classes, 24 in


# --- the end of a run ----------------------------------------------------------------------------

class _Data:
    """What save_outputs reads of a dataset."""
    class_names = ["cats", "dogs", "owls"]
    stored_size = 32


def at_the_end(config, model, totals=None):
    """The run context and last phase save_outputs reads: rank 0 of 1 writing into --output."""
    from types import SimpleNamespace
    from pipelines.training.context import RankContext
    from pipelines.training.plan import RunPlan
    from pipelines.training.rank import Rank
    context = RankContext(config, Rank(0, 1, 0, 1, 1), RunPlan(_Data(), None, 0.001, _Data.stored_size))
    return context, SimpleNamespace(inputs=SimpleNamespace(exported_model=lambda: model), totals=totals)


def tiny(num_classes=3, size=32):
    from pipelines.training.model.build import build_model
    return build_model(num_classes, size, dropout=0.0, weights="none", seed=1, backbone="tiny")


REPORT = {"test": {"loss": 0.5, "accuracy": 0.5, "count": 2}, "best_epoch": 1, "epochs_run": 1,
          "validation": {"epoch": 1, "loss": 0.4, "accuracy": 0.75, "count": 4, "expected_count": 4}}


def saved(tmp_path, monkeypatch, draw, totals=None, **options):
    """save_outputs of `REPORT` into ``tmp_path/out`` with ``draw`` as save_pictures: ``(out, metrics.json)``."""
    from pipelines.training.records import report as results
    from pipelines.training.config import TrainConfig

    monkeypatch.setattr(results, "save_pictures", draw)
    out = str(tmp_path / "out")
    os.makedirs(out)
    config = TrainConfig(data=str(tmp_path), output=out, backbone="tiny", weights="none", tracking=False, **options)
    context, last = at_the_end(config, tiny(), totals)
    results.save_outputs(context, json.loads(json.dumps(REPORT)), last)
    with open(os.path.join(out, "metrics.json")) as f:
        return out, json.load(f)


def test_a_failure_while_drawing_leaves_the_results_written(tmp_path, monkeypatch):
    from pipelines.training.evaluate import Totals

    def broken(*_args):
        raise MemoryError("drawing 257 classes")

    totals = Totals.of_confusion(1.0, [[1, 0, 0], [1, 0, 0], [0, 0, 0]])
    out, written = saved(tmp_path, monkeypatch, broken, totals)
    assert written["test"]["confusion"][1] == [1, 0, 0] and written["pictures"] == {}
    assert written["pictures_error"] == "MemoryError: drawing 257 classes"
    assert {"model.keras", "model.json", "class_names.json", "metrics.json"} <= set(os.listdir(out))


def test_no_pictures_draws_none_and_records_no_error(tmp_path, monkeypatch):
    def drawn(*_args):
        raise AssertionError("a picture was drawn under --no-pictures")

    out, written = saved(tmp_path, monkeypatch, drawn, pictures=False)
    assert written["pictures"] == {} and "pictures_error" not in written
    assert not [name for name in os.listdir(out) if name.endswith(".png")]


def test_results_are_written_before_any_picture(tmp_path, monkeypatch):
    seen = {}

    def pictures(directory, report, exported, data):
        seen["metrics"] = json.loads(open(os.path.join(directory, "metrics.json")).read())
        return {"curves": os.path.join(directory, "curves.png")}

    out, written = saved(tmp_path, monkeypatch, pictures)
    assert seen["metrics"]["test"]["accuracy"] == 0.5 and seen["metrics"]["pictures"] == {}
    assert written["pictures"] == {"curves": f"{out}/curves.png"}


def test_model_json_records_the_model_files_sha256(tmp_path):
    from pipelines.contract import MODEL_SHA256
    from pipelines.training.model.export import export_model
    path = str(tmp_path / "model.keras")
    export_model(tiny(), path, 32, _Data.class_names)
    contract = json.loads((tmp_path / "model.json").read_text())
    with open(path, "rb") as f:
        assert contract[MODEL_SHA256] == hashlib.sha256(f.read()).hexdigest()
    assert contract["file"] == "model.keras" and oct(os.stat(path).st_mode & 0o777) == "0o644"


@pytest.fixture
def mixed_policy():
    import tensorflow as tf
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_a_mixed_precision_model_is_exported_computing_in_float32(tmp_path, mixed_policy):
    import tensorflow as tf
    from pipelines.training.model.export import export_model
    model = tiny()
    assert model.get_layer("tiny").compute_dtype == "float16"  # trained under mixed_float16
    rng = np.random.default_rng(0)
    model.get_layer("head").set_weights([rng.normal(0, 0.5, (32, 3)).astype(np.float32), np.zeros(3, np.float32)])
    exported = export_model(model, str(tmp_path / "model.keras"), 32, _Data.class_names)
    tf.keras.mixed_precision.set_global_policy("float32")  # as batch inference loads it
    loaded = tf.keras.models.load_model(str(tmp_path / "model.keras"))
    for m in (exported, loaded):
        layers = list(m.layers) + list(m.get_layer("tiny").layers)
        computing = [layer for layer in layers if not isinstance(layer, tf.keras.layers.InputLayer)]
        assert {layer.compute_dtype for layer in computing} == {"float32"}, [(x.name, x.compute_dtype) for x in layers]
    images = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    reference = tiny()  # the same weights, built and computed in float32
    reference.set_weights(model.get_weights())
    expected = reference.predict(images, verbose=0)
    np.testing.assert_allclose(loaded.predict(images, verbose=0), expected, rtol=1e-5, atol=1e-6)
    assert loaded.predict(images, verbose=0).dtype == np.float32


def test_a_checkpoint_carries_the_loss_scale_of_mixed_precision(tmp_path, mixed_policy):
    import tensorflow as tf
    from pipelines.training.checkpoints.files import load_checkpoint, optimizer_state, save_checkpoint

    def compiled():
        m = tiny()
        m.compile(optimizer=tf.keras.optimizers.Nadam(0.01), loss="sparse_categorical_crossentropy")
        return m

    first = compiled()
    first.fit(np.zeros((4, 32, 32, 3), np.uint8), np.arange(4) % 3, batch_size=4, epochs=2, verbose=0)
    scale = first.optimizer._loss_scale
    scale._current_loss_scale.assign(1024.0)  # as after overflows halved it
    scale._counter.assign(17)
    path = str(tmp_path / "checkpoint-2.npz")
    save_checkpoint(first, path)
    second = compiled()
    load_checkpoint(second, path)
    state = second.optimizer._loss_scale
    assert float(state._current_loss_scale.numpy()) == 1024.0 and int(state._counter.numpy()) == 17
    assert int(second.optimizer.iterations.numpy()) == 2
    assert second.optimizer.inner_optimizer._u_product is optimizer_state(second.optimizer)[-3]
    for a, b in zip(optimizer_state(first.optimizer), optimizer_state(second.optimizer)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_the_feature_cache_is_keyed_by_the_backbones_compute_dtype_and_the_models_input():
    from pipelines.training.data.features import model_key as feature_key
    from pipelines.training.model.build import model_input
    uint8 = model_input(tiny(size=71))
    assert uint8 == "uint8-71"
    float32 = feature_key("none", 71, 42, "tiny", "float32", uint8)
    assert feature_key("none", 71, 42, "tiny", "float16", uint8) != float32
    # features computed before the model took uint8 (float32 images preprocessed on the CPU) had this
    # key: never reused for these
    assert float32 != hashlib.sha256(b"tiny-avg:random-42:71").hexdigest()[:16]
    assert feature_key("none", 71, 42, "tiny", "float32", "float32-71") != float32
    assert feature_key("none", 71, 42, "tiny", "float32", "uint8-90") != float32  # other stored images


def test_the_training_config_imports_no_job_module_back():
    """The circle config -> finetune -> train -> config is gone: finetune imports neither the job nor
    the input paths, and importing the config loads neither."""
    source = open(os.path.join(REPO, "pipelines", "training", "model", "finetune.py")).read()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"pipelines.training.train", "pipelines.training.inputs", "pipelines.training.config"}
    proc = subprocess.run([sys.executable, "-c", "import sys, pipelines.training.config; "
                           "print(sorted(m for m in sys.modules if m in ('pipelines.training.train', "
                           "'pipelines.training.inputs')))"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr[-2000:]


def test_the_report_gives_the_chosen_epochs_validation_figures_from_its_history():
    from pipelines.training.records.report import best_validation

    history = [{"epoch": 1, "val_loss": 0.9, "val_accuracy": 0.5, "val_count": 8.0},
               {"epoch": 2, "val_loss": 0.7, "val_accuracy": 0.625, "val_count": 8.0}]
    assert best_validation(history, 2, 8) == {"epoch": 2, "loss": 0.7, "accuracy": 0.625, "count": 8,
                                              "expected_count": 8}
    # an epoch the history lacks: no figure invented
    assert best_validation([], 3, 8) == {"epoch": 3, "loss": None, "accuracy": None, "count": None,
                                         "expected_count": 8}
