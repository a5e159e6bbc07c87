"""Scaling: training throughput against world size and per-rank batch size, and time in allreduce.

For each world size in ``--np`` (one Horovod job each, ``HorovodRunner(np=-N)``: N local processes,
Gloo, the same ``--threads`` TensorFlow threads in every process) and each per-rank batch size in
``--batch-sizes``, every rank trains the article's model on its Petastorm shard exactly as
``jobs/train.py`` does (:func:`measure.measure_throughput`): ``--warmup-steps``
steps are discarded (graph tracing, cold cache, initial broadcast), the next ``--steps`` are timed.
Horovod's timeline is recorded over the timed window, so the share of step time spent in
``ALLREDUCE`` (and in negotiation: waiting until every rank's gradient is ready) comes from Horovod
itself. Printed and written (``scaling.csv``, ``scaling.png`` in ``--out``): images/s, step time,
speed-up and scaling efficiency against world size 1 at the same per-rank batch, and the shares.
Goal here: scaling efficiency at np=2 of at least 0.9 (for ``--headline-batch``).

Training settings are ``TrainConfig``'s options (``--threads``, ``--bind-cores``, ``--image-size``: the
model's input, 0 = the ETL's size; ``--weights``), one base config for every measurement; the sample's
ETL size is ``--etl-image-size``.

Each rank is bound to ``--threads`` cores of its own (``--no-bind-cores`` to compare): otherwise
world size 1 borrows the idle cores for its helper threads, while at a full machine every rank's
helper threads preempt the others' compute and the synchronous allreduce waits for the slowest.
Horovod's background thread runs a negotiation round with every other rank each
``HOROVOD_CYCLE_TIME`` (default 1 ms), on the rank's own cores; ``--cycle-time-ms 5`` makes those
rounds rarer (at most 5 ms more latency per step, against steps of 0.3-3 s here).

Fine-tuning (``--fine-tune-blocks N``): the backbone's top N blocks train too, as in the job's
second phase, so their gradients are allreduced as well (Xception's block 14 alone: 4.75 M
parameters, 19 MB per step in float32, against the frozen backbone's head, 2048 x classes).
``--fp16-allreduce`` allreduces them as float16 (``hvd.Compression.fp16``); ``--compare-fp16``
measures every point both ways, side by side. The table prints the bytes a rank allreduces per
step (trainable parameters x 4, or x 2 with fp16).

``--co-run`` also runs N independent world-size-1 jobs at the same time (N = the largest
``--np``), each bound to cores of its own, with no allreduce between them: their combined images/s
against N times world size 1's is this machine's own efficiency at N (shared memory bandwidth
and caches), the bound on what Horovod can reach here; the rest of the np=N loss is Horovod's.

A list of sizes on a bigger machine: ``--np 1,2,4,8`` (each world size needs that many cores
times ``--threads``, or GPUs: one per rank).

Usage: python benchmarks/scaling.py [--np 1,2] [--batch-sizes 4,8,16,32] [--threads 1] [--no-bind-cores]
           [--cycle-time-ms MS] [--fine-tune-blocks N] [--fp16-allreduce | --compare-fp16] [--mixed-precision]
           [--co-run] [--warmup-steps 3] [--steps 10] [--sample fashion-mnist --per-class 100 --etl-image-size 299 |
            --data ETL_OUTPUT] [--image-size 0] [--weights FILE] [--out OUT/scaling]
"""
from __future__ import annotations

import argparse
import os
import sys

import sample_data
from measure import write_csv

# TrainConfig options of this benchmark, with its defaults: one thread per rank, each rank on cores of its own.
TRAINING = {"threads": 1, "bind_cores": True, "image_size": 0, "backbone": None, "fine_tune_blocks": 0,
            "fp16_allreduce": False, "mixed_precision": False}


def int_list(text: str) -> list:
    """argparse type: distinct positive integers, comma-separated."""
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct positive integers, comma-separated, got {text!r}")
    return values


