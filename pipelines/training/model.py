"""The model: Keras Xception (ImageNet, frozen) + dropout + softmax head, as in the article."""
from __future__ import annotations

import os


def build_model(num_classes: int, image_size: int, dropout: float = 0.5, weights: str = "imagenet",
                seed: int = 0):
    """Xception transfer-learning model.

    ``Input (image_size, image_size, 3) float32 in [-1, 1]`` -> ``Xception(include_top=False,
    pooling='avg')`` frozen and called with ``training=False`` (its batch-norm statistics stay
    ImageNet's) -> ``Dropout(dropout)`` -> ``Dense(num_classes, softmax)``.

    Args:
        weights: ``'imagenet'`` (Keras downloads them: needs internet), ``'none'`` (random), or the
            path of a no-top Xception weights file (e.g. from ``python -m pipelines.tools.weights``).

    Returns:
        an uncompiled ``tf.keras.Model`` with outputs of shape ``(batch, num_classes)``.

    Raises:
        FileNotFoundError: a weights path that does not exist.
    """
    import tensorflow as tf

    if weights not in ("imagenet", "none") and not os.path.isfile(weights):
        raise FileNotFoundError(f"weights file not found: {weights}")
    tf.keras.utils.set_random_seed(seed)
    base = tf.keras.applications.Xception(include_top=False, pooling="avg",
                                          weights="imagenet" if weights == "imagenet" else None,
                                          input_shape=(image_size, image_size, 3))
    if weights not in ("imagenet", "none"):
        base.load_weights(weights)
    base.trainable = False
    inputs = tf.keras.Input((image_size, image_size, 3), name="image")
    features = base(inputs, training=False)
    x = tf.keras.layers.Dropout(dropout, seed=seed, name="dropout")(features)
    outputs = tf.keras.layers.Dense(num_classes, activation="softmax", name="head")(x)
    return tf.keras.Model(inputs, outputs, name="xception_transfer")


def compile_distributed(model, learning_rate: float) -> None:
    """Compile for Horovod data-parallel training: ``Nadam(learning_rate)`` wrapped in
    ``hvd.DistributedOptimizer`` (gradients averaged over ranks by allreduce), sparse categorical
    cross-entropy on int32 labels, accuracy. ``learning_rate`` is already scaled by the world size
    (:func:`pipelines.training.schedule.scaled_lr`). Needs ``hvd.init()`` first."""
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Nadam(learning_rate=learning_rate))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def inference_model(model, stored_size: int):
    """The trained ``model`` behind its input contract: the ETL's image, uint8 RGB ``(stored_size,
    stored_size, 3)`` with values 0-255, preprocessed inside the graph exactly as training's
    input pipeline does (:func:`pipelines.training.data.preprocessor`): ``Resizing`` (bilinear) to
    the model's size when it differs, then ``Rescaling(1/127.5, offset=-1)``, which is Xception's
    ``preprocess_input``. The trained layers (``xception``, ``dropout``, ``head``) are the same
    objects, not copies, and keep their names."""
    import tensorflow as tf

    size = model.input_shape[1]
    image = tf.keras.Input((stored_size, stored_size, 3), dtype="uint8", name="image")
    x = tf.keras.layers.Rescaling(1.0, name="to_float")(image)  # uint8 -> float32, values unchanged
    if size != stored_size:
        x = tf.keras.layers.Resizing(size, size, interpolation="bilinear", name="resize")(x)
    x = tf.keras.layers.Rescaling(1 / 127.5, offset=-1.0, name="xception_preprocess")(x)
    for layer in model.layers[1:]:  # the trained model is a chain: input, xception, dropout, head
        x = layer(x, training=False) if layer.name == "xception" else layer(x)
    return tf.keras.Model(image, x, name=f"{model.name}_on_uint8")


def input_contract(stored_size: int, model_size: int, class_names) -> dict:
    """The exported model's contract (``model.json``): what it takes and what it returns."""
    return {
        "file": "model.keras",
        "input": {"name": "image", "dtype": "uint8", "shape": [None, stored_size, stored_size, 3],
                  "layout": "NHWC", "channels": "RGB", "range": [0, 255],
                  "what": "the ETL's stored image as in the Parquet 'image' column: stored_size x "
                          "stored_size x 3 bytes, row-major, RGB"},
        "preprocessing": ("inside the model: "
                          + (f"Resizing to {model_size}x{model_size} (bilinear), " if model_size != stored_size else "")
                          + "Rescaling(1/127.5, offset=-1) = Xception preprocess_input; do not preprocess "
                            "the input yourself"),
        "model_image_size": model_size,
        "output": {"name": "probabilities", "dtype": "float32", "shape": [None, len(class_names)],
                   "what": "softmax over class_names, index = label"},
        "class_names": list(class_names),
    }


def export_model(model, path: str, stored_size: int = 0, class_names=None):
    """Save the model for inference, atomically: the trained layers behind the ETL-image input
    contract (:func:`inference_model`; ``stored_size`` 0 = the model's own size), architecture +
    weights, no optimizer (the saved model is a new, uncompiled one: Horovod's wrapped optimizer is
    not serialisable). With ``class_names``, also ``model.json`` beside it (:func:`input_contract`).

    Returns the exported model, in memory (what loading ``path`` gives back, without the seconds
    that loading takes)."""
    from pipelines.atomic import replacing, write_json

    size = model.input_shape[1]
    exported = inference_model(model, stored_size or size)
    with replacing(path, suffix=".keras") as tmp:
        exported.save(tmp)
    if class_names is not None:
        write_json(os.path.join(os.path.dirname(path), "model.json"),
                   input_contract(stored_size or size, size, class_names))
    return exported
