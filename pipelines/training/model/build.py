"""The model: a frozen backbone + dropout + softmax head; the backbone is Keras Xception (ImageNet),
as in the article, or a tiny one for checking a pipeline or a cluster end to end in seconds.

Here it is built (:func:`build_model`; the head alone on cached features: :func:`build_head`) and
compiled for Horovod (:func:`compile_distributed`); what its checkpoints hold is
:mod:`pipelines.training.model.checkpoints`, its export for inference
:mod:`pipelines.training.model.export`."""
from __future__ import annotations

import os
from dataclasses import dataclass

from pipelines.contract import MODEL_INPUT_DTYPE, MODEL_INPUT_NAME, PREPROCESS_OFFSET, PREPROCESS_SCALE
from pipelines.runtime.errors import MissingInput, Refused
from pipelines.training.model.checkpoints import build_optimizer, resumable_dropout


@dataclass(frozen=True)
class Backbone:
    """A frozen feature extractor: its layer ``name`` inside the model, the smallest input side it
    takes (``min_size`` px), the length of its pooled feature vector (``feature_dim``), whether
    pretrained weights exist for it (``pretrained``: ``--weights imagenet`` or a weights file), and
    its ``blocks`` for ``--fine-tune-blocks``: block ``k`` (1 = nearest the input) is named by
    ``block_prefix.format(k)`` (:mod:`pipelines.training.model.finetune`)."""

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
        raise Refused(f"unknown backbone {name!r}: one of {', '.join(BACKBONES)}")
    return BACKBONES[name]


def check_backbone(name: str, weights: str, input_size: int = 0) -> Backbone:
    """Refuse a backbone that cannot take these ``weights`` or this input side (``input_size`` px;
    0 = not known yet). Raises ``ValueError`` with the reason; returns the :class:`Backbone`."""
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
    """Transfer-learning model on a frozen backbone (:data:`BACKBONES`), taking the ETL's image.

    ``Input (stored_size, stored_size, 3) uint8`` (:data:`pipelines.contract.MODEL_INPUT_DTYPE`: the
    stored image as it is) -> :func:`preprocessing` on the model's device, in float32 (``Resizing``
    to ``input_size`` when it differs, then ``x / 127.5 - 1``) -> the backbone (for ``xception``:
    ``Xception(include_top=False, pooling='avg')``), frozen and called with ``training=False`` (its
    batch-norm statistics stay ImageNet's, also when ``--fine-tune-blocks`` later unfreezes some of
    its layers) -> ``Dropout(dropout)`` -> ``Dense(num_classes, softmax)``, the head computing in
    float32 whatever the global dtype policy (under ``mixed_float16`` the softmax stays float32).
    The same model is trained, evaluated, cached from (:func:`feature_extractor`) and exported
    (:func:`pipelines.training.model.export.export_model`): nothing outside it preprocesses.

    Args:
        input_size: side of the backbone's input, pixels (``--image-size``, or the stored size).
        stored_size: side of the stored images the model takes, pixels (0 = ``input_size``).
        weights: ``'imagenet'`` (Keras downloads them: needs internet), ``'none'`` (random), or the
            path of a no-top Xception weights file (e.g. from ``python -m pipelines.tools.weights``).
        backbone: a name in :data:`BACKBONES`; the backbone's layer in the model has that name.

    Returns:
        an uncompiled ``tf.keras.Model`` from uint8 ``(batch, stored_size, stored_size, 3)`` to
        float32 ``(batch, num_classes)``.

    Raises:
        FileNotFoundError: a weights path that does not exist.
        ValueError: as :func:`check_backbone`.
    """
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
    """The model's first layers, on the uint8 image ``(batch, s, s, 3)``: ``Resizing`` to
    ``input_size`` (bilinear, half-pixel centres) when it differs from ``stored_size``, then
    ``Rescaling`` by :data:`pipelines.contract.PREPROCESS_SCALE` and
    :data:`~pipelines.contract.PREPROCESS_OFFSET` (Xception's ``preprocess_input``: ``x / 127.5 - 1``,
    in [-1, 1]). Both cast uint8 to float32 themselves and compute in float32 whatever the global
    policy (under ``mixed_float16`` the backbone's first layer casts to float16 after them).
    They run where the model runs: on a GPU, a 299 px image crosses PCIe as its 268,203 uint8
    bytes, not as 1,072,812 bytes of float32. No weights: checkpoints are unchanged by them."""
    from pipelines.stack.kerasapi import keras

    x = image
    if input_size != stored_size:
        x = keras.layers.Resizing(input_size, input_size, interpolation="bilinear", name="resize",
                                  dtype="float32")(x)
    return keras.layers.Rescaling(PREPROCESS_SCALE, offset=PREPROCESS_OFFSET, name="xception_preprocess",
                                  dtype="float32")(x)


