"""``HorovodRunner``: run one function on N Horovod ranks, locally or as Spark barrier tasks.

The semantics Databricks users know (``sparkdl.HorovodRunner``):

* ``HorovodRunner(np=-N).run(main, **kwargs)`` starts N processes on this machine with Horovod's
  own launcher (``horovod.runner.run``, Gloo);
* ``HorovodRunner(np=N).run(main, **kwargs)`` runs N Spark **barrier** tasks on whatever cluster
  the active SparkSession points at: the tasks start together or not at all, learn each other's
  hosts from ``BarrierTaskContext``, task 0 serves Gloo's rendezvous, and each task runs its rank
  in a child process (a fresh interpreter, so TensorFlow and Horovod start clean; it dies with
  its task). The GPU addresses Spark assigned to a task reach its rank as
  ``PIPELINES_SPARK_GPUS``. Each rank's output reaches the driver while it runs, prefixed
  ``[rank R on HOST]`` (:mod:`pipelines.ranklogs`), and is kept as ``rank-R.log`` in ``log_dir``.

Both return rank 0's return value. A failing rank (exception, or a killed process) fails the whole
run promptly with :class:`HorovodJobFailed`, which names the rank, its host and the cause; the barrier
tasks report failures as results instead of failing, so Spark does not retry a deterministic error.
With ``max_failures=K`` a run whose rank was lost (killed, OOM, executor or host lost) is relaunched
up to K times (:mod:`pipelines.recovery`).
"""
from __future__ import annotations

import base64
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from pipelines.atomic import write_json
from pipelines.logs import plural
from pipelines.ranklogs import LogSink, forward
from pipelines.redact import redact
from pipelines.recovery import signal_is_loss
from pipelines.training.devices import SPARK_GPUS_ENV

log = logging.getLogger("pipelines")
FAILURE_DIR_ENV = "PIPELINES_FAILURE_DIR"


@dataclass(frozen=True)
class RankFailure:
    """Why one rank failed: ``cause`` is one line (``Type: message`` or the exit status); ``host``
    where it ran; ``lost``: its process or host was taken away (killed, executor lost), which a
    relaunch may survive (:mod:`pipelines.recovery`)."""

    rank: int
    cause: str
    traceback: str = ""
    secondary: bool = False  # a Horovod error caused by another rank's failure
    host: str = ""
    lost: bool = False


def describe(failure: RankFailure) -> str:
    """One line: ``rank R on HOST failed: CAUSE`` (``on HOST`` when known)."""
    where = f" on {failure.host}" if failure.host else ""
    return f"rank {failure.rank}{where} failed: {failure.cause}"


class HorovodJobFailed(RuntimeError):
    """A Horovod run failed; ``failures`` lists every rank that reported, root cause first."""

    def __init__(self, failures: List[RankFailure]):
        self.failures = sorted(failures, key=lambda f: (f.secondary, f.rank))
        first = self.failures[0]
        others = ", ".join(f"rank {f.rank}" for f in self.failures[1:])
        super().__init__(describe(first) + (f" (then also: {others})" if others else ""))


class RelaunchImpossible(RuntimeError):
    """A job whose rank was lost could not be relaunched (e.g. the cluster no longer offers the
    task slots of its world size); the message names the failure and why."""

    def __init__(self, failure: str, attempt: int, reason: str):
        super().__init__(f"{failure}; attempt {attempt} could not start: {reason}")


_SECONDARY = ("Horovod has been shut down", "HorovodInternalError", "Connection closed by peer",
              "Gloo", "gloo")


def _is_secondary(exc: BaseException) -> bool:
    """Errors a rank gets because a peer died (Horovod shut down, Gloo connections lost), not a
    cause of their own."""
    text = f"{type(exc).__name__}: {exc}"
    return "Horovod" in type(exc).__name__ or any(marker in text for marker in _SECONDARY)


