"""``--weights imagenet`` resolved once before any rank trains (pipelines/training/model/imagenet.py): Keras'
cache, its URL and hash, a fetch from a real URL, and offline refusals, before TensorFlow loads.

Offline is made deterministic, whatever network the machine has: Keras' cache is an empty HOME,
and every HTTP(S) request goes through a proxy at a local port that is bound but never listens
(connection refused at once); no_proxy is emptied so nothing bypasses it.
"""
import ast
import importlib.util
import os
import subprocess
import sys

import pytest

from pipelines.backbones import BACKBONES, KerasFile
from pipelines.training.model.imagenet import (WeightsUnavailable, ensure_imagenet_weights, ensure_keras_file,
                                               keras_cache_dir, md5_of)
from tests.support.env import REPO
from tests.support.offline import manifest, offline, offline_env

SPEC = BACKBONES["xception"].imagenet


@pytest.fixture
def offline_here(tmp_path, refused_port, monkeypatch):
    """This process offline, its Keras cache under ``tmp_path/home``; returns that home."""
    home = tmp_path / "home"
    home.mkdir()
    for key, value in offline(home, refused_port).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("KERAS_HOME", raising=False)
    return home


def source_file(url: str, data: bytes, tmp_path) -> KerasFile:
    path = tmp_path / "served" / "weights.h5"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    import hashlib
    return KerasFile("weights.h5", path.as_uri() if url == "file" else url, hashlib.md5(data).hexdigest())


def string_value(node, constants):
    """A module's string expression: a literal, a module constant's name, or their ``+``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return string_value(node.left, constants) + string_value(node.right, constants)
    if isinstance(node, ast.Name):
        return constants[node.id]
    return ast.literal_eval(node)


def get_file_calls(path):
    """``{file name: (url, keywords)}`` of every ``get_file`` call in the Keras source file ``path``."""
    tree = ast.parse(open(path).read())
    constants = {}
    for node in tree.body:  # in order: a constant may be built from an earlier one
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = string_value(node.value, constants)
            except (ValueError, KeyError, TypeError):
                pass
    calls = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get_file" and len(node.args) >= 2 \
                and isinstance(node.args[0], ast.Constant):
            try:  # a name built at run time (an f-string, a variable) is none of ours
                calls[node.args[0].value] = (string_value(node.args[1], constants),
                                             {k.arg: ast.literal_eval(k.value) for k in node.keywords})
            except (ValueError, KeyError, TypeError):
                pass
    return calls


@pytest.mark.parametrize("backbone", [b.name for b in BACKBONES.values() if b.imagenet])
def test_the_urls_and_hashes_are_keras_own(backbone):
    """Read from the installed Keras 2's source (no TensorFlow import; the stack's Keras 2 package:
    ``keras`` 2.15 on mission, ``tf_keras`` on current): each pretrained backbone's no-top file name,
    URL and md5 as one of its applications' get_file calls has them."""
    from pipelines import stack
    spec = BACKBONES[backbone].imagenet
    package = stack.active().keras_package
    folder = os.path.join(importlib.util.find_spec(package).submodule_search_locations[0], "src", "applications")
    calls = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            calls.update(get_file_calls(os.path.join(folder, name)))
    assert calls[spec.name] == (spec.url, {"cache_subdir": spec.subdir, "file_hash": spec.md5})


def test_a_file_in_keras_cache_is_used_and_nothing_fetched(offline_here, tmp_path):
    spec = source_file("http://127.0.0.1:1/never-asked", b"weights", tmp_path)
    cached = os.path.join(keras_cache_dir(), spec.name)
    assert cached == str(offline_here / ".keras" / "models" / spec.name)
    os.makedirs(os.path.dirname(cached))
    with open(cached, "wb") as f:
        f.write(b"weights")
    assert ensure_keras_file(spec) == cached


def test_a_missing_or_damaged_file_is_fetched_once_into_keras_cache(offline_here, tmp_path):
    spec = source_file("file", b"the real weights", tmp_path)
    cached = ensure_keras_file(spec)
    assert open(cached, "rb").read() == b"the real weights" and md5_of(cached) == spec.md5
    with open(cached, "wb") as f:
        f.write(b"half a fi")  # Keras would download it again: so do we
    assert ensure_keras_file(spec) == cached and open(cached, "rb").read() == b"the real weights"
    assert os.listdir(os.path.dirname(cached)) == [spec.name]  # no temporary file left


def test_a_download_with_another_hash_is_refused_and_leaves_nothing(offline_here, tmp_path):
    spec = source_file("file", b"something else", tmp_path)
    with pytest.raises(ValueError, match=f"Keras expects {'0' * 32}"):
        ensure_keras_file(KerasFile(spec.name, spec.url, "0" * 32))
    assert os.listdir(keras_cache_dir()) == []


