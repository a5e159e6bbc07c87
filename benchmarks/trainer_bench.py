"""Trainers side by side: our Horovod job against TensorFlow's own ``MultiWorkerMirroredStrategy``.

The same model, data, per-worker and global batch, precision (float32), core binding and threads,
trained by each trainer at world size ``--np`` (default 2) on this machine's CPUs:

* ``horovod``: our training path, :func:`measure.measure_throughput` on ``HorovodRunner(np=-N)``
  (N local processes, Gloo), as ``benchmarks/scaling.py`` runs it: ``setup_rank``, ``build_model``,
  ``compile_distributed`` (``hvd.DistributedOptimizer``), ``ImageInputs``' reader;
* ``mwms``: N worker processes of ``tf.distribute.MultiWorkerMirroredStrategy`` (``TF_CONFIG``
  naming localhost ports; ``benchmarks/mwms_worker.py``), each training the same model on the same
  shard through the same reader, with Keras' ``fit`` and the strategy's ring all-reduce over gRPC.

Only the trainer differs, so the ratio of their steady-state images/s is the trainers' own.
``--rounds`` rounds, the trainers taking turns (the order flips each round, so that the machine's
load falls on both alike); each job's ``--warmup-steps`` steps are discarded and the next
``--steps`` timed (:func:`measure.step_window`), the slowest rank's window counts. Figures are
medians over the rounds. What the difference is made of:

* the allreduce: ``--solo`` also runs each trainer at world size 1 in every round (no gradient is
  exchanged), so ``step ms at N - step ms at 1`` is what being distributed costs each trainer
  (collectives and waiting for the slower rank); Horovod's timeline gives its ``ALLREDUCE`` share
  of the timed window too;
* input: the same reader and ``tf.data`` pipeline in both (nothing to tell apart by design);
* tracing and graph building: each job's first step (``fit``'s start to step 1's end), and the
  whole job's wall time (processes, imports, model, tracing, steps).

Written to ``--out``: ``trainers.csv`` (one row per job). ``--trainers`` names a subset; an
unknown name exits 2 in one line listing the names.

Usage: python benchmarks/trainer_bench.py [--trainers horovod,mwms] [--np 2] [--solo] [--rounds 3]
           [--warmup-steps 3] [--steps 20] [--batch-size 8] [--backbone xception|tiny] [--image-size 0]
           [--threads 1] [--sample fashion-mnist --per-class 40 --etl-image-size 128 | --data ETL_OUTPUT]
           [--out out/trainers]
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import socket
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINERS = {"horovod": "our training path under Horovod (Gloo)",
            "mwms": "tf.distribute.MultiWorkerMirroredStrategy (ring all-reduce over gRPC)"}
# TrainConfig options of this benchmark, with its defaults: as scaling.py's, one batch size.
TRAINING = {"threads": 1, "bind_cores": True, "image_size": 0, "backbone": None, "fine_tune_blocks": 0,
            "batch_size": 8}


def pick_trainers(flag: str) -> List[str]:
    """The trainers ``--trainers`` names (comma-separated, each once, in the order given).

    Raises:
        pipelines.runtime.errors.Refused: an unknown name or an empty list; the message lists the names.
    """
    from pipelines.runtime.errors import Refused

    wanted = list(dict.fromkeys(x.strip() for x in flag.split(",") if x.strip()))
    choose = f"choose from {', '.join(TRAINERS)}"
    if not wanted:
        raise Refused(f"--trainers names no trainer; {choose}")
    unknown = [x for x in wanted if x not in TRAINERS]
    if unknown:
        raise Refused(f"--trainers {flag}: unknown {', '.join(unknown)}; {choose}")
    return wanted


def turns(trainers: Sequence[str], rounds: int) -> List[List[str]]:
    """The order the trainers go in each round: as given in even rounds, reversed in odd ones."""
    return [list(trainers) if r % 2 == 0 else list(reversed(trainers)) for r in range(rounds)]


def job_row(trainer: str, world_size: int, round_: int, result: Dict, wall_s: float,
            allreduce_ms: Optional[float]) -> Dict:
    """One job's row: ``result`` holds ``batch_size`` (per rank), ``steps`` and ``seconds`` (the
    slowest rank's timed window) and ``first_step_seconds``; ``wall_s`` the job's wall seconds,
    launch to end; ``allreduce_ms`` the gradients' all-reduce per step (``None`` at world size 1).
    Images/s = steps x batch x world size / seconds."""
    seconds = result["seconds"]
    return {"trainer": trainer, "np": world_size, "round": round_, "batch_per_rank": result["batch_size"],
            "global_batch": result["batch_size"] * world_size, "steps": result["steps"],
            "images_per_second": round(result["steps"] * result["batch_size"] * world_size / seconds, 3),
            "step_ms": round(1000.0 * seconds / result["steps"], 2),
            "first_step_s": round(result["first_step_seconds"], 3), "job_s": round(wall_s, 2),
            "allreduce_ms": None if allreduce_ms is None else round(allreduce_ms, 3)}


def summarize(rows: Sequence[Dict]) -> List[Dict]:
    """Per trainer and world size (in the rows' first-seen order): the medians of images/s, step ms,
    all-reduce ms (``None`` at world size 1), first step s and job s over the rounds, the runs'
    images/s, and ``vs_horovod``, our median images/s over this one's at the same world size
    (``None`` without a Horovod row there); at world size N > 1 with a world-size-1 row of the same
    trainer, ``distributed_ms``: its median step ms minus world size 1's (what being distributed
    costs a step)."""
    keys = list(dict.fromkeys((r["trainer"], r["np"]) for r in rows))
    out = []
    for trainer, n in keys:
        mine = [r for r in rows if (r["trainer"], r["np"]) == (trainer, n)]
        out.append({"trainer": trainer, "np": n, "runs": [r["images_per_second"] for r in mine],
                    **{k: statistics.median(r[k] for r in mine)
                       for k in ("images_per_second", "step_ms", "first_step_s", "job_s")},
                    "allreduce_ms": statistics.median(r["allreduce_ms"] for r in mine) if n > 1 else None})
    by_key = {(s["trainer"], s["np"]): s for s in out}
    for s in out:
        ours = by_key.get(("horovod", s["np"]))
        s["vs_horovod"] = round(ours["images_per_second"] / s["images_per_second"], 3) if ours else None
        solo = by_key.get((s["trainer"], 1))
        s["distributed_ms"] = round(s["step_ms"] - solo["step_ms"], 2) if solo and s["np"] > 1 else None
    return out


def free_ports(count: int) -> List[int]:
    """``count`` TCP ports free on localhost now (bound to port 0, then released together)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run_mwms(config, world_size: int, warmup_steps: int, steps: int, work: str, timeout_s: float) -> Dict:
    """One ``MultiWorkerMirroredStrategy`` job of ``world_size`` worker processes
    (``benchmarks/mwms_worker.py``; a lone worker has no ``TF_CONFIG``). Returns worker 0's result with
    the slowest worker's ``seconds`` and ``first_step_seconds``.

    Raises:
        RuntimeError: a worker failed or the job ran past ``timeout_s`` (every worker is then
            stopped), with the end of the failed worker's log.
    """
    ports = free_ports(world_size)
    procs, logs, results = [], [], []
    for index in range(world_size):
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        if world_size > 1:
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                                           "task": {"type": "worker", "index": index}})
        stem = os.path.join(work, f"mwms-np{world_size}-worker{index}")
        with open(stem + ".spec", "wb") as f:
            pickle.dump((config, warmup_steps, steps, stem + ".json"), f)
        logs.append(stem + ".log")
        results.append(stem + ".json")
        with open(logs[-1], "w") as log:
            procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "mwms_worker.py"), stem + ".spec"],
                                          stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
    deadline = time.monotonic() + timeout_s
    try:
        for index, proc in enumerate(procs):
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            if code != 0:
                raise RuntimeError(f"MWMS worker {index} of {world_size} exited {code}: {_tail(logs[index])}")
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"MWMS job of {world_size} workers ran past {timeout_s:.0f} s: {_tail(logs[0])}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    found = [json.load(open(path)) for path in results]
    return {**found[0], **{key: max(r[key] for r in found)
                           for key in ("seconds", "first_step_seconds", "allreduce_seconds")}}


