"""The cluster checks a Spark launch makes before any task starts: settings, task slots, interfaces."""
from __future__ import annotations

import logging
import time
from typing import Callable, Dict, List, Optional

from pipelines.launch.failures import ClusterConfigError
from pipelines.launch.network import (
    GLOO_IFACE_ENV,
    bare_host,
    interface_of,
    is_this_machine,
    rendezvous_ipv4,
    split_host_port,
)
from pipelines.launch.worlds import WorldBounds, relaunch_line
from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural
from pipelines.runtime.spark import is_local_master

log = logging.getLogger("pipelines")


def _is_true(value: Optional[str]) -> bool:
    """Spark's reading of a boolean setting (``String.trim.toBoolean``)."""
    return value is not None and value.strip().lower() == "true"


def check_barrier_conf(conf: Dict[str, str]) -> None:
    """Refuse ``spark.dynamicAllocation.enabled=true`` (no barrier stage runs), unless on a ``local`` master.

    Raises:
        ClusterConfigError: naming the setting and the value to use."""
    master = conf.get("spark.master", "")
    if _is_true(conf.get("spark.dynamicAllocation.enabled")) and (
            not is_local_master(master) or _is_true(conf.get("spark.dynamicAllocation.testing"))):
        raise ClusterConfigError(
            f"spark.dynamicAllocation.enabled={conf['spark.dynamicAllocation.enabled'].strip()}: Spark runs no "
            f"barrier tasks under dynamic allocation (master {master}); set spark.dynamicAllocation.enabled=false "
            f"(executors: spark.executor.instances or spark.cores.max)")


def executor_id_hosts(sc, active_only: bool = False) -> Dict[str, str]:
    """Executor id -> host for every executor the application has had (or only live ones); {} where Spark cannot say."""
    from py4j.protocol import Py4JError  # in the function: `import pipelines` stays free of PySpark

    try:
        summaries = sc._jsc.sc().statusStore().executorList(active_only).iterator()
        found = {}
        while summaries.hasNext():
            summary = summaries.next()
            found[str(summary.id())] = split_host_port(str(summary.hostPort()))[0]
        return found
    except Py4JError:  # a JVM call that failed: naming the host is best effort, the failure stands
        return {}


def executor_hosts(sc) -> List[str]:
    """Hosts of the executors that run tasks (the driver only on a ``local`` master, where it is the executor)."""
    local = is_local_master(sc.master)
    # Spark's status store, not SparkEnv's block manager: py4j cannot reflect on the latter on
    # Spark 4.3 (its protobuf classes are shaded away: ClassNotFoundException MessageOrBuilder)
    return sorted({host for executor, host in executor_id_hosts(sc, active_only=True).items()
                   if local or executor != "driver"})


def check_local_executors(sc, requested: Optional[str]) -> None:
    """Before any task starts, choose the Gloo interface of every executor on this machine as its task will.

    Raises:
        ValueError: a missing interface, an unresolvable host, an address on no interface, or an IPv6-only host."""
    requested = requested or sc.environment.get(GLOO_IFACE_ENV)
    everything_here = is_local_master(sc.master) or sc.master.startswith("local-cluster")
    for host in executor_hosts(sc):
        if everything_here or is_this_machine(host):
            rendezvous_ipv4(host)
            interface_of(host, requested)
        elif ":" in bare_host(host):  # an IPv6 literal: refused without resolving anything remote
            rendezvous_ipv4(host)


def task_slots(sc) -> int:
    """Tasks the cluster can run at once now, as Spark's barrier scheduler counts them (``maxNumConcurrentTasks``)."""
    jsc = sc._jsc.sc()
    try:
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # noqa: BLE001 - an internal API: fall back to the public estimate
        cpus_per_task = int(sc.getConf().get("spark.task.cpus", "1"))
        return sc.defaultParallelism // cpus_per_task


def wait_for_slots(slots: Callable[[], int], wanted: int, timeout_s: float, settle_s: float = 8.0) -> int:
    """Poll ``slots()`` until it reaches ``wanted``, ``timeout_s`` passes or it is steady for ``settle_s``."""
    start = time.monotonic()
    count, changed = slots(), start
    while count < wanted:
        now = time.monotonic()
        if now - start > timeout_s or (count > 0 and now - changed > settle_s):
            break
        time.sleep(0.5)
        current = slots()
        if current != count:
            count, changed = current, time.monotonic()
    return count


def attempt_world(slots: Callable[[], int], master: str, bounds: WorldBounds, previous: Optional[int],
                  timeout_s: float) -> int:
    """How many barrier tasks an attempt runs, ``slots()`` counting the free task slots.

    ``bounds.np`` for a first attempt or a fixed world; a relaunch takes the slots offered now, up to ``max_np``.

    Raises:
        pipelines.runtime.errors.Refused: too few slots, naming both numbers."""
    if previous is None or bounds.fixed:
        count = wait_for_slots(slots, bounds.np, timeout_s)
        if count < bounds.np:
            why = f" (no executor registered within {timeout_s:g} s)" if count == 0 else ""
            raise Refused(f"np={bounds.np} Spark tasks requested but the cluster ({master}) offers "
                          f"{plural(count, 'task slot')}{why}: lower np, add workers or wait longer for them")
        return bounds.np
    count = slots()
    if bounds.relaunch_size(count) is None:  # a replacement may be starting: wait for min_np, no settling
        count = wait_for_slots(slots, bounds.min_np, timeout_s, settle_s=timeout_s)
    size = bounds.relaunch_size(count)
    if size is None:
        raise Refused(f"the cluster ({master}) offers {plural(count, 'task slot')} after {timeout_s:g} s, "
                      f"fewer than --min-np {bounds.min_np}: add workers, or lower --min-np")
    log.warning("%s", relaunch_line(bounds, previous, size, count))
    return size
