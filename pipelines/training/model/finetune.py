"""The fine-tuning phase (``--fine-tune-blocks N``): after the head has converged on the frozen
backbone, unfreeze the backbone's top N blocks and train on with a lowered learning rate.

This is the recipe of the Keras transfer-learning guide (https://keras.io/guides/transfer_learning/,
"Fine-tuning" and "An end-to-end example"): first train only the new head on the frozen base
model until it converges (phase 1: the job's own early stopping, on images or on the feature
cache); then unfreeze (part of) the base model, *keep its BatchNormalization layers in inference
mode* (the base model is called with ``training=False``, :func:`pipelines.training.model.build.build_model`,
so their moving mean and variance stay the pretrained ones while their gamma and beta train),
*recompile* (a change of ``trainable`` takes effect at compile) and train end to end with a very
low learning rate. The guide goes from Adam's 1e-3 to 1e-5: the factor 0.01 that is
``--fine-tune-lr``'s default (phase 2's rate = factor x phase 1's, ``base_lr x world size``).

Phase 2 runs the job's own machinery (:func:`pipelines.training.train.fine_tune`, beside phase 1's
``head_phase``; this module is the phase's pure knowledge, so the config can import it without
importing the job back): the same
``hvd.DistributedOptimizer`` (a new Nadam, with ``--fp16-allreduce`` the same compression),
callbacks (no warmup: it belongs to phase 1), early stopping by the same rule continuing from phase 1's
best value of its monitor (so phase 1's best weights are kept when fine-tuning never beats them), rank-0
checkpoints (the marker records ``phase: 2`` and phase 1's outcome) and the exact evaluation.
It always reads images: the cached features of ``--feature-cache`` are the frozen backbone's
outputs, which fine-tuning changes. Epochs are numbered on from phase 1's.

Which layers N blocks cover: the backbone's layers from the first one named
``Backbone.block_prefix.format(15 - N)`` (Xception, 14 blocks: ``block14_`` for N = 1, ``block13_``
for N = 2, ...) to its end, in the backbone's layer order, so a block's unnamed layers come with it
(Xception's residual ``conv2d_3``/``batch_normalization_3`` and ``add_11`` are block 13's).
N = 1 is ``block14_sepconv1``/``_bn`` and ``block14_sepconv2``/``_bn``: 4,748,800 trainable
parameters (the batch norms' moving statistics, 7,168 more, are not), against the head's
2048 x classes + classes; N = 14 is the whole backbone. ``tiny`` has 2 blocks (``tiny_block1_conv``,
``tiny_block1_bn``; ``tiny_block2_...``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural
from pipelines.training.model.build import backbone_of, backbone_spec

if TYPE_CHECKING:
    from pipelines.training.evaluate import Totals
    from pipelines.training.resume import Resume

#: The Keras guide's fine-tuning rate over its head-training rate: Adam(1e-5) after Adam() (1e-3).
KERAS_GUIDE_LR_FACTOR = 0.01


def check_fine_tune(backbone, blocks: int, lr_factor: float, epochs: int = 0) -> None:
    """Refuse ``--fine-tune-blocks``/``--fine-tune-lr``/``--fine-tune-epochs`` values that cannot
    apply to ``backbone`` (a :class:`pipelines.training.model.build.Backbone`).

    Raises:
        ValueError: ``blocks`` below 0 or above the backbone's block count, ``lr_factor`` not in
            (0, 1] (phase 2's rate is phase 1's *lowered*), ``epochs`` below 0.
    """
    if not 0 <= blocks <= backbone.blocks:
        raise Refused(f"--fine-tune-blocks must be in 0..{backbone.blocks} for backbone {backbone.name} "
                      f"(it has {plural(backbone.blocks, 'block')}), got {blocks}")
    if not 0 < lr_factor <= 1:
        raise Refused(f"--fine-tune-lr is the factor that lowers phase 1's learning rate: it must be in "
                      f"(0, 1], got {lr_factor}")
    if epochs < 0:
        raise Refused(f"--fine-tune-epochs must be >= 0, got {epochs}")


def block_layers(layer_names: Sequence[str], backbone, blocks: int) -> List[str]:
    """Names of the layers that ``blocks`` top blocks of ``backbone`` cover: from the first layer of
    block ``backbone.blocks - blocks + 1`` (by ``backbone.block_prefix``) to the last of
    ``layer_names`` (the backbone's layers in order). ``blocks`` 0 gives ``[]``.

    Raises:
        ValueError: as :func:`check_fine_tune`, or no layer of that block in ``layer_names``.
    """
    check_fine_tune(backbone, blocks, 1.0)
    if blocks == 0:
        return []
    prefix = backbone.block_prefix.format(backbone.blocks - blocks + 1)
    first = next((i for i, name in enumerate(layer_names) if name.startswith(prefix)), None)
    if first is None:
        raise ValueError(f"backbone {backbone.name} has no layer named {prefix}*")
    return list(layer_names[first:])


def phase2_lr(phase1_lr: float, factor: float) -> float:
    """Phase 2's learning rate: ``factor x phase1_lr`` (phase 1's is ``base_lr x world size``)."""
    return phase1_lr * factor


def unfreeze(model, backbone_name: str, blocks: int) -> List[str]:
    """Make the top ``blocks`` blocks of ``model``'s backbone trainable (:func:`block_layers`) and
    every other backbone layer not. The model must be (re)compiled afterwards. Returns the names of
    the unfrozen layers that hold weights."""
    base = backbone_of(model)
    names = set(block_layers([layer.name for layer in base.layers], backbone_spec(backbone_name), blocks))
    base.trainable = True  # a nested model's flag gates its layers' own
    for layer in base.layers:
        layer.trainable = layer.name in names
    return [layer.name for layer in base.layers if layer.name in names and layer.weights]


def allreduce_bytes(trainable_parameters: int, fp16: bool) -> int:
    """Bytes one rank allreduces per step: one gradient per trainable parameter, float32 (4 bytes)
    or float16 with ``hvd.Compression.fp16`` (2 bytes)."""
    return trainable_parameters * (2 if fp16 else 4)


def trainable_parameters(model) -> int:
    """Number of trainable scalars of ``model``."""
    return int(sum(v.shape.num_elements() for v in model.trainable_weights))


@dataclass
class Phase:
    """One phase's outcome, as the job reports it: its ``inputs`` (the input path object), the
    early-stopping callback, the epochs every rank ran in it, the seconds in ``fit`` and the exact
    totals it ended with (test; validation for phase 1 of a fine-tuning run)."""

    inputs: Any  # the phase's input path
    early_stopping: Any  # callbacks.BestWeightsEarlyStopping
    epochs_run: int
    fit_seconds: float
    totals: Totals
    resume: Optional[Resume] = None  # where the phase started
    report: Optional[Dict] = None  # phase 2: what report["fine_tune"] holds


def phase1_record(phase: Phase, resume) -> Dict:
    """What phase 2's checkpoint markers and the report keep of phase 1: its epochs, best epoch, the
    metric its early stopping watched (``monitor``) and its best value (``best``), and the exact validation metrics of the model it ended with (from the
    marker when phase 1 ran in an earlier process). No test figure: the test split is read once,
    after phase 2."""
    if resume.phase == 2:
        return dict(resume.marker["phase1"])
    es = phase.early_stopping
    best = float(es.best) if es.model is not None else resume.marker["early_stopping"]["best"]
    totals = phase.totals
    return {"epochs": resume.initial_epoch + phase.epochs_run, "best_epoch": int(es.best_epoch) + 1,
            "monitor": es.monitor, "best": best, "input_path": phase.inputs.name,
            "validation": {"loss": totals.loss, "accuracy": totals.accuracy, "count": totals.count}}
