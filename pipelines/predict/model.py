"""Which model runs and what it takes: resolved once, on the driver, before Spark starts.

Models take uint8 ``(batch, S, S, 3)``, return ``(batch, len(class_names))`` probabilities; no model file runs code."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from typing import List, Optional, Tuple

from pipelines.contract import MODEL_CONTRACT as CONTRACT_FILE
from pipelines.contract import MODEL_FILE, MODEL_INPUT_DTYPE
from pipelines.contract import MODEL_SHA256 as HASH_KEY
from pipelines.predict.config import is_mlflow_uri
from pipelines.predict.safeload import (
    HDF5_MAGIC,
    ZIP_MAGIC,
    ModelContractError,
    UnsafeModel,
    check_hdf5_config,
    check_model_config,
    check_model_stack,
    mlflow_model_file,
    read_zip_config,
)
from pipelines.runtime.errors import MissingInput
from pipelines.runtime.imports import frozen_imports
from pipelines.runtime.logs import plural
from pipelines.runtime.quiet import is_verbose, quiet_libraries
from pipelines.runtime.redact import redact_text
from pipelines.tracking import using_store

KERAS, MLFLOW = "keras", "mlflow"


@dataclass(frozen=True)


class ModelSpec:
    """A resolved model: what loads it and what it takes."""

    source: str  # as the user named it (path or URI)
    path: str  # model.keras or a local MLflow model folder, on a file system the executors share
    flavor: str  # KERAS or MLFLOW
    image_size: int  # S of the uint8 input (batch, S, S, 3)
    class_names: Tuple[Optional[str], ...]  # per output index; None for a label no folder used
    sha256: str = ""  # of model.keras (flavor keras), from model.json

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def load(self):
        """The ``tf.keras`` model, loaded once per process, its input and output checked."""
        model = load_model(self.flavor, self.path, self.sha256)
        check_loaded(model, self.image_size, self.num_classes)
        return model


def load_model(flavor: str, path: str, sha256: str = ""):
    """Load a ``model.keras`` file or a local MLflow model folder, uncompiled, without running code from it.

    A ``model.keras`` must be Keras' zip format by its first bytes (HDF5 takes the legacy loader, which runs a
    ``Lambda``'s bytecode), with the recorded ``sha256``; MLflow's loader (it unpickles) is never used. Each file is
    checked (`pipelines.predict.safeload`) and loaded from a private copy; cached per process by path and mtime.

    Raises:
        UnsafeModel: any of these checks failed."""
    return _load(flavor, path, sha256, os.stat(path).st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _load(flavor: str, path: str, sha256: str, _stamp: int):
    with frozen_imports():  # TensorFlow's objects kept out of every later collection
        from pipelines.stack.kerasapi import keras

    quiet_libraries(is_verbose())  # TensorFlow's and MLflow's Python loggers: errors only, unless verbose
    source = mlflow_model_file(path) if flavor == MLFLOW else path
    with tempfile.TemporaryDirectory(prefix="model-") as private:  # 0700: nobody swaps the file after the check
        copy = os.path.join(private, "model")
        digest = _copy_hashed(source, copy)
        with open(copy, "rb") as f:
            magic = f.read(8)
        if flavor == KERAS and sha256 != digest:
            raise UnsafeModel(f"{path}: sha256 {digest} is not the {HASH_KEY} {sha256} that {CONTRACT_FILE} "
                              "records: the file was changed or replaced since its training run wrote it")
        if magic.startswith(ZIP_MAGIC):
            config = read_zip_config(copy, source)
            check_model_config(config, source)
            check_model_stack(config, source)
            os.rename(copy, copy + ".keras")  # Keras picks its loader by name: the zip loader, safe mode on
            return keras.models.load_model(copy + ".keras", compile=False, safe_mode=True)
        if flavor == MLFLOW and magic == HDF5_MAGIC:
            check_hdf5_config(copy, source)
            os.rename(copy, copy + ".h5")
            return keras.models.load_model(copy + ".h5", compile=False)
        raise UnsafeModel(f"{source}: not a Keras zip file (.keras format; it starts with {magic[:4]!r}): an "
                          "HDF5 or other file would be loaded by Keras' legacy loader, which can run code from it; "
                          "export the model with pipelines.training.model.export.export_model")


def _copy_hashed(source: str, target: str) -> str:
    """Copy ``source`` to ``target`` (created owner-only) and return the copy's hex sha256."""
    digest = hashlib.sha256()
    with open(source, "rb") as src, open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as dst:
        for block in iter(lambda: src.read(1 << 20), b""):
            digest.update(block)
            dst.write(block)
    return digest.hexdigest()


def check_loaded(model, image_size: int, num_classes: int) -> None:
    """Refuse (`ModelContractError`) a model whose input is not uint8 ``(None, S, S, 3)`` or output ``(None, C)``."""
    dtype = getattr(model.inputs[0].dtype, "name", str(model.inputs[0].dtype))
    shape, out = tuple(model.input_shape), tuple(model.output_shape)
    if dtype != MODEL_INPUT_DTYPE or shape[1:] != (image_size, image_size, 3):
        raise ModelContractError(f"the model takes {dtype} {shape}, not the ETL's {MODEL_INPUT_DTYPE} (None, "
                                 f"{image_size}, {image_size}, 3) images: export it with "
                                 "pipelines.training.model.export.export_model")
    if out[1:] != (num_classes,):
        raise ModelContractError(f"the model returns {out}, not one probability per class name "
                                 f"({plural(num_classes, 'name')})")


