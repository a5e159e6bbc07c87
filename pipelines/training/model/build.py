"""The model: a frozen backbone (Keras Xception, ImageNet; or ``tiny`` for quick end-to-end checks) + dropout +
softmax head, built and compiled for Horovod here; checkpoints and export live beside it."""
from __future__ import annotations

import os
from dataclasses import dataclass

from pipelines.contract import MODEL_INPUT_DTYPE, MODEL_INPUT_NAME, PREPROCESS_OFFSET, PREPROCESS_SCALE
from pipelines.runtime.errors import MissingInput, Refused
from pipelines.training.model.checkpoints import build_optimizer, resumable_dropout


@dataclass(frozen=True)
class Backbone:
    """A frozen feature extractor as ``--backbone`` names it; ``min_size`` in px, block ``k`` (1 = nearest the
    input) is ``block_prefix.format(k)``."""

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
    """The ``Backbone`` called ``name``; ``Refused`` (a ``ValueError``) naming the known ones."""
    if name not in BACKBONES:
        raise Refused(f"unknown backbone {name!r}: one of {', '.join(BACKBONES)}")
    return BACKBONES[name]


def check_backbone(name: str, weights: str, input_size: int = 0) -> Backbone:
    """The ``Backbone`` ``name`` if it takes ``weights`` and ``input_size`` px (0 = not known); else ``Refused``."""
    spec = backbone_spec(name)
    if weights != "none" and not spec.pretrained:
        raise Refused(f"backbone {name} has no pretrained weights: use --weights none (got {weights})")
    if input_size and input_size < spec.min_size:
        raise Refused(f"backbone {name} takes images of at least {spec.min_size} px, got {input_size} "
                      f"(--image-size, or the ETL's size)")
    return spec


def _build_backbone(name: str, input_size: int, weights: str):
    """The backbone as a Keras model ``(N, S, S, 3) float32 in [-1, 1] -> (N, feature_dim)``, pooled."""
    from pipelines.stack.kerasapi import keras

    shape = (input_size, input_size, 3)
    if name == "xception":
        base = keras.applications.Xception(include_top=False, pooling="avg", input_shape=shape,
                                              weights="imagenet" if weights == "imagenet" else None)
        if weights not in ("imagenet", "none"):
            base.load_weights(weights)
        return base
    x = image = keras.Input(shape, name="tiny_input")
    for block, filters in ((1, 16), (2, BACKBONES["tiny"].feature_dim)):  # a BatchNormalization, as Xception has
        x = keras.layers.Conv2D(filters, 3, strides=2, activation="relu", name=f"tiny_block{block}_conv")(x)
        x = keras.layers.BatchNormalization(name=f"tiny_block{block}_bn")(x)
    return keras.Model(image, keras.layers.GlobalAveragePooling2D(name="tiny_pool")(x), name="tiny")


def build_model(num_classes: int, input_size: int, dropout: float = 0.5, weights: str = "imagenet",
                seed: int = 0, backbone: str = "xception", stored_size: int = 0):
    """Transfer-learning model: stored uint8 image -> ``preprocessing`` -> frozen backbone -> dropout -> softmax.

    The backbone runs with ``training=False``: batch-norm statistics stay ImageNet's, also when fine-tuned.

    Args:
        input_size: side of the backbone's input, pixels.
        stored_size: side of the stored images the model takes, pixels (0 = ``input_size``).
        weights: ``'imagenet'``, ``'none'`` (random), or a no-top Xception weights file's path.

    Returns:
        an uncompiled model, uint8 ``(batch, stored_size, stored_size, 3)`` -> float32 ``(batch, num_classes)``.

    Raises:
        MissingInput: a weights path that does not exist.
        Refused: as ``check_backbone``."""
    from pipelines.stack.kerasapi import keras

    check_backbone(backbone, weights, input_size)
    if weights not in ("imagenet", "none") and not os.path.isfile(weights):
        raise MissingInput(f"weights file not found: {weights}")
    keras.utils.set_random_seed(seed)
    base = _build_backbone(backbone, input_size, weights)
    base.trainable = False
    stored = stored_size or input_size
    image = keras.Input((stored, stored, 3), dtype=MODEL_INPUT_DTYPE, name=MODEL_INPUT_NAME)
    features = base(preprocessing(image, stored, input_size), training=False)
    x = resumable_dropout(dropout, seed)(features)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="head", dtype="float32")(x)
    return keras.Model(image, outputs, name=f"{backbone}_transfer")