def _tail(path: str, lines: int = 15) -> str:
    with open(path, errors="replace") as f:
        return "\n" + "".join(f.readlines()[-lines:])


def run_horovod(config, world_size: int, warmup_steps: int, steps: int, timelines: str):
    """One Horovod job (``HorovodRunner(np=-world_size)``) of :func:`measure.measure_throughput` at
    the config's batch. Returns ``(result, allreduce_ms)``: rank 0's result and, at world size > 1, the
    milliseconds per timed step its timeline spent in ``ALLREDUCE`` (``None`` at world size 1)."""
    import measure
    from pipelines.launch import HorovodRunner

    [result] = HorovodRunner(np=-world_size).run(
        measure.measure_throughput, config=config, batch_sizes=[config.fit.batch_size], warmup_steps=warmup_steps,
        steps=steps, timeline_dir=timelines, fp16_variants=[False])
    point = measure.point_from_result(result)
    return result, (1000.0 * point.allreduce_seconds / steps if world_size > 1 else None)


def parse(argv):
    """The options: ``--trainers``, ``--np``, ``--solo``, ``--rounds``, the steps, the sample or
    ``--data``, ``TrainConfig``'s options of :data:`TRAINING`, ``--out``."""
    import sample_data

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--trainers", default=",".join(TRAINERS), help=f"comma-separated, among: {', '.join(TRAINERS)}")
    parser.add_argument("--np", type=sample_data.positive_int, default=2, help="world size of the comparison")
    parser.add_argument("--solo", action="store_true",
                        help="also run each trainer at world size 1 every round: the step without an allreduce")
    parser.add_argument("--rounds", type=sample_data.positive_int, default=3, help="rounds of turns; medians count")
    parser.add_argument("--warmup-steps", type=sample_data.positive_int, default=3)
    parser.add_argument("--steps", type=sample_data.positive_int, default=20, help="timed steps per job")
    parser.add_argument("--job-timeout", type=float, default=900.0, help="seconds an MWMS job may take")
    sample_data.add_arguments(parser, per_class=40, etl_image_size=128, training=TRAINING)
    parser.add_argument("--out", default="out/trainers", help="folder for trainers.csv, logs and the sample data")
    args = parser.parse_args(argv)
    args.trainers = pick_trainers(args.trainers)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1 here (the same threads in every trainer), got {args.threads}")
    if args.bind_cores and args.np * args.threads > len(os.sched_getaffinity(0)):
        parser.error(f"binding {args.np} ranks x {args.threads} thread(s) needs {args.np * args.threads} cores; "
                     f"{len(os.sched_getaffinity(0))} are available (fewer --np or --threads, or --no-bind-cores)")
    return args, sample_data.check(parser, args, TRAINING, output=args.out, tensorboard=False)


