"""``HorovodRunner``: run one function on N Horovod ranks, locally or as Spark barrier tasks.

The semantics Databricks users know (``sparkdl.HorovodRunner``):

* ``HorovodRunner(np=-N).run(main, **kwargs)`` starts N processes on this machine with Horovod's
  own launcher (``horovod.runner.run``, Gloo);
* ``HorovodRunner(np=N).run(main, **kwargs)`` runs N Spark **barrier** tasks on whatever cluster
  the active SparkSession points at: the tasks start together or not at all, learn each other's
  hosts from ``BarrierTaskContext``, task 0 serves Gloo's rendezvous, and each task runs its rank
  in a child process (a fresh interpreter, so TensorFlow and Horovod start clean; it dies with
  its task). The GPU addresses Spark assigned to a task reach its rank as
  ``PIPELINES_SPARK_GPUS``.

Both return rank 0's return value. A failing rank (exception, or a killed process) fails the whole
run promptly with :class:`HorovodJobFailed`, which names the rank and the cause; the barrier tasks
report failures as results instead of failing, so Spark does not retry a deterministic error.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

log = logging.getLogger("pipelines")
SPARK_GPUS_ENV = "PIPELINES_SPARK_GPUS"
FAILURE_DIR_ENV = "PIPELINES_FAILURE_DIR"


@dataclass(frozen=True)
class RankFailure:
    """Why one rank failed: ``cause`` is one line (``Type: message`` or the exit status)."""

    rank: int
    cause: str
    traceback: str = ""
    secondary: bool = False  # a Horovod error caused by another rank's failure


class HorovodJobFailed(RuntimeError):
    """A Horovod run failed; ``failures`` lists every rank that reported, root cause first."""

    def __init__(self, failures: List[RankFailure]):
        self.failures = sorted(failures, key=lambda f: (f.secondary, f.rank))
        first = self.failures[0]
        others = ", ".join(f"rank {f.rank}" for f in self.failures[1:])
        super().__init__(f"rank {first.rank} failed: {first.cause}" + (f" (then also: {others})" if others else ""))


_SECONDARY = ("Horovod has been shut down", "HorovodInternalError", "Connection closed by peer",
              "Gloo", "gloo")


def _is_secondary(exc: BaseException) -> bool:
    """Errors a rank gets because a peer died (Horovod shut down, Gloo connections lost), not a
    cause of their own."""
    text = f"{type(exc).__name__}: {exc}"
    return "Horovod" in type(exc).__name__ or any(marker in text for marker in _SECONDARY)


def _failure_record(exc: BaseException) -> Dict[str, Any]:
    return {"rank": int(os.environ.get("HOROVOD_RANK", "0")), "cause": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(), "secondary": _is_secondary(exc)}


# horovod.runner.run (0.28.1) starts from ``cycle_time_ms = None,`` and ``cache_capacity = None,``
# (stray commas: tuples) and passes them on as HOROVOD_CYCLE_TIME="(None,)" and
# HOROVOD_CACHE_CAPACITY="(None,)", which Horovod's core reads as 0: a background thread that never
# sleeps between cycles and no response cache. On a CPU it steals a core from the training: a rank
# alone on one core trained at half speed. ``horovodrun`` itself sets neither. The launching
# process's own values are handed over as PIPELINES_KEEP_<NAME>, which horovod.runner.run leaves alone.
_BROKEN_BY_HOROVOD_RUN = ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")
_KEEP = "PIPELINES_KEEP_"


def repair_horovod_env() -> None:
    """Replace the ``"(None,)"`` values ``horovod.runner.run`` gives some tuning variables, before
    ``hvd.init()`` reads them: by the launching process's own value when it had one, else by
    nothing (Horovod's defaults apply). Values that are not ``"(None,)"`` stay."""
    for name in _BROKEN_BY_HOROVOD_RUN:
        if os.environ.get(name) == "(None,)":
            if _KEEP + name in os.environ:
                os.environ[name] = os.environ[_KEEP + name]
            else:
                del os.environ[name]


class _Recorded:
    """Wraps ``main`` so that a rank's exception is written to ``FAILURE_DIR`` before it propagates."""

    def __init__(self, main: Callable[..., Any]):
        self.main = main

    def __call__(self, **kwargs: Any) -> Any:
        repair_horovod_env()
        try:
            return self.main(**kwargs)
        except BaseException as exc:
            record = _failure_record(exc)
            log.error("rank %d failed: %s", record["rank"], record["cause"])
            directory = os.environ.get(FAILURE_DIR_ENV)
            if directory:
                with open(os.path.join(directory, f"rank-{record['rank']}.json"), "w") as f:
                    json.dump(record, f)
            raise


class HorovodRunner:
    """Run a function on ``abs(np)`` Horovod ranks: ``np < 0`` locally, ``np > 0`` on Spark.

    Args:
        np: number of ranks; negative for local processes, positive for Spark barrier tasks.
        slots_timeout_s: how long to wait for a cluster's executors to offer ``np`` task slots.

    Raises:
        ValueError: ``np == 0``.
    """

    def __init__(self, np: int, slots_timeout_s: float = 60.0):
        if not isinstance(np, int) or np == 0:
            raise ValueError(f"np must be a non-zero integer (negative: local processes, positive: "
                             f"Spark tasks), got {np!r}")
        self.np = np
        self.slots_timeout_s = slots_timeout_s

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every rank; return rank 0's return value.

        ``main`` and ``kwargs`` must be picklable (cloudpickle); ``main`` calls ``hvd.init()``.

        Raises:
            HorovodJobFailed: a rank raised or died. ValueError: more Spark tasks than slots, or
            no active SparkSession for ``np > 0``.
        """
        if self.np < 0:
            return self._run_local(main, kwargs, -self.np)
        return self._run_spark(main, kwargs, self.np)

    # -- local: Horovod's own launcher --------------------------------------------------------
    def _run_local(self, main, kwargs, num_proc: int) -> Any:
        import horovod.runner

        handed = {FAILURE_DIR_ENV: None, **{_KEEP + n: os.environ[n] for n in _BROKEN_BY_HOROVOD_RUN
                                            if n in os.environ}}
        with tempfile.TemporaryDirectory(prefix="hvd-failures-") as failures:
            handed[FAILURE_DIR_ENV] = failures
            os.environ.update(handed)  # inherited by the ranks
            try:
                results = horovod.runner.run(_Recorded(main), kwargs=kwargs, num_proc=num_proc,
                                             hosts=f"localhost:{num_proc}", use_gloo=True)
            except RuntimeError as exc:
                raise HorovodJobFailed(_collect_failures(failures, str(exc))) from exc
            finally:
                for name in handed:
                    os.environ.pop(name, None)
        return results[0]

    # -- Spark: barrier tasks ------------------------------------------------------------------
    def _run_spark(self, main, kwargs, num_proc: int) -> Any:
        import cloudpickle
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise ValueError("HorovodRunner(np > 0) needs an active SparkSession (use np < 0 to run locally)")
        sc = spark.sparkContext
        slots = wait_for_slots(sc, num_proc, self.slots_timeout_s)
        if slots < num_proc:
            raise ValueError(f"np={num_proc} Spark tasks requested but the cluster ({sc.master}) offers "
                             f"{slots} task slots: lower np or add workers")
        payload = cloudpickle.dumps((main, kwargs))
        log.info("HorovodRunner: %d barrier tasks on %s", num_proc, sc.master)
        records = (sc.parallelize(range(num_proc), num_proc).barrier()
                   .mapPartitions(_barrier_task(payload, num_proc)).collect())
        failures = [RankFailure(r["rank"], r["cause"], r.get("traceback", ""), r.get("secondary", False))
                    for r in records if r["status"] != "ok"]
        if failures:
            raise HorovodJobFailed(failures)
        return cloudpickle.loads(base64.b64decode(next(r["result"] for r in records if r["rank"] == 0)))


def task_slots(sc) -> int:
    """Tasks the cluster can run at once right now: the number Spark's barrier scheduler checks
    (``SparkContext.maxNumConcurrentTasks`` for the default resource profile, i.e. the free cores
    of the registered executors divided by ``spark.task.cpus``, and by GPUs per task when set)."""
    jsc = sc._jsc.sc()
    try:
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # noqa: BLE001 - an internal API: fall back to the public estimate
        cpus_per_task = int(sc.getConf().get("spark.task.cpus", "1"))
        return sc.defaultParallelism // cpus_per_task


def wait_for_slots(sc, wanted: int, timeout_s: float, settle_s: float = 8.0) -> int:
    """Poll :func:`task_slots` until it reaches ``wanted``; executors of a fresh session register
    a few seconds after it starts. Gives up after ``timeout_s``, or once some slots exist and
    their number has not changed for ``settle_s``. Returns the last count."""
    start = time.monotonic()
    slots, changed = task_slots(sc), start
    while slots < wanted:
        now = time.monotonic()
        if now - start > timeout_s or (slots > 0 and now - changed > settle_s):
            break
        time.sleep(0.5)
        current = task_slots(sc)
        if current != slots:
            slots, changed = current, time.monotonic()
    return slots


def _collect_failures(directory: str, horovod_message: str) -> List[RankFailure]:
    """Failure records the ranks wrote, with the rank Horovod saw exit first as the root cause."""
    match = re.search(r"Process name: (\d+)\s+Exit code: (-?\d+)", horovod_message)
    first = int(match.group(1)) if match else None
    records = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            records.append(json.load(f))
    # A rank that died of a peer's failure (Horovod shut down) may exit first: its own error text
    # decides; Horovod's "first process" only breaks ties between ranks that failed on their own.
    own = [r for r in records if not r["secondary"]]
    failures = [RankFailure(r["rank"], r["cause"], r["traceback"],
                            r["secondary"] or (len(own) > 1 and first is not None and r["rank"] != first))
                for r in records]
    if first is not None and not any(f.rank == first for f in failures):  # killed: it could not say why
        failures.append(RankFailure(first, _exit_cause(int(match.group(2)))))
    if not failures:
        failures.append(RankFailure(-1, horovod_message.strip()))
    return failures


def _exit_cause(code: int) -> str:
    if code < 0:
        return f"process killed by signal {signal.Signals(-code).name}"
    return f"process exited with status {code}"


# -- inside a barrier task ---------------------------------------------------------------------

def _barrier_task(payload: bytes, num_proc: int):
    """The function each barrier task runs: plan ranks, rendezvous, run the rank as a child."""

    def run(_partition):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        index = ctx.partitionId()
        hosts = [info.address.rsplit(":", 1)[0] for info in ctx.getTaskInfos()]
        plan = rank_plan(hosts)
        slot = plan[index]
        server = None
        if index == 0:  # the rendezvous lives as long as task 0
            from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
            from horovod.runner.http.http_server import RendezvousServer

            server = RendezvousServer(verbose=0)
            port = server.start()
            host_list = ",".join(f"{h}:{n}" for h, n in _host_counts(hosts))
            server.init(get_host_assignments(parse_hosts(host_list), num_proc))
            message = f"{hosts[0]}:{port}"
        else:
            message = ""
        address, port = ctx.allGather(message)[0].rsplit(":", 1)
        gpus = ctx.resources().get("gpu")
        env = dict(os.environ,
                   HOROVOD_HOSTNAME=hosts[index], HOROVOD_RANK=str(slot["rank"]), HOROVOD_SIZE=str(num_proc),
                   HOROVOD_LOCAL_RANK=str(slot["local_rank"]), HOROVOD_LOCAL_SIZE=str(slot["local_size"]),
                   HOROVOD_CROSS_RANK=str(slot["cross_rank"]), HOROVOD_CROSS_SIZE=str(slot["cross_size"]),
                   HOROVOD_GLOO_RENDEZVOUS_ADDR=address, HOROVOD_GLOO_RENDEZVOUS_PORT=port,
                   HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo",
                   HOROVOD_GLOO_IFACE=interface_of(hosts[index]))
        env[SPARK_GPUS_ENV] = ",".join(gpus.addresses) if gpus else ""
        try:
            yield run_child(payload, env, slot["rank"])
        finally:
            if server is not None:
                server.stop()

    return run


def _host_counts(hosts: List[str]) -> List[tuple]:
    """Hosts in order of first appearance with their task counts."""
    counts: Dict[str, int] = {}
    for h in hosts:
        counts[h] = counts.get(h, 0) + 1
    return list(counts.items())


def rank_plan(hosts: List[str]) -> List[Dict[str, int]]:
    """Rank layout of barrier tasks from the host of each task (index = task's partition).

    Ranks are numbered host by host, in order of first appearance, as Horovod's
    ``get_host_assignments`` numbers them; within a host, tasks keep their partition order.

    Returns:
        for each task: ``rank``, ``local_rank``, ``local_size``, ``cross_rank``, ``cross_size``.
    """
    counts = _host_counts(hosts)
    first_rank, order = {}, {}
    total = 0
    for i, (h, n) in enumerate(counts):
        first_rank[h], order[h] = total, i
        total += n
    seen: Dict[str, int] = {}
    plan = []
    for h in hosts:
        local = seen.get(h, 0)
        seen[h] = local + 1
        plan.append({"rank": first_rank[h] + local, "local_rank": local, "local_size": dict(counts)[h],
                     "cross_rank": order[h], "cross_size": len(counts)})
    return plan


def interface_of(host: str) -> str:
    """Name of the network interface that carries ``host``'s IPv4 address (``lo`` for 127.0.0.1)."""
    import socket

    import psutil

    ip = socket.gethostbyname(host)
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addresses):
            return name
    raise ValueError(f"no network interface has the address {ip} of host {host}")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def run_child(payload: bytes, env: Dict[str, str], rank: int) -> Dict[str, Any]:
    """Run one rank in a fresh interpreter; return ``{'rank', 'status', 'result' | 'cause'}``."""
    with tempfile.TemporaryDirectory(prefix=f"hvd-rank{rank}-") as work:
        job, result = os.path.join(work, "job.pkl"), os.path.join(work, "result.json")
        with open(job, "wb") as f:
            f.write(payload)
        proc = subprocess.run([sys.executable, "-m", "pipelines.launcher", job, result], env=env,
                              preexec_fn=_die_with_parent)
        if os.path.exists(result):
            with open(result) as f:
                record = json.load(f)
        else:
            record = {"status": "error", "cause": _exit_cause(proc.returncode), "secondary": False}
        record["rank"] = rank
        return record


def _child_main(job_path: str, result_path: str) -> int:
    """Entry point of a rank's process: run the pickled function, write its outcome."""
    import cloudpickle

    with open(job_path, "rb") as f:
        main, kwargs = cloudpickle.load(f)
    try:
        value = main(**kwargs)
        record = {"status": "ok", "result": base64.b64encode(cloudpickle.dumps(value)).decode()}
        code = 0
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, which raises
        record = {"status": "error", **_failure_record(exc)}
        log.error("rank %s failed: %s", os.environ.get("HOROVOD_RANK"), record["cause"])
        code = 1
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, result_path)
    return code


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1], sys.argv[2]))
