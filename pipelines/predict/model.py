"""Which model runs, and what it takes: resolved once, on the driver, before Spark starts.

A model is named three ways (:func:`resolve_model`):

- a ``model.keras`` file: its contract ``model.json`` must lie beside it (``jobs/train.py`` writes
  both, :func:`pipelines.training.model.input_contract`); it gives the input size and the class
  names, so nothing is loaded on the driver;
- a training run's output folder: its ``model.keras`` (and ``model.json``);
- an MLflow URI, ``models:/NAME/VERSION`` or ``runs:/RUN_ID/PATH``: the model is downloaded once
  into a local folder, loaded with ``mlflow.tensorflow.load_model`` (a ``tf.keras`` model) to read
  its input, and its class names are the ``class_names`` entry of the MLflow model's metadata
  (``mlflow.tensorflow.log_model(..., metadata={"class_names": [...]})``), else the
  ``--class-names`` file (a run's ``class_names.json``).

Every model must take the ETL's image, uint8 RGB ``(batch, S, S, 3)``, preprocessing inside its
graph, and return ``(batch, len(class_names))`` probabilities; :func:`check_loaded` checks it
where the model is loaded.
"""
from __future__ import annotations

import functools
import json
import os
import tempfile
from dataclasses import dataclass
from typing import List, Optional, Tuple

from pipelines.logs import plural
from pipelines.predict.config import is_mlflow_uri
from pipelines.redact import redact_text

MODEL_FILE = "model.keras"
CONTRACT_FILE = "model.json"
KERAS, MLFLOW = "keras", "mlflow"


