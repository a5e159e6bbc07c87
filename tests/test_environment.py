"""The stack is one stack: setup.cfg, both Dockerfiles and the installed venv agree."""
import configparser
import os
import re
import subprocess
import sys
from importlib.metadata import version

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def setup_pins() -> dict:
    config = configparser.ConfigParser()
    config.read(os.path.join(REPO, "setup.cfg"))
    lines = config["options"]["install_requires"].splitlines()
    for extra in ("cpu", "gpu"):
        lines += config["options.extras_require"][extra].splitlines()
    pins = {}
    for line in filter(None, (l.strip() for l in lines)):
        name, wanted = re.split(r"==", line)
        pins[re.sub(r"\[.*\]", "", name)] = wanted
    return pins


def docker_args(name: str) -> dict:
    with open(os.path.join(REPO, "docker", name)) as f:
        return dict(re.findall(r"^ARG (\w+)=(\S+)$", f.read(), re.M))


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_dockerfiles_name_the_versions_of_setup_cfg(dockerfile):
    pins, args = setup_pins(), docker_args(dockerfile)
    assert args["TENSORFLOW_VERSION"] == pins["tensorflow-cpu"] == pins["tensorflow"]
    for package in ("horovod", "pyspark", "petastorm", "pyarrow", "mlflow", "protobuf", "sqlalchemy"):
        assert args[f"{package.upper()}_VERSION"] == pins[package], package
    assert args["PYTHON_VERSION"] == "3.11" and args["JAVA_VERSION"] == "17"


def test_both_dockerfiles_agree():
    assert {k: v for k, v in docker_args("Dockerfile.cpu").items() if k != "CUDA_IMAGE"} == \
           {k: v for k, v in docker_args("Dockerfile.gpu").items() if k != "CUDA_IMAGE"}


def test_the_venv_has_the_pinned_versions():
    pins = setup_pins()
    for package in ("numpy", "pandas", "pyarrow", "pyspark", "petastorm", "diskcache", "pillow", "h5py", "horovod", "tensorflow-cpu",
                    "mlflow", "protobuf", "sqlalchemy"):
        assert version(package) == pins[package], package


def test_mlflow_and_tensorflow_import_together_and_open_a_sqlite_store(tmp_path):
    """One fresh interpreter, as rank 0 of a tracked run: TensorFlow 2.15 on the pinned protobuf
    (MLflow's own range would take protobuf 5+, which TensorFlow cannot import), then MLflow's SQL
    store (SQLAlchemy 2.1 breaks it at import)."""
    code = ("import sys, tensorflow as tf, mlflow, google.protobuf as pb; "
            "mlflow.MlflowClient(sys.argv[1]).search_experiments(); "
            "print(tf.__version__, mlflow.__version__, pb.__version__)")
    out = subprocess.run([sys.executable, "-c", code, f"sqlite:///{tmp_path}/mlruns.db"], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
                         cwd=str(tmp_path))  # a plain MLflow client of a SQLite store makes ./mlruns where it runs
    assert out.returncode == 0, out.stderr[-3000:]
    pins = setup_pins()
    assert out.stdout.split() == [pins["tensorflow-cpu"], pins["mlflow"], pins["protobuf"]]


def _discover(tmp_path, nvidia_smi=None):
    """Run the script with a PATH of only ``sed``, ``paste`` and the given ``nvidia-smi`` (none: no GPU
    tool, even on a GPU host)."""
    import json
    import shutil
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("sed", "paste"):
        os.symlink(shutil.which(tool), tools / tool)
    if nvidia_smi:
        (tools / "nvidia-smi").write_text(nvidia_smi)
        (tools / "nvidia-smi").chmod(0o755)
    out = subprocess.run([shutil.which("bash"), os.path.join(REPO, "scripts", "gpu_discovery.sh")],
                         capture_output=True, text=True, timeout=60, env={"PATH": str(tools)})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_gpu_discovery_script_lists_what_nvidia_smi_reports(tmp_path):
    """A fake ``nvidia-smi`` first on PATH answers the script's query with two GPU indices."""
    fake = ('#!/bin/sh\n[ "$1 $2" = "--query-gpu=index --format=csv,noheader" ] || exit 9\n'
            'printf "0\\n1\\n"\n')
    assert _discover(tmp_path, fake) == {"name": "gpu", "addresses": ["0", "1"]}


def test_gpu_discovery_script_offers_no_gpu_without_nvidia_smi(tmp_path):
    assert _discover(tmp_path) == {"name": "gpu", "addresses": []}
