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
        [--batch-size 32] [--master local[2]] [--workdir out/predict-bench]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipelines.quiet import quiet_by_default  # noqa: E402

quiet_by_default()


def default_model(workdir: str, class_names, size: int) -> str:
    """An exported ``model.keras`` (+ ``model.json``): ImageNet Xception, untrained head."""
    from pipelines.tools.workspace import ensure_weights
    from pipelines.training.model import build_model, export_model

    folder = os.path.join(workdir, f"model-{size}px-{len(class_names)}")
    if not os.path.isfile(os.path.join(folder, "model.json")):
        os.makedirs(folder, exist_ok=True)
        model = build_model(len(class_names), size, weights=ensure_weights(""))
        export_model(model, os.path.join(folder, "model.keras"), size, list(class_names))
    return folder


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
    from pipelines.spark import spark_session

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
    parser.add_argument("--image-size", type=int, default=299, help="the default model's input size")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workdir", default="out/predict-bench")
    args = parser.parse_args()
    from pipelines.logs import setup_logging
    from pipelines.predict.inputs import folder_class, plan_tree
    from pipelines.predict.model import resolve_model

    setup_logging("predict-bench")
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    if not args.input:
        from pipelines.tools import samples

        args.input = os.path.join(workdir, "tuxpaint")
        samples.main(["tuxpaint", "--dest", args.input])
    files = plan_tree(args.input, [], 50 * 2**20).items
    classes = sorted({folder_class(os.path.relpath(i.path, args.input)) for i in files} - {None})
    spec = resolve_model(args.model or default_model(workdir, classes or ["image"], args.image_size))
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
