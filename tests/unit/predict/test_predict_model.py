"""Loading a model runs no code from it: Keras' zip format only, safe mode on, the sha256 its run
recorded; MLflow models checked before anything of theirs is unpickled or imported. Each unsafe
model here writes a marker file when its code runs: after the refusal the marker must not exist."""
import hashlib
import json
import os
import pickle
import shutil
import zipfile

import mlflow.tensorflow

import numpy as np
import pytest
import tensorflow as tf

from pipelines.predict.model import KERAS, MLFLOW, load_model, resolve_model
from pipelines.predict.safeload import ModelContractError, UnsafeModel, check_model_config, read_zip_config
from pipelines.training.model.build import build_model
from pipelines.training.model.export import export_model, file_sha256, input_contract

pytestmark = pytest.mark.slow  # TensorFlow and MLflow models: seconds each
NAMES = ["a", "b"]


def uint8_model(lambda_marker: str = ""):
    """A tiny model taking uint8 (None, 4, 4, 3), returning 2 probabilities; with
    ``lambda_marker``, a Lambda layer whose code writes that file when it runs."""
    image = tf.keras.Input((4, 4, 3), dtype="uint8")
    x = tf.keras.layers.Rescaling(1 / 255)(image)
    if lambda_marker:
        x = tf.keras.layers.Lambda(lambda t, marker=lambda_marker: (open(marker, "w").close(), t)[1])(x)
    probabilities = tf.keras.layers.Dense(2, activation="softmax")(tf.keras.layers.GlobalAveragePooling2D()(x))
    return tf.keras.Model(image, probabilities)


def write_contract(folder, model_file, digest=None):
    with open(model_file, "rb") as f:
        digest = digest or hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(folder, "model.json"), "w") as f:
        json.dump({**input_contract(4, 4, NAMES), "model_sha256": digest}, f)


def keras_run(folder, model=None):
    """A run folder: model.keras in Keras' zip format and its model.json with the right hash."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.keras")
    (model or uint8_model()).save(path)
    write_contract(folder, path)
    return str(folder)


def test_a_zip_model_with_its_recorded_hash_loads(tmp_path):
    run = keras_run(tmp_path / "run")
    spec = resolve_model(run)
    model = spec.load()
    assert model.predict(np.zeros((1, 4, 4, 3), np.uint8), verbose=0).shape == (1, 2)


def test_an_hdf5_file_named_model_keras_is_refused_before_its_lambda_runs(tmp_path):
    marker = str(tmp_path / "ran")
    run = tmp_path / "run"
    run.mkdir()
    uint8_model(marker).save(str(tmp_path / "m.h5"), save_format="h5")
    shutil.copy(tmp_path / "m.h5", run / "model.keras")
    write_contract(str(run), str(run / "model.keras"))  # even with the right hash
    os.remove(marker)  # building the model ran the layer
    with pytest.raises(UnsafeModel, match=r"not a Keras zip file \(.keras format; it starts with b'\\x89HDF'"):
        resolve_model(str(run)).load()
    assert not os.path.exists(marker)
    tf.keras.models.load_model(str(tmp_path / "m.h5"), compile=False)  # the control: Keras' own load runs it
    assert os.path.exists(marker)


def test_a_lambda_in_a_zip_model_is_refused_before_keras_reads_it(tmp_path):
    marker = str(tmp_path / "ran")
    run = keras_run(tmp_path / "run", uint8_model(marker))
    os.remove(marker)  # building the model ran the layer
    with pytest.raises(UnsafeModel, match=r"has 'keras.layers.Lambda' \(registered name None\), a layer that calls a function its config names"):
        resolve_model(run).load()
    assert not os.path.exists(marker)


@pytest.mark.parametrize("backbone,size,stored", [("tiny", 32, 32), ("tiny", 32, 40), ("xception", 71, 71),
                                                  ("densenet121", 32, 40)])
def test_every_model_the_product_builds_passes_the_allowlist(tmp_path, backbone, size, stored):
    """The allowlist is the product's own models: each exported (with Resizing when the stored size
    differs) is accepted, and all but Xception (its load alone takes seconds) load and predict."""
    run = tmp_path / "run"
    run.mkdir()
    model = build_model(2, size, weights="none", backbone=backbone, stored_size=stored)
    export_model(model, str(run / "model.keras"), stored_size=stored, class_names=NAMES)
    check_model_config(read_zip_config(str(run / "model.keras"), "m"), "m")
    if backbone != "xception":
        spec = resolve_model(str(run))
        assert spec.load().predict(np.zeros((1, stored, stored, 3), np.uint8), verbose=0).shape == (1, 2)


def test_a_tfoplambda_that_safe_mode_loads_is_refused(tmp_path):
    """A TensorFlow op on a Keras tensor is a TFOpLambda layer, which calls the function its config
    names; Keras' safe mode loads it (the control), the allowlist refuses it by name."""
    image = tf.keras.Input((4, 4, 3), dtype="uint8")
    x = tf.cast(image, tf.float32) * 2.0
    outputs = tf.keras.layers.Dense(2, activation="softmax")(tf.keras.layers.GlobalAveragePooling2D()(x))
    run = keras_run(tmp_path / "run", tf.keras.Model(image, outputs))
    with pytest.raises(UnsafeModel, match=r"TFOpLambda' \(registered name 'TFOpLambda'\), a layer that calls"):
        resolve_model(run).load()
    tf.keras.models.load_model(os.path.join(run, "model.keras"), compile=False, safe_mode=True)  # the control