def _failure_record(exc: BaseException) -> Dict[str, Any]:
    record = {"rank": int(os.environ.get("HOROVOD_RANK", "0")), "cause": f"{type(exc).__name__}: {exc}",
              "traceback": traceback.format_exc(), "secondary": _is_secondary(exc),
              "host": os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()}
    return redact(record)  # a cause or traceback may quote a config's secrets or a URI's userinfo


# horovod.runner.run (0.28.1) starts from ``cycle_time_ms = None,`` and ``cache_capacity = None,``
# (stray commas: tuples) and passes them on as HOROVOD_CYCLE_TIME="(None,)" and
# HOROVOD_CACHE_CAPACITY="(None,)", which Horovod's core reads as 0: a background thread that never
# sleeps between cycles and no response cache. On a CPU it steals a core from the training: a rank
# alone on one core trained at half speed. ``horovodrun`` itself sets neither. The launching
# process's own values are handed over as PIPELINES_KEEP_<NAME>, which horovod.runner.run leaves alone.
_BROKEN_BY_HOROVOD_RUN = ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")
_KEEP = "PIPELINES_KEEP_"


def _pad_rank(rank: int, size: int) -> str:
    """Horovod's name of a rank's log folder (``rank.<this>``): ``rank`` zero-padded to the digits
    of ``size - 1``, and ``"0"`` for a world of one."""
    return str(rank).zfill(len(str(max(size - 1, 0))))


def _mend_pad_rank() -> None:
    """Give Horovod's launcher a :func:`_pad_rank` that takes a world of one.

    Horovod 0.28.1's ``gloo_run._pad_rank`` computes ``int(log10(size - 1)) + 1`` digits, a
    ``ValueError: math domain error`` for one process, so every one-rank local run with rank logs
    (``jobs/train.py --spark-np -1``) failed before its rank started. Same names for every other size.
    """
    from horovod.runner import gloo_run

    gloo_run._pad_rank = _pad_rank


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
            log.error("rank %d on %s failed: %s", record["rank"], record["host"], record["cause"])
            directory = os.environ.get(FAILURE_DIR_ENV)
            if directory:
                write_json(os.path.join(directory, f"rank-{record['rank']}.json"), record)
            raise


class ClusterConfigError(ValueError):
    """A Spark setting under which barrier tasks cannot run; the message (one line) names the
    setting and the value to use. ``jobs/train.py`` exits with status 2 on it."""


