"""What step checkpoints cost a training step (``--checkpoint-every-steps``/``--checkpoint-every-minutes``,
pipelines/training/checkpointer.py), measured side by side in one process.

The model is the job's trainable part at Caltech-256 size: the head on Xception's 2,048 pooled
features (``features.build_head``: resumable dropout, ``Dense(257)``, Nadam built as
``compile_distributed`` builds it), whose checkpoint (weights, Nadam's two moments, the learning
rate and the dropout generator's state) is what rank 0 writes within an epoch. Its step on
in-memory features is the shortest step any input path of the job takes (the feature cache), so
the ratios below bound the overhead from above; a step on images adds the backbone's forward pass
(seconds on a CPU) while the checkpoint stays the same size.

Printed, for each interval of ``--intervals`` (steps between checkpoints; 0: none), the mean step
time (the writes included), median over ``--rounds`` alternating rounds of ``--steps`` steps (the first round discarded:
tracing), its ratio to no checkpoints, and one checkpoint's median write time and size. The
default ``--checkpoint-every-minutes`` (10) costs one write per 600 s: printed as a fraction too.

Usage: python benchmarks/checkpoint_bench.py [--classes 257] [--batch-size 16] [--steps 100]
           [--rounds 3] [--intervals 0,50,20,5,1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def head_model(classes: int):
    """The job's head on 2,048 features, compiled with Nadam and built (as compile_distributed)."""
    from pipelines.stack.kerasapi import keras
    from pipelines.training.checkpoints.files import build_optimizer
    from pipelines.training.model.build import build_head

    model = build_head(classes, 0.5, 42, 2048)
    model.compile(optimizer=keras.optimizers.Nadam(1e-3), loss="sparse_categorical_crossentropy")
    build_optimizer(model)
    return model


def round_ms(model, data, steps: int, every: int, directory: str, writes: list) -> float:
    """Mean ms per step of ``steps`` steps (the writes included) with a step checkpoint after every
    ``every``-th (0: none)."""
    from pipelines.stack.kerasapi import keras
    from pipelines.training.callbacks import BestWeightsEarlyStopping, EpochStats
    from pipelines.training.checkpoints.writer import CheckpointMarker, Interval

    stopper = BestWeightsEarlyStopping(monitor="loss", patience=100)
    marker = CheckpointMarker(directory, stopper, [], every=Interval(every or None, None, steps + 1))
    original = marker.write_step

    def timed(epoch, step):
        start = time.perf_counter()
        name = original(epoch, step)
        writes.append(time.perf_counter() - start)
        return name

    marker.write_step = timed
    stats = EpochStats(steps, 1)
    callbacks = [stats, stopper, marker] if every else [stats, stopper]
    history = keras.callbacks.History()
    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=[*callbacks, history], verbose=0)
    return 1000.0 / history.history["train_images_per_second"][0]  # EpochStats(steps, 1): steps per second


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, default=257)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--intervals", default="0,50,20,5,1")
    args = parser.parse_args(argv)
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    intervals = [int(v) for v in args.intervals.split(",")]
    rng = np.random.default_rng(0)
    x = rng.random((args.batch_size * 8, 2048), np.float32)
    y = rng.integers(0, args.classes, len(x)).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch_size)
    model = head_model(args.classes)
    times, writes = {every: [] for every in intervals}, []
    with tempfile.TemporaryDirectory() as directory:
        for number in range(args.rounds + 1):
            for every in intervals:  # alternating: each interval sees the same machine load
                ms = round_ms(model, data, args.steps, every, directory, writes if number else [])
                if number:
                    times[every].append(ms)
        size = sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory) if n.endswith(".npz"))
    base = statistics.median(times[0]) if 0 in times else None
    write_s = statistics.median(writes) if writes else 0.0
    print(f"head of {args.classes} classes on 2048 features, batch {args.batch_size}; one step checkpoint "
          f"{size:,} bytes, written in {1000 * write_s:.1f} ms (median of {len(writes)})")
    for every in intervals:
        ms = statistics.median(times[every])
        ratio = f", {ms / base:.3f} x none" if base else ""
        print(f"  every {every or '-'} steps: {ms:.2f} ms per step{ratio}")
    print(f"  every 10 minutes (the default): {write_s / 600:.6f} of the time (one write per 600 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
