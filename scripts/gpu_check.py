"""A GPU host's check in one command: Horovod's build (NCCL present), one process per GPU, scaling
of the frozen and the 2-block fine-tuned model, and the loader on the same host; one table, one PNG.

    python scripts/gpu_check.py [--np 1,2,4,8] [--out out/gpu-check] [--data ETL_OUTPUT] [--weights FILE]
    python scripts/gpu_check.py --dry-run        # on a CPU: np 1 and 2, tiny backbone, a few steps

Steps, each reported in the table or the lines below it:
1. ``horovodrun --check-build``: TensorFlow, Gloo and (on a GPU host) NCCL must be listed.
2. One process per GPU: ``horovodrun -np N`` (N = the largest ``--np``) with ``NCCL_DEBUG=INFO``
   runs this script's ``--probe`` on every rank: the training job's own rank set-up
   (``pipelines.training.rank.setup_rank``), then which GPU each rank sees (its PCI bus id) and an
   allreduce whose sum is checked; NCCL's INFO lines are counted.
3. ``benchmarks/scaling.py`` at every ``--np``: the frozen backbone and ``--fine-tune-blocks 2``,
   each without and with ``--mixed-precision``, every point with float32 and float16 allreduce
   (``--compare-fp16``). The dry run measures the frozen model without and the fine-tuned one with
   mixed precision (a CPU never computes in float16, so the other two pairs would repeat them); its
   frozen run also runs lone world-size-1 jobs at once (``--co-run``): on a CPU the ranks share the
   host's cores, so what they reach together is the bound the np=2 efficiency is read against.
4. ``benchmarks/loader_bench.py`` at 32 MiB row groups (the ETL's default) on the same host.
Then: the table (also ``gpu_check.csv``), ``gpu_check.png``, the effective allreduce bandwidth
fitted from each run at the largest world size (``benchmarks/scaling_model.py``'s ``fit``), and
whether one loader process keeps up with what a GPU consumed.

Exit status: 0 when every check passed, 1 when one failed (each named), 2 for bad input (no GPU
without ``--dry-run``, more ranks than GPUs, a bad ``--np``), before anything runs.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
PROBE_TAG = "GPU-CHECK "
# (run name, --fine-tune-blocks, --mixed-precision)
RUNS = [("frozen", 0, False), ("frozen", 0, True), ("fine-tune 2 blocks", 2, False), ("fine-tune 2 blocks", 2, True)]
DRY_RUNS = [RUNS[0], RUNS[3]]


def parse_check_build(text: str) -> Dict[str, Dict[str, bool]]:
    """``horovodrun --check-build``'s output as ``{section: {name: listed}}``, e.g.
    ``{"Available Tensor Operations": {"NCCL": True, "Gloo": True, ...}, ...}``."""
    sections: Dict[str, Dict[str, bool]] = {}
    current = None
    for line in text.splitlines():
        entry = re.match(r"\s*\[([ Xx])\]\s+(\S.*?)\s*$", line)
        if entry and current is not None:
            sections[current][entry.group(2)] = entry.group(1) != " "
        elif line.strip().endswith(":"):
            current = line.strip()[:-1]
            sections[current] = {}
    return sections


def build_problems(sections: Dict[str, Dict[str, bool]], need_nccl: bool) -> List[str]:
    """What the build lacks: TensorFlow, Gloo and, on a GPU host, NCCL (one line each)."""
    wanted = [("Available Frameworks", "TensorFlow"), ("Available Controllers", "Gloo")]
    if need_nccl:
        wanted.append(("Available Tensor Operations", "NCCL"))
    return [f"horovodrun --check-build does not list {name} under {section}"
            for section, name in wanted if not sections.get(section, {}).get(name)]


def parse_gpus(text: str) -> List[Dict[str, str]]:
    """``nvidia-smi --query-gpu=index,name,pci.bus_id --format=csv,noheader`` as a list of dicts."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append({"index": parts[0], "name": parts[1], "pci_bus_id": parts[2]})
    return gpus


def world_sizes(text: str, gpus: int, dry_run: bool) -> List[int]:
    """The ``--np`` list, checked: distinct positive integers; on a GPU host at most one rank per
    GPU. Raises ``ValueError`` naming what is wrong (both numbers when ranks outnumber GPUs)."""
    try:
        sizes = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"--np takes comma-separated integers, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise ValueError(f"--np takes positive integers, got {text!r}")
    if not dry_run and sizes[-1] > gpus:
        raise ValueError(f"--np {sizes[-1]} needs {sizes[-1]} GPUs (one per rank); this host has {gpus}")
    return sizes


