"""The backbone table (pipelines/backbones.py): every row builds with random weights as it says, DenseNet121's
model and fine-tuning blocks, ``--backbone``'s choices, and Xception's feature cache key as before."""
import numpy as np
import pytest

from pipelines.backbones import BACKBONES, backbone_layers
from pipelines.predict.safeload import ALLOWED_LAYERS


@pytest.mark.parametrize("name", list(BACKBONES))
def test_each_row_builds_the_model_it_describes(name):
    """Random weights at the row's smallest input: the Keras model named as the row, pooled features of its
    width, built from exactly its layer classes, with a layer starting each of its fine-tuning blocks."""
    spec = BACKBONES[name]
    base = spec.build(spec.min_size, "none")
    assert base.name == name  # export finds the row by it
    assert tuple(base.input_shape) == (None, spec.min_size, spec.min_size, 3)
    assert tuple(base.output_shape) == (None, spec.feature_dim)
    assert {type(layer).__name__ for layer in base.layers} == spec.layers
    names = [layer.name for layer in base.layers]
    starts = [next(i for i, n in enumerate(names) if n.startswith(spec.top_blocks_prefix(k)))
              for k in range(spec.blocks, 0, -1)]
    assert starts == sorted(set(starts)), starts  # block 1 nearest the input, each block after the one below
    features = base(np.zeros((1, spec.min_size, spec.min_size, 3), np.float32), training=False).numpy()
    assert features.shape == (1, spec.feature_dim) and np.isfinite(features).all()


def test_the_safe_loader_allows_every_backbones_layers():
    assert backbone_layers() <= ALLOWED_LAYERS
    assert {"Concatenate", "AveragePooling2D", "ZeroPadding2D", "SeparableConv2D"} <= ALLOWED_LAYERS


def test_densenet121_is_a_whole_model_from_uint8_images_with_torch_preprocessing():
    """``build_model`` at 32 px (DenseNet's smallest) from 40 px stored images: a forward pass, and the
    preprocessing layer computing Keras' own DenseNet preprocess_input (x / 255, ImageNet mean and std)."""
    from pipelines.stack.kerasapi import keras
    from pipelines.training.model.build import backbone_of, build_model

    model = build_model(3, 32, weights="none", backbone="densenet121", stored_size=40)
    images = np.random.default_rng(0).integers(0, 256, (2, 40, 40, 3), dtype=np.uint8)
    probabilities = model.predict(images, verbose=0)
    assert probabilities.shape == (2, 3) and np.allclose(probabilities.sum(axis=1), 1, atol=1e-5)
    assert backbone_of(model).name == "densenet121" and not backbone_of(model).trainable
    preprocess = model.get_layer("densenet121_preprocess")
    resized = keras.layers.Resizing(32, 32)(images.astype(np.float32)).numpy()
    expected = keras.applications.densenet.preprocess_input(resized.copy())
    np.testing.assert_allclose(preprocess(resized).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_densenet121_top_block_is_its_last_dense_block():
    """``unfreeze`` of 1 block: exactly the weighted layers of dense block 4 (``conv5_``) and the batch norm
    after it, trainable; every other backbone weight frozen. 4 blocks reach down to ``conv2_``."""
    from pipelines.backbones import backbone_spec
    from pipelines.training.model.build import backbone_of, build_model
    from pipelines.training.model.finetune import block_layers, unfreeze

    model = build_model(3, 32, weights="none", backbone="densenet121")
    base = backbone_of(model)
    weighted = {layer.name for layer in base.layers if layer.weights}
    top = {name for name in weighted if name.startswith("conv5_")} | {"bn"}
    assert len(top) == 16 * 4 + 1  # 16 dense layers of 2 batch norms and 2 convolutions, the final batch norm
    assert set(unfreeze(model, "densenet121", 1)) == top
    assert {layer.name for layer in base.layers if layer.trainable and layer.weights} == top
    assert {layer.name for layer in base.layers if not layer.trainable and layer.weights} == weighted - top
    expected = [w for layer in base.layers if layer.name in top for w in layer.trainable_weights]
    assert {id(w) for w in model.trainable_weights} == {id(w) for w in expected + model.get_layer("head").weights}
    names = [layer.name for layer in base.layers]
    assert block_layers(names, backbone_spec("densenet121"), 4)[0].startswith("conv2_block1_")
    assert block_layers(names, backbone_spec("densenet121"), 2)[0] == "conv4_block1_0_bn"


def test_backbone_choices_come_from_the_table(capsys):
    from pipelines.launch.config import LaunchConfig
    from pipelines.runtime.config import parse_configs
    from pipelines.training.config import TrainConfig

    config, _ = parse_configs((TrainConfig, LaunchConfig), ["--data", "d", "--output", "o", "--backbone",
                                                             "densenet121", "--fine-tune-blocks", "4"])
    assert config.model.backbone == "densenet121" and config.model.fine_tune_blocks == 4
    with pytest.raises(SystemExit) as info:
        parse_configs((TrainConfig, LaunchConfig), ["--data", "d", "--output", "o", "--backbone", "resnet50"])
    assert info.value.code == 2
    assert "invalid choice: 'resnet50' (choose from " + ", ".join(f"'{n}'" for n in BACKBONES) in capsys.readouterr().err


def test_xceptions_feature_cache_key_is_unchanged():
    """Caches written before the table stay valid: the key still hashes the backbone's name as before."""
    from pipelines.training.data.features import model_key
    assert model_key("imagenet", 299, 42, "xception", "float32", "uint8-299") == "773e3428fdbaec9c"
    assert model_key("none", 71, 3, "xception", "float32", "uint8-90") == "784523e8b954c7b3"
