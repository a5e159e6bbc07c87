"""Each stack is one stack: its .in pins, its hash lock, the Dockerfiles and the installed venv agree."""
import glob
import os
import re
import subprocess
import sys
from importlib.metadata import version

import pytest

from pipelines import stack
from tests.support.env import REPO
from tests.support.locks import lock_pins

sys.path.insert(0, os.path.join(REPO, "scripts"))
import lockfile  # noqa: E402


def docker_args(name: str) -> dict:
    with open(os.path.join(REPO, "docker", name)) as f:
        return dict(re.findall(r"^ARG (\w+)=(\S+)$", f.read(), re.M))


def test_the_stacks_are_the_lock_files():
    locks = {os.path.basename(p)[:-len(".lock")] for p in glob.glob(os.path.join(stack.REQUIREMENTS, "*.lock"))}
    assert locks == set(stack.STACKS) | {"mission-gpu"} | {f"{name}-peers" for name in stack.STACKS}


def test_the_gpu_lock_is_the_mission_stack_with_tensorflow_for_cuda():
    gpu, pins = lock_pins("mission-gpu"), stack.pins("mission")
    assert gpu["tensorflow"] == pins.pop("tensorflow-cpu") and "tensorflow-cpu" not in gpu
    assert {package: gpu.get(package) for package in pins} == pins
    assert any(package.startswith("nvidia-nccl") for package in gpu)


@pytest.mark.parametrize("name", list(stack.STACKS))
def test_each_lock_pins_what_its_in_file_says_each_with_a_hash(name):
    locked = lock_pins(name)
    for package, wanted in stack.pins(name).items():
        assert locked.get(package) == wanted, (name, package)
    with open(stack.requirements_file(name, "lock")) as f:
        for package, lines in lockfile.blocks(f.read()).items():
            assert any("--hash=sha256:" in line for line in lines), (name, package)


def test_the_stacks_differ_where_the_issue_says():
    """The current stack is past CVE-2026-25087's Arrow C++ range (pyarrow >= 23.0.1), clears
    CVE-2026-0994 (protobuf 7) and
    runs a supported TensorFlow; the mission stack stays where Petastorm and TF 2.15 hold it."""
    mission, current = lock_pins("mission"), lock_pins("current")
    as_tuple = lambda v: tuple(int(p) for p in re.findall(r"\d+", v)[:3])  # noqa: E731
    assert as_tuple(current["pyarrow"]) >= (23, 0, 1) and as_tuple(current["protobuf"])[0] >= 7
    assert as_tuple(current["tensorflow-cpu"])[:2] == (2, 21) and current["tf-keras"] == current["tensorflow-cpu"]
    assert as_tuple(current["numpy"])[0] == 2 and as_tuple(current["pandas"])[0] < 3
    assert "petastorm" not in current and mission["petastorm"] == "0.13.1" and mission["pyarrow"] == "14.0.2"
    assert stack.pythons("current")[0] == "3.12" and stack.pythons("mission")[0] == "3.11"


def test_the_dockerfiles_take_the_stack_and_a_python_it_supports():
    cpu, gpu = docker_args("Dockerfile.cpu"), docker_args("Dockerfile.gpu")
    for args in (cpu, gpu):
        assert args["STACK"] in stack.STACKS and args["PYTHON_VERSION"] in stack.pythons(args["STACK"]), args
        assert args["JAVA_VERSION"] == "17"
        # no version of a package is written in a Dockerfile: they install the stack's lock
        assert not any(key.endswith("_VERSION") for key in args if key not in ("PYTHON_VERSION", "JAVA_VERSION"))
    assert gpu["STACK"] == "mission"  # the patch's CPU build leaves xla_mpi_ops.cc out: no CUDA build on current


