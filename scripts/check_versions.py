"""Fail unless the installed distributions have exactly the versions a stack pins.

Usage: python scripts/check_versions.py --stack NAME [--gpu]
       python scripts/check_versions.py NAME==VERSION [NAME==VERSION ...]
The Dockerfiles run the first after set-up, so that an image holds what requirements/<stack>.in
says (--gpu: ``tensorflow`` in place of ``tensorflow-cpu``, as the GPU lock has it).
"""
import os
import sys
from importlib.metadata import PackageNotFoundError, version


def wanted_pins(argv):
    """``[(name, version)]`` from ``--stack NAME [--gpu]`` or ``NAME==VERSION`` arguments."""
    if argv[:1] == ["--stack"] and len(argv) >= 2:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from pipelines import stack

        pins = stack.pins(argv[1])
        if "--gpu" in argv[2:]:
            pins["tensorflow"] = pins.pop("tensorflow-cpu")
        return sorted(pins.items())
    return [tuple(pin.partition("==")[::2]) for pin in argv]


def main(argv) -> int:
    bad, pins = [], wanted_pins(argv)
    for name, wanted in pins:
        try:
            got = version(name)
        except PackageNotFoundError:
            got = "not installed"
        if got != wanted:
            bad.append(f"{name}: wanted {wanted}, got {got}")
    if bad:
        print("version mismatch:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    print("versions ok:", ", ".join(f"{n}=={v}" for n, v in pins))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
