"""Spark barrier tasks (``HorovodRunner(np=N)``): N tasks that start together, one rank each.

A task reports its rank's failure as a record, so Spark retries nothing."""
from __future__ import annotations

import base64
import json
import logging
import os
import re
from typing import Any, Callable, Dict, List, Mapping, Optional

import cloudpickle

from pipelines.launch.child import run_child
from pipelines.launch.failures import HorovodJobFailed, RankFailure, with_late_ranks
from pipelines.launch.gpus import (
    CUDA_VISIBLE,
    check_local_gpus,
    nccl_env,
    parse_visible,
    rank_gpu_env,
    task_gpus,
    visible_gpu_count,
)
from pipelines.launch.network import GLOO_IFACE_ENV, interface_of, rendezvous_ipv4, split_host_port
from pipelines.launch.rankenv import gloo_timeout, own_timeouts
from pipelines.launch.ranklogs import LogSink
from pipelines.launch.rendezvous import Rendezvous, gloo_address
from pipelines.launch.sparkcheck import (
    attempt_world,
    check_barrier_conf,
    check_local_executors,
    executor_id_hosts,
    task_slots,
)
from pipelines.launch.worlds import WorldBounds
from pipelines.runtime.errors import Refused, is_refusal
from pipelines.runtime.logs import plural

log = logging.getLogger("pipelines")


def run_spark(main: Callable[..., Any], kwargs: Dict[str, Any], bounds: WorldBounds, slots_timeout_s: float,
              requested_iface: Optional[str], log_dir: Optional[str], before_ranks: Callable[[], None],
              rank_timeouts: Optional[Dict[str, str]] = None, previous: Optional[int] = None) -> Any:
    """Run ``main(**kwargs)`` as barrier tasks of the active SparkSession; return rank 0's value.

    Raises:
        ValueError, ClusterConfigError: as ``HorovodRunner.run``.
        HorovodJobFailed: a rank raised, died or could not choose its interface."""
    from pyspark.sql import SparkSession  # in the function: `import pipelines` stays free of PySpark

    spark = SparkSession.getActiveSession()
    if spark is None:
        raise Refused("HorovodRunner(np > 0) needs an active SparkSession (use np < 0 to run locally)")
    sc = spark.sparkContext
    log.info("HorovodRunner: np=%d on %s: checking the cluster", bounds.np, sc.master)
    check_barrier_conf(dict(sc.getConf().getAll()))  # before waiting: some make slots never come
    world_size = attempt_world(lambda: task_slots(sc), sc.master, bounds, previous, slots_timeout_s)
    check_local_executors(sc, requested_iface)
    before_ranks()
    try:
        return _run_barrier_stage(sc, cloudpickle.dumps((main, kwargs)), world_size, requested_iface, log_dir,
                                  rank_timeouts)
    except HorovodJobFailed as exc:
        exc.world_size = world_size
        raise


def _run_barrier_stage(sc, payload: bytes, world_size: int, requested_iface: Optional[str], log_dir: Optional[str],
                       rank_timeouts: Optional[Dict[str, str]]) -> Any:
    """One barrier stage of ``world_size`` tasks on ``payload`` (pickled function and arguments); rank 0's value."""
    log.info("HorovodRunner: %s on %s", plural(world_size, "barrier task"), sc.master)
    conf = sc.getConf()
    sink = LogSink(conf.get("spark.driver.host"), log_dir, world_size, bind_host=conf.get("spark.driver.bindAddress"))
    try:
        task = barrier_task(payload, world_size, requested_iface, (sink.address, sink.token), rank_timeouts or {})
        records = collect_tasks(sc.parallelize(range(world_size), world_size).barrier().mapPartitions(task),
                                sink.hosts, lambda: executor_id_hosts(sc))
        if not sink.wait_for({r["rank"]: r.get("log_lines", 0) for r in records}):
            log.warning("HorovodRunner: some ranks' output did not reach the driver (see the executors' logs)")
    finally:
        sink.close()
    failures = [RankFailure(r["rank"], r["cause"], r.get("traceback", ""), r.get("secondary", False),
                            r.get("host", ""), r.get("lost", False), r.get("refused", False), r.get("exit_status"))
                for r in records if r["status"] == "error"]
    first = next((r for r in records if r["rank"] == 0), {})
    failures = with_late_ranks(failures, first.get("rendezvous_missing", []),
                               first.get("gloo_timeout", gloo_timeout({})),
                               {r["rank"]: r.get("host", "") for r in records})
    if failures:
        raise HorovodJobFailed(failures)
    return cloudpickle.loads(base64.b64decode(next(r["result"] for r in records if r["rank"] == 0)))


