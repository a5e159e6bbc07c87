"""The fine-tuning phase (``--fine-tune-blocks N``): unfreeze the backbone's top N blocks at a lowered rate.

Batch norms stay in inference mode; the model is recompiled (``trainable`` acts at compile); phase 2 reads images."""
from __future__ import annotations

from typing import List, Sequence

from pipelines.backbones import backbone_spec
from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural
from pipelines.training.model.build import backbone_of

#: The Keras guide's fine-tuning rate over its head-training rate: Adam(1e-5) after Adam() (1e-3).
KERAS_GUIDE_LR_FACTOR = 0.01


def check_fine_tune(backbone, blocks: int, lr_factor: float, epochs: int = 0) -> None:
    """Refuse ``--fine-tune-blocks``/``--fine-tune-lr``/``--fine-tune-epochs`` values that cannot apply to ``backbone``.

    Raises:
        Refused: ``blocks`` not in ``0..backbone.blocks``, ``lr_factor`` not in (0, 1], ``epochs`` below 0."""
    if not 0 <= blocks <= backbone.blocks:
        raise Refused(f"--fine-tune-blocks must be in 0..{backbone.blocks} for backbone {backbone.name} "
                      f"(it has {plural(backbone.blocks, 'block')}), got {blocks}")
    if not 0 < lr_factor <= 1:
        raise Refused(f"--fine-tune-lr is the factor that lowers phase 1's learning rate: it must be in "
                      f"(0, 1], got {lr_factor}")
    if epochs < 0:
        raise Refused(f"--fine-tune-epochs must be >= 0, got {epochs}")


def block_layers(layer_names: Sequence[str], backbone, blocks: int) -> List[str]:
    """The layers the top ``blocks`` blocks cover, from that block's first on; ValueError as ``check_fine_tune``."""
    check_fine_tune(backbone, blocks, 1.0)
    if blocks == 0:
        return []
    prefix = backbone.top_blocks_prefix(blocks)
    first = next((i for i, name in enumerate(layer_names) if name.startswith(prefix)), None)
    if first is None:
        raise ValueError(f"backbone {backbone.name} has no layer named {prefix}*")
    return list(layer_names[first:])


def phase2_lr(phase1_lr: float, factor: float) -> float:
    """Phase 2's learning rate: ``factor x phase1_lr`` (phase 1's is ``base_lr x world size``)."""
    return phase1_lr * factor


def unfreeze(model, backbone_name: str, blocks: int) -> List[str]:
    """Make the top ``blocks`` blocks of the backbone trainable, the rest not; the unfrozen layers with weights."""
    base = backbone_of(model)
    names = set(block_layers([layer.name for layer in base.layers], backbone_spec(backbone_name), blocks))
    base.trainable = True  # a nested model's flag gates its layers' own
    for layer in base.layers:
        layer.trainable = layer.name in names
    return [layer.name for layer in base.layers if layer.name in names and layer.weights]


def allreduce_bytes(trainable_parameters: int, fp16: bool) -> int:
    """Bytes one rank allreduces per step: 4 per trainable parameter, 2 with ``hvd.Compression.fp16``."""
    return trainable_parameters * (2 if fp16 else 4)


def trainable_parameters(model) -> int:
    """Number of trainable scalars of ``model``."""
    return int(sum(v.shape.num_elements() for v in model.trainable_weights))
