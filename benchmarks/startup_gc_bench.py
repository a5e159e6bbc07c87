"""A small training job's CPU seconds with TensorFlow imported under ``frozen_imports`` and without, side by side.

Each case runs ``jobs/train.py`` alone (one rank, the tiny backbone, 2 epochs on a written dataset of
16 px images) as a child process and reads its user + system CPU seconds. "frozen" is the job as
it is (``pipelines.runtime.imports.frozen_imports`` around the rank's first import of TensorFlow);
"plain" replaces it with a no-op before the job loads. Cases alternate. Usage::

    python benchmarks/startup_gc_bench.py [--repeats 3] [--epochs 2]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

#: the job with frozen_imports a no-op: patched before pipelines.training imports it
PLAIN = ("import contextlib, runpy, sys; import pipelines.runtime.imports as imports; "
         "imports.frozen_imports = contextlib.nullcontext; sys.argv = sys.argv[1:]; "
         "runpy.run_path(sys.argv[0], run_name='__main__')")


def child_cpu(command: list, env: dict) -> float:
    """User + system CPU seconds of ``command``, run to its end (it must exit 0)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case, alternating")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each run")
    args = parser.parse_args()

    from tests.support.datagen import write_dataset

    work = tempfile.mkdtemp(prefix="startup-gc-")
    data = os.path.join(work, "data")
    write_dataset(data, train_groups=[4, 4], test_groups=[2], size=16, rows_per_group=4, names=("a", "b"))
    env = dict(os.environ, PIPELINES_TRACKING="0", TF_CPP_MIN_LOG_LEVEL="2")
    job = [os.path.join(REPO, "jobs", "train.py"), "--data", data, "--weights", "none", "--backbone", "tiny",
           "--batch-size", "4", "--no-tensorboard", "--no-pictures", "--epochs", str(args.epochs)]
    cases = {"frozen": [sys.executable], "plain": [sys.executable, "-c", PLAIN]}
    seconds = {name: [] for name in cases}
    try:
        for turn in range(args.repeats):
            for name, prefix in cases.items():
                out = os.path.join(work, f"{name}-{turn}")
                seconds[name].append(child_cpu([*prefix, *job, "--output", out, "--cache-dir", out + "-cache"], env))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, values in seconds.items():
        print(f"{name:7s} CPU s: {', '.join(f'{v:.2f}' for v in values)} (median {statistics.median(values):.2f})")
    ratio = statistics.median(seconds["frozen"]) / statistics.median(seconds["plain"])
    print(f"frozen / plain: {ratio:.3f}")


if __name__ == "__main__":
    main()