def read_class_names(path: str) -> List[Optional[str]]:
    """A JSON list of class names, ``null`` for unused labels; `ModelContractError` if not a non-empty list."""
    with open(path, encoding="utf-8") as f:
        names = json.load(f)
    if not isinstance(names, list) or not names or not all(n is None or isinstance(n, str) for n in names):
        raise ModelContractError(f"{path}: not a JSON list of class names")
    return names


def read_contract(model_file: str) -> Tuple[int, List[Optional[str]], str]:
    """``(image_size, class_names, sha256)`` from the ``model.json`` beside ``model_file``.

    Raises `ModelContractError` for none there, or one without uint8 ``(None, S, S, 3)``, classes or a sha256."""
    path = os.path.join(os.path.dirname(model_file), CONTRACT_FILE)
    if not os.path.isfile(path):
        raise ModelContractError(f"no {CONTRACT_FILE} beside {model_file}: a model needs its input contract "
                                 "(jobs/train.py writes it with model.keras) to say its input size and class names")
    with open(path, encoding="utf-8") as f:
        contract = json.load(f)
    spec = contract.get("input", {}) if isinstance(contract, dict) else {}
    shape = spec.get("shape")
    if spec.get("dtype") != MODEL_INPUT_DTYPE or not (isinstance(shape, list) and len(shape) == 4 and shape[3] == 3
                                            and shape[1] == shape[2] and isinstance(shape[1], int)):
        raise ModelContractError(f"{path}: the input must be {MODEL_INPUT_DTYPE} [null, S, S, 3], got "
                                 f"{spec.get('dtype')} {shape}")
    names = contract.get("class_names")
    if not isinstance(names, list) or not names:
        raise ModelContractError(f"{path}: no class_names")
    digest = contract.get(HASH_KEY)
    if not (isinstance(digest, str) and len(digest) == 64):
        raise ModelContractError(f"{path}: no {HASH_KEY} (the sha256 of {MODEL_FILE} its training run recorded): "
                                 "the model file cannot be checked, so it is not loaded; export it again with "
                                 "pipelines.training.model.export.export_model")
    return shape[1], names, digest


def resolve_model(model: str, class_names_file: str = "", download_dir: Optional[str] = None) -> ModelSpec:
    """Resolve ``--model``: a ``model.keras`` with its ``model.json`` beside it, a run's folder, or an MLflow URI.

    Only an MLflow model (``models:/NAME/VERSION``, ``runs:/RUN_ID/PATH``) is loaded here, to read its input; it is
    downloaded into ``download_dir``. ``class_names_file`` overrides the model's own names.

    Raises:
        FileNotFoundError: no such model, or an MLflow URI the tracking server does not know.
        ModelContractError: no contract, or one that does not hold."""
    names = read_class_names(class_names_file) if class_names_file else None
    if is_mlflow_uri(model):
        return _resolve_mlflow(model, names, download_dir)
    path = os.path.join(model, MODEL_FILE) if os.path.isdir(model) else model
    if not os.path.isfile(path):
        raise MissingInput(f"model not found: {path}" + (" (a run's output folder holds model.keras)"
                                                         if os.path.isdir(model) else ""))
    size, contract_names, digest = read_contract(path)
    if zipfile.is_zipfile(path):  # refused here, on the driver, not by every executor's load
        check_model_stack(read_zip_config(path, path), path)
    if names is not None and len(names) != len(contract_names):
        raise ModelContractError(f"--class-names lists {plural(len(names), 'name')}, the model has "
                                 f"{plural(len(contract_names), 'class')}")
    return ModelSpec(model, path, KERAS, size, tuple(names or contract_names), digest)


def _resolve_mlflow(uri: str, names: Optional[List[Optional[str]]], download_dir: Optional[str]) -> ModelSpec:
    """Download the MLflow model, load it to read its input; ``names``, else its metadata's ``class_names``."""
    if not is_verbose():
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow
    from mlflow.exceptions import MlflowException

    quiet_libraries(is_verbose())

    try:
        # through the tracking module: a SQLite store's ./mlruns is made beside it, not where the job runs
        with using_store(mlflow.get_tracking_uri()):
            local = mlflow.artifacts.download_artifacts(artifact_uri=uri,
                                                        dst_path=download_dir or tempfile.mkdtemp(prefix="model-"))
        metadata = mlflow.models.Model.load(local).metadata or {}
    except (MlflowException, OSError) as exc:
        raise MissingInput(redact_text(f"MLflow model {uri} (tracking URI {mlflow.get_tracking_uri()}): "
                                       f"{exc}")) from None
    names = names or metadata.get("class_names")
    if not names:
        raise ModelContractError(f"{uri}: the MLflow model's metadata has no class_names; pass --class-names "
                                 "FILE (a run's class_names.json), or log the model with "
                                 "metadata={'class_names': [...]}")
    shape = tuple(load_model(MLFLOW, local).input_shape)
    spec = ModelSpec(uri, local, MLFLOW, shape[1] if len(shape) == 4 else 0, tuple(names))
    spec.load()  # checks its input and output against the names
    return spec
