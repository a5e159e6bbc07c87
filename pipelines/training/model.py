"""The model: a frozen backbone + dropout + softmax head; the backbone is Keras Xception (ImageNet),
as in the article, or a tiny one for checking a pipeline or a cluster end to end in seconds."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Backbone:
    """A frozen feature extractor: its layer ``name`` inside the model, the smallest input side it
    takes (``min_size`` px), the length of its pooled feature vector (``feature_dim``), whether
    pretrained weights exist for it (``pretrained``: ``--weights imagenet`` or a weights file), and
    its ``blocks`` for ``--fine-tune-blocks``: block ``k`` (1 = nearest the input) is named by
    ``block_prefix.format(k)`` (:mod:`pipelines.training.finetune`)."""

    name: str
    min_size: int
    feature_dim: int
    pretrained: bool
    blocks: int
    block_prefix: str


#: The backbones ``--backbone`` names. ``tiny`` (two blocks of a random 3x3 convolution and a
#: batch normalization, 5 k weights) builds and traces in a fraction of a second where Xception
#: (20.8 M weights, 133 layers) takes several: a run on it checks data, sharding, launchers, outputs
#: and fine-tuning quickly (tests, a new cluster); its accuracy is not the point. Xception's 14 blocks
#: are Keras' ``block1_`` .. ``block14_`` layers.
BACKBONES = {
    "xception": Backbone("xception", 71, 2048, True, 14, "block{}_"),
    "tiny": Backbone("tiny", 8, 32, False, 2, "tiny_block{}_"),
}


def backbone_spec(name: str) -> Backbone:
    """The :class:`Backbone` called ``name``. Raises ``ValueError`` naming the known ones."""
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}: one of {', '.join(BACKBONES)}")
    return BACKBONES[name]


def check_backbone(name: str, weights: str, image_size: int = 0) -> Backbone:
    """Refuse a backbone that cannot take these ``weights`` or this input side (``image_size`` px;
    0 = not known yet). Raises ``ValueError`` with the reason; returns the :class:`Backbone`."""
    spec = backbone_spec(name)
    if weights != "none" and not spec.pretrained:
        raise ValueError(f"backbone {name} has no pretrained weights: use --weights none (got {weights})")
    if image_size and image_size < spec.min_size:
        raise ValueError(f"backbone {name} takes images of at least {spec.min_size} px, got {image_size} "
                         f"(--image-size, or the ETL's size)")
    return spec


def _build_backbone(name: str, image_size: int, weights: str):
    """The backbone as a Keras model ``(N, S, S, 3) float32 in [-1, 1] -> (N, feature_dim)``, pooled."""
    import tensorflow as tf

    shape = (image_size, image_size, 3)
    if name == "xception":
        base = tf.keras.applications.Xception(include_top=False, pooling="avg", input_shape=shape,
                                              weights="imagenet" if weights == "imagenet" else None)
        if weights not in ("imagenet", "none"):
            base.load_weights(weights)
        return base
    x = image = tf.keras.Input(shape, name="tiny_input")
    for block, filters in ((1, 16), (2, BACKBONES["tiny"].feature_dim)):  # a BatchNormalization, as Xception has
        x = tf.keras.layers.Conv2D(filters, 3, strides=2, activation="relu", name=f"tiny_block{block}_conv")(x)
        x = tf.keras.layers.BatchNormalization(name=f"tiny_block{block}_bn")(x)
    return tf.keras.Model(image, tf.keras.layers.GlobalAveragePooling2D(name="tiny_pool")(x), name="tiny")


def build_model(num_classes: int, image_size: int, dropout: float = 0.5, weights: str = "imagenet",
                seed: int = 0, backbone: str = "xception"):
    """Transfer-learning model on a frozen backbone (:data:`BACKBONES`).

    ``Input (image_size, image_size, 3) float32 in [-1, 1]`` -> the backbone (for ``xception``:
    ``Xception(include_top=False, pooling='avg')``), frozen and called with ``training=False`` (its
    batch-norm statistics stay ImageNet's, also when ``--fine-tune-blocks`` later unfreezes some of
    its layers) -> ``Dropout(dropout)`` -> ``Dense(num_classes, softmax)``, the head computing in
    float32 whatever the global dtype policy (under ``mixed_float16`` the softmax stays float32).

    Args:
        weights: ``'imagenet'`` (Keras downloads them: needs internet), ``'none'`` (random), or the
            path of a no-top Xception weights file (e.g. from ``python -m pipelines.tools.weights``).
        backbone: a name in :data:`BACKBONES`; the backbone's layer in the model has that name.

    Returns:
        an uncompiled ``tf.keras.Model`` with outputs of shape ``(batch, num_classes)``.

    Raises:
        FileNotFoundError: a weights path that does not exist.
        ValueError: as :func:`check_backbone`.
    """
    import tensorflow as tf

    check_backbone(backbone, weights, image_size)
    if weights not in ("imagenet", "none") and not os.path.isfile(weights):
        raise FileNotFoundError(f"weights file not found: {weights}")
    tf.keras.utils.set_random_seed(seed)
    base = _build_backbone(backbone, image_size, weights)
    base.trainable = False
    inputs = tf.keras.Input((image_size, image_size, 3), name="image")
    features = base(inputs, training=False)
    x = tf.keras.layers.Dropout(dropout, seed=seed, name="dropout")(features)
    outputs = tf.keras.layers.Dense(num_classes, activation="softmax", name="head", dtype="float32")(x)
    return tf.keras.Model(inputs, outputs, name=f"{backbone}_transfer")


def backbone_of(model):
    """The backbone layer of a model from :func:`build_model` (or :func:`inference_model`): the one
    nested model in it."""
    import tensorflow as tf

    return next(layer for layer in model.layers if isinstance(layer, tf.keras.Model))


def compile_distributed(model, learning_rate: float, fp16_allreduce: bool = False) -> None:
    """Compile for Horovod data-parallel training: ``Nadam(learning_rate)`` wrapped in
    ``hvd.DistributedOptimizer`` (gradients averaged over ranks by allreduce; with
    ``fp16_allreduce``, ``hvd.Compression.fp16``: float32 gradients cast to float16 for the
    allreduce, half the bytes, and back), sparse categorical cross-entropy on int32 labels,
    accuracy. ``learning_rate`` is already scaled by the world size
    (:func:`pipelines.training.schedule.scaled_lr`). Under a ``mixed_float16`` global policy Keras
    wraps the optimizer in its ``LossScaleOptimizer`` itself. Needs ``hvd.init()`` first."""
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Nadam(learning_rate=learning_rate),
                                         compression=compression)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def inference_model(model, stored_size: int):
    """The trained ``model`` behind its input contract: the ETL's image, uint8 RGB ``(stored_size,
    stored_size, 3)`` with values 0-255, preprocessed inside the graph exactly as training's
    input pipeline does (:func:`pipelines.training.data.preprocessor`): ``Resizing`` (bilinear) to
    the model's size when it differs, then ``Rescaling(1/127.5, offset=-1)``, which is Xception's
    ``preprocess_input`` (every backbone here takes [-1, 1]). The trained layers (the backbone,
    ``dropout``, ``head``) are the same objects, not copies, and keep their names."""
    import tensorflow as tf

    size = model.input_shape[1]
    image = tf.keras.Input((stored_size, stored_size, 3), dtype="uint8", name="image")
    x = tf.keras.layers.Rescaling(1.0, name="to_float")(image)  # uint8 -> float32, values unchanged
    if size != stored_size:
        x = tf.keras.layers.Resizing(size, size, interpolation="bilinear", name="resize")(x)
    x = tf.keras.layers.Rescaling(1 / 127.5, offset=-1.0, name="xception_preprocess")(x)
    backbone = backbone_of(model)
    for layer in model.layers[1:]:  # the trained model is a chain: input, backbone, dropout, head
        x = layer(x, training=False) if layer is backbone else layer(x)
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
        import hashlib

        with open(path, "rb") as f:  # predict loads model.keras only when its bytes have this hash
            digest = hashlib.sha256(f.read()).hexdigest()
        write_json(os.path.join(os.path.dirname(path), "model.json"),
                   {**input_contract(stored_size or size, size, class_names), "model_sha256": digest})
    return exported