class HorovodRunner:
    """Run a function on ``abs(np)`` Horovod ranks: ``np < 0`` locally, ``np > 0`` on Spark.

    Args:
        np: number of ranks; negative for local processes, positive for Spark barrier tasks.
        slots_timeout_s: how long to wait for a cluster's executors to offer ``np`` task slots.
        network_interface: the interface Gloo uses on every host (e.g. ``eth0``); default: the
            ``HOROVOD_GLOO_IFACE`` of this process, else of each executor, else the interface that
            carries each host's address (``lo`` for any loopback address). A named interface is used
            as it is or refused, never replaced.
        max_failures: relaunch the whole run up to this many times when a rank's process or host
            is lost (:mod:`pipelines.recovery`), with the same ``np``; the function must then continue
            from its own checkpoints when ``pipelines.recovery.relaunched()``. 0: fail at once.
        log_dir: a local folder that keeps each rank's whole output: ``rank-R.log`` (``np > 0``,
            written by the driver as the lines arrive), or Horovod's ``rank.R/stdout`` and
            ``rank.R/stderr`` (``np < 0``). None: the output is only shown, live, at the driver.
        before_ranks: called once the launch's own checks (slots, network interface) have passed,
            just before any rank starts, on every attempt; what it raises ends the run there
            (training fetches ``--weights imagenet`` here: a refused launch downloads nothing).

    Raises:
        ValueError: ``np == 0``, or a negative ``max_failures``.
    """

    def __init__(self, np: int, slots_timeout_s: float = 60.0, network_interface: Optional[str] = None,
                 max_failures: int = 0, log_dir: Optional[str] = None,
                 before_ranks: Optional[Callable[[], None]] = None):
        if not isinstance(np, int) or np == 0:
            raise ValueError(f"np must be a non-zero integer (negative: local processes, positive: "
                             f"Spark tasks), got {np!r}")
        if not isinstance(max_failures, int) or max_failures < 0:
            raise ValueError(f"max_failures must be an integer >= 0, got {max_failures!r}")
        self.np = np
        self.max_failures = max_failures
        self.slots_timeout_s = slots_timeout_s
        self.network_interface = network_interface or os.environ.get(GLOO_IFACE_ENV) or None
        self.log_dir = log_dir
        self.before_ranks = before_ranks or (lambda: None)

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every rank; return rank 0's return value.

        ``main`` and ``kwargs`` must be picklable (cloudpickle); ``main`` calls ``hvd.init()``.

        Raises:
            ClusterConfigError: the Spark configuration forbids barrier tasks (before any task).
            ValueError: no active SparkSession for ``np > 0``, more Spark tasks than slots, or a
                network interface that does not exist / an address on no interface on this
                machine's executors (before any task).
            HorovodJobFailed: a rank raised or died, or could not choose its network interface on
                its host (the cause names the host); with ``max_failures``, a lost rank only once
                the relaunches are spent.
            RelaunchImpossible: a relaunch found the cluster without the task slots.
        """
        from pipelines.recovery import run_with_retries

        return run_with_retries(lambda attempt: self._launch(attempt, kwargs), main, self.max_failures)

    def _launch(self, main, kwargs) -> Any:
        if self.np < 0:
            return self._run_local(main, kwargs, -self.np)
        return self._run_spark(main, kwargs, self.np)

    # -- local: Horovod's own launcher --------------------------------------------------------
    def _run_local(self, main, kwargs, num_proc: int) -> Any:
        iface = _local_interface(self.network_interface)
        self.before_ranks()
        import horovod.runner

        _mend_pad_rank()

        handed = {FAILURE_DIR_ENV: None, **{_KEEP + n: os.environ[n] for n in _BROKEN_BY_HOROVOD_RUN
                                            if n in os.environ}}
        with tempfile.TemporaryDirectory(prefix="hvd-failures-") as failures:
            handed[FAILURE_DIR_ENV] = failures
            os.environ.update(handed)  # inherited by the ranks
            try:
                if self.log_dir:
                    os.makedirs(self.log_dir, exist_ok=True)
                results = horovod.runner.run(_Recorded(main), kwargs=kwargs, num_proc=num_proc,
                                             hosts=f"localhost:{num_proc}", use_gloo=True,
                                             network_interfaces=[iface] if iface else None,
                                             output_filename=self.log_dir)
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
        log.info("HorovodRunner: np=%d on %s: checking the cluster", num_proc, sc.master)
        check_barrier_conf(dict(sc.getConf().getAll()))  # before waiting: some make slots never come
        slots = wait_for_slots(sc, num_proc, self.slots_timeout_s)
        if slots < num_proc:
            why = f" (no executor registered within {self.slots_timeout_s:g} s)" if slots == 0 else ""
            raise ValueError(f"np={num_proc} Spark tasks requested but the cluster ({sc.master}) offers "
                             f"{plural(slots, 'task slot')}{why}: lower np, add workers or wait longer for them")
        check_local_executors(sc, self.network_interface)
        self.before_ranks()
        payload = cloudpickle.dumps((main, kwargs))
        log.info("HorovodRunner: %s on %s", plural(num_proc, "barrier task"), sc.master)
        sink = LogSink(sc.getConf().get("spark.driver.host"), self.log_dir)
        try:
            task = _barrier_task(payload, num_proc, self.network_interface, (sink.address, sink.token))
            records = _collect_tasks(sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(task),
                                     sink.hosts, lambda: executor_id_hosts(sc))
            if not sink.wait_for({r["rank"]: r.get("log_lines", 0) for r in records}):
                log.warning("HorovodRunner: some ranks' output did not reach the driver (see the executors' logs)")
        finally:
            sink.close()
        failures = [RankFailure(r["rank"], r["cause"], r.get("traceback", ""), r.get("secondary", False),
                                r.get("host", ""), r.get("lost", False))
                    for r in records if r["status"] == "error"]
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
    """The host of the lost executor a Spark failure ``text`` names, or "". Where the text names
    only the executor's id, its host is looked up in ``executor_hosts()`` (id -> host, as
    :func:`executor_id_hosts` gives), called only then."""
    for pattern in _LOST_HOST:
        match = re.search(pattern, text)
        if match:
            return match.group(1)
    match = re.search(_LOST_EXECUTOR, text)
    return executor_hosts().get(match.group(1), "") if match else ""


def executor_id_hosts(sc) -> Dict[str, str]:
    """Executor id -> host for every executor the application has had, lost ones included (Spark's
    status store keeps the last ``spark.ui.retainedDeadExecutors``); {} where Spark cannot say."""
    from py4j.protocol import Py4JError

    try:
        summaries = sc._jsc.sc().statusStore().executorList(False).iterator()
        found = {}
        while summaries.hasNext():
            summary = summaries.next()
            found[str(summary.id())] = str(summary.hostPort()).rsplit(":", 1)[0]
        return found
    except Py4JError:  # a JVM call that failed: naming the host is best effort, the failure stands
        return {}


def _collect_tasks(rdd, rank_hosts: Dict[int, str],
                   executor_hosts: Callable[[], Dict[str, str]] = dict) -> List[Dict[str, Any]]:
    """The barrier tasks' records; a Spark job that failed because an executor (or its host) was
    lost becomes a lost :class:`RankFailure` naming the host (:func:`lost_host`, with
    ``executor_hosts``) and the (lowest) rank that ran there, from ``rank_hosts`` (rank -> host, as
    the tasks named them; the tasks report every other failure as a record)."""
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


def _local_interface(requested: Optional[str], interfaces: Optional[Dict[str, List[str]]] = None) -> Optional[str]:
    """The user's interface for local ranks, checked before any starts; None: Horovod's choice.

    ``horovod.runner.run`` sets the ranks' ``HOROVOD_GLOO_IFACE`` itself, over the user's, and with
    only local hosts accepts no interface but one that carries 127.0.0.1 (else "No interface is
    found for address 127.0.0.1"): hand it the user's choice, or refuse that choice by name.

    Raises:
        ValueError: the interface does not exist, or does not carry 127.0.0.1.
    """
    if not requested:
        return None
    interfaces = local_interfaces() if interfaces is None else interfaces
    iface = interface_of("localhost", requested, interfaces)
    addresses = interfaces[iface]
    if "127.0.0.1" not in addresses:
        raise ValueError(f"network interface {iface!r} ({' '.join(addresses) or 'no address'}) cannot carry local "
                         f"ranks (np < 0): Horovod's launcher runs them over the interface of 127.0.0.1; "
                         f"unset {GLOO_IFACE_ENV} / --network-interface, or name that interface")
    return iface


def _is_true(value: Optional[str]) -> bool:
    """Spark's reading of a boolean setting (``String.trim.toBoolean``: any case, spaces around)."""
    return value is not None and value.strip().lower() == "true"


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``, ``local[N,F]``: Spark's ``Utils.isLocalMaster`` (not
    ``local-cluster[...]``, whose executors are separate processes)."""
    master = master.strip()
    return master == "local" or master.startswith("local[")


def check_barrier_conf(conf: Dict[str, str]) -> None:
    """Refuse Spark settings under which Spark 4.0 will not run a barrier stage.

    ``spark.dynamicAllocation.enabled=true``: the DAGScheduler refuses every barrier stage
    (``BarrierJobRunWithDynamicAllocationException``), except on a ``local``/``local[N]`` master,
    where Spark turns dynamic allocation off itself (unless ``spark.dynamicAllocation.testing``).
    Without ``minExecutors`` it shows first as a cluster without executors (0 task slots).

    Args:
        conf: the SparkConf's settings (``dict(sc.getConf().getAll())``); ``spark.master`` among them.

    Raises:
        ClusterConfigError: naming the setting and the value to use.
    """
    master = conf.get("spark.master", "")
    if _is_true(conf.get("spark.dynamicAllocation.enabled")) and (
            not is_local_master(master) or _is_true(conf.get("spark.dynamicAllocation.testing"))):
        raise ClusterConfigError(
            f"spark.dynamicAllocation.enabled={conf['spark.dynamicAllocation.enabled'].strip()}: Spark runs no "
            f"barrier tasks under dynamic allocation (master {master}); set spark.dynamicAllocation.enabled=false "
            f"(executors: spark.executor.instances or spark.cores.max)")


def executor_hosts(sc) -> List[str]:
    """Hosts of the executors that run tasks, as Spark names them (the driver counts only on a
    ``local`` master, where it is the executor)."""
    jsc = sc._jsc.sc()
    driver = jsc.env().blockManager().blockManagerId()
    local = is_local_master(sc.master)
    return sorted({info.host() for info in jsc.statusTracker().getExecutorInfos()
                   if local or (info.host(), info.port()) != (driver.host(), driver.port())})


def is_this_machine(host: str) -> bool:
    """``host`` resolves to a loopback address or to an address of one of this machine's interfaces."""
    import ipaddress

    try:
        address = resolve(host)
    except ValueError:
        return False
    mine = {a for addresses in local_interfaces().values() for a in addresses}
    return ipaddress.ip_address(address).is_loopback or address in mine