def plot(rows: list, path: str, title: str) -> None:
    """Two panels: images/s against world size (one line per per-rank batch, linear ideal dashed),
    and images/s per rank against per-rank batch size (one line per world size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch_size_per_rank"] for r in rows})
    sizes = sorted({r["world_size"] for r in rows})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for b, fp16 in sorted({(r["batch_size_per_rank"], r["fp16_allreduce"]) for r in rows}):
        pts = sorted((r["world_size"], r["images_per_second"]) for r in rows
                     if r["batch_size_per_rank"] == b and r["fp16_allreduce"] == fp16)
        line, = left.plot(*zip(*pts), marker="o", label=f"batch {b} per rank{', fp16 allreduce' if fp16 else ''}")
        base = dict(pts).get(1)
        if base:
            left.plot(sizes, [base * n for n in sizes], linestyle="--", color=line.get_color(), alpha=0.4)
    left.set(xlabel="world size (ranks)", ylabel="training images/s", xticks=sizes,
             title="throughput vs world size (dashed: linear)")
    left.legend(fontsize=8)
    for n in sizes:
        pts = sorted((r["batch_size_per_rank"], r["images_per_second"] / n) for r in rows
                     if r["world_size"] == n and not r["fp16_allreduce"])
        right.plot(*zip(*pts), marker="o", label=f"np={n}")
    right.set_xscale("log", base=2)
    right.set_xticks(batches, [str(b) for b in batches])
    right.minorticks_off()
    right.set(xlabel="batch size per rank", ylabel="images/s per rank", title="per-rank batch-size sweep")
    left.set_ylim(bottom=0)
    right.set_ylim(bottom=0)
    right.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--np", type=int_list, default=[1, 2], help="world sizes, e.g. 1,2,4,8")
    parser.add_argument("--batch-sizes", type=int_list, default=[4, 8, 16, 32], help="per-rank batch sizes")
    parser.add_argument("--headline-batch", type=int, default=16, help="per-rank batch of the goal line")
    parser.add_argument("--cycle-time-ms", type=float, default=0.0,
                        help="HOROVOD_CYCLE_TIME (ms) of the ranks; 0 = as in this environment (unset: 1 ms)")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    sample_data.add_arguments(parser, per_class=100, etl_image_size=299, training=TRAINING)
    parser.add_argument("--compare-fp16", action="store_true",
                        help="measure every point with float32 and with float16 (--fp16-allreduce) allreduce")
    parser.add_argument("--co-run", action="store_true",
                        help="also time max(--np) independent world-size-1 jobs at once (no allreduce): the "
                             "machine's own efficiency, the bound on Horovod's")
    parser.add_argument("--out", default="out/scaling",
                        help="folder for scaling.csv, scaling.png, timelines/ and the sample data")
    args = parser.parse_args(argv)
    if args.warmup_steps < 1 or args.steps < 1:
        parser.error("--warmup-steps and --steps must be >= 1")
    if args.cycle_time_ms < 0:
        parser.error("--cycle-time-ms must be >= 0")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1 here (the same threads at every world size), got {args.threads}")
    if args.headline_batch not in args.batch_sizes:
        parser.error(f"--headline-batch {args.headline_batch} is not one of --batch-sizes {args.batch_sizes}")
    if args.co_run and 1 not in args.np:
        parser.error("--co-run compares with world size 1: put 1 in --np")
    available = len(os.sched_getaffinity(0))
    if args.bind_cores and max(args.np) * args.threads > available:
        parser.error(f"binding {max(args.np)} ranks x {args.threads} thread(s) needs {max(args.np) * args.threads} "
                     f"cores; {available} are available (fewer --np or --threads, or --no-bind-cores)")
    base = sample_data.check(parser, args, TRAINING, output=args.out, tensorboard=False)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"  # recorded only over the timed window
    if args.cycle_time_ms > 0:
        os.environ["HOROVOD_CYCLE_TIME"] = str(args.cycle_time_ms)

    import cloudpickle

    import measure
    from pipelines.launch import HorovodRunner

    # The ranks cannot import this folder's modules: the measuring function travels by value.
    cloudpickle.register_pickle_by_value(measure)

    os.makedirs(os.path.join(args.out, "timelines"), exist_ok=True)
    config = sample_data.prepare(base, args, args.out)
    results = []
    fp16_variants = [False, True] if args.compare_fp16 else [config.compute.fp16_allreduce]
    for n in args.np:
        print(f"np={n}: batch sizes {args.batch_sizes} per rank, {config.compute.threads} thread(s) per rank",
              flush=True)
        results += HorovodRunner(np=-n).run(
            measure.measure_throughput, config=config, batch_sizes=args.batch_sizes, warmup_steps=args.warmup_steps,
            steps=args.steps, timeline_dir=os.path.abspath(os.path.join(args.out, "timelines")),
            fp16_variants=fp16_variants)
    rows = measure.scaling_rows([measure.point_from_result(r) for r in results])
    alone = co_run(max(args.np), config, args, fp16_variants) if args.co_run else []

    machine = (f"{os.cpu_count()} CPUs, {config.compute.threads} thread(s) per rank"
               f"{', bound to cores of its own' if config.compute.bind_cores else ', not bound'}, "
               f"HOROVOD_CYCLE_TIME {os.environ.get('HOROVOD_CYCLE_TIME', 'unset (1 ms)')}")
    trained = (f"top {config.model.fine_tune_blocks} backbone block(s) + head trained" if config.model.fine_tune_blocks
               else "frozen backbone, head trained")
    print(f"\nScaling: {machine}, data {config.loader.data}, {trained}, {args.steps} timed steps after "
          f"{args.warmup_steps} warm-up")
    print(f"{'np':>3s} {'batch/rank':>10s} {'global':>7s} {'allreduce':>9s} {'MB/step':>8s} {'step ms':>8s} "
          f"{'images/s':>9s} {'speed-up':>9s} {'efficiency':>10s} {'allreduce':>10s} {'negotiation':>12s}")
    for r in rows:
        speed_up = f"{r['speed_up']:.3f}" if r["speed_up"] else "-"
        efficiency = f"{r['scaling_efficiency']:.3f}" if r["scaling_efficiency"] else "-"
        print(f"{r['world_size']:3d} {r['batch_size_per_rank']:10d} {r['global_batch_size']:7d} "
              f"{'float16' if r['fp16_allreduce'] else 'float32':>9s} {r['allreduce_bytes_per_step'] / 1e6:8.2f} "
              f"{r['step_ms']:8.1f} {r['images_per_second']:9.1f} {speed_up:>9s} {efficiency:>10s} "
              f"{100 * r['allreduce_share']:9.2f}% {100 * r['negotiation_share']:11.2f}%")
    write_csv(rows, os.path.join(args.out, "scaling.csv"))
    plot(rows, os.path.join(args.out, "scaling.png"), f"{config.model.backbone}: {trained}, {machine}")
    print(f"wrote {os.path.join(args.out, 'scaling.csv')} and {os.path.join(args.out, 'scaling.png')}")

    headline = [r for r in rows if r["world_size"] == 2 and r["batch_size_per_rank"] == args.headline_batch]
    for r in (r for r in headline if r["scaling_efficiency"]):
        eff = r["scaling_efficiency"]
        print(f"goal (scaling efficiency at np=2, batch {args.headline_batch} per rank"
              f"{', fp16 allreduce' if r['fp16_allreduce'] else ''}, >= 0.9): {eff:.3f}, "
              f"{'met' if eff >= 0.9 else 'NOT met'}")
    print_co_run(alone, rows, max(args.np))
    return 0


def co_run(n: int, config, args, fp16_variants) -> list:
    """``n`` world-size-1 jobs at once, job ``i`` on cores ``[i * threads, (i + 1) * threads)`` of
    this process's; returns each job's :func:`measure.measure_throughput` results, one list per job."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    print(f"co-run: {n} independent world-size-1 jobs at once, {config.compute.threads} thread(s) each", flush=True)
    # Not multiprocessing.Pool: its workers are daemons, which may not start horovodrun's processes.
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        jobs = [pool.submit(_alone, slot, config, args.batch_sizes, args.warmup_steps, args.steps, fp16_variants)
                for slot in range(n)]
        return [job.result() for job in jobs]