def test_the_dockerfiles_take_their_base_as_an_argument_whose_default_is_the_official_image():
    """A local base (make image-test: one made from Debian's archive) builds the same file; the
    defaults stay the official images, the CPU one of the Python the stack defaults to."""
    cpu, gpu = docker_args("Dockerfile.cpu"), docker_args("Dockerfile.gpu")
    assert cpu["BASE_IMAGE"] == "python:${PYTHON_VERSION}-slim-bookworm"
    assert gpu["CUDA_IMAGE"].startswith("nvidia/cuda:") and "-cudnn" in gpu["CUDA_IMAGE"]
    for name, arg in (("Dockerfile.cpu", "BASE_IMAGE"), ("Dockerfile.gpu", "CUDA_IMAGE")):
        with open(os.path.join(REPO, "docker", name)) as f:
            text = f.read()
        assert re.findall(r"^FROM (.*)$", text, re.M) == ["${%s}" % arg], name


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_each_image_installs_its_stacks_lock_with_hashes_through_the_set_up_script(name):
    """No pip install of its own: the image's venv is scripts/setup_env.sh's (the lock, --require-hashes,
    Horovod's build flags), and the locked versions are checked in the image once installed."""
    with open(os.path.join(REPO, "docker", name)) as f:
        text = f.read()
    steps = re.findall(r"^RUN (.*?)(?<!\\)$", text, re.M | re.S)
    setup = [step for step in steps if "scripts/setup_env.sh /opt/venv" in step]
    assert len(setup) == 1 and "scripts/check_versions.py --stack ${STACK}" in setup[0], steps
    # pip's cache is mounted for the build only: a rebuild downloads nothing again, the image holds no cache
    assert setup[0].startswith("--mount=type=cache,target=/root/.cache/pip "), setup[0]
    assert not re.search(r"pip3? install|pip\.main", text), name
    with open(os.path.join(REPO, "scripts", "setup_env.sh")) as f:
        assert f.read().count("--require-hashes") >= 2  # the lock, then Horovod's sdist


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_each_image_runs_its_jobs_as_a_user_that_is_not_root(name):
    """The last USER of each image is its own unprivileged user, set after the last root step
    (the set-up, the copy of the checkout) and before what the image runs."""
    with open(os.path.join(REPO, "docker", name)) as f:
        steps = [line.split(None, 1) for line in f.read().splitlines() if line and not line.startswith((" ", "#"))]
    users = [i for i, (word, *_) in enumerate(steps) if word == "USER"]
    assert users, name
    last = users[-1]
    assert steps[last][1].strip() not in ("root", "0") and not steps[last][1].startswith("0:")
    assert any(word == "RUN" and "useradd" in rest[0] and steps[last][1].strip() in rest[0]
               for word, *rest in steps[:last])
    assert not [word for word, *_ in steps[last:] if word in ("RUN", "COPY", "ADD")], name  # nothing after as root
    assert "CMD" in [word for word, *_ in steps[last:]]


def test_the_build_context_leaves_out_history_venvs_outputs_stores_caches_and_credentials():
    """.dockerignore keeps from every image what `COPY . .` would otherwise take: .git, the
    virtual environments, out/, MLflow's and Spark's stores, caches, local credential files."""
    with open(os.path.join(REPO, ".dockerignore")) as f:
        patterns = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    kinds = {"history": {".git"}, "venvs": {".venv", ".venv-*"}, "outputs": {"out", "out-*"},
             "stores": {"mlruns", "**/*.db", "spark-warehouse", "metastore_db"},
             "caches": {"**/__pycache__", ".pytest_cache", ".cache", ".ipynb_checkpoints"},
             "credentials": {".env", "**/*.pem", "**/storage-options*.json"}}
    for kind, wanted in kinds.items():
        assert wanted <= patterns, (kind, wanted - patterns)
    # what the images need stays in: the code, the jobs, the locks, the set-up
    assert not {"pipelines", "jobs", "requirements", "scripts", "Makefile", "conf"} & patterns


def test_the_venv_has_every_locked_version():
    """Every pin of the active stack's lock is what is installed (the whole closure, not only the
    top-level pins)."""
    active = stack.active()
    for package, wanted in lock_pins(active.name).items():
        assert version(package) == wanted, (active.name, package)


@pytest.mark.slow
@pytest.mark.current  # starts processes that load TensorFlow: slow, and about the stack
def test_mlflow_and_tensorflow_import_together_and_open_a_sqlite_store(tmp_path):
    """One fresh interpreter, as rank 0 of a tracked run: TensorFlow on the stack's protobuf (on
    mission MLflow's own range would take protobuf 5+, which TensorFlow 2.15 cannot import), then
    MLflow's SQL store, then the stack's Keras 2 module."""
    code = ("import sys, pipelines, tensorflow as tf, mlflow, google.protobuf as pb; "
            "mlflow.MlflowClient(sys.argv[1]).search_experiments(); "
            "from pipelines.stack.kerasapi import keras_version; "
            "print(tf.__version__, mlflow.__version__, pb.__version__, keras_version())")
    out = subprocess.run([sys.executable, "-c", code, f"sqlite:///{tmp_path}/mlruns.db"], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
                         cwd=str(tmp_path))  # a plain MLflow client of a SQLite store makes ./mlruns where it runs
    assert out.returncode == 0, out.stderr[-3000:]
    pins = stack.pins(stack.active().name)
    keras_version = pins.get("tf-keras", pins["tensorflow-cpu"])  # Keras 2.15.0 ships with TF 2.15.1
    assert out.stdout.split()[:3] == [pins["tensorflow-cpu"], pins["mlflow"], pins["protobuf"]]
    assert out.stdout.split()[3].split(".")[:2] == keras_version.split(".")[:2]


