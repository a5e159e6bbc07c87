"""The time from a lost rank to training again with fewer ranks (issue 38, item 4), on both launch paths.

* ``horovodrun``, one machine: ``horovodrun -np 2 --min-np 1 --max-np 2 --network-interface lo
  --host-discovery-script "scripts/host_discovery.sh SLOTS" python jobs/train.py ...`` (each slot a
  name of its own: pipelines/launch/discovery.py); the ranks left go on in the same processes
  (pipelines/launch/elastic.py).
* Spark barrier tasks: a standalone cluster of three 1-core workers on this machine
  (pipelines/launch/cluster.py), ``spark-submit jobs/train.py --spark-np 3 --min-np 2
  --max-failures 1 ...``; the driver relaunches on the two slots left (pipelines/launch/sparkcheck.py).

Both train the tiny backbone on generated 71 px images (3 classes x 26, ``tests/support/imagegen.py``),
batch 4 per rank, 4 epochs, a step checkpoint every ``--checkpoint-every-steps`` steps (default 1).
Once rank 0 has marked ``--kill-after`` steps of epoch 2 done (``OUTPUT/progress.json``), rank 1 is
lost: under horovodrun its process is SIGKILLed (its slot
taken out of the discovery file first, as a lost machine's); on Spark every process of its worker
(the worker, its executor, the Python daemon, the rank) is SIGKILLed, and nothing replaces it.
Only processes this benchmark started are ever killed.

Printed per path, in seconds after the kill: when the loss was acted on (horovodrun: the rank left
says ``a rank was lost``; Spark: the driver's ``relaunching on N ranks`` line), when the new rank 0
had restored the checkpoint (its ``resuming ...`` line), and when the first step of the new world
was done (rank 0's mark of its newest step moves on: the answer); with each attempt's world size,
the step the run resumed after and the steps it trained again (``steps_redone``: at most the
checkpoint interval less one), from ``metrics.json``. Lines are seen by polling every 50 ms.

Usage: python benchmarks/elastic_bench.py [--paths horovodrun,spark] [--workdir DIR]
       [--checkpoint-every-steps K] [--kill-after N]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
PATHS = ("horovodrun", "spark")
TRAIN = ["--weights", "none", "--backbone", "tiny", "--batch-size", "4", "--no-tensorboard", "--epochs", "4",
         "--patience", "10", "--warmup-epochs", "0", "--reader", "own"]
POLL_S = 0.05


def make_data(workdir: str) -> str:
    """Generated images through the ETL into ``workdir/etl`` (reused when there)."""
    etl = os.path.join(workdir, "etl")
    if not os.path.exists(os.path.join(etl, "manifest.json")):
        from tests.support.imagegen import make_tree

        make_tree(os.path.join(workdir, "tree"), classes=3, per_class=26, bad=False)
        subprocess.run([sys.executable, os.path.join(REPO, "jobs", "etl.py"), "--input", os.path.join(workdir, "tree"),
                        "--output", etl, "--image-size", "71", "--test-fraction", "0.3", "--min-row-groups", "4"],
                       check=True, capture_output=True, env=job_env())
    return etl


def job_env(**extra: str) -> Dict[str, str]:
    """This venv first on PATH, no MLflow run, TensorFlow quiet, output unbuffered."""
    env = dict(os.environ, PYTHONPATH=REPO, PIPELINES_TRACKING="0", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def environ_of(pid: int) -> Dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(item.decode(errors="replace").split("=", 1) for item in f.read().split(b"\0") if b"=" in item)


def parents() -> Dict[int, Tuple[int, int]]:
    """Every process's ``(parent pid, process group)``, from /proc."""
    found = {}
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[1]), int(fields[2]))
    return found


