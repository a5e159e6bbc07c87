"""The input path on a GPU, checked on the CPU: uint8 batches to the model, which casts and
preprocesses where it runs; the last stage prefetches to the device TensorFlow sees (the choice
pure, tested with fake device lists; the copy stage itself run to the CPU device); batch inference
sends the same uint8 image; ``--xla on`` compiles the model's pass and trains, an unknown value is
refused before any rank starts."""
import subprocess
import sys

import numpy as np
import pytest

from tests.support.datagen import write_dataset
from tests.support.env import REPO, subprocess_env


@pytest.mark.parametrize("gpus, chosen", [
    ([], None),  # a CPU host: the host's prefetch only, no copy
    (["/device:GPU:0"], "/device:GPU:0"),  # a rank after apply_device: its own GPU, seen as GPU 0
    (["/device:GPU:0", "/device:GPU:1"], "/device:GPU:0"),  # a process seeing several: where Keras computes
])
def test_batches_are_prefetched_to_the_first_visible_gpu_else_stay_on_the_host(gpus, chosen):
    from pipelines.training.devices import prefetch_device
    assert prefetch_device(gpus) == chosen


def stages(ds):
    """The class names of a ``tf.data`` pipeline's stages, last first."""
    names = []
    while ds is not None:
        names.append(type(ds).__name__.lstrip("_"))
        ds = getattr(ds, "_input_dataset", None)
    return names


def uint8_rows(n=12, size=8):
    """``n`` constant images whose pixel value is their label (``0 .. n - 1``)."""
    import tensorflow as tf
    labels = np.arange(n, dtype=np.int32)
    images = np.broadcast_to(labels.astype(np.uint8)[:, None, None, None], (n, size, size, 3)).copy()
    return tf.data.Dataset.from_tensor_slices((images, labels))


def test_the_tail_sends_uint8_batches_through_a_device_copy_that_keras_fit_takes():
    """The tail's output is the stored bytes (4x fewer than float32), and with a device the last
    stages are the copy and a prefetch there; here the device is the CPU (no GPU on this host),
    which runs the same copy stage, and Keras' fit trains the model on it."""
    import tensorflow as tf

    from pipelines.contract import row_bytes
    from pipelines.training.data import batched
    from pipelines.training.model.build import build_model

    host = batched(uint8_rows(), 4)  # each ends with autotuning off (tfdata.without_autotune): OptionsDataset
    assert "CopyToDeviceDataset" not in stages(host) and stages(host)[:2] == ["OptionsDataset", "PrefetchDataset"]
    staged = batched(uint8_rows(), 4, device="/cpu:0")
    assert stages(staged)[:4] == ["OptionsDataset", "PrefetchDataset", "CopyToDeviceDataset", "PrefetchDataset"]
    assert not host.options().autotune.enabled and not staged.options().autotune.enabled
    images, labels = next(iter(staged))
    assert images.dtype == tf.uint8 and images.shape == (4, 8, 8, 3) and images.device.endswith("CPU:0")
    assert images.numpy().nbytes == 4 * row_bytes(8) == images.numpy().astype(np.float32).nbytes // 4
    np.testing.assert_array_equal(images.numpy()[:, 0, 0, 0], labels.numpy())  # each image with its label

    model = build_model(12, 8, dropout=0.0, weights="none", seed=1, backbone="tiny")
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    history = model.fit(staged.repeat(), steps_per_epoch=3, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()


def test_augmentation_flips_the_uint8_images_on_the_host_by_each_rows_key():
    """--augment in the tail: each row its image or that image mirrored, both occur, the coin drawn from the
    row's key (seed, position) alone: the same keys in another order and batching flip the same rows."""
    import tensorflow as tf

    from pipelines.training.data import batched
    images = np.repeat(np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3), 16, axis=0)
    keys = np.stack([np.full(32, 3), np.arange(32)], axis=1).astype(np.int64)
    rows = tf.data.Dataset.from_tensor_slices((images, np.arange(32, dtype=np.int32), keys))
    out, labels = (x.numpy() for x in next(iter(batched(rows, 32, augment=("flip",)))))
    assert out.dtype == np.uint8 and labels.tolist() == list(range(32))
    flipped = [bool((o == s[:, ::-1]).all()) for o, s in zip(out, images)]
    assert all(f or (o == s).all() for f, o, s in zip(flipped, out, images)) and 0 < sum(flipped) < 32
    again = batched(rows.shuffle(32, seed=5), 8, augment=("flip",))
    for got, label in ((x.numpy(), y.numpy()) for x, y in again):
        np.testing.assert_array_equal(got, out[label])
    with pytest.raises(ValueError, match="needs each row's key"):
        batched(tf.data.Dataset.from_tensor_slices((images, np.zeros(32, np.int32))), 32, augment=("flip",))


