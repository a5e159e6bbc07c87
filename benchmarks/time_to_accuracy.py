"""Time to accuracy: the article's path (backbone run on every image every epoch) against the
feature cache (backbone run once, head trained on cached features), same data, seed and world size.

Each path runs as a fresh Horovod job (``HorovodRunner(np=-N)``) from an empty output folder; the
feature path also starts without cached features, so its time includes computing them. Printed per
path: wall time of the whole job, wall time to the epoch of the best validation accuracy (job start
+ fit time up to that epoch), epochs run, best validation accuracy and the exact test accuracy.

Usage: python benchmarks/time_to_accuracy.py [--np 2] [--epochs 30] [--patience 3] [--batch-size 8]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--np", type=int, default=2, help="local Horovod processes")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--patience", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--data", default="", help="an ETL output; default: the Tux Paint sample at 299 px")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from pipelines import notebook
    from pipelines.training.features import feature_dir, feature_key
    from pipelines.training.weights import ensure_xception_notop_weights

    work = args.workdir or tempfile.mkdtemp(prefix="tta-bench-")
    data = args.data or notebook.ensure_sample_etl(work, image_size=299, test_fraction=0.3)
    weights = str(ensure_xception_notop_weights())
    base = dict(data=data, weights=weights, epochs=args.epochs, patience=args.patience,
                batch_size=args.batch_size, tensorboard=False, seed=42)
    shutil.rmtree(os.path.join(data, "features"), ignore_errors=True)

    results = {}
    for label, extra in (("article: backbone every epoch", {}), ("feature cache", {"feature_cache": True})):
        out = os.path.join(work, label.split(":")[0].replace(" ", "-"))
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        report = notebook.train(np=-args.np, output=out, **base, **extra)
        wall = time.perf_counter() - start
        history = report["history"]
        best = report["best_epoch"]
        setup = wall - report["fit_seconds"]  # processes, model, data (and features) before fit
        to_best = setup + sum(h["epoch_seconds"] for h in history[:best])
        results[label] = (wall, to_best, len(history), best, max(h["val_accuracy"] for h in history),
                          report["test"]["accuracy"])
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nTime to accuracy: np={args.np}, batch {args.batch_size} per rank, patience {args.patience}, "
          f"{os.cpu_count()} CPUs, data {data}")
    print(f"{'path':32s} {'wall s':>8s} {'to best s':>10s} {'epochs':>7s} {'best':>5s} {'best val acc':>13s} "
          f"{'test acc':>9s}")
    for label, (wall, to_best, epochs, best, val, test) in results.items():
        print(f"{label:32s} {wall:8.1f} {to_best:10.1f} {epochs:7d} {best:5d} {val:13.4f} {test:9.4f}")
    (a_wall, a_best, *_, a_test), (f_wall, f_best, *_, f_test) = results.values()
    print(f"speed-up: {a_wall / f_wall:.1f}x wall, {a_best / f_best:.1f}x to the best epoch; "
          f"test accuracy difference {100 * (f_test - a_test):+.1f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
