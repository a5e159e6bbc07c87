"""Byte-identical input files: one copy is written, every other copy is a recorded rejection.

Trees gathered from the web hold the same photo more than once, under one class or under two.
Split file by file, the copies could land in train and in test, and the test figure would then
be measured partly on training images. So before the split the ETL hashes every candidate's bytes
(``sha256``, in a first Spark pass: :func:`pipelines.etl.transform.hash_chunks`) and keeps one
file per hash (:func:`duplicates`); only the kept files are split, so each content is in one
split only.

The rule, a pure function of the set of ``(relative path, class, hash)``: in each group of files
with the same bytes, the file with the smallest relative path (Python's ``str`` order: by code
point, so by the bytes of its UTF-8 name) is kept, in its class. Every other copy is rejected:

* ``"duplicate: same bytes as <kept path>"`` when it is in the kept file's class;
* ``"label conflict: same bytes as <kept path> in class <name>"`` when it is in another class (the
  same image labelled twice): it is recorded, and the kept file's class wins.

A file its hash pass could not read has no hash and stays a candidate: the main pass reads it again
and records why it cannot be used.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

DUPLICATE = "duplicate"
LABEL_CONFLICT = "label conflict"


def duplicates(files: Iterable[Tuple[str, int, str, str]]) -> Dict[str, str]:
    """The copies not kept, with why.

    Args:
        files: ``(relative_path, label, label_name, sha256)`` of each hashed candidate (any order;
            paths unique).

    Returns:
        ``{relative_path: reason}`` for every file of a hash group but the group's smallest relative
        path (see the module for the reasons' wording); ``{}`` when all hashes differ. The same
        for any order of ``files``.
    """
    groups: Dict[str, List[Tuple[str, int, str]]] = {}
    for relative_path, label, label_name, digest in files:
        groups.setdefault(digest, []).append((relative_path, label, label_name))
    rejected: Dict[str, str] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort()
        kept, kept_label, kept_name = members[0]
        for relative_path, label, _ in members[1:]:
            if label == kept_label:
                rejected[relative_path] = f"{DUPLICATE}: same bytes as {kept}"
            else:
                rejected[relative_path] = f"{LABEL_CONFLICT}: same bytes as {kept} in class {kept_name}"
    return rejected
