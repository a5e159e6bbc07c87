"""What differs between the project's two dependency stacks, said in one place.

- ``mission``: TensorFlow 2.15 (Keras 2 is ``tf.keras``), Horovod 0.28.1 as released, Petastorm's
  reader on pyarrow 14, Python 3.11. The default.
- ``current``: TensorFlow 2.21 with the Keras 2 API from ``tf_keras`` (``tf.keras`` and ``import
  keras`` are Keras 3 there, which Horovod's ``DistributedOptimizer`` wraps without averaging),
  Horovod 0.28.1 with ``scripts/patches/horovod-0.28.1-current.patch``, the project's own Parquet
  reader (Petastorm cannot import pyarrow >= 16), Python 3.12 and 3.13.

Each stack's versions are written once, in ``requirements/<stack>.in`` (with the Python versions
it supports on its ``# python:`` line); ``requirements/<stack>.lock`` is generated from it with
hashes and is what ``scripts/setup_env.sh`` installs. This module, the package's table, reads
those files and needs only the standard library (the set-up script and the Makefile run it before
any venv exists: ``python3 -m pipelines.stack``); :mod:`pipelines.stack.kerasapi` is the Keras 2
API of the stack installed here.
Python's own difference, CPython gh-103200 fixed in 3.12 (:mod:`pipelines.runtime.zipcache`'s
patch below it), is :data:`ZIPIMPORT_FIXED_IN` here.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Dict, NamedTuple, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
REQUIREMENTS = os.path.join(ROOT, "requirements")
DEFAULT = "mission"
# A `.in` line starting so names a pin that `make lock` hashes and the set-up installs with --no-deps
NO_DEPS = "# no-deps:"


# CPython gh-103200 (every importlib.invalidate_caches() re-reads each zip archive's whole
# directory, as PySpark's worker does at each task's start) is fixed in 3.12: a stack whose Pythons
# are older needs pipelines.runtime.zipcache's patch (the mission stack's 3.11).
ZIPIMPORT_FIXED_IN = (3, 12)


class Stack(NamedTuple):
    """One stack, every difference between the stacks that code or tests act on (its versions are
    :func:`pins`, its Pythons :func:`pythons`).

    Attributes:
        name: ``mission`` or ``current``.
        keras_module: the Keras 2 API its training code imports (:mod:`pipelines.stack.kerasapi`):
            ``tensorflow.keras`` (TF 2.15) or ``tf_keras`` (TF 2.21, whose ``tf.keras`` and
            ``keras`` are Keras 3, which Horovod's ``DistributedOptimizer`` wraps without averaging).
        keras_package: the distribution and import name of that Keras 2 (``keras`` 2.15, which
            TF 2.15's ``tf.keras`` is; ``tf_keras``): its version, its source.
        environment: ``(variable, value)`` pairs that ``import pipelines`` sets (a value) or
            removes (``None``) in every process of the stack, before TensorFlow loads.
            ``TF_USE_LEGACY_KERAS=1`` makes TF 2.21's own ``tf.keras`` the same Keras 2
            (tf_keras), which MLflow's TensorFlow flavour relies on (without it 12 of Horovod's 13
            Keras tests fail); TF 2.15 reads it too, and ``tf.keras`` then fails to import (no
            tf_keras there): removed, even a user's own.
        reader: the reader of training data it uses by default, ``--reader``'s name: ``petastorm``
            (Petastorm 0.13.1 runs on pyarrow < 15 only) or ``own``.
        horovod_patch: the patch its Horovod is built with (a path in the checkout), or ``None``.
        functional_module: the module a ``.keras`` file it saves names for a functional model;
        loads_models_of: the stacks whose ``.keras`` files its Keras loads (Keras 2.15 cannot
            import ``tf_keras``' module);
        mlflow_schema: the alembic revision its MLflow leaves a SQLite tracking store at
            (``alembic_version``). These three are what its artefacts carry that the other stack
            reads (docs/stacks.md, "What moves between the stacks"; tests/e2e/test_cross_stack.py checks
            them against the installed libraries).
    """
    name: str
    keras_module: str
    keras_package: str
    environment: Tuple[Tuple[str, Optional[str]], ...]
    reader: str
    horovod_patch: Optional[str]
    functional_module: str
    loads_models_of: Tuple[str, ...]
    mlflow_schema: str

    def has(self, package: str) -> bool:
        """Whether the stack installs ``package`` (its ``requirements/<stack>.in`` pins it):
        ``petastorm`` is the mission stack's alone."""
        return package.lower() in pins(self.name)

    @property
    def zipcache(self) -> bool:
        """Whether PySpark's workers need :mod:`pipelines.runtime.zipcache`'s patch on its Pythons
        (all older than :data:`ZIPIMPORT_FIXED_IN`): the mission stack's alone."""
        return all(needs_zipcache(tuple(map(int, python.split(".")))) for python in pythons(self.name))


STACKS: Dict[str, Stack] = {
    "mission": Stack("mission", keras_module="tensorflow.keras", keras_package="keras",
                     environment=(("TF_USE_LEGACY_KERAS", None),), reader="petastorm", horovod_patch=None,
                     functional_module="keras.src.engine.functional", loads_models_of=("mission",),
                     mlflow_schema="0584bdc529eb"),
    "current": Stack("current", keras_module="tf_keras", keras_package="tf_keras",
                     environment=(("TF_USE_LEGACY_KERAS", "1"),), reader="own",
                     horovod_patch="scripts/patches/horovod-0.28.1-current.patch",
                     functional_module="tf_keras.src.engine.functional", loads_models_of=("current", "mission"),
                     mlflow_schema="dc11669786a5"),
}


def needs_zipcache(python: Tuple[int, ...] = tuple(sys.version_info[:2])) -> bool:
    """Whether the Python ``python`` (``(major, minor)``; default this one) needs
    :mod:`pipelines.runtime.zipcache`'s patch: older than :data:`ZIPIMPORT_FIXED_IN`."""
    return tuple(python[:2]) < ZIPIMPORT_FIXED_IN


def venv(name: str) -> str:
    """The stack's virtual environment, relative to the checkout (``.venv``, ``.venv-current``)."""
    return ".venv" if get(name).name == DEFAULT else f".venv-{name}"


class UnknownStack(ValueError):
    """A stack name that is not one of :data:`STACKS`, or an installed TensorFlow no stack pins."""


def get(name: str) -> Stack:
    """The stack called ``name``.

    Raises:
        UnknownStack: no such stack (the message lists the stacks).
    """
    if name not in STACKS:
        raise UnknownStack(f"unknown stack {name!r}: the stacks are {', '.join(STACKS)}")
    return STACKS[name]


def requirements_file(name: str, kind: str = "in") -> str:
    """The path of ``requirements/<name>.<kind>`` (``in``: the pins as written; ``lock``: hashed)."""
    return os.path.join(REQUIREMENTS, f"{get(name).name}.{kind}")


def pins(name: str) -> Dict[str, str]:
    """The exact pins ``package -> version`` written in the stack's ``.in`` file and the files it
    includes with ``-r``, :data:`NO_DEPS` lines included (names lower-cased, extras dropped; ranges
    such as ``setuptools<70`` are left out: the lock file holds what they resolved to)."""
    found: Dict[str, str] = {}

    def read(path: str) -> None:
        with open(path) as f:
            for line in f:
                if line.startswith(NO_DEPS):  # installed without its dependencies, still pinned here
                    line = line[len(NO_DEPS):]
                line = line.split("#", 1)[0].strip()
                if line.startswith("-r "):
                    read(os.path.join(os.path.dirname(path), line[3:].strip()))
                elif "==" in line:
                    package, version = line.split("==", 1)
                    found[re.sub(r"\[.*\]", "", package).strip().lower()] = version.strip()

    read(requirements_file(name))
    return found


def pythons(name: str) -> Tuple[str, ...]:
    """The Python versions (``major.minor``) the stack supports, preferred first: its ``.in`` file's
    ``# python:`` line."""
    with open(requirements_file(name)) as f:
        for line in f:
            if line.startswith("# python:"):
                return tuple(line.split(":", 1)[1].split())
    raise UnknownStack(f"{requirements_file(name)} has no '# python:' line")


def installed_tensorflow() -> Optional[str]:
    """The installed TensorFlow distribution's version (CPU or CUDA build), from its metadata:
    TensorFlow itself is not imported. None when none is installed."""
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("tensorflow-cpu", "tensorflow", "tensorflow-gpu"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return None


def active() -> Stack:
    """The stack installed in this interpreter: the one whose ``tensorflow-cpu`` pin has the
    installed TensorFlow's ``major.minor`` (the GPU image installs ``tensorflow`` of the same version).

    Raises:
        UnknownStack: no TensorFlow is installed, or its version is on no stack.
    """
    installed = installed_tensorflow()
    minor = ".".join((installed or "").split(".")[:2])
    for stack in STACKS.values():
        if ".".join(pins(stack.name)["tensorflow-cpu"].split(".")[:2]) == minor:
            return stack
    wanted = ", ".join(f"{s.name}: {pins(s.name)['tensorflow-cpu']}" for s in STACKS.values())
    raise UnknownStack(f"TensorFlow {installed or '(not installed)'} is on no stack ({wanted})")


def main(argv) -> int:
    """``python -m pipelines.stack names`` prints the stacks; ``... check NAME`` exits 2 with one
    line for an unknown one; ``... pythons NAME`` prints its Python versions."""
    try:
        if argv[:1] == ["names"]:
            print(" ".join(STACKS))
        elif argv[:1] == ["check"] and len(argv) == 2:
            get(argv[1])
        elif argv[:1] == ["pythons"] and len(argv) == 2:
            print(" ".join(pythons(argv[1])))
        else:
            print("usage: python3 -m pipelines.stack names | check NAME | pythons NAME", file=sys.stderr)
            return 2
    except UnknownStack as error:
        print(error, file=sys.stderr)
        return 2
    return 0