EXECUTOR_LOST = ("ExecutorLostFailure", "Executor lost", "Remote RPC client disassociated", "Worker lost",
                 "worker lost")
# Where Spark's messages name the lost executor's host: "Lost task 1.0 in stage 0.0 (TID 1) (HOST
# executor 3)", or, when its worker went with it (Spark 4.0's barrier abort), "worker lost: HOST:PORT".
_LOST_HOST = (r"\(([^ ()]+) executor [^ ()]+\)", r"[Ww]orker lost: \[?([^ \]]+?)\]?:\d+")
# Where they name only the executor: a barrier abort's "ExecutorLostFailure (executor 3 exited ...)".
_LOST_EXECUTOR = r"ExecutorLostFailure \(executor ([^ ()]+)"


def lost_host(text: str, executor_hosts: Callable[[], Dict[str, str]] = dict) -> str:
    """The host of the lost executor a Spark failure ``text`` names, or ""; ``executor_hosts()``: id -> host."""
    for pattern in _LOST_HOST:
        match = re.search(pattern, text)
        if match:
            return match.group(1)
    match = re.search(_LOST_EXECUTOR, text)
    return executor_hosts().get(match.group(1), "") if match else ""


def collect_tasks(rdd, rank_hosts: Dict[int, str],
                   executor_hosts: Callable[[], Dict[str, str]] = dict) -> List[Dict[str, Any]]:
    """The barrier tasks' records.

    Raises:
        HorovodJobFailed: an executor was lost: a lost ``RankFailure`` naming its host and lowest rank there."""
    try:
        return rdd.collect()
    except Exception as exc:  # noqa: BLE001 - Py4JJavaError; only an executor loss is ours to name
        text = str(exc)
        if not any(marker in text for marker in EXECUTOR_LOST):
            raise
        line = next((ln.strip() for ln in text.splitlines() if any(m in ln for m in EXECUTOR_LOST)), text[:300])
        line = line[line.find("ExecutorLostFailure"):] if "ExecutorLostFailure" in line else line
        host = lost_host(text, executor_hosts)
        rank = min((r for r, h in rank_hosts.items() if h == host), default=-1)
        raise HorovodJobFailed([RankFailure(rank, f"Spark executor lost: {line}", host=host, lost=True)]) from exc


