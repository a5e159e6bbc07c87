"""The pins of a stack's hash lock (requirements/<name>.lock), read with the set-up's own parser."""
import os
import re
import sys

from pipelines import stack
from tests.support.env import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))
import lockfile  # noqa: E402


def lock_pins(name: str) -> dict:
    """``package -> version`` of every pin in ``requirements/<name>.lock``."""
    with open(os.path.join(stack.REQUIREMENTS, f"{name}.lock")) as f:
        blocks = lockfile.blocks(f.read())
    return {package: re.search(r"==([^ ;\\]+)", lines[0]).group(1) for package, lines in blocks.items()}
