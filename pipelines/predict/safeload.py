"""What a model file may hold before Keras or MLflow opens it, so that nothing read from it runs code."""
from __future__ import annotations

import json
import os
import zipfile

from pipelines import stack as stacks
from pipelines.backbones import backbone_layers
from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural


class ModelContractError(Refused):
    """The model's contract (input uint8 ``(batch, S, S, 3)``, class names) is missing or broken."""


class UnsafeModel(ModelContractError):
    """A model file that could run code when loaded, or that is not the file its run recorded."""


ZIP_MAGIC = b"PK\x03\x04"  # a zip file's local header: Keras' own format (.keras)
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# What an MLflow model folder may not hold: the user's pickled custom objects (a model that needs
# them loads only by unpickling them, which mlflow.tensorflow does) and code (MLflow puts it on
# sys.path). Its global_custom_objects.cloudpickle is never read here: MLflow writes one for every
# Keras 2.15 model (Keras registers its own optimizers there), and the Keras file loads without it.
MLFLOW_REFUSED = ("custom_objects.cloudpickle", "code")
# What a model may be built from: the layer classes, initializers and activations of the models
# the product builds and exports (pipelines.training.model.build: the preprocessing layers and the head
# here, every backbone's own layer classes from its row in pipelines/backbones.py;
# tests/unit/predict/test_predict_model.py exports each and checks it passes).
# Anything else that names a class or a function (Lambda, TFOpLambda, a custom or registered
# object, a function such as builtins.exec) is refused by name before Keras reads the file.
ALLOWED_LAYERS = frozenset({"Dense", "Dropout", "InputLayer", "Rescaling", "Resizing"}) | backbone_layers()
ALLOWED_INITIALIZERS = frozenset({"GlorotUniform", "Ones", "Zeros"})
ALLOWED_ACTIVATIONS = frozenset({"linear", "relu", "softmax"})
# A nested or outer model: Keras 2.15's own module, and tf_keras' (the current stack).
FUNCTIONAL_MODULES = frozenset(s.functional_module for s in stacks.STACKS.values())
MAX_CONFIG_BYTES = 64 << 20  # an Xception config is about 0.2 MiB
# The members of a ``.keras`` file the product writes (Keras 2's own save of a model without assets,
# both stacks). Keras 2.15 also loads weights stored as ``model.weights.npz``, through
# ``np.load(allow_pickle=True)``: whatever its ``__root__`` entry pickles runs on load.
KERAS_MEMBERS = ("config.json", "metadata.json", "model.weights.h5")
WEIGHTS_MEMBER = "model.weights.h5"


def allowed_object(item: dict) -> bool:
    """Whether one serialised Keras object (a dict with ``class_name``, maybe ``module``) is one the product builds."""
    name, module, registered = item.get("class_name"), item.get("module"), item.get("registered_name")
    if name == "Functional":
        return module in FUNCTIONAL_MODULES | {None} and registered in ("Functional", None)
    if registered is not None:  # a registered name makes Keras look the class up elsewhere
        return False
    if name in ALLOWED_LAYERS:
        return module in ("keras.layers", None)
    return name in ALLOWED_INITIALIZERS and module in ("keras.initializers", None)


def check_model_config(config, shown: str) -> None:
    """Refuse (`UnsafeModel`) a parsed config naming, at any depth, a class or activation outside the allowlist.

    Keras' safe mode refuses a zip model's ``Lambda`` but not a ``TFOpLambda``, nor a function by module
    (``builtins.exec``)."""
    stack = [config]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        if not isinstance(item, dict):
            continue
        if any(key in item for key in ("class_name", "module", "registered_name")) and not allowed_object(item):
            what = ".".join(str(p) for p in (item.get("module"), item.get("class_name")) if p is not None)
            calls = ", a layer that calls a function its config names" if what.endswith("Lambda") else ""
            raise UnsafeModel(f"{shown}: the model has {what!r} (registered name {item.get('registered_name')!r}){calls}, "
                              "not one of the layers, initializers and activations the product's models are "
                              "built from: refused before anything of it is loaded (export the model with "
                              "pipelines.training.model.export.export_model)")
        activation = item.get("activation")
        if isinstance(activation, str) and activation not in ALLOWED_ACTIVATIONS:
            raise UnsafeModel(f"{shown}: the model names the activation {activation!r}, not one of "
                              f"{sorted(ALLOWED_ACTIVATIONS)}: refused before anything of it is loaded")
        stack.extend(item.values())


def check_model_stack(config, shown: str) -> None:
    """Refuse (`ModelContractError`) a zip model of another stack that this stack's Keras cannot load."""
    module = config.get("module") if isinstance(config, dict) else None
    made_by = next((s.name for s in stacks.STACKS.values() if s.functional_module == module), None)
    try:
        here = stacks.active()
    except stacks.UnknownStack:  # neither stack's TensorFlow: Keras' own error stands
        return
    if made_by is not None and made_by not in here.loads_models_of:
        tensorflow = stacks.pins(made_by).get("tensorflow-cpu")
        raise ModelContractError(f"{shown} was saved on the {made_by} stack (TensorFlow {tensorflow}: its model is "
                                 f"{module}), which the {here.name} stack's Keras cannot load: serve it on the "
                                 f"{made_by} stack ({stacks.venv(made_by)}/bin/python -m pipelines.predict, or "
                                 f"jobs/predict.py there), or train or export it again on this stack")