def feature_extractor(model):
    """The part of a model from :func:`build_model` that the feature cache runs once: uint8 image ->
    :func:`preprocessing` -> backbone -> pooled features ``(batch, feature_dim)`` (the dropout's
    input), the same layers, not copies."""
    from pipelines.stack.kerasapi import keras

    return keras.Model(model.input, model.get_layer("dropout").input, name=f"{model.name}_features")


def model_input(model) -> str:
    """What ``model`` takes, as the feature cache keys it: its input's dtype and side,
    ``uint8-299`` for a model from :func:`build_model` on 299 px stored images."""
    return input_tag(model.inputs[0].dtype.name, model.input_shape[1])


def input_tag(dtype: str, stored_size: int) -> str:
    """What a model takes, as the feature cache keys it
    (:func:`pipelines.training.data.features.model_key`): its input's dtype and side (``uint8-299``)."""
    return f"{dtype}-{stored_size}"


def backbone_of(model):
    """The backbone layer of a model from :func:`build_model`: the one nested model in it."""
    from pipelines.stack.kerasapi import keras

    return next(layer for layer in model.layers if isinstance(layer, keras.Model))


def compile_distributed(model, learning_rate: float, fp16_allreduce: bool = False, xla: bool = False,
                        weight_decay: float = 0.0) -> None:
    """Compile for Horovod data-parallel training: ``Nadam(learning_rate)`` (with ``weight_decay`` > 0,
    its decoupled weight decay: each step also shrinks every weight by ``learning_rate x weight_decay``) wrapped in
    ``hvd.DistributedOptimizer`` (gradients averaged over ranks by allreduce; with
    ``fp16_allreduce``, ``hvd.Compression.fp16``: float32 gradients cast to float16 for the
    allreduce, half the bytes, and back), sparse categorical cross-entropy on int32 labels,
    accuracy; the optimizer's variables are made now (:func:`pipelines.training.model.checkpoints.build_optimizer`).
    ``learning_rate`` is already scaled by the world size
    (:func:`pipelines.training.schedule.scaled_lr`). Under a ``mixed_float16`` global policy Keras
    wraps the optimizer in its ``LossScaleOptimizer`` itself. With ``xla`` (``--xla on``), the
    forward and backward pass are compiled by XLA (:func:`xla_train_step`). Needs ``hvd.init()`` first.

    Raises:
        pipelines.stack.kerasapi.Keras3Error: ``model`` is not a Keras 2 model (before any step)."""
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
    """Keras' ``train_step`` for ``model`` with its forward pass (and so its backward pass: the
    gradient of a ``jit_compile`` function is compiled too) one XLA computation,
    ``tf.function(jit_compile=True)``; the loss, Horovod's allreduce inside ``optimizer.minimize``
    (and Keras' loss scaling under mixed precision) and the update stay TensorFlow ops.

    Why not ``model.compile(jit_compile=True)``: that compiles the whole step, allreduce included,
    and ``HorovodAllreduce`` has no XLA kernel but on a GPU build of Horovod with
    ``HOROVOD_ENABLE_XLA_OPS=1`` (Horovod's ``xla_mpi_ops.cc``); elsewhere the first step fails
    ("tf2xla conversion failed", measured with Horovod 0.28.1 on the CPU, np 1). Horovod's XLA
    guide names this split (XLA for the model, Horovod's ops left to TensorFlow) as the one that
    works without its XLA ops."""
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
    """The trainable part alone: ``Input(feature_dim) -> Dropout -> Dense(num_classes, softmax)``
    (2048 features for Xception), with the same layer names as in
    :func:`build_model` so weights carry over (the feature cache's model,
    :class:`pipelines.training.inputs.FeatureInputs`)."""
    from pipelines.stack.kerasapi import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((feature_dim,), name="features")
    x = resumable_dropout(dropout, seed)(inputs)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="head", dtype="float32")(x)
    return keras.Model(inputs, outputs, name="head_on_features")
