"""The main job's accuracy over training seeds, on each stack: the honest headline.

``make main`` trains once, with one seed, and its 44 test photos make one run's test accuracy a
noisy figure. This benchmark retrains the main job (the same ETL output, ``OUT/etl`` of each stack's
``make main``, and the same options, ``conf/main-train.args``, under ``horovodrun -np NP``) with
each of ``--seeds`` (weights' initialisation, shuffling, dropout; the split is the ETL's, fixed)
and prints, per stack and seed, the best epoch, the exact validation accuracy that chose it and the
exact test accuracy, read once after training, with the linear probe's beside them (a logistic
regression on the same frozen features, ``C`` chosen on validation: ``metrics.json``'s ``probe``,
fitted by the run itself on the feature cache); then each stack's mean and sample standard
deviation over the seeds, and the model's mean minus the probe's. The test split chooses nothing:
its figure is never the basis of a choice.

``--train-args`` adds training options after the main job's (``--train-args="--stopping article"``:
the article's early stopping beside the default). ``--venv STACK=PATH`` and ``--etl STACK=PATH``
name another environment or ETL output for a stack (a worktree without its own).

Standard library only (each stack's own venv runs the jobs): run it with any ``python3`` after
``make main`` and ``make main STACK=current``.

Usage: python3 benchmarks/seed_accuracy.py [--stacks mission,current] [--seeds 1,2,3,4,5] [--np 2]
           [--out out/seeds] [--csv FILE] [--train-args "..."] [--venv STACK=PATH] [--etl STACK=PATH]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENVS = {"mission": ".venv", "current": ".venv-current"}
MAIN_OUTPUTS = {"mission": "out", "current": "out-current"}


def main_train_args() -> List[str]:
    """The main job's training options, as ``scripts/main.sh`` reads them."""
    with open(os.path.join(ROOT, "conf", "main-train.args")) as f:
        return shlex.split(f.read())


def train_once(stack: str, seed: int, args: argparse.Namespace, weights: str) -> Dict:
    """One training of the main job on ``stack`` with ``seed``; returns its ``metrics.json``.

    Raises:
        RuntimeError: the job failed (its log's path named).
    """
    venv, data = args.venvs[stack], args.etls[stack]
    out = os.path.join(args.out, f"{stack}-seed{seed}")
    command = [os.path.join(venv, "bin", "horovodrun"), "-np", str(args.np), "-H", f"localhost:{args.np}", "--gloo",
               os.path.join(venv, "bin", "python"), os.path.join(ROOT, "jobs", "train.py"), "--data", data,
               "--output", out, "--weights", weights, *main_train_args(), *shlex.split(args.train_args),
               "--seed", str(seed),
               "--cache-dir", os.path.join(args.out, "cache"), "--overwrite", "--no-tracking", "--no-tensorboard"]
    os.makedirs(args.out, exist_ok=True)
    log = os.path.join(args.out, f"{stack}-seed{seed}.log")
    env = {**os.environ, "PATH": os.path.join(venv, "bin") + os.pathsep + os.environ.get("PATH", "")}
    with open(log, "w") as f:
        if subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env).returncode:
            raise RuntimeError(f"{stack}, seed {seed}: the training failed; see {log}")
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)


def row_of(stack: str, seed: int, m: Dict) -> Dict:
    """The figures of one run's ``metrics.json`` (the probe's ``None`` when the run has none)."""
    probe, stopping = m.get("probe") or {}, m.get("stopping") or {}
    return {"stack": stack, "seed": seed, "rule": stopping.get("rule"), "monitor": stopping.get("monitor"),
            "patience_epochs": stopping.get("patience"), "epochs": m["epochs_run"], "best_epoch": m["best_epoch"],
            "selected_on": m["selected_on"], "validation_accuracy": m["validation"]["accuracy"],
            "validation_count": m["validation"]["count"], "test_accuracy": m["test"]["accuracy"],
            "test_count": m["test"]["count"], "probe_C": probe.get("C"),
            "probe_validation_accuracy": probe.get("validation_accuracy"),
            "probe_test_accuracy": probe.get("test_accuracy"), "probe_seconds": probe.get("seconds"),
            "fit_seconds": m.get("fit_seconds"), "total_seconds": m.get("total_seconds")}


def pairs(values: List[str]) -> Dict[str, str]:
    """``["STACK=PATH", ...]`` as ``{STACK: absolute PATH}``."""
    found = dict(v.split("=", 1) for v in values)
    return {k: os.path.abspath(v) for k, v in found.items()}


def summary(values: List[float]) -> str:
    """``mean ± sample standard deviation (min-max)``."""
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4f} ± {spread:.4f} (min {min(values):.4f}, max {max(values):.4f})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stacks", default="mission,current")
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(ROOT, "out", "seeds"))
    parser.add_argument("--csv", default="")
    parser.add_argument("--train-args", default="", help="training options after the main job's")
    parser.add_argument("--venv", action="append", default=[], metavar="STACK=PATH")
    parser.add_argument("--etl", action="append", default=[], metavar="STACK=PATH")
    args = parser.parse_args(argv)
    stacks, seeds = args.stacks.split(","), [int(s) for s in args.seeds.split(",")]
    args.venvs = {**{k: os.path.join(ROOT, v) for k, v in VENVS.items()}, **pairs(args.venv)}
    args.etls = {**{k: os.path.join(ROOT, v, "etl") for k, v in MAIN_OUTPUTS.items()}, **pairs(args.etl)}
    for stack in stacks:
        if stack not in VENVS or not os.path.isfile(os.path.join(args.etls[stack], "manifest.json")):
            parser.error(f"{stack}: no main job output ({args.etls.get(stack)}): run make main STACK={stack}")
    weights = subprocess.run([os.path.join(args.venvs[stacks[0]], "bin", "python"), "-m", "pipelines.tools.weights"],
                             capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip().splitlines()[-1]
    rows = []
    for seed in seeds:  # the stacks take turns, so a slow spell of the machine falls on both
        for stack in stacks:
            rows.append(row_of(stack, seed, train_once(stack, seed, args, weights)))
            r = rows[-1]
            print(f"{stack:8s} seed {seed}: best epoch {r['best_epoch']}/{r['epochs']} (chosen on "
                  f"{r['selected_on']}, accuracy {r['validation_accuracy']:.4f} on {r['validation_count']}), "
                  f"test accuracy {r['test_accuracy']:.4f} on {r['test_count']}; linear probe "
                  f"{'none' if r['probe_test_accuracy'] is None else format(r['probe_test_accuracy'], '.4f')}",
                  flush=True)
    for stack in stacks:
        mine = [r for r in rows if r["stack"] == stack]
        print(f"{stack}: test accuracy {summary([r['test_accuracy'] for r in mine])}; validation accuracy of the "
              f"chosen epoch {summary([r['validation_accuracy'] for r in mine])}; over {len(mine)} seeds")
        probes = [r for r in mine if r["probe_test_accuracy"] is not None]
        if probes:
            model = statistics.fmean(r["test_accuracy"] for r in probes)
            probe = statistics.fmean(r["probe_test_accuracy"] for r in probes)
            print(f"{stack}: linear probe test accuracy {summary([r['probe_test_accuracy'] for r in probes])}, "
                  f"validation {summary([r['probe_validation_accuracy'] for r in probes])}; model minus probe "
                  f"{100 * (model - probe):+.1f} points of test accuracy")
    path = args.csv or os.path.join(args.out, "seed_accuracy.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
