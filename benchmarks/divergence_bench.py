"""What the divergence check costs a training step (pipelines/training/callbacks.py, DivergenceGuard).

Every training step, every rank allreduces one float32 over Gloo (whether its loss is finite) so
that all ranks stop at the same step. Measured here on ``--np`` local ranks
(``HorovodRunner(np=-N)``, one TensorFlow thread each), side by side in one job:

* the check alone: ``--calls`` calls of the guard's collective (after 20 discarded), the median
  wall time of one, in microseconds;
* the job's training step (``compile_distributed``: Nadam in Horovod's ``DistributedOptimizer``) of
  each ``--backbones`` model at ``--image-size`` px on random uint8 images, ``--batch-size`` per
  rank, with and without the guard among its callbacks: ``--rounds`` alternating rounds of
  ``--steps`` steps each way (the first round of each discarded: tracing), the median step time
  (``EpochStats.step_ms``) of each way over its rounds.

Printed: both figures per backbone and the ratio the goal is about, the check's cost over the
step without it (goal: below 0.01, one per cent of a step, for the article's Xception; the tiny
backbone, a step of a few ms, is the bound for GPU-sized steps).

Usage: python benchmarks/divergence_bench.py [--np 2] [--backbones tiny,xception] [--image-size 71]
           [--batch-size 4] [--steps 20] [--rounds 3] [--calls 300]
"""
from __future__ import annotations

import argparse
import statistics
import time


def rank_main(backbones, image_size: int, batch_size: int, steps: int, rounds: int, calls: int) -> dict:
    """One rank's measurements: ``{"check_us": median, "steps": {backbone: {"off": ms, "on": ms}}}``."""
    import horovod.tensorflow.keras as hvd
    import numpy as np
    import tensorflow as tf

    from pipelines.training.callbacks import DivergenceGuard, EpochStats, ranks_flagged
    from pipelines.training.model.build import build_model, compile_distributed

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    for _ in range(20):
        ranks_flagged((False, False))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        ranks_flagged((False, False))
        times.append(time.perf_counter() - start)
    result = {"check_us": 1e6 * statistics.median(times), "steps": {}}
    rng = np.random.default_rng(hvd.rank())
    images = rng.integers(0, 256, (batch_size * steps, image_size, image_size, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, batch_size * steps).astype(np.int32)
    for backbone in backbones:
        model = build_model(3, image_size, 0.5, "none", seed=0, backbone=backbone, stored_size=image_size)
        compile_distributed(model, 1e-3)
        step_ms = {"off": [], "on": []}
        for round_ in range(rounds + 1):
            for way in ("off", "on"):
                stats = EpochStats(steps, batch_size * hvd.size())
                guard = [DivergenceGuard(steps)] if way == "on" else []
                logs = model.fit(images, labels, batch_size=batch_size, epochs=1, verbose=0, shuffle=False,
                                 callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), stats, *guard])
                if round_:  # the first round of each way traces and warms up
                    step_ms[way].append(logs.history["step_ms"][0])
        result["steps"][backbone] = {way: statistics.median(v) for way, v in step_ms.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--np", type=int, default=2, help="local ranks")
    parser.add_argument("--backbones", default="tiny,xception")
    parser.add_argument("--image-size", type=int, default=71)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20, help="steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds each way")
    parser.add_argument("--calls", type=int, default=300, help="timed calls of the check alone")
    args = parser.parse_args()
    from pipelines.launch import HorovodRunner
    from pipelines.runtime.logs import plural

    r = HorovodRunner(np=-args.np).run(rank_main, backbones=args.backbones.split(","), image_size=args.image_size,
                                       batch_size=args.batch_size, steps=args.steps, rounds=args.rounds,
                                       calls=args.calls)
    print(f"divergence check, np={args.np} local ranks over Gloo, 1 TensorFlow thread each, rank 0's figures")
    print(f"  the check alone: {r['check_us']:.0f} us per step (median of {plural(args.calls, 'call')})")
    for backbone, ms in r["steps"].items():
        cost = r["check_us"] / 1000 / ms["off"]
        print(f"  {backbone} at {args.image_size} px, batch {args.batch_size} per rank: step {ms['off']:.1f} ms "
              f"without the guard, {ms['on']:.1f} ms with it (x{ms['on'] / ms['off']:.3f}); "
              f"the check alone is {cost:.4f} of a step")
    if "xception" in r["steps"]:
        cost = r["check_us"] / 1000 / r["steps"]["xception"]["off"]
        print(f"goal (the check below 0.01 of an Xception step): {cost:.4f} {'met' if cost < 0.01 else 'NOT met'}")


if __name__ == "__main__":
    main()