def lineage(pid: int, roots: List[int], table: Dict[int, Tuple[int, int]]) -> Optional[List[int]]:
    """``pid`` and its ancestors up to one of ``roots`` (processes this benchmark started), or
    ``None`` when ``pid`` descends from none of them: only its own processes are ever killed."""
    chain = []
    while pid in table and pid > 1:
        chain.append(pid)
        if pid in roots:
            return chain
        pid = table[pid][0]
    return None


def rank_process(rank: int, roots: List[int]) -> Tuple[int, List[int]]:
    """The process that started as rank ``rank`` among the descendants of ``roots`` (a horovodrun
    worker, or a barrier task's rank child: ``HOROVOD_RANK`` in its environment), and its lineage
    up to its root (:func:`lineage`), from /proc."""
    table = parents()
    for pid in table:
        chain = lineage(pid, roots, table)
        if not chain or pid in roots:
            continue
        try:
            environ = environ_of(pid)
        except OSError:
            continue
        if environ.get("HOROVOD_RANK") == str(rank):  # set by its launcher: the rank itself, not its task
            return pid, chain
    raise RuntimeError(f"no process of rank {rank} among the descendants of {roots}")


def newest_step(output: str) -> Optional[Tuple[int, int]]:
    """``(epoch, steps done in it)`` of rank 0's mark in ``output`` (``progress.json``), or None."""
    from pipelines.training.records.progress import read_mark

    mark = read_mark(output)
    return (mark["epoch"], mark["step"]) if mark else None


def watch(proc: subprocess.Popen, log: str, output: str, kill: Callable[[], None], acted: str,
          kill_after: int) -> Dict[str, float]:
    """Run the job to its end, killing rank 1 once rank 0 has marked ``kill_after`` steps of epoch 2
    done; return the seconds from the kill to the ``acted`` line, the ``resuming`` line after it,
    and rank 0's next step after that."""
    marks, killed_at, resumed_at = {}, None, None
    while proc.poll() is None:
        time.sleep(POLL_S)
        if killed_at is None:
            if (newest_step(output) or (0, 0)) >= (1, kill_after):
                kill()
                killed_at = time.monotonic()
            continue
        text = open(log, errors="replace").read()
        if "acted" not in marks and acted in text:
            marks["acted"] = time.monotonic() - killed_at
        if "restored" not in marks and "resuming " in text:
            marks["restored"], resumed_at = time.monotonic() - killed_at, newest_step(output)
        if "restored" in marks and "trained" not in marks and newest_step(output) != resumed_at:
            marks["trained"] = time.monotonic() - killed_at
    if proc.returncode != 0 or killed_at is None:
        raise RuntimeError(f"the job ended with {proc.returncode} (killed: {killed_at is not None}):\n"
                           f"{open(log, errors='replace').read()[-3000:]}")
    return marks


def horovodrun_path(workdir: str, data: str, train: List[str], kill_after: int) -> Dict:
    """horovodrun's elastic mode on this machine, 2 ranks, one lost."""
    output, slots, log = (os.path.join(workdir, name) for name in ("out-horovodrun", "slots", "horovodrun.log"))
    with open(slots, "w") as f:
        f.write("0 1\n")
    cmd = ["horovodrun", "-np", "2", "--min-np", "1", "--max-np", "2", "--network-interface", "lo",
           "--host-discovery-script", f"{os.path.join(REPO, 'scripts', 'host_discovery.sh')} {slots}",
           sys.executable, os.path.join(REPO, "jobs", "train.py"), "--data", data, "--output", output,
           "--cache-dir", output + "-cache", *train]

    def kill():
        from pipelines.launch.discovery import slot_of

        pid, _ = rank_process(1, [proc.pid])
        with open(slots, "w") as f:  # the slot goes with its rank, as a lost machine's does
            f.write(f"{1 - slot_of(environ_of(pid)['HOROVOD_HOSTNAME'])}\n")
        os.kill(pid, signal.SIGKILL)

    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=job_env(), cwd=REPO)
    marks = watch(proc, log, output, kill, "a rank was lost", kill_after)
    return {"command": shlex.join(cmd), **marks, **read_report(output)}


