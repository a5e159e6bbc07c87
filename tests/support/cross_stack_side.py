"""What one stack makes and what it makes of the other stack's, for tests/e2e/test_cross_stack.py.

The test runs :func:`make` and :func:`read` in its own interpreter and, on the other stack, this
module once: ``python -m tests.support.cross_stack_side MINE THEIRS RESULT.json`` makes ``THEIRS`` and
writes what it reads of ``MINE``. The artefacts are tiny: the ``tiny`` backbone on 8 px images.
"""
import json
import os
import sys

import numpy as np

NAMES = ["a", "b"]
SIZE = 8
CHECKPOINT = "checkpoint-1.npz"


def batch():
    """A fixed batch: uint8 ``(4, 8, 8, 3)`` images and int labels ``(4,)``."""
    images = (np.arange(4 * SIZE * SIZE * 3) % 251).astype("uint8").reshape(4, SIZE, SIZE, 3)
    return images, np.array([0, 1, 0, 1])


def compiled_model():
    """The job's model on the tiny backbone (random weights, seed 1), compiled with Nadam."""
    from pipelines.stack.kerasapi import keras
    from pipelines.training.model.build import build_model

    model = build_model(len(NAMES), SIZE, dropout=0.0, weights="none", seed=1, backbone="tiny")
    model.compile(optimizer=keras.optimizers.Nadam(0.01), loss="sparse_categorical_crossentropy")
    return model


def resumed_step(folder: str) -> dict:
    """A fresh model that loads ``folder``'s checkpoint (weights and optimizer state, as
    ``resume.restore`` does) and takes one step: its frozen weights' checksum (what ``--resume``
    compares with the marker's) and its predictions after the step."""
    from pipelines.training.checkpoints.files import frozen_checksum, load_checkpoint

    images, labels = batch()
    model = compiled_model()
    frozen = frozen_checksum(model)
    load_checkpoint(model, os.path.join(folder, CHECKPOINT))
    model.train_on_batch(images, labels)
    return {"frozen_sha256": frozen, "predicted": model.predict(images, verbose=0).tolist()}


def store_uri(folder: str) -> str:
    return "sqlite:///" + os.path.join(folder, "mlruns.db")


def make(folder: str) -> dict:
    """In ``folder``: a tracked MLflow run in ``mlruns.db``, a checkpoint after one step,
    ``model.keras`` and ``model.json`` as training exports them; returns what this stack makes of
    them itself (``made.json``)."""
    from pipelines import stack, tracking
    from pipelines.tracking import storeschema
    from pipelines.predict.model import resolve_model
    from pipelines.training.checkpoints.files import frozen_checksum, save_checkpoint
    from pipelines.training.model.export import export_model

    os.makedirs(folder, exist_ok=True)
    with tracking.start(store_uri(folder), "cross-stack", folder, params={"stack": stack.active().name}):
        pass
    images, labels = batch()
    model = compiled_model()
    model.train_on_batch(images, labels)
    save_checkpoint(model, os.path.join(folder, CHECKPOINT))
    frozen = frozen_checksum(model)
    export_model(model, os.path.join(folder, "model.keras"), SIZE, NAMES)
    made = {"stack": stack.active().name, "revision": storeschema.store_revision(os.path.join(folder, "mlruns.db")),
            "frozen_sha256": frozen, "resumed": resumed_step(folder),
            "predicted": resolve_model(folder).load().predict(images, verbose=0).tolist()}
    with open(os.path.join(folder, "made.json"), "w") as f:
        json.dump(made, f)
    return made


def read(folder: str) -> dict:
    """What this stack makes of the other stack's ``folder``: the refusals of its store (the
    driver's check and opening it) and the store's revision afterwards, the checkpoint resumed
    (:func:`resumed_step`), and ``model.keras``'s predictions or its refusal."""
    from pipelines.tracking import storeschema
    from pipelines import tracking
    from pipelines.predict.model import ModelContractError, resolve_model

    found = {}
    for name, attempt in (("check_store", lambda: tracking.check_store(store_uri(folder))),
                          ("open_store", lambda: tracking.open_store(store_uri(folder)))):
        try:
            attempt()
            found[name] = None
        except tracking.TrackingUnavailable as refused:
            found[name] = str(refused)
    found["revision"] = storeschema.store_revision(os.path.join(folder, "mlruns.db"))
    found["resumed"] = resumed_step(folder)
    try:
        found["predicted"] = resolve_model(folder).load().predict(batch()[0], verbose=0).tolist()
    except ModelContractError as refused:
        found["model_refused"] = str(refused)
    return found


if __name__ == "__main__":
    import pipelines  # noqa: F401  (the stack's Keras set-up first)

    mine, theirs, result = sys.argv[1:4]
    make(theirs)
    with open(result, "w") as f:
        json.dump(read(mine), f)