def barrier_task(payload: bytes, world_size: int, requested_iface: Optional[str], sink: tuple,
                 rank_timeouts: Optional[Dict[str, str]] = None):
    """The function each barrier task runs: plan ranks, check network and GPUs, rendezvous, run the rank as a child.

    Every task decides its interface and GPUs *before* the one ``allGather``: if one cannot, none starts a rank."""

    def run(_partition):
        from pyspark import BarrierTaskContext  # in the function: runs in the executor, with PySpark

        ctx = BarrierTaskContext.get()
        index = ctx.partitionId()
        hosts = [split_host_port(info.address)[0] for info in ctx.getTaskInfos()]
        slot = rank_plan(hosts)[index]
        gpus = ctx.resources().get("gpu")
        mine = task_choices(hosts[index], requested_iface, list(gpus.addresses) if gpus else [], slot["local_size"],
                            os.environ)
        server = None
        if index == 0 and "error" not in mine:  # the rendezvous lives as long as task 0
            try:  # on the address the other tasks reach task 0 at, not on every interface
                server = Rendezvous(rendezvous_ipv4(hosts[0]), _host_counts(hosts), world_size)
                mine["rendezvous"], mine["token"] = f"{hosts[0]}:{server.port}", server.token
            except OSError as exc:  # the address Spark names this host by is not one of its own
                mine = {"error": f"Gloo's rendezvous cannot listen on {hosts[0]}: {exc}", "refused": False}
        try:
            gathered = [json.loads(m) for m in ctx.allGather(json.dumps(mine))]
            if any("error" in m for m in gathered):
                yield ({"rank": slot["rank"], "status": "error", "cause": mine["error"], "secondary": False,
                        "host": hosts[index], "refused": mine["refused"]}
                       if "error" in mine else {"rank": slot["rank"], "status": "not started"})
                return
            env = dict(os.environ, **rank_env(slot, hosts[index], world_size, gathered[0]["rendezvous"], mine,
                                              os.environ, gathered[0]["token"]),
                       **own_timeouts(rank_timeouts or {}, os.environ))
            record = run_child(payload, env, slot["rank"], (*sink, hosts[index]))
            if server is not None:
                record["rendezvous_missing"] = server.missing()
                record["gloo_timeout"] = gloo_timeout(env)
            yield record
        finally:
            if server is not None:
                server.stop()

    return run


def task_choices(host: str, requested_iface: Optional[str], addresses: List[str], local_size: int,
                 environ: Mapping[str, str]) -> Dict[str, Any]:
    """What a barrier task decides before the ``allGather``: Gloo's interface and the rank's GPUs.

    Returns:
        ``{'iface', 'gpus', 'addresses'}``, or ``{'error': 'Type: message', 'refused': bool}`` when the rank
        cannot start (``refused``: a ``Refused``, the driver's exit 2)."""
    try:
        rendezvous_ipv4(host)
        iface = interface_of(host, requested_iface or environ.get(GLOO_IFACE_ENV))
        count = visible_gpu_count(environ)
        if addresses:
            owned = task_gpus(addresses, parse_visible(environ.get(CUDA_VISIBLE)), count)
        else:
            check_local_gpus(local_size, count)
            owned = []
    except ValueError as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "refused": is_refusal(exc)}
    return {"iface": iface, "gpus": owned, "addresses": addresses}


def rank_env(slot: Dict[str, int], host: str, world_size: int, rendezvous: str, choices: Dict[str, Any],
             environ: Mapping[str, str], token: str) -> Dict[str, str]:
    """The variables a barrier task's rank starts with beyond ``environ``: Horovod's, NCCL's interface, its GPUs."""
    address, port = split_host_port(rendezvous)
    return {"HOROVOD_HOSTNAME": host, "HOROVOD_RANK": str(slot["rank"]), "HOROVOD_SIZE": str(world_size),
            "HOROVOD_LOCAL_RANK": str(slot["local_rank"]), "HOROVOD_LOCAL_SIZE": str(slot["local_size"]),
            "HOROVOD_CROSS_RANK": str(slot["cross_rank"]), "HOROVOD_CROSS_SIZE": str(slot["cross_size"]),
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": gloo_address(address, port, token), "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": choices["iface"],
            **nccl_env(choices["iface"], environ),
            **rank_gpu_env(choices["gpus"], choices["addresses"], environ)}


def _host_counts(hosts: List[str]) -> List[tuple]:
    """Hosts in order of first appearance with their task counts."""
    counts: Dict[str, int] = {}
    for h in hosts:
        counts[h] = counts.get(h, 0) + 1
    return list(counts.items())


def rank_plan(hosts: List[str]) -> List[Dict[str, int]]:
    """Rank layout of barrier tasks, host by host in order of first appearance (as Horovod's ``get_host_assignments``).

    Returns:
        For each task: ``rank``, ``local_rank``, ``local_size``, ``cross_rank``, ``cross_size``."""
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
