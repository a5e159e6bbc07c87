"""The loader, training and resume figures of this checkout beside an earlier commit's, measured in one run.

Both trees (this checkout, and ``--ref`` exported with ``git archive``) run the same whole processes
on the same Fashion-MNIST images, taking turns, ``--repeats`` times each:

- loader: the tree's own ``benchmarks/loader_bench.py`` (32 MiB row groups): images/s of each path;
- training: ``jobs/train.py`` alone on the tree's own ETL output, Xception with random weights and
  ``--augment`` (a flip: the augmentation path of each tree), step checkpoints every
  ``steps_per_epoch + 2`` steps: images/s of epochs 2 on, and the run's wall;
- resume: the same run killed after step 2 of epoch 2, then ``--resume``: the resumed run's wall,
  and whether its final weights equal the uninterrupted run's bit for bit.

Printed: each figure's median per tree and this tree's ratio to the commit's (above 1: this tree
is faster, or for walls, slower).

Usage: python benchmarks/versus_commit.py [--ref 9011832] [--repeats 2] [--per-class 50]
       [--image-size 71] [--epochs 3] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOADER_LINE = re.compile(r"^\s+(own|petastorm), ((?:reader alone, )?(?:cold|warm|no) cache \(epoch \d\))\s+(\d+) images/s",
                         re.M)


def export(ref: str, dest: str) -> None:
    """Write the tree of commit ``ref`` into ``dest`` (no .git: a plain copy, the repository untouched)."""
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", REPO, "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)


def run(tree: str, argv: List[str], env: Dict[str, str], timeout: float = 1800) -> float:
    """Run ``python ARGV`` with ``tree``'s package first on the path; return its wall seconds.

    Raises:
        RuntimeError: the process failed (its last output in the message)."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, *argv], cwd=tree, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": tree, "PIPELINES_TRACKING": "0", **env})
    wall = time.monotonic() - start
    if proc.returncode != 0 and not env.get("PIPELINES_FAULT_INJECT"):
        raise RuntimeError(f"{tree}: {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    run.last = proc.stdout + proc.stderr  # type: ignore[attr-defined]
    return wall


def loader(tree: str, work: str, per_class: int, size: int) -> Dict[str, float]:
    """``loader_bench.py`` of ``tree`` (our reader and Petastorm's): images/s by path."""
    run(tree, ["benchmarks/loader_bench.py", "--per-class", str(per_class), "--etl-image-size", str(size),
               "--row-group-mb", "32", "--readers", "own,petastorm", "--workdir", work], {})
    return {f"loader, {reader}, {path}": float(rate) for reader, path, rate in LOADER_LINE.findall(run.last)}


def training(tree: str, data: str, work: str, epochs: int, steps_per_epoch: int) -> Dict[str, float]:
    """One uninterrupted run, one killed after epoch 2's step 2 and its resume: images/s, walls, equality."""
    args = ["jobs/train.py", "--data", data, "--weights", "none", "--batch-size", "8", "--epochs", str(epochs),
            "--patience", str(epochs), "--augment", "--no-tensorboard", "--seed", "7",
            "--checkpoint-every-steps", str(steps_per_epoch + 2)]
    whole, cut = os.path.join(work, "whole"), os.path.join(work, "cut")
    wall = run(tree, [*args, "--output", whole, "--cache-dir", whole + "-cache"], {})
    run(tree, [*args, "--output", cut, "--cache-dir", cut + "-cache"], {"PIPELINES_FAULT_INJECT": "rank=0,epoch=2,step=2,mode=kill"})
    resumed = run(tree, [*args, "--output", cut, "--cache-dir", cut + "-cache", "--resume"], {})
    metrics = [json.load(open(os.path.join(out, "metrics.json"))) for out in (whole, cut)]
    rates = [h["train_images_per_second"] for h in metrics[0]["history"][1:]]
    same = metrics[0]["weights_checksum_per_rank"] == metrics[1]["weights_checksum_per_rank"]
    return {"training, images/s (epochs 2 on)": statistics.median(rates), "training, wall s": wall,
            "resume, wall s of the resumed run": resumed, "resume, same weights as uninterrupted (1 = yes)": float(same)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", default="9011832", help="the commit to measure against")
    parser.add_argument("--repeats", type=int, default=2, help="turns of each tree (median reported)")
    parser.add_argument("--per-class", type=int, default=50, help="Fashion-MNIST images per class (10 classes)")
    parser.add_argument("--image-size", type=int, default=71, help="the ETL's image size, px")
    parser.add_argument("--epochs", type=int, default=3, help="training epochs (at least 3: the kill is in epoch 2)")
    parser.add_argument("--workdir", default=None, help="where the trees, data and runs go (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.epochs < 3:
        parser.error("--repeats must be >= 1 and --epochs >= 3")
    work = args.workdir or tempfile.mkdtemp(prefix="versus-")
    trees = {"this": REPO, args.ref: os.path.join(work, "ref")}
    if not os.path.isdir(trees[args.ref]):
        export(args.ref, trees[args.ref])
    images = os.path.join(work, "images")
    if not os.path.isdir(images):
        run(REPO, ["-m", "pipelines.tools.samples", "fashion-mnist", "--dest", images,
                   "--per-class", str(args.per_class)], {})
    data, steps = {}, {}
    for name, tree in trees.items():  # each tree's own ETL of the same images
        data[name] = os.path.join(work, f"etl-{name}")
        if not os.path.exists(os.path.join(data[name], "manifest.json")):
            run(tree, ["jobs/etl.py", "--input", images, "--output", data[name], "--image-size", str(args.image_size)], {})
        rows = json.load(open(os.path.join(data[name], "manifest.json")))["splits"]["train"]["rows"]
        steps[name] = rows // 8
    figures: Dict[str, Dict[str, List[float]]] = {name: {} for name in trees}
    for turn in range(args.repeats):
        for name in (list(trees) if turn % 2 == 0 else list(trees)[::-1]):
            scratch = os.path.join(work, f"runs-{name}-{turn}")
            shutil.rmtree(scratch, ignore_errors=True)
            found = {**loader(trees[name], os.path.join(scratch, "loader"), args.per_class, args.image_size),
                     **training(trees[name], data[name], scratch, args.epochs, steps[name])}
            for key, value in found.items():
                figures[name].setdefault(key, []).append(value)
            print(f"turn {turn + 1}, {name}: " + ", ".join(f"{k} {v:.4g}" for k, v in found.items()), flush=True)
    ref = args.ref
    print(f"\nmedian of {args.repeats} turns; this tree ({subprocess.run(['git', '-C', REPO, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}, "
          f"with its uncommitted changes) against {ref}")
    print(f"{'figure':58s} {'this':>10s} {ref:>10s} {'ratio':>7s}")
    for key in figures["this"]:
        mine, theirs = statistics.median(figures["this"][key]), statistics.median(figures[ref].get(key, [float("nan")]))
        print(f"{key:58s} {mine:10.4g} {theirs:10.4g} {mine / theirs if theirs else float('nan'):7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