EXEC = {"module": "builtins", "class_name": "function", "config": "exec", "registered_name": "function"}
LAMBDA = {"module": "keras.layers", "class_name": "Lambda", "registered_name": None, "name": "hidden",
          "config": {"name": "hidden", "function": EXEC, "arguments": {}}, "inbound_nodes": []}


def _layer(config, class_name):
    """The first layer of ``class_name`` at any depth of a model config."""
    stack = [config]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("class_name") == class_name and "inbound_nodes" in item:
                return item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    raise AssertionError(class_name)


def _lambda_with_exec(c):
    c["config"]["layers"].append(LAMBDA)


def _inner_lambda(c):
    _layer(c["config"]["layers"], "Functional")["config"]["layers"].append(LAMBDA)


def _exec_activation(c):
    _layer(c, "Dense")["config"]["activation"] = EXEC


def _unknown_module(c):
    _layer(c, "Dense")["module"] = "os"


def _unknown_class(c):
    _layer(c, "Dense")["class_name"] = "Flatten"


def _registered_elsewhere(c):
    _layer(c, "Dense")["registered_name"] = "attacker>Dense"


def _activation_by_name(c):
    _layer(c, "Dense")["config"]["activation"] = "exec"


@pytest.mark.parametrize("edit,refused", [
    (_lambda_with_exec, "has 'keras.layers.Lambda' .*, a layer that calls"), (_inner_lambda, "'keras.layers.Lambda'"),
    (_exec_activation, "'builtins.function'"), (_unknown_module, "'os.Dense'"), (_unknown_class, "'keras.layers.Flatten'"),
    (_registered_elsewhere, "registered name 'attacker>Dense'"), (_activation_by_name, "activation 'exec'")])