def test_batch_inference_sends_the_uint8_image_and_gets_the_models_own_probabilities(tmp_path):
    """What batch inference predicts (predict_columns, as the executors and python -m
    pipelines.predict run it) equals the exported model on the uint8 images directly: nothing is
    preprocessed outside the model, so nothing twice."""
    from PIL import Image

    from pipelines.predict.infer import decode_file, decode_stored, predict_columns
    from pipelines.predict.local import predict_files
    from pipelines.predict.model import resolve_model
    from pipelines.training.model.build import build_model
    from pipelines.training.model.export import export_model

    model = build_model(3, 8, dropout=0.0, weights="none", seed=1, backbone="tiny", stored_size=12)
    rng = np.random.default_rng(0)
    model.get_layer("head").set_weights([rng.normal(0, 2, (32, 3)).astype(np.float32), np.zeros(3, np.float32)])
    export_model(model, str(tmp_path / "model.keras"), 12, ["a", "b", "c"])
    spec = resolve_model(str(tmp_path))
    loaded = spec.load()
    images = rng.integers(0, 256, (5, 12, 12, 3), dtype=np.uint8)
    direct = loaded(images).numpy()
    assert direct.std() > 0.01  # probabilities that tell images apart

    columns = predict_columns(loaded, [image.tobytes() for image in images], None,
                              lambda value: decode_stored(value, 12), 3, spec.class_names)
    assert columns["top_labels"].tolist() == np.argsort(-direct, axis=1, kind="stable").tolist()
    np.testing.assert_allclose(columns["top_probabilities"], -np.sort(-direct, axis=1), rtol=1e-6, atol=1e-7)

    paths = []
    for i, image in enumerate(images):
        paths.append(str(tmp_path / f"{i}.png"))
        Image.fromarray(image).save(paths[-1])
    decoded = np.stack([decode_file(path, 12, 1 << 20) for path in paths])
    expected = loaded(decoded).numpy()
    rows = predict_files(paths, spec, top_k=3)
    np.testing.assert_allclose([r["top_probabilities"] for r in rows], -np.sort(-expected, axis=1), rtol=1e-6,
                               atol=1e-7)


MAIN = ("import runpy, sys; sys.argv = ['jobs/train.py', *sys.argv[1:]]\n"
        "try:\n    runpy.run_path('jobs/train.py', run_name='__main__')\n"
        "finally:\n    print('tensorflow loaded:', 'tensorflow' in sys.modules)\n")


@pytest.mark.parametrize("launch", [[], ["--spark-np", "-2"]])
def test_an_unknown_xla_value_exits_2_in_one_line_before_any_rank(tmp_path, launch, value="maybe"):
    """Alone, and launching 2 local ranks: exit 2, one line naming the value and the choices,
    TensorFlow never loaded, no rank started (no rank logs)."""
    data = str(tmp_path / "data")
    write_dataset(data, train_groups=[4], test_groups=[2], size=8)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", MAIN, "--data", data, "--output", str(out), "--weights", "none",
                           "--backbone", "tiny", "--xla", value, *launch], capture_output=True, text=True, cwd=REPO,
                          env=subprocess_env(), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"train.py: error: --xla {value}: choose one of off, on", proc.stderr
    assert proc.stdout.strip() == "tensorflow loaded: False"
    assert not out.exists()


@pytest.mark.parametrize("value", ["ON", "1", "", "true"])
def test_every_other_xla_value_is_refused_with_exit_2(value, capsys):
    from pipelines.runtime.config import parse_configs
    from pipelines.launch.config import LaunchConfig
    from pipelines.training.config import TrainConfig
    with pytest.raises(SystemExit) as info:
        parse_configs((TrainConfig, LaunchConfig), ["--data", "d", "--output", "o", "--xla", value])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"error: --xla {value}: choose one of off, on")


def test_xla_is_off_unless_asked_for():
    from pipelines.training.config import TrainConfig
    assert TrainConfig(data="d", output="o").compute.xla == "off"
    assert not TrainConfig(data="d", output="o").compute.xla_on
    assert TrainConfig(data="d", output="o", xla="on").compute.xla_on