def test_offline_imagenet_is_one_line_naming_what_to_do(offline_here):
    with pytest.raises(WeightsUnavailable) as info:
        ensure_imagenet_weights("xception", "imagenet", timeout_s=10)
    message = str(info.value)
    cached = os.path.join(keras_cache_dir(), SPEC.name)
    assert "\n" not in message and message.startswith("--weights imagenet: xception's ImageNet weights are not")
    assert "Connection refused" in message and SPEC.url in message and cached in message
    assert "--weights none" in message and "--weights PATH" in message
    assert "python -m pipelines.tools.weights" in message
    assert os.listdir(keras_cache_dir()) == []


def test_offline_imagenet_of_a_backbone_without_an_offline_source_names_no_converter(offline_here):
    with pytest.raises(WeightsUnavailable) as info:
        ensure_imagenet_weights("densenet121", "imagenet", timeout_s=10)
    message = str(info.value)
    assert message.startswith("--weights imagenet: densenet121's ImageNet weights are not")
    assert BACKBONES["densenet121"].imagenet.url in message and "pipelines.tools.weights" not in message


@pytest.mark.parametrize("backbone, weights", [("xception", "none"), ("xception", "/some/file.h5"), ("tiny", "none")])
def test_other_weights_need_nothing_fetched(offline_here, backbone, weights):
    assert ensure_imagenet_weights(backbone, weights) is None
    assert not (offline_here / ".keras").exists()


# jobs/train.py's main, saying afterwards whether TensorFlow was imported
MAIN = ("import runpy, sys; sys.argv = ['jobs/train.py', *sys.argv[1:]]\n"
        "try:\n    runpy.run_path('jobs/train.py', run_name='__main__')\n"
        "finally:\n    print('tensorflow loaded:', 'tensorflow' in sys.modules)\n")


@pytest.mark.parametrize("how, env, launch, where", [
    ("alone", {}, [], "[train]"),
    ("rank 0 under horovodrun", {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, [], "[train rank 0]"),
    ("launching local ranks", {}, ["--spark-np", "-2"], "[train driver]"),
])
def test_offline_training_exits_2_in_one_line_before_tensorflow_and_any_rank(how, env, launch, where, tmp_path,
                                                                            refused_port):
    """The default --weights imagenet on an offline machine with an empty Keras cache: exit 2, one
    ERROR line, no traceback, TensorFlow never imported, no rank started (no rank logs), nothing
    left in Keras' cache."""
    home, out = tmp_path / "home", tmp_path / "out"
    home.mkdir()
    args = ["--data", manifest(tmp_path / "etl"), "--output", str(out), "--batch-size", "2", *launch]
    proc = subprocess.run([sys.executable, "-c", MAIN, *args], capture_output=True, text=True, cwd=REPO,
                          env=offline_env(home, refused_port, **env), timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout.strip() == "tensorflow loaded: False"
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and where in errors[0] and "--weights imagenet: xception's ImageNet weights" in errors[0]
    assert "--weights none" in errors[0] and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) <= 2, proc.stderr  # the error and the line saying what it fetched
    assert not (out / "logs").exists() and "rank 1" not in proc.stderr and "HorovodRunner" not in proc.stderr
    assert os.listdir(home / ".keras" / "models") == []


def test_the_notebooks_refuse_before_any_rank_too(offline_here, tmp_path):
    from pipelines import notebook
    with pytest.raises(WeightsUnavailable, match="Connection refused"):
        notebook.train(notebook.LaunchConfig(np=-2), data=manifest(tmp_path / "etl"), output=str(tmp_path / "out"), batch_size=2,
                       tracking=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a horovodrun job
def test_the_ranks_find_the_file_where_the_launcher_put_it(tmp_path, refused_port):
    """The launcher's fetch (no TensorFlow) and a rank's Keras (get_file, as Xception calls it)
    agree on the file: with the network refused, Keras returns our file instead of downloading."""
    home = tmp_path / "home"
    home.mkdir()
    env = offline_env(home, refused_port)
    place = ("from pipelines.training.model.imagenet import keras_cache_dir; from pipelines.backbones import BACKBONES; "
             "import os; s = BACKBONES['xception'].imagenet; "
             "p = os.path.join(keras_cache_dir(s.subdir), s.name); os.makedirs(os.path.dirname(p)); "
             "open(p, 'wb').write(b'ours'); print(p)")
    placed = subprocess.run([sys.executable, "-c", place], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=60, check=True).stdout.strip()
    keras = ("import sys, tensorflow as tf; s = sys.argv[1:]; "
             "print(tf.keras.utils.get_file(s[0], s[1], cache_subdir=s[2]))")  # no hash: our file is no real one
    found = subprocess.run([sys.executable, "-c", keras, SPEC.name, SPEC.url, SPEC.subdir], capture_output=True,
                           text=True, env=env, cwd=REPO, timeout=300)
    assert found.returncode == 0, found.stderr[-3000:]
    assert found.stdout.strip().splitlines()[-1] == placed == str(home / ".keras" / "models" / SPEC.name)