class ModelContractError(ValueError):
    """The model's contract (input uint8 ``(batch, S, S, 3)``, class names) is missing or broken."""


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model: what loads it and what it takes.

    Attributes:
        source: the model as the user named it (path or URI).
        path: what loads: a ``model.keras`` file (flavor ``keras``) or a local MLflow model folder
            (flavor ``mlflow``); executors load the same path, so on a cluster it must be on a
            file system they share (like the input).
        flavor: :data:`KERAS` or :data:`MLFLOW`.
        image_size: ``S`` of the uint8 input ``(batch, S, S, 3)``.
        class_names: the name of each output index (``None`` for a label no folder used).
    """

    source: str
    path: str
    flavor: str
    image_size: int
    class_names: Tuple[Optional[str], ...]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def load(self):
        """The ``tf.keras`` model, loaded once per process (cached), its input checked.

        Raises:
            ModelContractError: the model does not take uint8 ``(batch, S, S, 3)`` or does not
                return one probability per class name.
        """
        model = load_model(self.flavor, self.path)
        check_loaded(model, self.image_size, self.num_classes)
        return model


def load_model(flavor: str, path: str):
    """Load a model file (``keras``) or MLflow model folder (``mlflow``), uncompiled.

    Cached per process while the file or folder is unchanged (its modification time is part of the
    key): a Python worker that Spark reuses loads a model once, and a process that resolved an
    MLflow model (which loads it) does not load it twice; a model rewritten since is loaded again.
    """
    return _load(flavor, path, os.stat(path).st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _load(flavor: str, path: str, _stamp: int):
    from pipelines.kerasapi import keras

    from pipelines.quiet import quiet_libraries

    quiet_libraries()  # TensorFlow's and MLflow's Python loggers: errors only, unless verbose
    if flavor == MLFLOW:
        import mlflow.tensorflow

        return mlflow.tensorflow.load_model(path)
    return keras.models.load_model(path, compile=False)


def check_loaded(model, image_size: int, num_classes: int) -> None:
    """Check a loaded model against its contract.

    Raises:
        ModelContractError: input not uint8 ``(None, image_size, image_size, 3)``, or output not
            ``(None, num_classes)``.
    """
    dtype = getattr(model.inputs[0].dtype, "name", str(model.inputs[0].dtype))
    shape, out = tuple(model.input_shape), tuple(model.output_shape)
    if dtype != "uint8" or shape[1:] != (image_size, image_size, 3):
        raise ModelContractError(f"the model takes {dtype} {shape}, not the ETL's uint8 (None, {image_size}, "
                                 f"{image_size}, 3) images: export it with pipelines.training.model.export_model")
    if out[1:] != (num_classes,):
        raise ModelContractError(f"the model returns {out}, not one probability per class name "
                                 f"({plural(num_classes, 'name')})")


def read_class_names(path: str) -> List[Optional[str]]:
    """A JSON list of class names (``class_names.json``): strings, ``null`` for unused labels.

    Raises:
        FileNotFoundError: no such file. ModelContractError: not a non-empty list of names.
    """
    with open(path, encoding="utf-8") as f:
        names = json.load(f)
    if not isinstance(names, list) or not names or not all(n is None or isinstance(n, str) for n in names):
        raise ModelContractError(f"{path}: not a JSON list of class names")
    return names


def read_contract(model_file: str) -> Tuple[int, List[Optional[str]]]:
    """``(image_size, class_names)`` from the ``model.json`` beside ``model_file``.

    Raises:
        ModelContractError: no ``model.json`` there, or one whose input is not uint8
            ``(None, S, S, 3)`` or that names no classes.
    """
    path = os.path.join(os.path.dirname(model_file), CONTRACT_FILE)
    if not os.path.isfile(path):
        raise ModelContractError(f"no {CONTRACT_FILE} beside {model_file}: a model needs its input contract "
                                 "(jobs/train.py writes it with model.keras) to say its input size and class names")
    with open(path, encoding="utf-8") as f:
        contract = json.load(f)
    spec = contract.get("input", {}) if isinstance(contract, dict) else {}
    shape = spec.get("shape")
    if spec.get("dtype") != "uint8" or not (isinstance(shape, list) and len(shape) == 4 and shape[3] == 3
                                            and shape[1] == shape[2] and isinstance(shape[1], int)):
        raise ModelContractError(f"{path}: the input must be uint8 [null, S, S, 3], got {spec.get('dtype')} {shape}")
    names = contract.get("class_names")
    if not isinstance(names, list) or not names:
        raise ModelContractError(f"{path}: no class_names")
    return shape[1], names


def resolve_model(model: str, class_names_file: str = "", download_dir: Optional[str] = None) -> ModelSpec:
    """Resolve ``--model`` (a ``model.keras`` file, a run's folder, or an MLflow URI) on the driver.

    Args:
        model: as given; a path is taken as it is (absolute paths in jobs).
        class_names_file: optional JSON list of names; it overrides the model's own.
        download_dir: where an MLflow model is downloaded (default: a new temporary folder).

    Returns:
        the :class:`ModelSpec`. Only an MLflow model is loaded here (to read its input).

    Raises:
        FileNotFoundError: no such file or folder, no ``model.keras`` in the folder, an MLflow URI
            the tracking server does not know. ModelContractError: no contract, or one that does
            not hold (see :func:`read_contract`, :func:`check_loaded`).
    """
    names = read_class_names(class_names_file) if class_names_file else None
    if is_mlflow_uri(model):
        return _resolve_mlflow(model, names, download_dir)
    path = os.path.join(model, MODEL_FILE) if os.path.isdir(model) else model
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model not found: {path}" + (" (a run's output folder holds model.keras)"
                                                              if os.path.isdir(model) else ""))
    size, contract_names = read_contract(path)
    if names is not None and len(names) != len(contract_names):
        raise ModelContractError(f"--class-names lists {plural(len(names), 'name')}, the model has "
                                 f"{plural(len(contract_names), 'class')}")
    return ModelSpec(model, path, KERAS, size, tuple(names or contract_names))


def _resolve_mlflow(uri: str, names: Optional[List[Optional[str]]], download_dir: Optional[str]) -> ModelSpec:
    """Download the MLflow model, read its class names and load it to read its input size."""
    from pipelines.quiet import is_verbose, quiet_libraries

    if not is_verbose([]):
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow
    from mlflow.exceptions import MlflowException

    quiet_libraries()
    from pipelines.tracking import using_store

    try:
        # through the tracking module: a SQLite store's ./mlruns is made beside it, not where the job runs
        with using_store(mlflow.get_tracking_uri()):
            local = mlflow.artifacts.download_artifacts(artifact_uri=uri,
                                                        dst_path=download_dir or tempfile.mkdtemp(prefix="model-"))
        metadata = mlflow.models.Model.load(local).metadata or {}
    except (MlflowException, OSError) as exc:
        raise FileNotFoundError(redact_text(f"MLflow model {uri} (tracking URI {mlflow.get_tracking_uri()}): "
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
