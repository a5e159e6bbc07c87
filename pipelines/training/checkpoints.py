"""Small checkpoints: what training changes, with the frozen weights identified by their hash.

A checkpoint of epoch N (``checkpoint-N.npz``) holds the model's trainable weights and the
optimizer's state (its variables, and Nadam's running ``u_product``), not the frozen backbone:
the frozen Xception is 84 MB, the head and its optimizer state a few KB. The frozen weights are
identified instead by :func:`frozen_checksum` (sha256 of their bytes), recorded in the checkpoint's
marker and checked on ``--resume``: a checkpoint is only meaningful on top of the same backbone.
"""
from __future__ import annotations

import hashlib
import os
from typing import List

import numpy as np

from pipelines.logs import plural

FORMAT = "trainable+optimizer npz v1"


def frozen_checksum(model) -> str:
    """sha256 of the bytes of ``model``'s non-trainable weights (for the job's model: the frozen
    backbone and its batch-norm statistics), in order."""
    digest = hashlib.sha256()
    for variable in model.non_trainable_weights:
        digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
    return digest.hexdigest()


def optimizer_state(optimizer) -> List:
    """The optimizer's state variables (built), in a fixed order: ``variables`` then Nadam's
    ``_u_product`` (a plain ``tf.Variable`` that ``variables`` leaves out)."""
    state = list(optimizer.variables)
    if getattr(optimizer, "_u_product", None) is not None:
        state.append(optimizer._u_product)
    return state


def optimizer_checksum(optimizer) -> str:
    """sha256 of the bytes of :func:`optimizer_state`'s arrays, in order: equal checksums mean the
    same optimisation state (iteration count, Nadam's moments and ``u_product``)."""
    digest = hashlib.sha256()
    for variable in optimizer_state(optimizer):
        digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
    return digest.hexdigest()


def build_optimizer(model) -> None:
    """Create the optimizer's slot variables now (Keras creates them at the first step), so that a
    resume can assign them before ``fit``."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not getattr(optimizer, "_built", False):
        optimizer.build(model.trainable_variables)


def save_checkpoint(model, path: str) -> int:
    """Write ``model``'s trainable weights and (when compiled) its optimizer state to ``path``
    (``.npz``) atomically. Returns the file's size in bytes."""
    from pipelines.atomic import replacing

    arrays = {f"trainable_{i:04d}": v.numpy() for i, v in enumerate(model.trainable_weights)}
    if getattr(model, "optimizer", None) is not None:
        build_optimizer(model)
        arrays.update({f"optimizer_{i:04d}": v.numpy() for i, v in enumerate(optimizer_state(model.optimizer))})
    with replacing(path, suffix=".npz") as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
    return os.path.getsize(path)


def load_checkpoint(model, path: str, optimizer: bool = True) -> None:
    """Assign a checkpoint's trainable weights to ``model`` and, with ``optimizer`` and a compiled
    model, its optimizer state.

    Raises:
        ValueError: the checkpoint does not fit the model (other layers or optimizer).
    """
    with np.load(path) as data:
        trainable = [data[k] for k in sorted(k for k in data.files if k.startswith("trainable_"))]
        state = [data[k] for k in sorted(k for k in data.files if k.startswith("optimizer_"))]
    targets = model.trainable_weights
    if len(trainable) != len(targets) or any(a.shape != tuple(v.shape) for a, v in zip(trainable, targets)):
        raise ValueError(f"checkpoint {path} does not fit this model's trainable weights")
    for variable, value in zip(targets, trainable):
        variable.assign(value)
    if optimizer and getattr(model, "optimizer", None) is not None and state:
        build_optimizer(model)
        variables = optimizer_state(model.optimizer)
        if len(variables) != len(state):
            raise ValueError(f"checkpoint {path} holds {plural(len(state), 'optimizer variable')}, "
                             f"this optimizer has {len(variables)}")
        for variable, value in zip(variables, state):
            variable.assign(value)
