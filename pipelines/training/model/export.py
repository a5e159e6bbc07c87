"""The trained model exported for inference: ``model.keras`` in float32, and its contract ``model.json``."""
from __future__ import annotations

import os

from pipelines.backbones import DEFAULT_BACKBONE, backbone_spec
from pipelines.contract import (
    MODEL_CONTRACT,
    MODEL_FILE,
    MODEL_INPUT_DTYPE,
    MODEL_INPUT_NAME,
    MODEL_INPUT_RANGE,
    MODEL_SHA256,
)
from pipelines.io.atomic import PUBLIC, replacing, write_json
from pipelines.io.digest import file_sha256
from pipelines.runtime.errors import Refused
from pipelines.training.model.build import backbone_of


def input_contract(stored_size: int, input_size: int, class_names, backbone: str = DEFAULT_BACKBONE) -> dict:
    """The exported model's contract (``model.json``): what it takes and what it returns."""
    return {
        "file": MODEL_FILE,
        "input": {"name": MODEL_INPUT_NAME, "dtype": MODEL_INPUT_DTYPE,
                  "shape": [None, stored_size, stored_size, 3], "layout": "NHWC", "channels": "RGB",
                  "range": list(MODEL_INPUT_RANGE),
                  "what": "the ETL's stored image as in the Parquet 'image' column: stored_size x "
                          "stored_size x 3 bytes, row-major, RGB"},
        "preprocessing": ("inside the model: "
                          + (f"Resizing to {input_size}x{input_size} (bilinear), " if input_size != stored_size else "")
                          + backbone_spec(backbone).preprocessing + "; do not preprocess the input yourself"),
        "model_image_size": input_size,
        "output": {"name": "probabilities", "dtype": "float32", "shape": [None, len(class_names)],
                   "what": "softmax over class_names, index = label"},
        "class_names": list(class_names),
    }


def export_model(model, path: str, stored_size: int = 0, class_names=None):
    """Save the model for inference atomically, uncompiled and float32; with ``class_names``, ``model.json`` too.

    Args:
        stored_size: the ETL's image size, checked against the model's input (0: not checked).

    Raises:
        Refused: the model does not take ``stored_size`` px images."""
    from pipelines.stack.kerasapi import keras

    base = backbone_of(model)
    stored, size = model.input_shape[1], base.input_shape[1]
    if stored_size and stored_size != stored:
        raise Refused(f"the model takes {stored} px images, not the data's {stored_size} px")
    exported = float32_model(keras.Model(model.input, model.output, name=model.name))
    with replacing(path, suffix=".keras", mode=PUBLIC) as tmp:
        exported.save(tmp)
    if class_names is not None:
        # a backbone's Keras model is named as its row (tests/unit/training/model/test_backbones.py)
        contract = {**input_contract(stored, size, class_names, base.name), MODEL_SHA256: file_sha256(path)}
        write_json(os.path.join(os.path.dirname(path), MODEL_CONTRACT), contract, mode=PUBLIC)
    return exported




def float32_model(model):
    """``model`` computing in float32: itself if every layer does, else a float32 copy with its weights."""
    import tensorflow as tf

    if not any(_mixed(layer.dtype_policy.name) for layer in _all_layers(model)):
        return model
    previous = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy("float32")
    try:
        copy = model.__class__.from_config(_float32_config(model.get_config()))
    finally:
        tf.keras.mixed_precision.set_global_policy(previous)
    copy.set_weights(model.get_weights())
    return copy


def _all_layers(model):
    import tensorflow as tf

    for layer in model.layers:
        yield layer
        if isinstance(layer, tf.keras.Model):
            yield from _all_layers(layer)


def _mixed(name) -> bool:
    return isinstance(name, str) and name.startswith("mixed_")


def _float32_config(value):
    """A Keras configuration with each ``dtype`` naming a ``mixed_*`` policy made ``"float32"``."""
    if isinstance(value, list):
        return [_float32_config(item) for item in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        policy = item.get("config", {}).get("name") if isinstance(item, dict) else item
        out[key] = "float32" if key == "dtype" and _mixed(policy) else _float32_config(item)
    return out
