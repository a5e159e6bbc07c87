"""What a run leaves for people and programs: the exported model's input contract, small
checkpoints tied to their frozen weights, the pictures (one process, no Horovod)."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from pipelines.tracking import pictures
from pipelines.stack.kerasapi import keras
from pipelines.training.checkpoints.files import frozen_checksum, load_checkpoint, optimizer_state, save_checkpoint
from pipelines.training.evaluate import add, batch_totals, evaluate_dataset
from pipelines.backbones import BACKBONES
from pipelines.training.model.build import backbone_of, build_model, feature_extractor
from pipelines.training.model.export import export_model

SIZE = 71  # Xception's smallest input


def build(stored=SIZE, seed=1, backbone="xception"):
    m = build_model(3, SIZE, weights="none", seed=seed, stored_size=stored, backbone=backbone)
    features = BACKBONES[backbone].feature_dim
    m.get_layer("head").set_weights([np.random.default_rng(0).normal(0, 0.05, (features, 3)).astype(np.float32),
                                     np.zeros(3, np.float32)])
    return m


@pytest.fixture(scope="module")
def model():
    return build()


def raw_images(n, size, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


# The contract does not depend on the backbone: the tiny one checks it in the fast tests (an
# Xception build, export, load and four traced predicts take 20 s of a worker), Xception itself in
# the whole suite.
@pytest.mark.parametrize("backbone, stored", [("tiny", SIZE), ("tiny", 90),
                                              pytest.param("xception", 90, marks=pytest.mark.slow)])
def test_exported_model_takes_the_etls_uint8_image(tmp_path, backbone, stored):
    """The model trained, evaluated and exported is one: uint8 stored images in, preprocessing
    (bilinear resizing to the backbone's size, then x / 127.5 - 1) inside it."""
    model = build(stored, backbone=backbone)
    assert model.input.dtype == tf.uint8 and tuple(model.input_shape) == (None, stored, stored, 3)
    path = str(tmp_path / "model.keras")
    export_model(model, path, stored, ["a", "b", "c"])
    exported = keras.models.load_model(path)
    assert exported.input.dtype == tf.uint8 and tuple(exported.input_shape) == (None, stored, stored, 3)
    contract = json.loads((tmp_path / "model.json").read_text())
    assert contract["input"]["dtype"] == "uint8" and contract["input"]["range"] == [0, 255]
    assert contract["input"]["shape"] == [None, stored, stored, 3] and contract["class_names"] == ["a", "b", "c"]
    assert contract["model_image_size"] == SIZE
    images = raw_images(6, stored)
    # what the backbone takes, computed here, not by the code's own preprocessing: bilinear
    # resizing (half-pixel centres, as TensorFlow 2's tf.image.resize) in numpy, then x / 127.5 - 1
    backbone_view = (bilinear(images, SIZE) / 127.5 - 1).astype(np.float32)
    assert backbone_view.min() >= -1 and backbone_view.max() <= 1
    features = backbone_of(model)(backbone_view, training=False)
    expected = model.get_layer("head")(model.get_layer("dropout")(features, training=False)).numpy()
    np.testing.assert_allclose(model.predict(images, verbose=0), expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(exported.predict(images, verbose=0), expected, rtol=1e-4, atol=1e-6)
    # the feature cache's extractor is the same preprocessing and backbone
    np.testing.assert_allclose(feature_extractor(model)(images).numpy(), features.numpy(), rtol=1e-4, atol=1e-5)


def test_a_model_is_exported_only_for_the_images_it_takes(model, tmp_path):
    with pytest.raises(ValueError, match="the model takes 71 px images, not the data's 90 px"):
        export_model(model, str(tmp_path / "model.keras"), 90, ["a", "b", "c"])
    assert not (tmp_path / "model.keras").exists()


def bilinear(images, size):
    """``(n, h, w, c)`` -> float64 ``(n, size, size, c)``: bilinear with half-pixel centres (source
    coordinate ``(i + 0.5) * in / out - 0.5``, clamped to the image), TensorFlow 2's default."""
    def axis(n_in):
        src = np.clip((np.arange(size) + 0.5) * n_in / size - 0.5, 0, n_in - 1)
        low = np.floor(src).astype(int)
        return low, np.minimum(low + 1, n_in - 1), src - low

    (y0, y1, fy), (x0, x1, fx) = axis(images.shape[1]), axis(images.shape[2])
    x = images.astype(np.float64)
    rows = x[:, y0] * (1 - fy)[:, None, None] + x[:, y1] * fy[:, None, None]
    return rows[:, :, x0] * (1 - fx)[:, None] + rows[:, :, x1] * fx[:, None]


def test_checkpoint_holds_what_training_changes_and_is_small(model, tmp_path):
    m = keras.models.clone_model(model)
    m.set_weights(model.get_weights())
    m.compile(optimizer=keras.optimizers.Nadam(0.01), loss="sparse_categorical_crossentropy")
    m.fit(raw_images(8, SIZE), np.arange(8) % 3, epochs=1, verbose=0)
    path = str(tmp_path / "checkpoint-1.npz")
    size = save_checkpoint(m, path)
    assert size == os.path.getsize(path) < 1_000_000  # the frozen backbone alone is 84 MB
    state = [v.numpy() for v in optimizer_state(m.optimizer)]
    assert int(state[0]) == 1  # iterations

    fresh = keras.models.clone_model(model)
    fresh.set_weights(model.get_weights())
    fresh.compile(optimizer=keras.optimizers.Nadam(0.01), loss="sparse_categorical_crossentropy")
    assert frozen_checksum(fresh) == frozen_checksum(m)
    load_checkpoint(fresh, path)
    for a, b in zip(fresh.get_weights(), m.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(optimizer_state(fresh.optimizer), state):
        np.testing.assert_array_equal(a.numpy(), b)


def test_frozen_checksum_tells_backbones_apart(model):
    other = build(seed=2)
    assert frozen_checksum(other) != frozen_checksum(model)


def test_totals_count_a_confusion_matrix():
    probs = np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.6, 0.3, 0.1]], np.float32)
    a = batch_totals(probs, np.array([0, 1, 1]))
    assert a.confusion_matrix().tolist() == [[1, 0, 0], [1, 1, 0], [0, 0, 0]]
    both = add(a, batch_totals(probs[:1], np.array([2])))
    assert both.confusion_matrix().tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 0]] and both.count == 4