def check_local_executors(sc, requested: Optional[str]) -> None:
    """Before any task starts, choose the Gloo interface of every executor on this machine as its
    barrier task will (all of them on a ``local``/``local-cluster`` master, whose hosts may not
    even resolve elsewhere); executors on other machines are checked by their tasks.

    Args:
        sc: the SparkContext. requested: the user's interface, or None; else the executors'
            ``HOROVOD_GLOO_IFACE`` set through Spark (``spark.executorEnv.*``) applies.

    Raises:
        ValueError: from :func:`interface_of`: a missing interface, an unresolvable host, or an
            address on no interface.
    """
    requested = requested or sc.environment.get(GLOO_IFACE_ENV)
    everything_here = is_local_master(sc.master) or sc.master.startswith("local-cluster")
    for host in executor_hosts(sc):
        if everything_here or is_this_machine(host):
            interface_of(host, requested)


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
    for name in sorted(n for n in os.listdir(directory) if n.startswith("rank-") and n.endswith(".json")):
        with open(os.path.join(directory, name)) as f:  # whole files only: written by rename
            records.append(json.load(f))
    # A rank that died of a peer's failure (Horovod shut down) may exit first: its own error text
    # decides; Horovod's "first process" only breaks ties between ranks that failed on their own.
    own = [r for r in records if not r["secondary"]]
    here = socket.gethostname()  # local ranks: all on this machine
    failures = [RankFailure(r["rank"], r["cause"], r["traceback"],
                            r["secondary"] or (len(own) > 1 and first is not None and r["rank"] != first), here)
                for r in records]
    if first is not None and not any(f.rank == first for f in failures):  # killed: it could not say why
        code = _shell_status(int(match.group(2)))
        failures.append(RankFailure(first, _exit_cause(code), host=here, lost=signal_is_loss(code)))
    if not failures:
        failures.append(RankFailure(-1, horovod_message.strip(), host=here))
    return failures


