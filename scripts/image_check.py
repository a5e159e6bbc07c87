"""Checks what `make main` left in an image's mounted output folder (scripts/image_test.sh).

Usage: python3 scripts/image_check.py FOLDER UID:GID

FOLDER holds ``main.log`` (the job's output) and ``out/`` (its OUT, mounted at /outputs/out in the
image). Passes (exit 0, one line) when the log's ``exact test accuracy`` line is the one
``out/train/metrics.json`` gives (its accuracy to 4 places, its test image and class counts), that
accuracy is above chance (1 / classes), every picture the report names is a PNG file in
``out/train``, no picture failed, and every file under FOLDER belongs to UID:GID (the caller).
Otherwise exit 1 with what differs. Standard library only: it runs on the host, not in the image.
"""
from __future__ import annotations

import json
import os
import posixpath
import re
import sys
from typing import List

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
IMAGE_OUT = "/outputs/out"  # where FOLDER/out is mounted in the image (scripts/image_test.sh)
ACCURACY_LINE = re.compile(r"^exact test accuracy: (\d\.\d{4}) on (\d+) images? \((\d+) class(?:es)?,", re.M)


def problems(folder: str, owner: str) -> List[str]:
    """What is wrong with FOLDER (empty list: nothing). ``owner`` is ``"UID:GID"``, decimal."""
    found: List[str] = []
    with open(os.path.join(folder, "main.log"), errors="replace") as f:
        log = f.read()
    with open(os.path.join(folder, "out", "train", "metrics.json")) as f:
        metrics = json.load(f)
    test, classes = metrics["test"], metrics["num_classes"]
    lines = ACCURACY_LINE.findall(log)
    want = (f"{test['accuracy']:.4f}", str(test["count"]), str(classes))
    if lines != [want]:
        found.append(f"exact test accuracy lines {lines}, metrics.json says {want}")
    if not test["accuracy"] > 1 / classes:
        found.append(f"test accuracy {test['accuracy']:.4f} is not above chance ({1 / classes:.3f})")
    if metrics.get("pictures_error") or not metrics.get("pictures"):
        found.append(f"no pictures: {metrics.get('pictures_error', 'metrics.json names none')}")
    for name, path in metrics.get("pictures", {}).items():
        local = os.path.join(folder, "out", posixpath.relpath(path, IMAGE_OUT))
        try:
            with open(local, "rb") as f:
                if f.read(len(PNG_MAGIC)) != PNG_MAGIC:
                    found.append(f"picture {name} ({local}) is not a PNG")
        except OSError as exc:
            found.append(f"picture {name}: {exc}")
    uid, gid = (int(part) for part in owner.split(":"))
    for root, dirs, files in os.walk(folder):
        for entry in [root] + [os.path.join(root, name) for name in files]:
            st = os.lstat(entry)
            if (st.st_uid, st.st_gid) != (uid, gid):
                found.append(f"{entry} belongs to {st.st_uid}:{st.st_gid}, not the caller {owner}")
                return found
    return found


def main(argv: List[str]) -> int:
    folder, owner = argv
    found = problems(folder, owner)
    for problem in found:
        print(f"[image-test] {folder}: {problem}", file=sys.stderr)
    if not found:
        with open(os.path.join(folder, "out", "train", "metrics.json")) as f:
            pictures = json.load(f)["pictures"]
        print(f"[image-test] {folder}: the accuracy line is metrics.json's, {len(pictures)} pictures "
              f"({', '.join(pictures)}), every file the caller's ({owner})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
