"""The model: a frozen backbone (a ``pipelines.backbones`` row: Keras Xception by default) + dropout + softmax head,
built and compiled for Horovod here; checkpoints and export live beside it."""
from __future__ import annotations

import os

from pipelines.backbones import DEFAULT_BACKBONE, Backbone, backbone_spec
from pipelines.contract import MODEL_INPUT_DTYPE, MODEL_INPUT_NAME
from pipelines.runtime.errors import MissingInput, Refused
from pipelines.training.checkpoints.files import build_optimizer, resumable_dropout


def check_backbone(name: str, weights: str, input_size: int = 0) -> Backbone:
    """The ``Backbone`` ``name`` if it takes ``weights`` and ``input_size`` px (0 = not known); else ``Refused``."""
    spec = backbone_spec(name)
    if weights != "none" and not spec.pretrained:
        raise Refused(f"backbone {name} has no pretrained weights: use --weights none (got {weights})")
    if input_size and input_size < spec.min_size:
        raise Refused(f"backbone {name} takes images of at least {spec.min_size} px, got {input_size} "
                      f"(--image-size, or the ETL's size)")
    return spec


def build_model(num_classes: int, input_size: int, dropout: float = 0.5, weights: str = "imagenet",
                seed: int = 0, backbone: str = DEFAULT_BACKBONE, stored_size: int = 0):
    """Transfer-learning model: stored uint8 image -> ``preprocessing`` -> frozen backbone -> dropout -> softmax.

    The backbone runs with ``training=False``: batch-norm statistics stay ImageNet's, also when fine-tuned.

    Args:
        input_size: side of the backbone's input, pixels.
        stored_size: side of the stored images the model takes, pixels (0 = ``input_size``).
        weights: ``'imagenet'``, ``'none'`` (random), or the path of the backbone's no-top weights file.

    Returns:
        an uncompiled model, uint8 ``(batch, stored_size, stored_size, 3)`` -> float32 ``(batch, num_classes)``.

    Raises:
        MissingInput: a weights path that does not exist.
        Refused: as ``check_backbone``."""
    from pipelines.stack.kerasapi import keras

    spec = check_backbone(backbone, weights, input_size)
    if weights not in ("imagenet", "none") and not os.path.isfile(weights):
        raise MissingInput(f"weights file not found: {weights}")
    keras.utils.set_random_seed(seed)
    base = spec.build(input_size, weights)
    base.trainable = False
    stored = stored_size or input_size
    image = keras.Input((stored, stored, 3), dtype=MODEL_INPUT_DTYPE, name=MODEL_INPUT_NAME)
    features = base(preprocessing(image, stored, input_size, spec), training=False)
    x = resumable_dropout(dropout, seed)(features)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="head", dtype="float32")(x)
    return keras.Model(image, outputs, name=f"{backbone}_transfer")


def preprocessing(image, stored_size: int, input_size: int, backbone: Backbone):
    """The model's first layers, float32 on its device: ``Resizing`` to ``input_size`` if needed, then
    ``backbone``'s ``x * scale + offset``."""
    from pipelines.stack.kerasapi import keras

    x = image
    if input_size != stored_size:
        x = keras.layers.Resizing(input_size, input_size, interpolation="bilinear", name="resize",
                                  dtype="float32")(x)
    return keras.layers.Rescaling(backbone.scale, offset=backbone.offset, name=f"{backbone.name}_preprocess",
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
