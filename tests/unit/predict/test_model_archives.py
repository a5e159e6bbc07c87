"""A ``.keras`` file loads only with the members Keras' own save writes, its weights as HDF5: weights
saved as NumPy's ``.npz`` (which Keras 2.15 unpickles), both formats, a nested archive, an extra
member or a name twice are refused before Keras opens the file, on every path a model is loaded by
(a run folder on the driver and on the executors, the quick-predict command, an MLflow model folder,
the registry). Each hostile archive is built from a real export; its planted pickle writes a marker
file when it is unpickled, and after the refusal the marker must not exist."""
import hashlib
import io
import json
import os
import warnings
import zipfile

import numpy as np
import pytest

from pipelines import stack as stacks
from pipelines.predict.model import KERAS, MLFLOW, load_model, resolve_model
from pipelines.predict.safeload import UnsafeModel, mlflow_model_file
from pipelines.training.model.export import input_contract

pytestmark = [pytest.mark.slow, pytest.mark.current]  # Keras' loaders differ by stack
NAMES = ["a", "b"]
SIZE = 4


class Plant:
    """Unpickling it writes its marker file (what a planted pickle can do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def pickled_npz(marker) -> bytes:
    """An npz whose ``__root__`` entry (the outer model's weights, the first Keras 2.15 reads) is a
    pickle that writes ``marker``."""
    return npz(__root__=np.array(Plant(marker), dtype=object))


def zip_bytes(members) -> bytes:
    """A zip file of ``members``, ``(name, bytes)`` pairs in order (a name may come twice)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Duplicate name": the point of one archive
        for name, data in members:
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The members of a real exported model, ``[(name, bytes)]`` in the archive's order."""
    from pipelines.stack.kerasapi import keras

    image = keras.Input((SIZE, SIZE, 3), dtype="uint8")
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Rescaling(1 / 255)(image))
    path = str(tmp_path_factory.mktemp("export") / "model.keras")
    keras.Model(image, keras.layers.Dense(2, activation="softmax")(x)).save(path)
    with zipfile.ZipFile(path) as zf:
        return [(name, zf.read(name)) for name in zf.namelist()]


def _npz_weights(members, marker):
    return [(n, d) for n, d in members if n != "model.weights.h5"] + [("model.weights.npz", pickled_npz(marker))]


def _npz_beside_h5(members, marker):
    return members + [("model.weights.npz", pickled_npz(marker))]


def _numeric_npz(members, marker):
    return [(n, d) for n, d in members if n != "model.weights.h5"] + [("model.weights.npz", npz(
        __root__=np.zeros(2, np.float32), dense=np.ones((3, 2), np.float32)))]


def _nested_archive(members, marker):
    return members + [("assets/inner.keras", zip_bytes(_npz_weights(members, marker)))]


def _archive_as_weights(members, marker):
    return [(n, zip_bytes(_npz_weights(members, marker)) if n == "model.weights.h5" else d) for n, d in members]


def _extra_member(members, marker):
    return members + [("code/plant.py", f"open({marker!r}, 'w')".encode())]


def _weights_twice(members, marker):
    return members + [("model.weights.h5", pickled_npz(marker))]


def _no_weights(members, marker):
    return [(n, d) for n, d in members if n != "model.weights.h5"]


HOSTILE = [
    (_npz_weights, r"model.weights.npz, which it may not hold \(npz weights are unpickled by Keras 2.15's loader\)"
                   r".*no model.weights.h5"),
    (_npz_beside_h5, r"has model.weights.npz, which it may not hold \(npz weights are unpickled"),
    (_numeric_npz, r"has model.weights.npz, which it may not hold"),
    (_nested_archive, r"has assets/inner.keras, which it may not hold"),
    (_archive_as_weights, r"its model.weights.h5 is not an HDF5 file \(it starts with b'PK\\x03\\x04'\)"),
    (_extra_member, r"has code/plant.py, which it may not hold"),
    (_weights_twice, r"has model.weights.h5 more than once"),
    (_no_weights, r"has no model.weights.h5"),
]
EXPECTED = "a model the product exports holds config.json, metadata.json, model.weights.h5 and nothing else"


def hostile_run(folder, members, edit, marker):
    """A run folder whose ``model.keras`` is ``edit``'s archive, its sha256 recorded in ``model.json``
    as its training run would have: only the members can refuse it."""
    os.makedirs(folder)
    path = os.path.join(folder, "model.keras")
    with open(path, "wb") as f:
        f.write(zip_bytes(edit(members, marker)))
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(folder, "model.json"), "w") as f:
        json.dump({**input_contract(SIZE, SIZE, NAMES), "model_sha256": digest}, f)
    return str(folder), path, digest


def test_the_members_of_an_exported_model_load(exported, tmp_path):
    run, path, digest = hostile_run(tmp_path / "run", exported, lambda members, marker: members, "")
    assert [name for name, _ in exported] == ["metadata.json", "config.json", "model.weights.h5"]
    assert resolve_model(run).load().predict(np.zeros((1, SIZE, SIZE, 3), np.uint8), verbose=0).shape == (1, 2)