def probe_problems(probe: Optional[Dict], ranks: int, dry_run: bool) -> List[str]:
    """What the probe's report shows wrong: a missing report, a rank that sees no GPU or several,
    two local ranks on one GPU, a wrong allreduce sum (expected ``0 + 1 + ... + ranks - 1``)."""
    if probe is None:
        return [f"the {ranks}-rank probe printed no report"]
    problems = []
    if probe["sum"] != ranks * (ranks - 1) / 2:
        problems.append(f"allreduce of the ranks' numbers gave {probe['sum']}, expected {ranks * (ranks - 1) // 2}")
    seen: Dict[Tuple[str, str], int] = {}
    for r in probe["ranks"]:
        if not dry_run and len(r["gpus"]) != 1:
            problems.append(f"rank {r['rank']} on {r['host']} sees {len(r['gpus'])} GPUs, expected 1")
        for gpu in r["gpus"]:
            key = (r["host"], gpu.get("pci_bus_id") or gpu["name"])
            if key in seen:
                problems.append(f"ranks {seen[key]} and {r['rank']} on {r['host']} share GPU {key[1]}")
            seen[key] = r["rank"]
    return problems


def parse_loader(text: str, labels: Sequence[str]) -> Dict[str, float]:
    """``loader_bench.py``'s images/s for its first row-group size, one per label (a path such as
    ``warm cache (epoch 2)``, of the first reader its table lists), and its ``ceiling``; empty when
    its output has no table."""
    found: Dict[str, float] = {}
    ceiling = re.search(r"ceiling \(in memory, same tail\) (\d+) images/s", text)
    if ceiling:
        found["ceiling"] = float(ceiling.group(1))
    block = re.search(r"^[\d.]+ MiB row groups:.*?\n((?:[ \t]+\S.*\n?)+)", text, re.M)
    for line in (block.group(1).splitlines() if block else []):
        row = re.match(r"\s+(?:[\w-]+, )?(.+?)\s+([\d.]+) images/s", line)
        if row and row.group(1) in labels and row.group(1) not in found:
            found[row.group(1)] = float(row.group(2))
    return found


def fitted_bandwidths(rows: Sequence[Dict]) -> Dict[str, float]:
    """Per run and allreduce precision at the largest world size with an allreduce: the effective
    bandwidth (bytes/s) fitted by the scaling model from step time, allreduce share and bytes."""
    sys.path.insert(0, BENCHMARKS)
    from scaling_model import fit

    out = {}
    largest = max(int(r["world_size"]) for r in rows)
    for r in rows:
        share, step = float(r["allreduce_share"]), float(r["step_ms"]) / 1000
        if int(r["world_size"]) == largest > 1 and 0 < share < 1:
            key = f"{r['run']}, {'fp16' if r['fp16_allreduce'] == 'True' else 'fp32'} allreduce"
            out[key] = fit(largest, step, share * step, float(r["allreduce_bytes_per_step"]))["bandwidth"]
    return out