def preprocessing(image, stored_size: int, input_size: int):
    """The model's first layers, float32 on its device: ``Resizing`` to ``input_size`` if needed, ``x / 127.5 - 1``."""
    from pipelines.stack.kerasapi import keras

    x = image
    if input_size != stored_size:
        x = keras.layers.Resizing(input_size, input_size, interpolation="bilinear", name="resize",
                                  dtype="float32")(x)
    return keras.layers.Rescaling(PREPROCESS_SCALE, offset=PREPROCESS_OFFSET, name="xception_preprocess",
                                  dtype="float32")(x)


def feature_extractor(model):
    """The feature cache's part of a ``build_model`` model, image -> pooled features: the same layers, not copies."""
    from pipelines.stack.kerasapi import keras

    return keras.Model(model.input, model.get_layer("dropout").input, name=f"{model.name}_features")


def model_input(model) -> str:
    """What ``model`` takes, as the feature cache keys it (``uint8-299``)."""
    return input_tag(model.inputs[0].dtype.name, model.input_shape[1])


def input_tag(dtype: str, stored_size: int) -> str:
    """What a model takes, as the feature cache keys it: its input's dtype and side (``uint8-299``)."""
    return f"{dtype}-{stored_size}"


def backbone_of(model):
    """The backbone layer of a model from ``build_model``: the one nested model in it."""
    from pipelines.stack.kerasapi import keras

    return next(layer for layer in model.layers if isinstance(layer, keras.Model))


def compile_distributed(model, learning_rate: float, fp16_allreduce: bool = False, xla: bool = False,
                        weight_decay: float = 0.0) -> None:
    """Compile for Horovod: Nadam in ``hvd.DistributedOptimizer``, sparse cross-entropy; needs ``hvd.init()`` first.

    Args:
        learning_rate: already scaled by the world size.
        weight_decay: decoupled; each step also shrinks every weight by ``learning_rate x weight_decay``.

    Raises:
        Keras3Error: ``model`` is not a Keras 2 model (before any step)."""
    import horovod.tensorflow.keras as hvd

    from pipelines.stack.kerasapi import distributed_optimizer, keras

    # Horovod: float16 gradients on the wire with --fp16-allreduce
    compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
    # Horovod: add Horovod's DistributedOptimizer: each step's gradients averaged over the ranks by allreduce
    optimizer = distributed_optimizer(keras.optimizers.Nadam(learning_rate=learning_rate,
                                                                weight_decay=weight_decay or None), model=model,
                                      compression=compression)
    # The metric as an object and the optimizer built here: every variable of the step exists before
    # fit, which then traces its step once, not twice (a tf.function whose first trace creates
    # variables is traced again; the time saved per rank: docs/benchmarks.md, Figures behind the code's constants).
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    build_optimizer(model)
    if xla:
        model.train_step = xla_train_step(model)
    else:
        vars(model).pop("train_step", None)  # Keras' own again, should a model be recompiled without


def xla_train_step(model):
    """Keras' ``train_step`` with the forward (and backward) pass one XLA computation (``HorovodAllreduce`` has
    no XLA kernel, so not ``jit_compile=True``)."""
    import tensorflow as tf

    from pipelines.stack.kerasapi import keras

    forward = tf.function(lambda images: model(images, training=True), jit_compile=True, reduce_retracing=True)

    def train_step(data):
        # sample weights: a rank's rows on another world than the run's data world (training/dataworld.py)
        images, labels, weights = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            probabilities = forward(images)
            loss = model.compute_loss(images, labels, probabilities, weights)
        model.optimizer.minimize(loss, model.trainable_variables, tape=tape)
        return model.compute_metrics(images, labels, probabilities, weights)

    train_step.forward = forward  # type: ignore[attr-defined]  # for the tests: its compiler IR is XLA's
    return train_step


def build_head(num_classes: int, dropout: float, seed: int, feature_dim: int):
    """The trainable part alone for the feature cache, with ``build_model``'s layer names so weights carry over."""
    from pipelines.stack.kerasapi import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((feature_dim,), name="features")
    x = resumable_dropout(dropout, seed)(inputs)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="head", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="head_on_features")
