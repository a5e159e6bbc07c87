"""Both stacks side by side: training images/s of the same Horovod job on the same data, and the
main job's results on each.

Each stack trains with its own virtual environment (``.venv`` for mission, ``.venv-current`` for
current: ``make setup STACK=...``) and its own default reader (Petastorm on mission, ours on
current). The throughput is ``benchmarks/scaling.py`` at one world size and one per-rank batch
(its steady-state images/s: ``--warmup-steps`` discarded, ``--steps`` timed), run ``--repeats``
times per stack with the stacks taking turns going first, on one ETL output (``--data``, default
the mission main job's ``out/etl``): the medians and their ratio (goal of issue 28: current at least
0.95 of mission). The main job's figures are read from each stack's ``make main`` output (``out/``
and ``out-current/``, ``--main-outputs``): exact test accuracy, epochs and the job's own training
images/s (whole epochs, input included). Standard library only: run it with any ``python3``.

Usage: python3 benchmarks/stacks_bench.py [--data out/etl] [--np 2] [--batch-size 8] [--steps 10]
           [--warmup-steps 3] [--repeats 3] [--backbone xception] [--weights FILE] [--main-outputs out,out-current]
           [--out out/stacks]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENVS = {"mission": ".venv", "current": ".venv-current"}
VERSIONS = ("import sys, importlib.metadata as m; "
            "print(sys.version.split()[0], m.version('tensorflow-cpu'), m.version('horovod'))")
GOAL = 0.95


def python_of(stack: str) -> str:
    """The stack's interpreter (``ROOT/<venv>/bin/python``)."""
    return os.path.join(ROOT, VENVS[stack], "bin", "python")


def versions(stack: str) -> List[str]:
    """``[python, tensorflow-cpu, horovod]`` versions of the stack's venv."""
    return subprocess.run([python_of(stack), "-c", VERSIONS], capture_output=True, text=True,
                          check=True).stdout.split()


def throughput(stack: str, args: argparse.Namespace, run: int) -> float:
    """One ``scaling.py`` measurement on ``stack``: images/s of the whole job (all ranks).

    Raises:
        RuntimeError: the benchmark failed (its log's path named).
    """
    out = os.path.join(args.out, f"{stack}-{run}")
    os.makedirs(out, exist_ok=True)
    command = [python_of(stack), os.path.join(ROOT, "benchmarks", "scaling.py"), "--np", str(args.np),
               "--batch-sizes", str(args.batch_size), "--headline-batch", str(args.batch_size),
               "--warmup-steps", str(args.warmup_steps), "--steps", str(args.steps), "--data", args.data,
               "--out", out, "--backbone", args.backbone] + (["--weights", args.weights] if args.weights else [])
    log = os.path.join(out, "scaling.log")
    with open(log, "w") as f:
        if subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode != 0:
            raise RuntimeError(f"benchmarks/scaling.py failed on the {stack} stack: see {log}")
    with open(os.path.join(out, "scaling.csv")) as f:
        rows = [r for r in csv.DictReader(f) if int(r["world_size"]) == args.np]
    return float(rows[0]["images_per_second"])


def main_job(folder: str) -> Optional[Dict]:
    """The main job's ``train/metrics.json`` in ``folder`` (``None`` when that stack's main job has not run)."""
    path = os.path.join(folder, "train", "metrics.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def report(stacks: List[str], speeds: Dict[str, List[float]], mains: Dict[str, Optional[Dict]],
           args: argparse.Namespace) -> None:
    """Print the side-by-side table and the ratios."""
    base = statistics.median(speeds["mission"])
    print(f"\ntraining throughput: scaling.py, world size {args.np}, batch {args.batch_size} per rank, "
          f"{args.steps} timed steps after {args.warmup_steps}, {args.repeats} runs per stack taking turns")
    print(f"{'stack':8s} {'python':7s} {'TF':7s} {'horovod':8s} {'images/s (median)':>18s} {'runs':24s} ratio")
    for stack in stacks:
        py, tf, hvd = versions(stack)
        median = statistics.median(speeds[stack])
        runs = ", ".join(f"{s:.1f}" for s in speeds[stack])
        print(f"{stack:8s} {py:7s} {tf:7s} {hvd:8s} {median:18.1f} {runs:24s} {median / base:.3f}")
    ratio = statistics.median(speeds["current"]) / base
    print(f"current / mission: {ratio:.3f} (goal >= {GOAL}: {'met' if ratio >= GOAL else 'NOT met'})")
    print("\nmain job (make main; exact test accuracy on the whole test split):")
    for stack in stacks:
        m = mains[stack]
        if m is None:
            print(f"{stack:8s} not run: make main STACK={stack}")
            continue
        t = m["test"]
        print(f"{stack:8s} accuracy {t['accuracy']:.4f} on {t['count']} images, epochs {m['epochs_run']} "
              f"(best {m['best_epoch']}), {m['train_images_per_second']:.1f} training images/s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(ROOT, "out", "etl"), help="an ETL output (both stacks read it)")
    parser.add_argument("--np", type=int, default=2, help="world size")
    parser.add_argument("--batch-size", type=int, default=8, help="per-rank batch size")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backbone", default="xception", help="xception (the main job's) or tiny (the tests')")
    parser.add_argument("--weights", default="", help="backbone weights file or none (default: scaling.py's)")
    parser.add_argument("--main-outputs", default="out,out-current",
                        help="the mission and current main jobs' OUT folders, comma-separated")
    parser.add_argument("--out", default=os.path.join(ROOT, "out", "stacks"))
    args = parser.parse_args(argv)
    if min(args.np, args.batch_size, args.steps, args.warmup_steps, args.repeats) < 1:
        parser.error("--np, --batch-size, --steps, --warmup-steps and --repeats must be >= 1")
    stacks = list(VENVS)
    main_outputs = args.main_outputs.split(",")
    if len(main_outputs) != len(stacks):
        parser.error("--main-outputs takes two folders: mission's and current's")
    if not os.path.isfile(os.path.join(args.data, "manifest.json")):
        parser.error(f"--data {args.data} has no ETL manifest (manifest.json): run make main, or give an ETL output")
    missing = [f"make setup STACK={s}" for s in stacks if not os.path.isfile(python_of(s))]
    if missing:  # last: the arguments' own faults are said first, whatever is installed
        parser.error(f"a stack's venv is missing: run {' and '.join(missing)}")
    speeds: Dict[str, List[float]] = {s: [] for s in stacks}
    for run in range(args.repeats):
        for stack in stacks if run % 2 == 0 else stacks[::-1]:
            try:
                speeds[stack].append(throughput(stack, args, run))
            except RuntimeError as err:
                print(f"FAILED: {err}", file=sys.stderr)
                return 1
            print(f"run {run + 1}/{args.repeats}, {stack}: {speeds[stack][-1]:.1f} images/s", flush=True)
    mains = {s: main_job(os.path.join(ROOT, folder) if not os.path.isabs(folder) else folder)
             for s, folder in zip(stacks, main_outputs)}
    report(stacks, speeds, mains, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
