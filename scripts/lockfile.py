"""Pick requirements out of a hash-locked requirements file (``requirements/<stack>.lock``).

Usage: python scripts/lockfile.py LOCK [--only NAME,...] [--without NAME,...]
       python scripts/lockfile.py LOCK --add-hashes DIR
The first prints the chosen requirement blocks (a pin with its ``--hash`` lines) to stdout, so that
the set-up installs the lock in steps that pip cannot take in one (Horovod builds against the
TensorFlow the first step installs). The second (scripts/lock.sh) rewrites LOCK, a pip-compile output
without hashes, giving each pin the sha256 of its files that ``pip download`` put in DIR (every
pin must have one). Standard library only.
"""
import argparse
import hashlib
import os
import re
import sys
from typing import Dict, List


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def file_pin(filename: str) -> str:
    """``name==version`` of a wheel or sdist file name (``tf_keras-2.21.0-py3-none-any.whl``)."""
    stem = filename[:-4] if filename.endswith(".whl") else re.sub(r"\.(tar\.gz|zip|tar\.bz2)$", "", filename)
    if filename.endswith(".whl"):
        name, version = stem.split("-")[:2]
    else:
        name, version = stem.rsplit("-", 1)
    return f"{normalize(name)}=={version}"


def add_hashes(lock: str, directory: str) -> None:
    """Give every pin of ``lock`` a ``--hash=sha256:...`` line per file of it in ``directory``.

    Raises:
        SystemExit: a pin without any file (pip download did not fetch it).
    """
    hashes: Dict[str, List[str]] = {}
    for filename in sorted(os.listdir(directory)):
        with open(os.path.join(directory, filename), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        hashes.setdefault(file_pin(filename), []).append(digest)
    out, missing = [], []
    for line in open(lock).read().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^]]*\])?==([^ ;\\]+)", line)
        if not match:
            out.append(line)
            continue
        pin = f"{normalize(match.group(1))}=={match.group(3)}"
        if pin not in hashes:
            missing.append(pin)
        out.append(line.rstrip(" \\") + " \\")
        out += [f"    --hash=sha256:{h} \\" for h in sorted(set(hashes.get(pin, [])))]
        out[-1] = out[-1][:-2]
    if missing:
        raise SystemExit(f"no file downloaded for {', '.join(missing)}")
    with open(lock, "w") as f:
        f.write("\n".join(out) + "\n")


def blocks(text: str) -> Dict[str, List[str]]:
    """``name -> lines`` of each requirement in a pip-compile lock: a pin line and the indented
    ``--hash``/comment lines under it (names lower-cased, ``_`` as ``-``)."""
    found: Dict[str, List[str]] = {}
    current = None
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            name = normalize(re.split(r"[=<>!~\[; ]", line, maxsplit=1)[0].strip())
            current = found.setdefault(name, [])
        elif not line.strip() or (line.startswith("#") and current is not None and not line.startswith("    ")):
            current = None
            continue
        if current is not None:
            current.append(line)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lock")
    parser.add_argument("--only", default="")
    parser.add_argument("--without", default="")
    parser.add_argument("--add-hashes", metavar="DIR")
    args = parser.parse_args(argv)
    if args.add_hashes:
        add_hashes(args.lock, args.add_hashes)
        return 0
    with open(args.lock) as f:
        found = blocks(f.read())
    only = [n for n in args.only.split(",") if n]
    without = set(n for n in args.without.split(",") if n)
    missing = [n for n in [*only, *without] if n not in found]
    if missing:
        print(f"{args.lock} pins no {', '.join(missing)}", file=sys.stderr)
        return 2
    for name, lines in found.items():
        if (not only or name in only) and name not in without:
            print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