def main(argv=None) -> int:
    from pipelines.runtime.errors import Refused

    try:
        args, base = parse(argv)
    except Refused as exc:  # one line, before any sample, Spark or rank
        print(f"trainer_bench.py: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"  # Horovod's, recorded only over the timed window

    import cloudpickle

    import measure
    import sample_data

    cloudpickle.register_pickle_by_value(measure)  # the ranks cannot import this folder's modules
    work, timelines = os.path.abspath(args.out), os.path.abspath(os.path.join(args.out, "timelines"))
    os.makedirs(timelines, exist_ok=True)
    config = sample_data.prepare(base, args, args.out)
    sizes = [args.np, 1] if args.solo and args.np > 1 else [args.np]
    rows = []
    for round_, order in enumerate(turns(args.trainers, args.rounds), 1):
        for n in sizes:
            for trainer in order:
                print(f"round {round_}/{args.rounds}: {trainer} at np={n}", flush=True)
                start = time.perf_counter()
                if trainer == "horovod":
                    result, allreduce_ms = run_horovod(config, n, args.warmup_steps, args.steps, timelines)
                else:
                    result = run_mwms(config, n, args.warmup_steps, args.steps, work, args.job_timeout)
                    allreduce_ms = 1000.0 * result["allreduce_seconds"] if n > 1 else None
                rows.append(job_row(trainer, n, round_, result, time.perf_counter() - start, allreduce_ms))
                print(f"  {rows[-1]['images_per_second']:.2f} images/s, step {rows[-1]['step_ms']:.1f} ms, "
                      f"first step {rows[-1]['first_step_s']:.2f} s, job {rows[-1]['job_s']:.1f} s", flush=True)
    measure.write_csv(rows, os.path.join(work, "trainers.csv"))
    report(summarize(rows), config, args)
    return 0


def report(summary: Sequence[Dict], config, args) -> None:
    """The table of :func:`summarize` and the goal line."""
    import tensorflow as tf

    from pipelines.training.data import load_dataset

    size_px = config.model.input_size(load_dataset(config.loader.data, 1).stored_size)
    print(f"\nTrainers: TensorFlow {tf.__version__}, {os.cpu_count()} CPUs, {config.compute.threads} thread(s) "
          f"per rank{', each bound to cores of its own' if config.compute.bind_cores else ''}; "
          f"{config.model.backbone} at {size_px} px, data {config.loader.data}; batch {config.fit.batch_size} per "
          f"rank, float32; {args.steps} timed steps after "
          f"{args.warmup_steps}, {args.rounds} round(s), medians")
    print(f"{'trainer':>8s} {'np':>3s} {'global':>6s} {'images/s':>9s} {'step ms':>8s} {'distributed ms':>14s} "
          f"{'allreduce ms':>12s} {'first step s':>12s} {'job s':>7s} {'ours / it':>9s}  runs")
    for s in summary:
        cells = [f"{s[k]:.1f}" if s[k] is not None else "-" for k in ("distributed_ms", "allreduce_ms")]
        ratio = f"{s['vs_horovod']:.3f}" if s["vs_horovod"] is not None else "-"
        print(f"{s['trainer']:>8s} {s['np']:3d} {config.fit.batch_size * s['np']:6d} {s['images_per_second']:9.2f} "
              f"{s['step_ms']:8.1f} {cells[0]:>14s} {cells[1]:>12s} {s['first_step_s']:12.2f} {s['job_s']:7.1f} "
              f"{ratio:>9s}  {', '.join(f'{v:.2f}' for v in s['runs'])}")
    print("distributed ms: the step at this world size less the step at world size 1 (--solo); allreduce ms: the "
          "gradients' all-reduce a step (horovod: its timeline's ALLREDUCE; mwms: the same tensors all-reduced alone)")
    print(f"wrote {os.path.join(args.out, 'trainers.csv')}")
    mwms = next((s for s in summary if s["trainer"] == "mwms" and s["np"] == args.np and s["vs_horovod"]), None)
    if mwms:
        print(f"goal (ours >= 1.0x MultiWorkerMirroredStrategy at np={args.np}): {mwms['vs_horovod']:.3f}x, "
              f"{'met' if mwms['vs_horovod'] >= 1.0 else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
