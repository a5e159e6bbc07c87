"""Validation accuracy of the head alone against the fine-tuned model, and the fine-tuned model's
test accuracy, over seeds, on one sample.

Each seed is one training job (``jobs/train.py --spark-np -NP``: NP local Horovod ranks) with
``--fine-tune-blocks N``: its ``metrics.json`` holds phase 1's exact validation figures (the head
trained on the frozen backbone, ``fine_tune.phase1.validation``: the comparison the phase choice
makes), the fine-tuned model's at its best epoch (``validation``) and, read once after phase 2, its
exact test figures (``test``). The head alone has no test figure: the test split is read once. Printed per seed, then the mean and the sample standard
deviation over seeds; written to ``--csv``. Any further option is passed to ``jobs/train.py``
as it is (e.g. ``--feature-cache``, ``--image-size 160``, ``--fine-tune-lr 0.1``).

Usage: python benchmarks/fine_tune_accuracy.py [--workdir out/fine-tune] [--sample tuxpaint]
           [--seeds 1,2,3] [--np 2] [--fine-tune-blocks 2] [--weights FILE] [TRAIN OPTIONS ...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from measure import write_csv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def summary(values):
    """``(mean, sample standard deviation)`` of ``values`` (0.0 spread for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="out/fine-tune", help="the sample's ETL output and one run per seed")
    parser.add_argument("--sample", default="tuxpaint", choices=["tuxpaint", "fashion-mnist"])
    parser.add_argument("--etl-image-size", type=int, default=299)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--np", type=int, default=2, help="local Horovod ranks of each job")
    parser.add_argument("--fine-tune-blocks", type=int, default=2)
    parser.add_argument("--weights", default="", help="default: the ImageNet file converted offline")
    parser.add_argument("--csv", default="", help="default: WORKDIR/fine_tune_accuracy.csv")
    args, train_args = parser.parse_known_args(argv)
    from pipelines.tools.workspace import ensure_sample_etl, ensure_weights

    data = ensure_sample_etl(os.path.abspath(args.workdir), image_size=args.etl_image_size, sample=args.sample)
    weights = ensure_weights(args.weights)
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        out = os.path.join(os.path.abspath(args.workdir), f"run-seed{seed}")
        cmd = [sys.executable, os.path.join(ROOT, "jobs", "train.py"), "--data", data, "--output", out,
               "--weights", weights, "--spark-np", str(-args.np), "--seed", str(seed),
               "--fine-tune-blocks", str(args.fine_tune_blocks), "--no-tensorboard", "--no-tracking", *train_args]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        with open(os.path.join(out, "metrics.json")) as f:
            m = json.load(f)
        phase1 = m["fine_tune"]["phase1"]
        rows.append({"seed": seed, "head_only_val_accuracy": phase1["validation"]["accuracy"],
                     "fine_tuned_val_accuracy": m["validation"]["accuracy"],
                     "fine_tuned_test_accuracy": m["test"]["accuracy"], "test_count": m["test"]["count"],
                     "phase1_epochs": phase1["epochs"], "epochs": m["epochs_run"], "best_epoch": m["best_epoch"],
                     "fit_seconds": round(m["fit_seconds"], 1), "total_seconds": round(m["total_seconds"], 1)})
    print(f"\n{'seed':>4s} {'head val':>8s} {'tuned val':>9s} {'tuned test':>10s} {'test n':>6s} {'phase 1 ep':>10s} "
          f"{'epochs':>6s} {'best':>4s} {'total s':>8s}")
    for r in rows:
        print(f"{r['seed']:4d} {r['head_only_val_accuracy']:8.4f} {r['fine_tuned_val_accuracy']:9.4f} "
              f"{r['fine_tuned_test_accuracy']:10.4f} {r['test_count']:6d} "
              f"{r['phase1_epochs']:10d} {r['epochs']:6d} {r['best_epoch']:4d} {r['total_seconds']:8.1f}")
    for key in ("head_only_val_accuracy", "fine_tuned_val_accuracy", "fine_tuned_test_accuracy"):
        mean, spread = summary([r[key] for r in rows])
        print(f"{key}: mean {mean:.4f}, standard deviation {spread:.4f} over {len(rows)} seeds")
    path = args.csv or os.path.join(args.workdir, "fine_tune_accuracy.csv")
    write_csv(rows, path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