def test_a_zip_model_naming_anything_else_is_refused_before_any_deserialisation(tmp_path, monkeypatch, edit, refused):
    """A real exported model whose config.json names what the product never builds, its hash
    recorded as its run would: refused, and Keras' loader is never reached (its spy's marker)."""
    from pipelines.stack.kerasapi import keras

    run = tmp_path / "run"
    run.mkdir()
    export_model(build_model(2, 32, weights="none", backbone="tiny"), str(tmp_path / "real.keras"))
    with zipfile.ZipFile(tmp_path / "real.keras") as src, zipfile.ZipFile(run / "model.keras", "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "config.json":
                config = json.loads(data)
                edit(config)
                data = json.dumps(config).encode()
            dst.writestr(info, data)
    with open(run / "model.json", "w") as f:
        json.dump({**input_contract(32, 32, NAMES), "model_sha256": file_sha256(str(run / "model.keras"))}, f)
    marker = tmp_path / "deserialised"
    real_load = keras.models.load_model
    monkeypatch.setattr(keras.models, "load_model", lambda *a, **k: (marker.touch(), real_load(*a, **k))[1])
    with pytest.raises(UnsafeModel, match=refused):
        resolve_model(str(run)).load()
    assert not marker.exists()


def test_a_model_file_that_is_not_the_one_its_run_recorded_is_refused(tmp_path):
    run = keras_run(tmp_path / "run")
    path = os.path.join(run, "model.keras")
    recorded = json.load(open(os.path.join(run, "model.json")))["model_sha256"]
    other = keras_run(tmp_path / "other")  # a valid model, other weights: swapped in
    os.replace(os.path.join(other, "model.keras"), path)
    with pytest.raises(UnsafeModel, match=f"is not the model_sha256 {recorded} that model.json records"):
        resolve_model(run).load()
    with open(path, "ab") as f:  # a byte appended
        f.write(b"\0")
    with pytest.raises(UnsafeModel, match="changed or replaced since its training run wrote it"):
        load_model(KERAS, path, recorded)


class Plant:
    """Unpickling it writes its marker file (what a planted pickle can do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def mlflow_model(folder, model, save_format="h5", files=()):
    """A local MLflow model folder as mlflow.tensorflow.save_model writes one, plus ``files``
    ({relative path: bytes}) planted in it."""
    mlflow.tensorflow.save_model(model, str(folder), keras_model_kwargs={"save_format": save_format},
                                 pip_requirements=[])
    for name, data in dict(files).items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return str(folder)


def test_an_mlflow_model_with_pickled_custom_objects_is_refused_before_mlflow_reads_it(tmp_path):
    marker = str(tmp_path / "ran")
    planted = {"data/custom_objects.cloudpickle": pickle.dumps(Plant(marker))}
    folder = mlflow_model(tmp_path / "model", uint8_model(), files=planted)
    with pytest.raises(UnsafeModel, match="holds custom_objects.cloudpickle: .*CVE-2024-37057"):
        load_model(MLFLOW, folder)
    assert not os.path.exists(marker)
    with pytest.raises(Exception):  # the control: MLflow's own loader unpickles it (then fails on its value)
        mlflow.tensorflow.load_model(folder)
    assert os.path.exists(marker)


def test_the_global_custom_objects_pickle_of_an_mlflow_model_is_never_read(tmp_path):
    """MLflow writes it for every Keras 2.15 model: the model loads, and a planted one never runs."""
    marker = str(tmp_path / "ran")
    planted = {"data/global_custom_objects.cloudpickle": pickle.dumps(Plant(marker))}
    folder = mlflow_model(tmp_path / "model", uint8_model(), files=planted)
    assert load_model(MLFLOW, folder).predict(np.zeros((1, 4, 4, 3), np.uint8), verbose=0).shape == (1, 2)
    assert not os.path.exists(marker)


def test_an_mlflow_hdf5_model_loads_unless_it_has_a_lambda(tmp_path):
    folder = mlflow_model(tmp_path / "plain", uint8_model())
    assert load_model(MLFLOW, folder).predict(np.zeros((1, 4, 4, 3), np.uint8), verbose=0).shape == (1, 2)
    marker = str(tmp_path / "ran")
    folder = mlflow_model(tmp_path / "lambda", uint8_model(marker))
    os.remove(marker)  # building the model ran the layer
    with pytest.raises(UnsafeModel, match=r"has 'Lambda' \(registered name None\), a layer that calls a function its config names"):
        load_model(MLFLOW, folder)
    assert not os.path.exists(marker)
    mlflow.tensorflow.load_model(folder)  # the control: MLflow's own loader runs it
    assert os.path.exists(marker)
    plain = uint8_model()  # the HDF5 check is the allowlist too: a TFOpLambda is refused
    folder = mlflow_model(tmp_path / "tfop", tf.keras.Model(plain.input, plain.output * 1.0))
    with pytest.raises(UnsafeModel, match=r"has 'TFOpLambda' \(registered name None\), a layer that calls"):
        load_model(MLFLOW, folder)


def test_an_mlflow_savedmodel_is_refused(tmp_path):
    folder = mlflow_model(tmp_path / "tf", uint8_model(), save_format="tf")
    with pytest.raises(ModelContractError, match="save_format 'tf'"):
        load_model(MLFLOW, folder)
