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


def export_model(model, path: str) -> None:
    """Save the model for inference (architecture + weights, no optimizer: Horovod's wrapped
    optimizer is not serialisable), atomically."""
    import tensorflow as tf

    from pipelines.atomic import replacing

    clean = tf.keras.models.clone_model(model)
    clean.set_weights(model.get_weights())
    with replacing(path, suffix=".keras") as tmp:
        clean.save(tmp)
