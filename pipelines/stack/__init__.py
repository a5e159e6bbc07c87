"""What differs between the project's two dependency stacks (``mission``, ``current``), said in one place.

Versions live in ``requirements/<stack>.in`` only. Standard library only: it runs before any venv exists."""
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
    """One stack: every difference between the stacks that code or tests act on.

    Attributes:
        keras_module: the Keras 2 API its code imports: ``tensorflow.keras`` or ``tf_keras``.
        environment: ``(variable, value)`` pairs ``import pipelines`` sets (None: removes) before TensorFlow loads.
        functional_module, loads_models_of, mlflow_schema: what its artefacts carry that the other stack reads."""
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
        """Whether the stack's ``.in`` file pins ``package``."""
        return package.lower() in pins(self.name)

    @property
    def zipcache(self) -> bool:
        """Whether PySpark's workers need ``pipelines.runtime.zipcache``'s patch on all its Pythons."""
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
    """Whether the Python ``(major, minor)`` (default this one) is older than ``ZIPIMPORT_FIXED_IN``."""
    return tuple(python[:2]) < ZIPIMPORT_FIXED_IN


def venv(name: str) -> str:
    """The stack's virtual environment, relative to the checkout (``.venv``, ``.venv-current``)."""
    return ".venv" if get(name).name == DEFAULT else f".venv-{name}"


class UnknownStack(ValueError):
    """A stack name not in ``STACKS``, or an installed TensorFlow that no stack pins."""


def get(name: str) -> Stack:
    """The stack called ``name``.

    Raises:
        UnknownStack: no such stack (the message lists the stacks)."""
    if name not in STACKS:
        raise UnknownStack(f"unknown stack {name!r}: the stacks are {', '.join(STACKS)}")
    return STACKS[name]


def requirements_file(name: str, kind: str = "in") -> str:
    """The path of ``requirements/<name>.<kind>`` (``in``: the pins as written; ``lock``: hashed)."""
    return os.path.join(REQUIREMENTS, f"{get(name).name}.{kind}")


def pins(name: str) -> Dict[str, str]:
    """The exact pins ``package -> version`` (lower-cased, no extras, no ranges) of the stack's ``.in`` file and
    its ``-r`` includes."""
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
    """The stack's Python versions (``major.minor``), preferred first, from its ``# python:`` line."""
    with open(requirements_file(name)) as f:
        for line in f:
            if line.startswith("# python:"):
                return tuple(line.split(":", 1)[1].split())
    raise UnknownStack(f"{requirements_file(name)} has no '# python:' line")


def installed_tensorflow() -> Optional[str]:
    """The installed TensorFlow's version (CPU or CUDA build) from its metadata, without importing it; else None."""
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("tensorflow-cpu", "tensorflow", "tensorflow-gpu"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return None


def active() -> Stack:
    """The stack whose ``tensorflow-cpu`` pin has the installed TensorFlow's ``major.minor``.

    Raises:
        UnknownStack: no TensorFlow is installed, or no stack pins its version."""
    installed = installed_tensorflow()
    minor = ".".join((installed or "").split(".")[:2])
    for stack in STACKS.values():
        if ".".join(pins(stack.name)["tensorflow-cpu"].split(".")[:2]) == minor:
            return stack
    wanted = ", ".join(f"{s.name}: {pins(s.name)['tensorflow-cpu']}" for s in STACKS.values())
    raise UnknownStack(f"TensorFlow {installed or '(not installed)'} is on no stack ({wanted})")


def main(argv) -> int:
    """``python -m pipelines.stack names | check NAME | pythons NAME``; exit 2 with one line on an unknown stack."""
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