def test_the_installed_stack_is_what_its_table_entry_says():
    """What only one stack has, read from the table, holds in this interpreter: Petastorm (and the
    default reader with it), the zipcache patch (its Python), its Keras 2 package, the variables
    ``import pipelines`` set or removed."""
    import importlib.util

    from pipelines.runtime import zipcache

    active = stack.active()
    assert active.has("petastorm") == (importlib.util.find_spec("petastorm") is not None)
    assert active.reader == ("petastorm" if active.has("petastorm") else "own")
    assert zipcache.NEEDED == active.zipcache == stack.needs_zipcache(sys.version_info[:2])
    assert version(active.keras_package) == lock_pins(active.name)[active.keras_package.replace("_", "-")]
    assert [os.environ.get(name) for name, _ in active.environment] == [value for _, value in active.environment]


def test_what_only_one_stack_has():
    mission, current = stack.get("mission"), stack.get("current")
    assert (mission.has("petastorm"), current.has("petastorm")) == (True, False)
    assert (mission.zipcache, current.zipcache) == (True, False)
    assert (mission.horovod_patch, os.path.isfile(os.path.join(REPO, current.horovod_patch))) == (None, True)
    assert not stack.needs_zipcache((3, 12)) and stack.needs_zipcache((3, 11))


def test_the_stack_is_detected_from_the_installed_tensorflow_without_importing_it():
    code = "import sys, pipelines.stack as s; print(s.active().name, 'tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == [stack.active().name, "False"], out.stderr


@pytest.mark.slow
@pytest.mark.current  # starts processes that load TensorFlow: slow, and about the stack
def test_a_process_that_imported_tensorflow_first_is_refused_on_the_current_stack():
    """TF_USE_LEGACY_KERAS must be set before ``tf.keras`` is first used (TF 2.21 reads it then): our
    Keras module refuses a process where it was not (tf.keras is Keras 3 there); on 2.15 there is
    nothing to refuse."""
    code = "import tensorflow as tf; tf.keras.Model; import pipelines.stack.kerasapi"
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if stack.active().name == "current":
        assert out.returncode == 1 and "TF_USE_LEGACY_KERAS=1" in out.stderr.strip().splitlines()[-1], out.stderr
    else:
        assert out.returncode == 0, out.stderr


@pytest.mark.slow
@pytest.mark.current  # starts processes that load TensorFlow: slow, and about the stack
def test_import_pipelines_sets_the_keras_variable_for_the_installed_stack():
    """Set on current (before TensorFlow), removed on mission, where TF 2.15 reads it too and
    ``tf.keras`` then fails to import (tf_keras is not installed there): even a user's own setting."""
    code = ("import os, pipelines, tensorflow as tf; from pipelines.stack.kerasapi import keras; "
            "print(os.environ.get('TF_USE_LEGACY_KERAS'), tf.keras.Model is keras.Model)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr[-2000:]
    expected = str(dict(stack.active().environment)["TF_USE_LEGACY_KERAS"])
    assert out.stdout.split() == [expected, "True"]


def test_the_keras_module_refuses_objects_of_another_keras_before_horovod_wraps_them():
    import tensorflow as tf

    from pipelines.stack.kerasapi import Keras3Error, keras, require_keras2

    require_keras2(model=keras.Sequential([keras.Input((1,))]), optimizer=keras.optimizers.SGD(0.1))
    require_keras2(optimizer=keras.optimizers.legacy.SGD(0.1))
    foreign = [tf.Module(), object()]
    if stack.active().name == "current":
        import keras as keras3
        foreign += [keras3.optimizers.SGD(0.1), keras3.Sequential([keras3.Input((1,))])]
    for thing in foreign:
        with pytest.raises(Keras3Error, match="Keras 2"):
            require_keras2(model=thing) if not hasattr(thing, "apply_gradients") else require_keras2(optimizer=thing)
    with pytest.raises(Keras3Error, match="optimizer"):
        require_keras2(optimizer=object())


def _discover(tmp_path, nvidia_smi=None):
    """Run the script with a PATH of only the text tools it uses and the given ``nvidia-smi`` (none: no GPU
    tool, even on a GPU host)."""
    import json
    import shutil
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("sed", "paste", "grep", "tr", "seq"):
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