@pytest.mark.parametrize("edit,refused", HOSTILE, ids=[edit.__name__.strip("_") for edit, _ in HOSTILE])
def test_a_run_folder_with_other_members_is_refused_on_the_driver_and_the_executors(exported, tmp_path, edit, refused):
    marker = str(tmp_path / "ran")
    run, path, digest = hostile_run(tmp_path / "run", exported, edit, marker)
    with pytest.raises(UnsafeModel, match=refused) as driver:  # resolve_model: before Spark starts
        resolve_model(run)
    assert EXPECTED in str(driver.value) and "refused before Keras opens it" in str(driver.value)
    with pytest.raises(UnsafeModel, match=refused):  # each executor's load
        load_model(KERAS, path, digest)
    assert not os.path.exists(marker)


def test_the_quick_predict_command_refuses_npz_weights_in_one_line(exported, tmp_path, capsys):
    from pipelines.predict.local import main

    marker = str(tmp_path / "ran")
    run, _, _ = hostile_run(tmp_path / "run", exported, _npz_weights, marker)
    image = tmp_path / "a.png"
    image.write_bytes(b"not read")
    assert main([str(image), "--model", run]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.weights.npz, which it may not hold" in err[0], err
    assert not os.path.exists(marker)


def test_keras_own_loader_runs_the_npz_pickle_on_the_mission_stack(exported, tmp_path):
    """The control: what the member check stands in front of. Keras 2.15 unpickles the npz's
    ``__root__`` (the marker is written); tf-keras 2.21 loads npz with pickling off."""
    from pipelines.stack.kerasapi import keras

    marker = str(tmp_path / "ran")
    _, path, _ = hostile_run(tmp_path / "run", exported, _npz_weights, marker)
    with pytest.raises(Exception):
        keras.models.load_model(path, compile=False, safe_mode=True)
    assert os.path.exists(marker) == (stacks.active().name == "mission")


def hostile_mlflow_model(folder, members, edit, marker):
    """A local MLflow model folder as ``mlflow.tensorflow.save_model`` writes one, its ``MLmodel``
    then naming Keras' zip format and its Keras file ``data/model.keras``, ``edit``'s archive (MLflow
    2.22 on TensorFlow 2.15 saves no zip format itself; a planted folder needs no MLflow)."""
    import mlflow.tensorflow
    from mlflow.models import Model
    from pipelines.stack.kerasapi import keras

    with open(folder.parent / "m.keras", "wb") as f:
        f.write(zip_bytes(members))
    model = keras.models.load_model(str(folder.parent / "m.keras"), compile=False)
    mlflow.tensorflow.save_model(model, str(folder), keras_model_kwargs={"save_format": "h5"},
                                 pip_requirements=[], metadata={"class_names": NAMES})
    conf = Model.load(str(folder))
    conf.flavors["tensorflow"]["save_format"] = "keras"
    conf.save(str(folder / "MLmodel"))
    os.remove(folder / "data" / "model.h5")
    with open(folder / "data" / "model.keras", "wb") as f:
        f.write(zip_bytes(edit(members, marker)))
    assert mlflow_model_file(str(folder)) == str(folder / "data" / "model.keras")
    return str(folder)


def test_an_mlflow_model_in_the_zip_format_with_the_exported_members_loads(exported, tmp_path):
    folder = hostile_mlflow_model(tmp_path / "model", exported, lambda members, marker: members, "")
    assert load_model(MLFLOW, folder).predict(np.zeros((1, SIZE, SIZE, 3), np.uint8), verbose=0).shape == (1, 2)


@pytest.mark.parametrize("edit,refused", HOSTILE[:4], ids=[edit.__name__.strip("_") for edit, _ in HOSTILE[:4]])
def test_an_mlflow_model_with_other_members_is_refused(exported, tmp_path, edit, refused):
    marker = str(tmp_path / "ran")
    folder = hostile_mlflow_model(tmp_path / "model", exported, edit, marker)
    with pytest.raises(UnsafeModel, match=refused):
        load_model(MLFLOW, folder)
    assert not os.path.exists(marker)


def test_a_registered_model_with_npz_weights_is_refused(exported, tmp_path, monkeypatch):
    """``models:/NAME/VERSION``: the registry serves the folder as it was logged; the download is
    checked before Keras opens it."""
    import mlflow

    monkeypatch.chdir(tmp_path)  # a SQLite store's artifacts go to ./mlruns
    marker = str(tmp_path / "ran")
    folder = hostile_mlflow_model(tmp_path / "model", exported, _npz_weights, marker)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # mlflow.set_tracking_uri exports it: put back after the test
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run() as run:
            mlflow.log_artifacts(folder, "model")
        mlflow.register_model(f"runs:/{run.info.run_id}/model", "planted")
        with pytest.raises(UnsafeModel, match=r"model.weights.npz, which it may not hold"):
            resolve_model("models:/planted/1", download_dir=str(tmp_path / "download"))
    finally:
        mlflow.set_tracking_uri(None)  # this process's URI unset, as the session set it up
    assert not os.path.exists(marker)