def _alone(slot: int, config, batch_sizes, warmup_steps: int, steps: int, fp16_variants) -> list:
    """One world-size-1 job (``HorovodRunner(np=-1)``), confined to its slot's cores first: the rank
    inherits them and binds within them (:func:`pipelines.training.devices.bind_to_cores`)."""
    import cloudpickle

    import measure
    from pipelines.launch import HorovodRunner

    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores[slot * config.compute.threads:(slot + 1) * config.compute.threads])
    cloudpickle.register_pickle_by_value(measure)
    return HorovodRunner(np=-1).run(measure.measure_throughput, config=config, batch_sizes=batch_sizes,
                                    warmup_steps=warmup_steps, steps=steps, fp16_variants=fp16_variants)


def print_co_run(alone: list, rows: list, n: int) -> None:
    """Per batch size and precision: the ``n`` lone jobs' combined images/s, and that against
    ``n`` x world size 1's alone (the machine's own efficiency at ``n``)."""
    if not alone:
        return
    solo = {(r["batch_size_per_rank"], r["fp16_allreduce"]): r["images_per_second"] for r in rows
            if r["world_size"] == 1}
    for i, first in enumerate(alone[0]):
        key = (first["batch_size"], first["fp16"])
        together = sum(job[i]["batch_size"] * job[i]["steps"] / job[i]["seconds"] for job in alone)
        horovod = next((r["scaling_efficiency"] for r in rows if r["world_size"] == n
                        and (r["batch_size_per_rank"], r["fp16_allreduce"]) == key), None)
        print(f"co-run, batch {key[0]}{' (fp16 variant)' if key[1] else ''}: {n} lone world-size-1 jobs at once "
              f"{together:.1f} images/s, {together / (n * solo[key]):.3f} of {n} x world size 1 alone (the "
              f"machine's own bound); Horovod at np={n}: {horovod:.3f}")


if __name__ == "__main__":
    sys.exit(main())