def spark_path(workdir: str, data: str, train: List[str], kill_after: int) -> Dict:
    """Spark barrier tasks on a standalone cluster of three 1-core workers, one worker lost."""
    from pipelines.launch.cluster import StandaloneCluster

    output, log = os.path.join(workdir, "out-spark"), os.path.join(workdir, "spark.log")
    cmd = ["spark-submit", "--conf", "spark.executor.memory=512m", os.path.join(REPO, "jobs", "train.py"),
           "--data", data, "--output", output, "--cache-dir", output + "-cache", *train, "--spark-np", "3",
           "--min-np", "2", "--max-failures", "1", "--slots-timeout", "30"]

    def kill():  # the rank, its Python daemon, its executor and its worker: every process of the worker
        workers = [p.pid for p in cluster.processes[1:]]  # [0] is the master
        _, chain = rank_process(1, workers)
        for pid in reversed(chain):  # the worker first: nothing restarts the rest
            os.kill(pid, signal.SIGKILL)

    with StandaloneCluster(workers=3, cores=1, memory="1g", work_dir=os.path.join(workdir, "cluster")) as cluster:
        submit = [cmd[0], "--master", cluster.url, *cmd[1:]]
        with open(log, "w") as out:
            proc = subprocess.Popen(submit, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                    env=job_env(SPARK_LOCAL_IP="127.0.0.1", **cluster.client_env))
        marks = watch(proc, log, output, kill, "WARNING relaunching on 2 ranks", kill_after)
    return {"command": shlex.join(submit), **marks, **read_report(output)}


def read_report(output: str) -> Dict:
    """The attempts (each with its world size) and where the run resumed, from ``metrics.json``."""
    with open(os.path.join(output, "metrics.json")) as f:
        report = json.load(f)
    return {"attempts": report["attempts"], "resumed": (report["resumed_after_epoch"], report["resumed_after_step"]),
            "redone": report["steps_redone"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--workdir", default="/tmp/elastic-bench", help="data and outputs (outputs replaced)")
    parser.add_argument("--checkpoint-every-steps", type=int, default=1, help="the job's step checkpoint interval")
    parser.add_argument("--kill-after", type=int, default=1, help="rank 1 is lost after this many steps of epoch 2")
    args = parser.parse_args(argv)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths:
        parser.exit(2, f"elastic_bench.py: --paths {args.paths}: unknown {', '.join(unknown) or 'none named'}; "
                       f"choose from {', '.join(PATHS)}\n")
    if args.checkpoint_every_steps < 1 or args.kill_after < 1:
        parser.exit(2, "elastic_bench.py: --checkpoint-every-steps and --kill-after must be >= 1\n")
    train = [*TRAIN, "--checkpoint-every-steps", str(args.checkpoint_every_steps)]
    os.makedirs(args.workdir, exist_ok=True)
    data = make_data(args.workdir)
    for path in paths:
        import shutil

        for stale in (f"out-{path}", f"out-{path}-cache"):
            shutil.rmtree(os.path.join(args.workdir, stale), ignore_errors=True)
        result = (horovodrun_path if path == "horovodrun" else spark_path)(args.workdir, data, train, args.kill_after)
        sizes = " -> ".join(str(a["world_size"]) for a in result["attempts"])
        epoch, step = result["resumed"]
        where = f"within epoch {epoch + 1} after step {step}" if step else f"after epoch {epoch}"
        print(f"{path}: {result['command']}\n  rank 1 lost, resumed {where}; "
              f"world size {sizes}; steps redone {result['redone']} (a checkpoint every "
              f"{args.checkpoint_every_steps}); after the kill: acted on {result.get('acted', float('nan')):.1f} s, "
              f"checkpoint restored {result.get('restored', float('nan')):.1f} s, training again (a step done) "
              f"{result.get('trained', float('nan')):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
