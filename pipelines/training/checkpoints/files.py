"""Small checkpoints (``checkpoint-N[-step-K].npz``): everything but the frozen backbone (only its checksum)."""
from __future__ import annotations

import hashlib
import os
from typing import Dict, List, Optional

import numpy as np

from pipelines.io.atomic import replacing_file
from pipelines.runtime.logs import plural
from pipelines.training.divergence import non_finite_arrays

FORMAT = "trainable+optimizer npz v1"


def frozen_checksum(model) -> str:
    """sha256 of the bytes of ``model``'s non-trainable weights (backbone and batch-norm statistics), in order."""
    digest = hashlib.sha256()
    for variable in model.non_trainable_weights:
        digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
    return digest.hexdigest()


def optimizer_state(optimizer) -> List:
    """The optimizer's state in a fixed order: ``variables``, Nadam's ``_u_product``, any dynamic loss scale state."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    state = list(inner.variables)
    if getattr(inner, "_u_product", None) is not None:
        state.append(inner._u_product)
    scale = getattr(optimizer, "_loss_scale", None)  # keras' _DynamicLossScaleState
    if scale is not None and hasattr(scale, "_current_loss_scale"):
        state += [scale._current_loss_scale, scale._counter]
    return state


def optimizer_checksum(optimizer) -> str:
    """sha256 of ``optimizer_state``'s bytes in order: equal checksums mean the same optimisation state."""
    digest = hashlib.sha256()
    for variable in optimizer_state(optimizer):
        digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
    return digest.hexdigest()


def build_optimizer(model) -> None:
    """Create the optimizer's slot variables now (Keras would at the first step), so a resume can assign them."""
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer builds its inner one
    if optimizer is not None and not getattr(inner, "_built", False):
        optimizer.build(model.trainable_variables)


def resumable_dropout(rate: float, seed: int):
    """The head's ``Dropout(rate)`` (``dropout``), masks from a seeded generator whose state checkpoints save."""
    from pipelines.stack.kerasapi import keras

    return keras.layers.Dropout(rate, seed=seed, rng_type="stateful", name="dropout")


def random_generators(model) -> List:
    """The ``tf.random.Generator`` s of ``model``'s layers, in layer order; a checkpoint saves their ``state``."""
    found = []
    for layer in model.submodules:
        generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
        if generator is not None and hasattr(generator, "state"):
            found.append(generator)
    return found


def learning_rate_variable(optimizer):
    """The learning rate variable Horovod's warmup assigns (its last value stays: a resume restores it), or None."""
    import tensorflow as tf

    inner = getattr(optimizer, "inner_optimizer", optimizer)
    variable = getattr(inner, "_learning_rate", None)
    return variable if isinstance(variable, tf.Variable) else None


def broadcast_state(model) -> List:
    """What a resume sends from rank 0: all of ``model``'s variables and ``checkpoint_variables``' others, each once."""
    found, seen = [], set()
    for variable in [*model.variables, *checkpoint_variables(model).values()]:
        if id(variable) not in seen:
            seen.add(id(variable))
            found.append(variable)
    return found


def checkpoint_variables(model) -> Dict:
    """A checkpoint's ``.npz`` key -> variable: ``trainable_``, ``optimizer_``, ``rng_NNNN``, ``learning_rate``."""
    variables = {f"trainable_{i:04d}": v for i, v in enumerate(model.trainable_weights)}
    if getattr(model, "optimizer", None) is not None:
        build_optimizer(model)
        variables.update({f"optimizer_{i:04d}": v for i, v in enumerate(optimizer_state(model.optimizer))})
    variables.update({f"rng_{i:04d}": g.state for i, g in enumerate(random_generators(model))})
    rate = learning_rate_variable(getattr(model, "optimizer", None))
    if rate is not None:
        variables["learning_rate"] = rate
    return variables


class DamagedCheckpoint(ValueError):
    """A checkpoint file that is missing, not of its marker's size or sha256, or not a readable ``.npz``."""




def read_checkpoint(location, size: Optional[int] = None, sha256: Optional[str] = None) -> Dict[str, np.ndarray]:
    """The arrays of a checkpoint at ``location`` by key, checked against the marker's ``size`` and ``sha256``.

    Raises:
        DamagedCheckpoint: missing, another size or sha256, or not an ``.npz`` of arrays."""
    import io
    import zipfile

    try:
        data = location.read_bytes()
    except FileNotFoundError:
        raise DamagedCheckpoint("missing") from None
    except OSError as exc:
        raise DamagedCheckpoint(f"unreadable ({exc.strerror or exc})") from None
    if size is not None and len(data) != size:
        raise DamagedCheckpoint(f"{plural(len(data), 'byte')}, its marker records {size}")
    if sha256 and hashlib.sha256(data).hexdigest() != sha256:
        raise DamagedCheckpoint("its bytes are not those its marker's sha256 records")
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("a single array, not an .npz")
        with loaded:
            return {key: loaded[key] for key in sorted(loaded.files)}
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise DamagedCheckpoint(f"not a readable .npz ({type(exc).__name__}: {exc})") from None


def non_finite_checkpoint(location) -> List[str]:
    """The keys of a checkpoint's arrays holding NaN or +-inf; ``[]`` when finite or unreadable (judged elsewhere)."""
    try:
        arrays = read_checkpoint(location)
    except DamagedCheckpoint:
        return []
    return non_finite_arrays(arrays)


def save_checkpoint(model, path: str) -> int:
    """Write ``checkpoint_variables(model)`` to ``path`` (``.npz``) atomically; returns its size in bytes."""
    arrays = {key: variable.numpy() for key, variable in checkpoint_variables(model).items()}
    with replacing_file(path) as f:  # owner-only: run state
        np.savez(f, **arrays)
    return os.path.getsize(path)


def load_checkpoint(model, path: str, optimizer: bool = True) -> None:
    """Assign a checkpoint's trainable weights and, with ``optimizer`` and a compiled model, the rest.

    Raises:
        ValueError: the checkpoint does not fit the model, or cannot be read (``DamagedCheckpoint``)."""
    from pipelines.io.storage import resolve

    try:
        data = read_checkpoint(resolve(path))
    except DamagedCheckpoint as exc:
        raise DamagedCheckpoint(f"checkpoint {path}: {exc}") from None
    trainable = [data[k] for k in sorted(k for k in data if k.startswith("trainable_"))]
    state = [data[k] for k in sorted(k for k in data if k.startswith("optimizer_"))]
    rng = [data[k] for k in sorted(k for k in data if k.startswith("rng_"))]
    rate = data.get("learning_rate")
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
    rate_variable = learning_rate_variable(getattr(model, "optimizer", None))
    if optimizer and rate is not None and rate_variable is not None:
        rate_variable.assign(rate)
    generators = random_generators(model)
    if optimizer and rng and len(rng) == len(generators):  # a checkpoint of before this format has none
        for generator, value in zip(generators, rng):
            generator.state.assign(value)