def _shell_status(code: int) -> int:
    """Horovod's launcher starts each rank through a shell, which reports a rank killed by signal N
    as exit status 128 + N: as ``subprocess`` would (-N)."""
    if 128 < code < 128 + 65:
        try:
            return -signal.Signals(code - 128)
        except ValueError:
            pass
    return code


def _exit_cause(code: int) -> str:
    if code < 0:
        return f"process killed by signal {signal.Signals(-code).name}"
    return f"process exited with status {code}"


# -- inside a barrier task ---------------------------------------------------------------------

def _barrier_task(payload: bytes, num_proc: int, requested_iface: Optional[str], sink: tuple):
    """The function each barrier task runs: plan ranks, check the network, rendezvous, run the rank
    as a child whose output goes to the driver's ``sink`` (address, token). Every task decides its
    Gloo interface *before* the one ``allGather`` all tasks join, and shares the outcome: a task
    that cannot (no such interface, an address on none) makes every task return without starting
    a rank, and the driver raises :class:`HorovodJobFailed` naming that rank and its host."""

    def run(_partition):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        index = ctx.partitionId()
        hosts = [info.address.rsplit(":", 1)[0] for info in ctx.getTaskInfos()]
        slot = rank_plan(hosts)[index]
        mine: Dict[str, str] = {}
        try:  # the driver's choice, else this executor's own HOROVOD_GLOO_IFACE, else by address
            mine["iface"] = interface_of(hosts[index], requested_iface or os.environ.get(GLOO_IFACE_ENV))
        except ValueError as exc:
            mine["error"] = f"{type(exc).__name__}: {exc}"
        server = None
        if index == 0 and "error" not in mine:  # the rendezvous lives as long as task 0
            server, port = _start_rendezvous(hosts, num_proc)
            mine["rendezvous"] = f"{hosts[0]}:{port}"  # the address Spark reaches task 0 at
        try:
            gathered = [json.loads(m) for m in ctx.allGather(json.dumps(mine))]
            if any("error" in m for m in gathered):
                yield ({"rank": slot["rank"], "status": "error", "cause": mine["error"], "secondary": False,
                        "host": hosts[index]}
                       if "error" in mine else {"rank": slot["rank"], "status": "not started"})
                return
            address, port = gathered[0]["rendezvous"].rsplit(":", 1)
            gpus = ctx.resources().get("gpu")
            env = dict(os.environ,
                       HOROVOD_HOSTNAME=hosts[index], HOROVOD_RANK=str(slot["rank"]), HOROVOD_SIZE=str(num_proc),
                       HOROVOD_LOCAL_RANK=str(slot["local_rank"]), HOROVOD_LOCAL_SIZE=str(slot["local_size"]),
                       HOROVOD_CROSS_RANK=str(slot["cross_rank"]), HOROVOD_CROSS_SIZE=str(slot["cross_size"]),
                       HOROVOD_GLOO_RENDEZVOUS_ADDR=address, HOROVOD_GLOO_RENDEZVOUS_PORT=port,
                       HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE=mine["iface"])
            env[SPARK_GPUS_ENV] = ",".join(gpus.addresses) if gpus else ""
            yield run_child(payload, env, slot["rank"], (*sink, hosts[index]))
        finally:
            if server is not None:
                server.stop()

    return run


