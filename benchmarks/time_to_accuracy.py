"""Time to accuracy: the article's path against the feature cache, same data, seeds and world size.

- article: the frozen backbone runs over every image in every epoch (``run_training`` as is);
- feature cache: the backbone runs once per image, the head trains on the cached features
  (``--feature-cache``); each run starts with no cached features, so its time includes computing them.

Each run is a fresh Horovod job (``HorovodRunner(np=-N)``: N local processes, Gloo) from an empty
output folder, with the default recipe: early stopping by ``--stopping converge`` (validation loss,
patience in steps) and ``--head-init probe``, which only the feature cache can use (the probe needs
the cached features), so the article's path starts from the seeded random head. What else differs
is random (shuffle order, dropout masks), so the benchmark runs ``--repeats`` seeds of each,
interleaved, and compares means, next to the seed-to-seed spread. Printed per run and per path:
wall time of the whole job, wall time from the job's start to the end of the best epoch
(:func:`measure.time_to_best`; the final test evaluation and the epochs after the best one are left
out), epochs run, best epoch, best validation accuracy and the exact test accuracy; then the
speed-ups and the accuracy difference.
Goal: at least 5x less wall time for a test accuracy within 1 point.

Default data: 2,000 Fashion-MNIST images (200 per class) through the ETL at 128 px — at the
article's 299 px each backbone pass costs about 5x more on both paths, which a 2-core machine
cannot afford for the article's path; the speed-up depends on the number of epochs, not on the
image size. ``--etl-image-size 299`` or ``--data`` (any ETL output) on a bigger machine.

Training settings are ``TrainConfig``'s options (``--epochs``, ``--patience``, ``--batch-size``,
``--threads``, ``--seed``: the first seed, ``--image-size``: the model's input, 0 = the ETL's size;
``--weights``): every run is that one base config with its own output folder, seed and path.

Usage: python benchmarks/time_to_accuracy.py [--np 2] [--repeats 2] [--batch-size 16] [--patience 3]
           [--sample fashion-mnist --per-class 200 --etl-image-size 128 | --data ETL_OUTPUT] [--csv FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time

import sample_data
from measure import time_to_best, write_csv

# TrainConfig options of this benchmark, with TrainConfig's defaults.
TRAINING = dict.fromkeys(("epochs", "patience", "batch_size", "threads", "seed", "image_size", "backbone"))
PATHS = (("article", {}), ("feature cache", {"feature_cache": True}))


def run_once(path: str, extra: dict, seed: int, base, np: int, work: str) -> dict:
    """One fresh Horovod job of one path on ``np`` local processes, ``base`` with its own output,
    seed and ``extra`` settings; returns its row of figures."""
    from pipelines.launch import HorovodRunner
    from pipelines.training.data import load_dataset
    from pipelines.contract import MODEL_INPUT_DTYPE
    from pipelines.training.data.features import feature_dir, feature_key, model_key
    from pipelines.training.model.build import input_tag
    from pipelines.training.train import run_training

    out = os.path.join(work, f"{path.replace(' ', '-')}-seed{seed}")
    config = dataclasses.replace(base, output=out, seed=seed, **extra)
    # The feature path pays for its features: this weights file's and size's set is computed anew.
    data = load_dataset(config.loader.data, np, config.storage_options)
    stored = data.stored_size
    model = model_key(config.model.weights, config.model.input_size(stored), seed, config.model.backbone,
                      "float32", input_tag(MODEL_INPUT_DTYPE, stored))  # float32: no --mixed-precision here
    key = feature_key(model, data.identity())
    feature_dir(config.loader.data, key, config.storage_options).delete()
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    report = HorovodRunner(np=-np).run(run_training, config=config)
    wall = time.perf_counter() - start
    history = report["history"]
    # Before fit: launching the processes (all of the job outside run_training, model export included)
    # and run_training's own set-up (model, readers and, for the feature cache, the features).
    setup = wall - report["total_seconds"] + report["seconds_before_fit"]
    row = {"path": path, "seed": seed, "wall_s": round(wall, 1),
           "to_best_s": round(time_to_best(setup, [h["epoch_seconds"] for h in history], report["best_epoch"]), 1),
           "epochs": len(history), "best_epoch": report["best_epoch"],
           "best_val_accuracy": round(max(h["val_accuracy"] for h in history), 4),
           "test_accuracy": round(report["test"]["accuracy"], 4), "test_images": report["test"]["count"]}
    print(f"  {path:14s} seed {seed}: {row['wall_s']:7.1f} s wall, {row['to_best_s']:7.1f} s to best epoch "
          f"{row['best_epoch']}/{row['epochs']}, test accuracy {row['test_accuracy']:.4f}", flush=True)
    return row


def summarise(rows: list) -> None:
    """Print mean (sd) per path, the speed-ups of the means and the accuracy difference."""
    def stat(path, key):
        values = [r[key] for r in rows if r["path"] == path]
        return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)

    print(f"\n{'path':14s} {'runs':>4s} {'wall s':>14s} {'to best s':>14s} {'epochs':>10s} {'test accuracy':>17s}")
    for path, _ in PATHS:
        runs = sum(r["path"] == path for r in rows)
        cells = [stat(path, k) for k in ("wall_s", "to_best_s", "epochs", "test_accuracy")]
        print(f"{path:14s} {runs:4d} " + " ".join(
            f"{m:{w}.{d}f} ({s:.{d}f})" for (m, s), w, d in zip(cells, (6, 6, 4, 7), (1, 1, 1, 4))))
    (a_wall, _), (f_wall, _) = stat("article", "wall_s"), stat("feature cache", "wall_s")
    (a_best, _), (f_best, _) = stat("article", "to_best_s"), stat("feature cache", "to_best_s")
    (a_acc, a_sd), (f_acc, f_sd) = stat("article", "test_accuracy"), stat("feature cache", "test_accuracy")
    diff = 100 * (f_acc - a_acc)
    print(f"\nspeed-up of the feature cache: {a_wall / f_wall:.1f}x wall, {a_best / f_best:.1f}x to the best epoch")
    print(f"test accuracy, feature cache minus article: {diff:+.2f} points (seed-to-seed sd: article "
          f"{100 * a_sd:.2f}, feature cache {100 * f_sd:.2f} points)")
    met = a_best / f_best >= 5 and abs(diff) <= 1.0
    print(f"goal (>= 5x less wall time to the best epoch, test accuracy within 1 point): {'met' if met else 'NOT met'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--np", type=sample_data.positive_int, default=2,
                        help="local Horovod processes (world size)")
    parser.add_argument("--repeats", type=sample_data.positive_int, default=2,
                        help="seeds per path (seed, seed + 1, ...)")
    sample_data.add_arguments(parser, per_class=200, etl_image_size=128, training=TRAINING)
    parser.add_argument("--workdir", default=None, help="kept when given; default: a temporary folder")
    parser.add_argument("--csv", default="", help="write the per-run rows here")
    args = parser.parse_args(argv)
    # Every run's output is a folder of its own in the work folder (run_once). Untracked: the wall
    # times compare training paths, not MLflow's start-up and model logging.
    base = sample_data.check(parser, args, TRAINING, output=os.curdir, tensorboard=False, tracking=False)
    if args.csv:
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    work = args.workdir or tempfile.mkdtemp(prefix="tta-bench-")
    try:
        return run(args, base, work)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def run(args, base, work: str) -> int:
    base = sample_data.prepare(base, args, work)
    print(f"Time to accuracy: np={args.np}, batch {base.fit.batch_size} per rank, patience {base.fit.patience}, "
          f"{args.repeats} seed(s) per path, {os.cpu_count()} CPUs, data {base.loader.data}", flush=True)
    rows = []
    for seed in range(base.fit.seed, base.fit.seed + args.repeats):
        for path, extra in PATHS:  # interleaved, so that drift of the machine hits both paths alike
            rows.append(run_once(path, extra, seed, base, args.np, work))
    summarise(rows)
    if args.csv:
        write_csv(rows, args.csv)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