def check_zip_members(zf: zipfile.ZipFile, shown: str) -> None:
    """Refuse (`UnsafeModel`) a Keras zip whose members are not exactly `KERAS_MEMBERS`, each once, with HDF5 weights.

    Keras 2.15 unpickles ``model.weights.npz``, and the zip reader takes the last of two members of one name."""
    names = zf.namelist()
    twice = sorted({n for n in names if names.count(n) > 1})
    extra = sorted(set(names) - set(KERAS_MEMBERS))
    missing = sorted(set(KERAS_MEMBERS) - set(names))
    expected = f"a model the product exports holds {', '.join(KERAS_MEMBERS)} and nothing else"
    if twice or extra or missing:
        npz = " (npz weights are unpickled by Keras 2.15's loader)" if any(n.endswith(".npz") for n in extra) else ""
        found = "; ".join(part for part in (
            f"{', '.join(twice)} more than once" if twice else "",
            f"{', '.join(extra)}, which it may not hold{npz}" if extra else "",
            f"no {', '.join(missing)}" if missing else "") if part)
        raise UnsafeModel(f"{shown}: the zip file has {found}: {expected}; refused before Keras opens it")
    with zf.open(WEIGHTS_MEMBER) as f:
        magic = f.read(len(HDF5_MAGIC))
    if magic != HDF5_MAGIC:
        raise UnsafeModel(f"{shown}: its {WEIGHTS_MEMBER} is not an HDF5 file (it starts with {magic[:4]!r}): "
                          f"{expected}; refused before Keras opens it")


def read_zip_config(path: str, shown: str):
    """The parsed ``config.json`` of a Keras zip file whose members pass; `UnsafeModel` if too large or not JSON."""
    try:
        with zipfile.ZipFile(path) as zf:
            check_zip_members(zf, shown)
            info = zf.getinfo("config.json")
            if info.file_size > MAX_CONFIG_BYTES:
                raise UnsafeModel(f"{shown}: a config.json of {plural(info.file_size, 'byte')}: refused")
            return json.loads(zf.read(info).decode("utf-8"))
    except (KeyError, zipfile.BadZipFile, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, UnsafeModel):
            raise
        raise UnsafeModel(f"{shown}: a zip file without a readable Keras config.json ({exc})") from None


def check_hdf5_config(path: str, shown: str) -> None:
    """Refuse (`UnsafeModel`) an HDF5 model without a readable ``model_config`` or one `check_model_config` refuses.

    Keras' legacy loader turns a ``Lambda`` layer's bytecode into a function, whatever ``safe_mode`` says."""
    import h5py

    with h5py.File(path, "r") as f:
        config = f.attrs.get("model_config")
    try:
        config = json.loads(config.decode("utf-8") if isinstance(config, bytes) else config)
    except (TypeError, ValueError):
        raise UnsafeModel(f"{shown}: an HDF5 file without a readable Keras model config") from None
    check_model_config(config, shown)


def mlflow_model_file(folder: str) -> str:
    """The Keras file (HDF5 or zip) of the local MLflow model ``folder``, read from its ``MLmodel`` first.

    Raises:
        UnsafeModel: pickled custom objects or code (`MLFLOW_REFUSED`), or no Keras model of the ``tensorflow``
            flavour (a SavedModel is not checked: log with ``keras_model_kwargs={"save_format": "h5"}``)."""
    from mlflow.models import Model

    conf = Model.load(folder).flavors.get("tensorflow") or {}
    data = os.path.join(folder, conf.get("data", "data"))
    found = [name for name in MLFLOW_REFUSED if os.path.exists(os.path.join(data, name))
             or os.path.exists(os.path.join(folder, name))]
    if conf.get("code"):
        found.append("code")
    if found:
        raise UnsafeModel(f"{folder}: the MLflow model holds {', '.join(sorted(set(found)))}: unpickling custom "
                          "objects or importing a model's code runs code from the model (CVE-2024-37057); refused")
    fmt = conf.get("save_format")
    if conf.get("model_type") != "keras" or fmt not in ("h5", "keras"):
        raise UnsafeModel(f"{folder}: not a Keras model saved as HDF5 or .keras by MLflow's tensorflow flavour "
                          f"(model_type {conf.get('model_type')!r}, save_format {fmt!r}): log it with "
                          "keras_model_kwargs={'save_format': 'h5'}")
    base = os.path.join(data, "model")
    path = next((p for p in (base + ".h5", base + ".keras", base) if os.path.isfile(p)), None)
    if path is None:
        raise UnsafeModel(f"{folder}: the MLflow model's Keras file is missing")
    return path