def _start_rendezvous(hosts: List[str], num_proc: int):
    """Start Horovod's Gloo rendezvous server (it listens on all addresses); return it and its port."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer(verbose=0)
    port = server.start()
    host_list = ",".join(f"{h}:{n}" for h, n in _host_counts(hosts))
    server.init(get_host_assignments(parse_hosts(host_list), num_proc))
    return server, port


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


GLOO_IFACE_ENV = "HOROVOD_GLOO_IFACE"


def local_interfaces() -> Dict[str, List[str]]:
    """This machine's network interfaces: name -> its IPv4 and IPv6 addresses (psutil)."""
    import socket

    import psutil

    families = (socket.AF_INET, socket.AF_INET6)
    return {name: [a.address.split("%")[0] for a in addresses if a.family in families]
            for name, addresses in psutil.net_if_addrs().items()}


def resolve(host: str) -> str:
    """The IP address ``host`` (a name or an address) resolves to, IPv4 preferred (Gloo's choice).

    Raises:
        ValueError: ``host`` does not resolve.
    """
    import socket

    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(f"host {host!r} does not resolve to an address: {exc}") from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return infos[0][4][0]


def _listing(interfaces: Dict[str, List[str]]) -> str:
    return ", ".join(f"{name} ({' '.join(addresses) or 'no address'})"
                     for name, addresses in sorted(interfaces.items()))


