"""What TensorFlow's op determinism costs a training step (``tf.config.experimental.enable_op_determinism``,
which CPU ranks turn on: pipelines/training/rank.py).

Determinism is a process-wide switch that cannot be turned off again, so each measurement is a
process of its own, the two ways alternating over ``--rounds`` rounds: a process builds the job's
model (``compile_distributed``: Nadam in Horovod's ``DistributedOptimizer``, one process), runs
``--steps`` steps of ``fit`` after a first ``fit`` of 5 (tracing), and prints the mean wall time of one step:

* ``image``: the image path, Xception (random weights, frozen) at ``--image-size`` px on random
  uint8 images, ``--batch-size`` a step;
* ``head``: the feature cache's path, the head alone on random 2048-feature rows, ``--head-batch``
  a step.

Printed: each path's median step time over the rounds, off and on, and their ratio.

Usage: python benchmarks/determinism_bench.py [--image-size 71] [--batch-size 4] [--head-batch 32]
           [--steps 30] [--rounds 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def child(deterministic: bool, image_size: int, batch_size: int, head_batch: int, steps: int, threads: int) -> dict:
    """One process's median step times, ms: ``{"image": ms, "head": ms}``."""
    import horovod.tensorflow.keras as hvd
    import numpy as np
    import tensorflow as tf

    from pipelines.training.model.build import build_head, build_model, compile_distributed

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    hvd.init()
    rng = np.random.default_rng(0)
    inputs = {"image": (build_model(3, image_size, 0.5, "none", seed=0, backbone="xception", stored_size=image_size),
                        rng.integers(0, 256, (batch_size, image_size, image_size, 3), dtype=np.uint8)),
              "head": (build_head(3, 0.5, 0, 2048), rng.standard_normal((head_batch, 2048)).astype(np.float32))}
    result = {}
    for name, (model, rows) in inputs.items():
        compile_distributed(model, 1e-3)
        labels = rng.integers(0, 3, len(rows)).astype(np.int32)
        batches = tf.data.Dataset.from_tensors((rows, labels)).repeat()
        model.fit(batches, steps_per_epoch=5, epochs=1, verbose=0)  # tracing
        start = time.perf_counter()
        model.fit(batches, steps_per_epoch=steps, epochs=1, verbose=0)
        result[name] = 1000 * (time.perf_counter() - start) / steps
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=71)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--head-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", choices=["off", "on"])
    args = parser.parse_args()
    sizes = (args.image_size, args.batch_size, args.head_batch, args.steps, args.threads)
    if args.child:
        print(json.dumps(child(args.child == "on", *sizes)))
        return
    found = {"off": [], "on": []}
    for _ in range(args.rounds):
        for way in ("off", "on"):
            out = subprocess.run([sys.executable, __file__, "--child", way, *sys.argv[1:]], capture_output=True,
                                 text=True, check=True).stdout
            found[way].append(json.loads(out.strip().splitlines()[-1]))
    for name in ("image", "head"):
        off = statistics.median(r[name] for r in found["off"])
        on = statistics.median(r[name] for r in found["on"])
        print(f"{name}: {off:.2f} ms a step without op determinism, {on:.2f} ms with it (x{on / off:.3f}); "
              f"rounds off {[round(r[name], 2) for r in found['off']]}, on {[round(r[name], 2) for r in found['on']]}")


if __name__ == "__main__":
    main()