def format_table(rows: Sequence[Dict], loader: Dict[str, float]) -> str:
    """The one table: a line per scaling point, then the loader's figures."""
    head = (f"{'run':<20s} {'mixed':>5s} {'np':>3s} {'allreduce':>9s} {'MB/step':>8s} {'step ms':>8s} "
            f"{'images/s':>9s} {'per GPU':>8s} {'efficiency':>10s} {'allreduce':>9s} {'negotiation':>11s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        n, rate = int(r["world_size"]), float(r["images_per_second"])
        eff = f"{float(r['scaling_efficiency']):.3f}" if r["scaling_efficiency"] else "-"
        lines.append(f"{r['run']:<20s} {'on' if r['mixed_precision'] == 'True' else 'off':>5s} {n:3d} "
                     f"{'float16' if r['fp16_allreduce'] == 'True' else 'float32':>9s} "
                     f"{float(r['allreduce_bytes_per_step']) / 1e6:8.3g} {float(r['step_ms']):8.1f} {rate:9.1f} "
                     f"{rate / n:8.1f} {eff:>10s} {100 * float(r['allreduce_share']):8.2f}% "
                     f"{100 * float(r['negotiation_share']):10.2f}%")
    for label, value in loader.items():
        lines.append(f"loader, one process: {label:<32s} {value:9.0f} images/s")
    return "\n".join(lines)


def probe_rank() -> int:
    """Run by every rank of the probe: the training job's own set-up, then this rank's GPUs (name,
    PCI bus id) and an allreduce of the rank numbers; rank 0 prints one ``GPU-CHECK {json}`` line."""
    import socket

    from pipelines.training.config import TrainConfig
    from pipelines.training.rank import setup_rank

    rank = setup_rank(TrainConfig(data=os.curdir, output=os.curdir, weights="none"), job="gpu-check")
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from tensorflow.python.client import device_lib  # the one API that gives a GPU's PCI bus id

    gpus = [{"name": d.name, "pci_bus_id": (re.search(r"pci bus id: ([0-9a-fA-F:.]+)", d.physical_device_desc)
                                            or [None, None])[1]}
            for d in device_lib.list_local_devices() if d.device_type == "GPU"]
    total = float(hvd.allreduce(tf.constant(float(rank.rank)), op=hvd.Sum).numpy())
    report = {"rank": rank.rank, "local_rank": rank.local_rank, "host": socket.gethostname(), "gpus": gpus,
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    reports = hvd.allgather_object(report)
    if rank.rank == 0:
        print(PROBE_TAG + json.dumps({"ranks": reports, "sum": total}), flush=True)
    return 0


def horovodrun() -> str:
    """The ``horovodrun`` beside this Python (the venv's), else the one on ``PATH``."""
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return beside if os.path.exists(beside) else (shutil.which("horovodrun") or "horovodrun")


def run(command: Sequence[str], env: Dict[str, str], log: str, timeout: int) -> subprocess.CompletedProcess:
    """Run ``command``, keep its whole output in ``log``; the output is returned too."""
    result = subprocess.run(list(command), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    with open(log, "w") as f:
        f.write(f"$ {' '.join(command)}\n{result.stdout}\n{result.stderr}")
    return result


def probe(ranks: int, env: Dict[str, str], out: str) -> Tuple[Optional[Dict], int]:
    """The probe on ``ranks`` local ranks with ``NCCL_DEBUG=INFO``: the report and the count of
    NCCL INFO lines."""
    result = run([horovodrun(), "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", sys.executable,
                  os.path.abspath(__file__), "--probe"], {**env, "NCCL_DEBUG": "INFO"},
                 os.path.join(out, "probe.log"), timeout=600)
    text = result.stdout + result.stderr
    line = next((line for line in text.splitlines() if PROBE_TAG in line), None)
    report = json.loads(line.split(PROBE_TAG, 1)[1]) if line and result.returncode == 0 else None
    return report, len(re.findall(r"NCCL INFO", text))


def scaling(name: str, blocks: int, mixed: bool, args, data: str, env: Dict[str, str],
            co_run: bool = False) -> List[Dict]:
    """One ``benchmarks/scaling.py`` run (every ``--np``, float32 and float16 allreduce, and with
    ``co_run`` its ``--co-run``, whose lines are printed); its CSV rows with ``run`` and
    ``mixed_precision`` added. Raises ``RuntimeError`` naming its log on failure."""
    slug = f"{name.replace(' ', '-')}{'-mixed' if mixed else ''}"
    folder = os.path.join(args.out, slug)
    command = [sys.executable, os.path.join(BENCHMARKS, "scaling.py"), "--np", ",".join(map(str, args.sizes)),
               "--batch-sizes", str(args.batch_size), "--headline-batch", str(args.batch_size), "--compare-fp16",
               "--warmup-steps", str(args.warmup_steps), "--steps", str(args.steps), "--data", data,
               "--out", folder, "--threads", str(args.threads), "--fine-tune-blocks", str(blocks)]
    command += (["--mixed-precision"] if mixed else []) + (["--co-run"] if co_run else [])
    command += ["--backbone", "tiny", "--weights", "none"] if args.dry_run else \
        (["--weights", args.weights] if args.weights else [])
    os.makedirs(folder, exist_ok=True)
    log = os.path.join(folder, "scaling.log")
    result = run(command, env, log, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"benchmarks/scaling.py failed for {name}{' (mixed precision)' if mixed else ''}: see {log}")
    for line in result.stdout.splitlines():
        if line.startswith("co-run, batch"):
            print(f"{name}: {line}")
    with open(os.path.join(folder, "scaling.csv")) as f:
        return [{"run": name, "mixed_precision": str(mixed), **row} for row in csv.DictReader(f)]


def loader(args, env: Dict[str, str]) -> Tuple[Dict[str, float], str]:
    """``benchmarks/loader_bench.py`` at 32 MiB row groups (1 MiB in the dry run's tiny sample); its
    figures and the log's path."""
    sys.path.insert(0, BENCHMARKS)
    from loader_bench import KINDS

    folder = os.path.join(args.out, "loader")
    os.makedirs(folder, exist_ok=True)
    command = [sys.executable, os.path.join(BENCHMARKS, "loader_bench.py"), "--per-class", str(args.per_class),
               "--etl-image-size", str(args.image_size), "--row-group-mb", "1" if args.dry_run else "32",
               "--batch-size", str(args.batch_size), "--workdir", os.path.join(folder, "work")]
    log = os.path.join(folder, "loader.log")
    result = run(command, env, log, timeout=3600)
    return (parse_loader(result.stdout, KINDS) if result.returncode == 0 else {}), log


def sample_data(args, env: Dict[str, str]) -> str:
    """``--data``, or Fashion-MNIST through the ETL into ``OUT/data/etl`` (reused when there), in a
    process of its own so that its Spark session ends with it."""
    if args.data:
        return args.data
    code = ("import sys; from pipelines.tools.workspace import ensure_sample_etl; "
            "print(ensure_sample_etl(sys.argv[1], image_size=int(sys.argv[2]), sample='fashion-mnist', "
            "per_class=int(sys.argv[3])))")
    log = os.path.join(args.out, "data.log")
    result = run([sys.executable, "-c", code, os.path.join(args.out, "data"), str(args.image_size),
                  str(args.per_class)], env, log, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"the sample's ETL failed: see {log}")
    return result.stdout.strip().splitlines()[-1]


def plot(rows: Sequence[Dict], path: str, title: str) -> None:
    """Images/s and scaling efficiency against world size, a line per run, precision and allreduce."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    keys = sorted({(r["run"], r["mixed_precision"], r["fp16_allreduce"]) for r in rows})
    for run_name, mixed, fp16 in keys:
        pts = sorted((int(r["world_size"]), float(r["images_per_second"]), float(r["scaling_efficiency"] or 0))
                     for r in rows if (r["run"], r["mixed_precision"], r["fp16_allreduce"]) == (run_name, mixed, fp16))
        label = f"{run_name}{', mixed' if mixed == 'True' else ''}{', fp16 allreduce' if fp16 == 'True' else ''}"
        left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        right.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=label)
    sizes = sorted({int(r["world_size"]) for r in rows})
    left.set(xlabel="ranks (one per GPU)", ylabel="training images/s", xticks=sizes, title="throughput")
    right.axhline(0.9, color="k", linestyle="--", linewidth=0.8)
    right.set(xlabel="ranks (one per GPU)", ylabel="scaling efficiency", xticks=sizes, ylim=(0, 1.1),
              title="efficiency (dashed: 0.9)")
    left.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="on a CPU: np 1,2, the tiny backbone on a small sample, a few steps")
    parser.add_argument("--np", default="", help="world sizes (default 1,2,4,8; dry run 1,2)")
    parser.add_argument("--out", default=os.path.join("out", "gpu-check"))
    parser.add_argument("--data", default="", help="an ETL output; default: Fashion-MNIST through the ETL")
    parser.add_argument("--weights", default="", help="backbone weights (default: the offline ImageNet file)")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)  # run by each rank of step 2
    args = parser.parse_args(argv)
    if args.probe:
        return args
    small = args.dry_run
    args.batch_size, args.steps, args.warmup_steps = (4, 2, 1) if small else (32, 20, 5)
    args.per_class, args.image_size = (4, 71) if small else (100, 299)
    listed = subprocess.run(["nvidia-smi", "--query-gpu=index,name,pci.bus_id", "--format=csv,noheader"],
                            capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    args.gpus = parse_gpus(listed.stdout) if listed and listed.returncode == 0 else []
    if not args.gpus and not small:
        parser.error("no GPU found (nvidia-smi lists none): run this on a GPU host, or with --dry-run on a CPU")
    try:
        args.sizes = world_sizes(args.np or ("1,2" if small else "1,2,4,8"), len(args.gpus), small)
    except ValueError as exc:
        parser.error(str(exc))
    if args.data and not os.path.isfile(os.path.join(args.data, "manifest.json")):
        parser.error(f"--data {args.data}: no manifest.json there (not an ETL output)")
    args.threads = max(1, len(os.sched_getaffinity(0)) // args.sizes[-1])
    return args


def checks(args, env: Dict[str, str]) -> List[str]:
    """Steps 1 and 2: the build and the probe. Prints what they found; returns the problems."""
    built = run([horovodrun(), "--check-build"], env, os.path.join(args.out, "check-build.log"), timeout=300)
    sections = parse_check_build(built.stdout)
    problems = build_problems(sections, need_nccl=not args.dry_run)
    listed = ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in
                       sections.get("Available Tensor Operations", {}).items())
    print(f"build: tensor operations: {listed or 'none listed'}")
    print(f"GPUs on this host: {len(args.gpus)}" + "".join(f"\n  {g['index']}: {g['name']} ({g['pci_bus_id']})"
                                                         for g in args.gpus))
    report, nccl_lines = probe(args.sizes[-1], env, args.out)
    problems += probe_problems(report, args.sizes[-1], args.dry_run)
    if not args.dry_run and nccl_lines == 0:
        problems.append("no NCCL INFO line in the probe's output: its allreduce did not use NCCL")
    for r in (report or {}).get("ranks", []):
        gpus = ", ".join(f"{g['pci_bus_id'] or g['name']}" for g in r["gpus"]) or "none (CPU)"
        print(f"  rank {r['rank']} (local {r['local_rank']}) on {r['host']}: GPU {gpus}")
    print(f"probe: {args.sizes[-1]} ranks, allreduce sum {report and report['sum']}, {nccl_lines} NCCL INFO lines "
          f"(see {os.path.join(args.out, 'probe.log')})")
    return problems


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.probe:
        return probe_rank()
    os.makedirs(args.out, exist_ok=True)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    problems = checks(args, env)
    try:
        data = sample_data(args, env)
        rows = [row for name, blocks, mixed in (DRY_RUNS if args.dry_run else RUNS)
                for row in scaling(name, blocks, mixed, args, data, env, co_run=args.dry_run and not blocks)]
    except RuntimeError as exc:
        print(f"FAILED: {exc}")
        return 1
    found, loader_log = loader(args, env)
    if not found:
        problems.append(f"the loader benchmark gave no figures: see {loader_log}")
    print("\n" + format_table(rows, found))
    with open(os.path.join(args.out, "gpu_check.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    what = "dry run on a CPU, tiny backbone" if args.dry_run else f"{len(args.gpus)} x {args.gpus[0]['name']}"
    plot(rows, os.path.join(args.out, "gpu_check.png"), f"gpu_check: {what}, batch {args.batch_size} per rank")
    summarise(rows, found)
    print(f"wrote {os.path.join(args.out, 'gpu_check.csv')} and {os.path.join(args.out, 'gpu_check.png')}")
    for problem in problems:
        print(f"FAILED: {problem}")
    print("all checks passed" if not problems else f"{len(problems)} check(s) failed")
    return 1 if problems else 0


def rate(bytes_per_second: float) -> str:
    """``bytes_per_second`` in GB/s, MB/s or kB/s, whichever keeps it above 1."""
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6)):
        if bytes_per_second >= size:
            return f"{bytes_per_second / size:.2f} {unit}"
    return f"{bytes_per_second / 1e3:.2f} kB/s"


def summarise(rows: Sequence[Dict], found: Dict[str, float]) -> None:
    """The fitted allreduce bandwidths, and whether one loader process keeps up with one GPU."""
    for key, bandwidth in fitted_bandwidths(rows).items():
        print(f"fitted allreduce bandwidth ({key}): {rate(bandwidth)} "
              f"(python benchmarks/scaling_model.py --fit-* predicts other world sizes from it)")
    warm = found.get("warm cache (epoch 2)")
    fastest = max(float(r["images_per_second"]) / int(r["world_size"]) for r in rows)
    if warm:
        verdict = "keeps up" if warm >= fastest else "is the bottleneck: more reader threads or processes per GPU"
        print(f"loader: {warm:.0f} images/s warm in one process against {fastest:.0f} images/s consumed per GPU "
              f"at best: one loader process {verdict}")


if __name__ == "__main__":
    sys.exit(main())