def interface_of(host: str, requested: Optional[str] = None,
                 interfaces: Optional[Dict[str, List[str]]] = None) -> str:
    """The network interface Gloo should use on the machine that runs a rank for ``host``.

    A ``requested`` interface (the user's ``HOROVOD_GLOO_IFACE`` or ``--network-interface``) is
    used as it is, never replaced; it only has to exist. Otherwise ``host`` (a name or an IPv4/IPv6
    address) is resolved: any loopback address (all of 127.0.0.0/8, e.g. Debian's hostname
    address 127.0.1.1, and ::1) maps to the loopback interface, since Linux routes the whole /8
    over it while only 127.0.0.1 is configured on it; any other address maps to the interface
    that carries it.

    Args:
        host: the rank's host as Spark names it (executor host).
        requested: an interface name chosen by the user, or None/"" for none.
        interfaces: name -> addresses; default :func:`local_interfaces` (this machine's).

    Raises:
        ValueError: the requested interface does not exist here, ``host`` does not resolve, or
            no interface carries its address; the message names the interfaces that exist.
    """
    import ipaddress

    interfaces = local_interfaces() if interfaces is None else interfaces
    if requested:
        if requested not in interfaces:
            raise ValueError(f"network interface {requested!r} ({GLOO_IFACE_ENV} / --network-interface) "
                             f"does not exist on host {host}; its interfaces: {_listing(interfaces)}")
        return requested
    address = ipaddress.ip_address(resolve(host))
    matches = [name for name, addresses in interfaces.items()
               if any(_same_or_loopback(address, a) for a in addresses)]
    if matches:
        return sorted(matches, key=lambda name: name != "lo")[0]
    raise ValueError(f"no network interface of host {host} has its address {address} (interfaces: "
                     f"{_listing(interfaces)}); set SPARK_LOCAL_IP to one of these addresses, or name the "
                     f"interface with --network-interface / {GLOO_IFACE_ENV}")


def _same_or_loopback(address, other: str) -> bool:
    """``address`` equals ``other``, or both are loopback addresses (of the same IP version)."""
    import ipaddress

    try:
        candidate = ipaddress.ip_address(other)
    except ValueError:
        return False
    if address.is_loopback and candidate.is_loopback:  # Gloo binds by name: lo serves both versions
        return True
    return candidate == address


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def run_child(payload: bytes, env: Dict[str, str], rank: int,
              sink: tuple = (None, "", "")) -> Dict[str, Any]:
    """Run one rank in a fresh interpreter, its output (stdout and stderr, unbuffered) forwarded
    line by line to the driver's log sink ``(address, token, this host)``.

    Returns:
        ``{'rank', 'status', 'result' | 'cause', 'log_lines'}`` (lines sent to the sink).
    """
    with tempfile.TemporaryDirectory(prefix=f"hvd-rank{rank}-") as work:
        job, result = os.path.join(work, "job.pkl"), os.path.join(work, "result.json")
        with open(job, "wb") as f:
            f.write(payload)
        proc = subprocess.Popen([sys.executable, "-m", "pipelines.launcher", job, result],
                                env=dict(env, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        address, token, host = sink
        with proc.stdout:
            lines = forward(proc.stdout, address, token, rank, host)
        proc.wait()
        if os.path.exists(result):
            with open(result) as f:
                record = json.load(f)
        else:
            record = {"status": "error", "cause": _exit_cause(proc.returncode), "secondary": False,
                      "lost": signal_is_loss(proc.returncode)}
        record["rank"], record["log_lines"] = rank, lines
        record["host"] = env.get("HOROVOD_HOSTNAME", "")
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
    write_json(result_path, record)
    return code


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1], sys.argv[2]))
