"""Batch-inference throughput: ``jobs/predict.py`` on Spark against one ``model.predict`` process.

Same images, same ``model.keras``, same decoding (the ETL's :func:`~pipelines.predict.infer.decode_file`:
read, decode, orient, fit into the model's size, paste on white) in both; one run each, side by
side. The job is :func:`pipelines.predict.job.run_predict`, what ``jobs/predict.py`` runs, timed
from its call to its return (listing, the Spark job with each Python worker's model load, the
Parquet write, the summary) in a SparkSession started before the clock (the JVM's start-up is not
counted). The single process is timed from its model load to its last prediction, decoding a
batch then calling ``model.predict`` on it; it is also shown without the load. Both read files
the operating system has cached (every file is read once before either run).

Defaults: the Tux Paint sample photos (148, up to 2348 px) and, without ``--model``, the offline
ImageNet Xception with an untrained head exported at ``--image-size`` (the speed of a trained
model is the same). Usage::

    python benchmarks/predict_bench.py [--input DIR] [--model MODEL] [--image-size 299]
        [--batch-size 32] [--master local[2]] [--workdir out/predict-bench] [--weights none]

``--memory`` measures instead the memory of batch inference on an ETL split (the input's ETL at
``--image-size``, default input: the Fashion-MNIST sample, ``--per-class`` images per class), run
twice, each in its own SparkSession: with Spark's default Arrow batch (10,000 rows) and with
:func:`pipelines.predict.job.arrow_batch_rows`. It prints the peak resident memory (``VmHWM``) of
each Python worker, read from ``/proc`` when the job has finished, before the session stops.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipelines.contract import DEFAULT_IMAGE_SIZE  # noqa: E402
from pipelines.runtime.environment import read_settings  # noqa: E402
from pipelines.runtime.quiet import quiet_by_default  # noqa: E402

quiet_by_default(read_settings().verbose)  # before TensorFlow or Spark load


def default_model(workdir: str, class_names, size: int, weights: str = "") -> str:
    """An exported ``model.keras`` (+ ``model.json``): Xception with ImageNet weights (``weights``
    ``""``) or random ones (``"none"``: same memory and speed), untrained head."""
    from pipelines.tools.workspace import ensure_weights
    from pipelines.training.model.build import build_model
    from pipelines.training.model.export import export_model

    folder = os.path.join(workdir, f"model-{size}px-{len(class_names)}-{weights or 'imagenet'}")
    if not os.path.isfile(os.path.join(folder, "model.json")):
        os.makedirs(folder, exist_ok=True)
        model = build_model(len(class_names), size, weights=weights or ensure_weights(""))
        export_model(model, os.path.join(folder, "model.keras"), size, list(class_names))
    return folder


def python_workers_peak_mib() -> list:
    """Peak resident memory (``VmHWM``, MiB) of each PySpark Python worker below this process:
    the processes forked by ``pyspark.daemon`` (the daemon itself left out), largest first."""
    procs = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/status") as f:
                peak = next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)
        except (OSError, ValueError):
            continue
        procs[int(name)] = (parent, command, peak)

    def below_me(pid: int) -> bool:
        while pid in procs:
            pid = procs[pid][0]
            if pid == os.getpid():
                return True
        return False

    daemons = {pid for pid, (_, command, _) in procs.items() if "pyspark.daemon" in command}
    return sorted((peak / 1024 for pid, (parent, _, peak) in procs.items()
                   if parent in daemons and below_me(pid)), reverse=True)


def memory_run(args, model: str, split: str, output: str, arrow_rows: int) -> dict:
    """``run_predict`` on the ETL split ``split`` with ``arrow_rows`` rows per Arrow batch (0: the
    job's own choice), in a session of its own; the Python workers' peak memory, the seconds."""
    from pipelines.predict.config import PredictConfig
    from pipelines.predict.job import run_predict
    from pipelines.runtime.spark import spark_session

    spark = spark_session("predict-bench-memory", args.master)
    config = PredictConfig(model=model, input=split, output=output, batch_size=args.batch_size,
                           arrow_batch_rows=arrow_rows)
    start = time.perf_counter()
    summary = run_predict(config, spark)
    seconds = time.perf_counter() - start
    workers = python_workers_peak_mib()
    spark.stop()
    shutil.rmtree(output, ignore_errors=True)
    return {"seconds": seconds, "rows": summary["files"]["rows"], "workers": workers}


def memory_main(args, workdir: str) -> int:
    """The ``--memory`` comparison: ETL at ``--image-size``, then predict its train split twice."""
    from pipelines.manifest import Manifest
    from pipelines.contract import row_bytes
    from pipelines.etl.config import ETLConfig
    from pipelines.etl.job import run_etl
    from pipelines.predict.job import SPARK_ARROW_ROWS, arrow_batch_rows
    from pipelines.predict.model import resolve_model
    from pipelines.runtime.spark import spark_session

    if not args.input:
        from pipelines.tools import samples

        args.input = os.path.join(workdir, f"fashion-mnist-{args.per_class}")
        if not os.path.isdir(args.input):
            samples.main(["fashion-mnist", "--dest", args.input, "--per-class", str(args.per_class)])
    etl = os.path.join(workdir, f"etl-{args.image_size}px")
    if os.path.isfile(os.path.join(etl, "manifest.json")):  # made by an earlier --memory run
        manifest = Manifest.read(etl).to_dict()
    else:
        spark = spark_session("predict-bench-etl", args.master)
        manifest = run_etl(ETLConfig(input=args.input, output=etl, image_size=args.image_size, min_row_groups=1),
                           spark)
        spark.stop()
    model = args.model or default_model(workdir, manifest["class_names"], args.image_size, args.weights)
    spec = resolve_model(model)
    chosen = arrow_batch_rows(args.batch_size, row_bytes(spec.image_size))
    runs = [(f"{SPARK_ARROW_ROWS:,} (Spark's default)", memory_run(args, model, os.path.join(etl, "train"),
                                                                  os.path.join(workdir, "old.parquet"),
                                                                  SPARK_ARROW_ROWS)),
            (f"{chosen:,} (arrow_batch_rows)", memory_run(args, model, os.path.join(etl, "train"),
                                                          os.path.join(workdir, "new.parquet"), 0))]
    print(f"\nbatch inference memory: the train split of {etl} ({runs[0][1]['rows']} rows of "
          f"{row_bytes(spec.image_size):,} bytes), batch {args.batch_size}, {args.master}")
    print(f"  {'rows per Arrow batch':28s} {'peak MiB per Python worker':40s} seconds")
    for label, run in runs:
        peaks = ", ".join(f"{m:.0f}" for m in run["workers"]) or "no worker found"
        print(f"  {label:28s} {peaks:40s} {run['seconds']:.1f}")
    return 0


def single_process(spec, paths, batch_size: int, max_file_bytes: int) -> dict:
    """One process: load the model, then decode ``batch_size`` files and ``model.predict`` them,
    to the end. Returns seconds of the load and of the rest, and the images predicted."""
    import numpy as np

    from pipelines.etl.images import ImageRejected
    from pipelines.predict.infer import make_decoder

    start = time.perf_counter()
    model = spec.load()
    loaded = time.perf_counter()
    decode, predicted = make_decoder(True, spec.image_size, max_file_bytes), 0
    for first in range(0, len(paths), batch_size):
        images = []
        for path in paths[first:first + batch_size]:
            try:
                images.append(decode(path))
            except ImageRejected:
                pass
        if images:
            model.predict(np.stack(images), batch_size=batch_size, verbose=0)
            predicted += len(images)
    return {"load_s": loaded - start, "run_s": time.perf_counter() - loaded, "images": predicted}


def spark_job(args, model: str, output: str) -> dict:
    """``run_predict`` in a session started before the clock; its seconds and summary."""
    from pipelines.predict.config import PredictConfig
    from pipelines.predict.job import run_predict
    from pipelines.runtime.spark import spark_session

    spark = spark_session("predict-bench", args.master)
    config = PredictConfig(model=model, input=args.input, output=output, batch_size=args.batch_size)
    start = time.perf_counter()
    summary = run_predict(config, spark)
    seconds = time.perf_counter() - start
    spark.stop()
    return {"seconds": seconds, "summary": summary, "parallelism": args.master}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", default="", help="an image tree; default: the Tux Paint sample")
    parser.add_argument("--model", default="", help="a run's folder or model.keras; default: untrained head")
    parser.add_argument("--image-size", type=int, default=DEFAULT_IMAGE_SIZE, help="the default model's input size")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workdir", default="out/predict-bench")
    parser.add_argument("--weights", default="", choices=["", "none"],
                        help="the default model's backbone weights: ImageNet (default) or random ('none')")
    parser.add_argument("--memory", action="store_true", help="compare the Python workers' memory on an ETL "
                                                              "split: Spark's default Arrow batch against ours")
    parser.add_argument("--per-class", type=int, default=40, help="--memory's Fashion-MNIST images per class")
    args = parser.parse_args()
    from pipelines.runtime.logs import setup_logging
    from pipelines.predict.inputs import folder_class, plan_tree
    from pipelines.predict.model import resolve_model

    setup_logging("predict-bench")
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    if args.memory:
        return memory_main(args, workdir)
    if not args.input:
        from pipelines.tools import samples

        args.input = os.path.join(workdir, "tuxpaint")
        samples.main(["tuxpaint", "--dest", args.input])
    files = plan_tree(args.input, [], 50 * 2**20).items
    classes = sorted({folder_class(os.path.relpath(i.path, args.input)) for i in files} - {None})
    spec = resolve_model(args.model or default_model(workdir, classes or ["image"], args.image_size, args.weights))
    paths = [i.path for i in files if i.reason is None]
    for path in paths:  # the same warm file cache for both runs
        with open(path, "rb") as f:
            f.read()
    one = single_process(spec, paths, args.batch_size, 50 * 2**20)
    output = os.path.join(workdir, "predictions.parquet")
    job = spark_job(args, spec.path, output)
    report(args, spec, one, job)
    shutil.rmtree(output, ignore_errors=True)
    return 0


def report(args, spec, one: dict, job: dict) -> None:
    """Print the two figures and their ratio."""
    rows = job["summary"]["files"]["predicted"]
    spark_rate, one_rate = rows / job["seconds"], one["images"] / (one["load_s"] + one["run_s"])
    print(f"\nbatch inference: {rows} images of {args.input}, {spec.image_size} px model, batch {args.batch_size}")
    print(f"  jobs/predict.py on Spark {job['parallelism']}: {job['seconds']:.1f} s, {spark_rate:.2f} images/s "
          "(model loaded once per Python worker, decode in the executors)")
    print(f"  one process, model.predict:      {one['load_s'] + one['run_s']:.1f} s, {one_rate:.2f} images/s "
          f"(load {one['load_s']:.1f} s; without it {one['images'] / one['run_s']:.2f} images/s)")
    print(f"  ratio Spark / one process: {spark_rate / one_rate:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