def test_evaluate_dataset_counts_every_batch_of_a_real_model_once():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(7, 4)).astype(np.float32), rng.integers(0, 5, 7)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="softmax")])
    totals = evaluate_dataset(m, tf.data.Dataset.from_tensor_slices((x, y)).batch(3))  # 3 + 3 + 1 rows
    whole = batch_totals(m(x).numpy(), y)
    assert (totals.count, totals.correct, totals.num_classes) == (7, whole.correct, 5)
    assert totals.loss_sum == pytest.approx(whole.loss_sum, rel=1e-6)
    assert totals.confusion_matrix().tolist() == whole.confusion_matrix().tolist()
    assert evaluate_dataset(m, tf.data.Dataset.from_tensor_slices((x, y)).take(0).batch(3)).confusion_matrix().shape \
        == (5, 5)


def test_pictures_are_written(tmp_path):
    history = [{"epoch": e, "loss": 1 / e, "val_loss": 1.2 / e, "accuracy": 0.5 + e / 10,
                "val_accuracy": 0.4 + e / 10} for e in range(1, 4)]
    paths = [pictures.plot_history(history, str(tmp_path / "curves.png")),
             pictures.plot_confusion([[5, 1], [2, 7]], ["cats", None], str(tmp_path / "confusion.png")),
             pictures.contact_sheet(raw_images(5, 32), [0, 1, 0, 1, 1], [0, 0, 0, 1, 1], ["cats", "dogs"],
                                    str(tmp_path / "sheet.png"), columns=4)]
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path)) == ["confusion.png", "curves.png", "sheet.png"]
