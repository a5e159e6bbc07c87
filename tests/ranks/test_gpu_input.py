"""``--xla on`` in Horovod ranks on the CPU: a rank of a world of 1 compiles the model's pass
and takes the steps Keras takes without it; 2 local ranks train with it (the input path:
tests/unit/training/test_gpu_input.py)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support.datagen import write_dataset
from tests.support.env import REPO, subprocess_env


XLA_STEP = """
import json, sys
import numpy as np
import horovod.tensorflow.keras as hvd
from pipelines.stack.kerasapi import keras
from pipelines.training.model.build import build_model, compile_distributed
hvd.init()
rng = np.random.default_rng(0)
x, y = rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8), np.arange(8) % 3
weights, traces, logged = {}, {}, {}
for xla in (False, True):
    keras.utils.set_random_seed(1)
    m = build_model(3, 16, dropout=0.0, weights="none", seed=1, backbone="tiny", stored_size=32)
    compile_distributed(m, 0.05, xla=xla)
    history = m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    weights[xla] = m.get_weights()
    traces[str(xla)], logged[str(xla)] = m.train_function.experimental_get_tracing_count(), sorted(history.history)
    if xla:
        jit = m.train_step.forward._jit_compile  # tf.function's own record of jit_compile=True
        hlo = m.train_step.forward.experimental_get_compiler_ir(x)(stage="hlo")
print(json.dumps({"max_difference": max(float(np.abs(a - b).max()) for a, b in zip(weights[False], weights[True])),
                  "jit": jit, "hlo": "HloModule" in hlo and "convolution" in hlo, "traces": traces,
                  "logged": logged}))
"""


@pytest.mark.slow
def test_xla_compiles_the_models_pass_and_trains_the_steps_keras_trains():
    """In a Horovod rank (world of 1): two steps with --xla on give the weights two steps without
    it give (the same gradients through Horovod's allreduce and Nadam), and the forward pass is an
    XLA computation (its HLO holds the backbone's convolutions). Either way fit traces its train
    step once (compile_distributed makes every variable of the step first) and logs loss and accuracy."""
    proc = subprocess.run([sys.executable, "-c", XLA_STEP], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["jit"] is True and result["hlo"] and result["max_difference"] < 1e-5, result
    assert result["traces"] == {"False": 1, "True": 1}, result
    assert result["logged"] == {"False": ["accuracy", "loss"], "True": ["accuracy", "loss"]}, result


def train_job(data, out, *args):
    return subprocess.run([sys.executable, os.path.join(REPO, "jobs", "train.py"), "--data", data, "--output", out,
                           "--weights", "none", "--backbone", "tiny", "--batch-size", "2", "--no-tensorboard",
                           "--no-tracking", *args], capture_output=True, text=True, timeout=420,
                          env=subprocess_env())


@pytest.mark.slow
def test_a_run_with_xla_on_trains_on_two_ranks(tmp_path):
    """--xla on through the launcher, 2 local ranks (allreduce over Gloo outside the XLA
    computation), the tiny backbone resizing 12 px uint8 images to 8 px inside the model."""
    data = str(tmp_path / "data")
    write_dataset(data, train_groups=[4, 4], test_groups=[3], size=12, rows_per_group=2)
    out = str(tmp_path / "out")
    proc = train_job(data, out, "--xla", "on", "--spark-np", "-2", "--epochs", "2", "--image-size", "8",
                     "--patience", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    assert m["config"]["xla"] == "on" and m["epochs_run"] == 2 and m["world_size"] == 2
    assert m["test"]["count"] == 6 and len(set(m["weights_checksum_per_rank"])) == 1
    assert all(np.isfinite(h["loss"]) for h in m["history"])
    with open(os.path.join(out, "model.json")) as f:
        contract = json.load(f)
    assert contract["input"]["dtype"] == "uint8" and contract["input"]["shape"] == [None, 12, 12, 3]
    assert contract["model_image_size"] == 8
