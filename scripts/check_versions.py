"""Fail unless the installed distributions have exactly the given versions.

Usage: python scripts/check_versions.py NAME==VERSION [NAME==VERSION ...]
The Dockerfiles run it after set-up, so that their ARGs are checked against what was installed.
"""
import sys
from importlib.metadata import PackageNotFoundError, version

bad = []
for pin in sys.argv[1:]:
    name, _, wanted = pin.partition("==")
    try:
        got = version(name)
    except PackageNotFoundError:
        got = "not installed"
    if got != wanted:
        bad.append(f"{name}: wanted {wanted}, got {got}")
if bad:
    sys.exit("version mismatch:\n  " + "\n  ".join(bad))
print("versions ok:", ", ".join(sys.argv[1:]))
