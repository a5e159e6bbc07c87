"""Which early-stopping rule finds the head's best epoch: rules replayed on recorded curves.

Trains the job's head (``build_head``: dropout, dense softmax; Nadam at ``--lr``, a batch of
``--batch`` rows, the last partial batch dropped as the job's stream drops it) on a feature cache
(``DATA/features/<key>``, as a ``--feature-cache`` run leaves it) for a fixed ``--epochs`` with each
of ``--seeds``, in one process (no Horovod: the job's 2 ranks x 8 rows average their gradients into
the same step as one batch of 16), recording each epoch's exact validation loss and accuracy and
test accuracy. Then it replays each rule of ``--rules`` on those curves (the job's early stopping:
:class:`pipelines.training.stopping.StoppingRule`'s patience, Keras' comparison with
``min_delta``) and prints, per rule, the mean test accuracy at the epoch it would keep, and where
each seed stopped. The test split chooses nothing: the rules see the validation curves only.

Usage: python benchmarks/stopping_rules.py --features DATA/features/KEY [--epochs 400] [--seeds 1,2,3,4,5]
           [--batch 16] [--lr 0.002] [--rules article,converge,val_loss:0:3:0,val_loss:100:3:0] [--json FILE]

A rule is a name of ``RULES`` or ``MONITOR:PATIENCE_STEPS:PATIENCE_EPOCHS:MIN_DELTA``.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Dict, List, Sequence, Tuple

import numpy as np


def parse_rule(text: str):
    """A rule of ``--rules``: a name of ``RULES`` or ``MONITOR:STEPS:EPOCHS:MIN_DELTA``.

    Raises:
        pipelines.runtime.errors.Refused: neither.
    """
    from pipelines.runtime.errors import Refused
    from pipelines.training.stopping import RULES, StoppingRule

    if text in RULES:
        return text, RULES[text]
    parts = text.split(":")
    if len(parts) != 4:
        raise Refused(f"--rules {text}: give a name ({', '.join(RULES)}) or MONITOR:STEPS:EPOCHS:MIN_DELTA")
    try:
        return text, StoppingRule(parts[0], int(parts[1]), int(parts[2]), float(parts[3]))
    except ValueError as exc:
        raise Refused(f"--rules {text}: {exc}") from exc


def replay(rule, curve: Sequence[Sequence[float]], steps_per_epoch: int) -> Tuple[int, int]:
    """``(best, stopped)`` epochs (0-based) of ``rule`` on ``curve`` (each epoch's ``[val_loss,
    val_accuracy, test_loss, test_accuracy]``), as Keras' ``EarlyStopping`` compares: a gain is a
    value beyond the best by more than ``min_delta``."""
    index, sign = (0, 1.0) if rule.mode == "min" else (1, -1.0)
    patience, best, best_epoch, wait = rule.patience(steps_per_epoch), math.inf, 0, 0
    for epoch, row in enumerate(curve):
        value = sign * row[index]
        if value < best - rule.min_delta:
            best, best_epoch, wait = value, epoch, 0
            continue
        wait += 1
        if wait >= patience:
            return best_epoch, epoch
    return best_epoch, len(curve) - 1


def curves(features: str, seeds: Sequence[int], epochs: int, batch: int, lr: float) -> Tuple[Dict, int]:
    """Each seed's per-epoch ``[val_loss, val_accuracy, test_loss, test_accuracy]`` and the steps an epoch."""
    import tensorflow as tf

    from pipelines.training.data.features import read_shard
    from pipelines.training.model.build import build_head

    (x, y), (vx, vy), (tx, ty) = (read_shard(features, split, 0, 1) for split in ("train", "validation", "test"))
    classes, steps = int(max(y.max(), vy.max(), ty.max())) + 1, len(y) // batch
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    found = {}
    for seed in seeds:
        tf.keras.utils.set_random_seed(seed)
        model, optimizer = build_head(classes, 0.5, seed, x.shape[1]), tf.keras.optimizers.Nadam(lr)

        @tf.function
        def step(bx, by):
            with tf.GradientTape() as tape:
                loss = loss_fn(by, model(bx, training=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

        def score(a, b):
            p = model(a, training=False).numpy()
            return float(-np.mean(np.log(np.maximum(p[np.arange(len(b)), b], 1e-12)))), float(np.mean(p.argmax(1) == b))

        rng, rows = np.random.default_rng(seed), []
        for _ in range(epochs):
            order = rng.permutation(len(y))
            for i in range(steps):
                chosen = order[i * batch:(i + 1) * batch]
                step(x[chosen], y[chosen])
            rows.append([*score(vx, vy), *score(tx, ty)])
        found[seed] = rows
        print(f"seed {seed}: {epochs} epochs recorded", flush=True)
    return found, steps


def report(rules: List, recorded: Dict, steps: int) -> None:
    """Per rule: mean ± sd of the test accuracy at the kept epoch, and each seed's (best, stopped) epoch."""
    for name, rule in rules:
        kept = {seed: replay(rule, rows, steps) for seed, rows in recorded.items()}
        tests = [recorded[seed][best][3] for seed, (best, _) in kept.items()]
        spread = statistics.stdev(tests) if len(tests) > 1 else 0.0
        print(f"{name:24s} patience {rule.patience(steps):3d} epochs: test accuracy {statistics.fmean(tests):.4f} "
              f"± {spread:.4f}; best/stopped epoch per seed {[(b + 1, s + 1) for b, s in kept.values()]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", required=True, help="a feature set: DATA/features/KEY")
    parser.add_argument("--epochs", type=int, default=400)
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--rules", default="article,converge,val_loss:0:3:0,val_loss:50:3:0,val_loss:100:3:0,"
                                           "val_loss:200:3:0,val_loss:300:3:0")
    parser.add_argument("--json", default="", help="also write the recorded curves here")
    args = parser.parse_args(argv)
    from pipelines.runtime.errors import Refused

    try:
        rules = [parse_rule(text) for text in args.rules.split(",")]
    except Refused as exc:
        parser.error(str(exc))
    if args.epochs < 1 or args.batch < 1 or not args.lr > 0:
        parser.error("--epochs and --batch must be >= 1, --lr > 0")
    recorded, steps = curves(args.features, [int(s) for s in args.seeds.split(",")], args.epochs, args.batch, args.lr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps_per_epoch": steps, "runs": recorded}, f)
    report(rules, recorded, steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
