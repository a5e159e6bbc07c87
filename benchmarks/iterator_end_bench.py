"""How long a ``tf.data`` iterator read slowly takes to end, with ``tf.data``'s autotuning on and off, side by side.

Each case reads ``--batches`` one-row batches of a small pipeline (``range``, ``map``, ``batch``,
``prefetch(AUTOTUNE)``), sleeping ``--pause`` seconds after each, as a rank reads validation batches
while it computes; the figure is the seconds from the last batch's end to the end of the ``for``
loop, where the iterator is dropped. "on" is TensorFlow's default; "off" is what every dataset the
training reads gets (``pipelines.training.data.tfdata.without_autotune``), and so is our tail
(``to_device``). Usage::

    python benchmarks/iterator_end_bench.py [--pause 4] [--batches 6] [--repeats 2]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def end_seconds(dataset, pause_s: float) -> float:
    """Seconds from the last batch (and its ``pause_s``) to the end of the loop over ``dataset``."""
    last = time.perf_counter()
    for _ in dataset:
        time.sleep(pause_s)
        last = time.perf_counter()
    return time.perf_counter() - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pause", type=float, default=4.0, help="seconds of 'work' after each batch")
    parser.add_argument("--batches", type=int, default=6, help="batches read per case")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each case, alternating")
    args = parser.parse_args()

    import tensorflow as tf

    from pipelines.training.data.tfdata import to_device, without_autotune

    def pipeline():
        return tf.data.Dataset.range(args.batches).map(lambda x: x).batch(1).prefetch(tf.data.AUTOTUNE)

    cases = {"autotune on (default)": pipeline, "autotune off": lambda: without_autotune(pipeline()),
             "our tail (to_device)": lambda: to_device(tf.data.Dataset.range(args.batches).batch(1))}
    print(f"TensorFlow {tf.__version__}; {args.batches} batches, {args.pause:g} s after each")
    figures = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, make in cases.items():
            figures[name].append(end_seconds(make(), args.pause))
    for name, seconds in figures.items():
        print(f"{name:24s} end of the loop: {', '.join(f'{s:.2f}' for s in seconds)} s")


if __name__ == "__main__":
    main()
