"""``HorovodRunner``: run one function on N Horovod ranks, locally or as Spark barrier tasks.

The semantics Databricks users know (``sparkdl.HorovodRunner``):

* ``HorovodRunner(np=-N).run(main, **kwargs)`` starts N processes on this machine, children of
  the driver that talk over loopback alone (Gloo: :mod:`pipelines.launch.local`);
* ``HorovodRunner(np=N).run(main, **kwargs)`` runs N Spark **barrier** tasks on whatever cluster
  the active SparkSession points at (:mod:`pipelines.launch.barrier`): the tasks start together or
  not at all, task 0 serves Gloo's rendezvous, and each task runs its rank in a child process
  (:mod:`pipelines.launch.child`). Each rank's output reaches the driver while it runs, prefixed
  ``[rank R on HOST]`` (:mod:`pipelines.launch.ranklogs`), and is kept as ``rank-R.log`` in ``log_dir``.

Both return rank 0's return value. A failing rank (exception, or a killed process) fails the whole
run promptly with :class:`~pipelines.launch.failures.HorovodJobFailed`, which names the rank, its
host and the cause; the barrier tasks report failures as results instead of failing, so Spark does
not retry a deterministic error. With ``max_failures=K`` a run whose rank was lost (killed, OOM,
executor or host lost) is relaunched up to K times (:mod:`pipelines.launch.recovery`).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional

from pipelines.launch.barrier import run_spark
from pipelines.launch.gpus import check_local_gpus, visible_gpu_count
from pipelines.launch.local import run_local
from pipelines.launch.network import GLOO_IFACE_ENV, local_interface
from pipelines.launch.recovery import run_with_retries
from pipelines.launch.worlds import WorldBounds
from pipelines.runtime.errors import Refused


class HorovodRunner:
    """Run a function on ``abs(np)`` Horovod ranks: ``np < 0`` locally, ``np > 0`` on Spark.

    Args:
        np: number of ranks; negative for local processes, positive for Spark barrier tasks.
        slots_timeout_s: how long to wait for a cluster's executors to offer ``np`` task slots.
        network_interface: the interface Gloo uses on every host (e.g. ``eth0``); default: the
            ``HOROVOD_GLOO_IFACE`` of this process, else of each executor, else the interface that
            carries each host's address (``lo`` for any loopback address, and for local ranks). A named interface is used
            as it is or refused, never replaced.
        max_failures: relaunch the whole run up to this many times when a rank's process or host
            is lost (:mod:`pipelines.launch.recovery`), with the same ``np``; the function must then continue
            from its own checkpoints when relaunched (``pipelines.launch.rankenv.RankEnvironment.relaunched``). 0: fail at once.
        min_np, max_np: with ``np > 0`` and ``max_failures``: a relaunch runs on the task slots the
            cluster offers then, at most ``max_np``, if at least ``min_np`` (waiting up to
            ``slots_timeout_s`` for them): :func:`pipelines.launch.sparkcheck.attempt_world`; the
            function then continues at that world size. Default ``np``: every attempt on ``np`` ranks.
        log_dir: a local folder that keeps each rank's whole output: ``rank-R.log`` (``np > 0``,
            written by the driver as the lines arrive), or ``rank.R/stdout`` and
            ``rank.R/stderr`` (``np < 0``, Horovod's layout). None: the output is only shown, live, at the driver.
        before_ranks: called once the launch's own checks (slots, network interface) have passed,
            just before any rank starts, on every attempt; what it raises ends the run there
            (training fetches ``--weights imagenet`` here: a refused launch downloads nothing).
        rank_timeouts: variables every rank starts with that bound its waits (Gloo's rendezvous,
            the progress watchdog: :func:`pipelines.launch.rankenv.timeouts_env`); None: Horovod's
            own 30 s rendezvous and no watchdog.

    Raises:
        ValueError: ``np == 0``, a negative ``max_failures``, bounds no run keeps
            (:func:`pipelines.launch.worlds.check_bounds`), or bounds for local ranks (``np < 0``).
    """

    def __init__(self, np: int, slots_timeout_s: float = 60.0, network_interface: Optional[str] = None,
                 max_failures: int = 0, log_dir: Optional[str] = None,
                 before_ranks: Optional[Callable[[], None]] = None, rank_timeouts: Optional[Dict[str, str]] = None,
                 min_np: Optional[int] = None, max_np: Optional[int] = None):
        if not isinstance(np, int) or np == 0:
            raise Refused(f"np must be a non-zero integer (negative: local processes, positive: "
                          f"Spark tasks), got {np!r}")
        if not isinstance(max_failures, int) or max_failures < 0:
            raise Refused(f"max_failures must be an integer >= 0, got {max_failures!r}")
        self.bounds = WorldBounds.of(abs(np), min_np, max_np)
        if np < 0 and not self.bounds.fixed:
            raise Refused("min_np and max_np apply to Spark barrier tasks (np > 0): local ranks are relaunched on "
                          "the -np they started with")
        self.np = np
        self.max_failures = max_failures
        self.slots_timeout_s = slots_timeout_s
        self.network_interface = network_interface or os.environ.get(GLOO_IFACE_ENV) or None
        self.log_dir = log_dir
        self.before_ranks = before_ranks or (lambda: None)
        self.rank_timeouts = dict(rank_timeouts or {})

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every rank; return rank 0's return value.

        ``main`` and ``kwargs`` must be picklable (cloudpickle); ``main`` calls ``hvd.init()``.

        Raises:
            ClusterConfigError: the Spark configuration forbids barrier tasks (before any task).
            ValueError: no active SparkSession for ``np > 0``, more Spark tasks than slots, a
                network interface that does not exist / an address on no interface / a host with
                no IPv4 address on this machine's executors, or more local ranks than this
                machine's GPUs (``np < 0``; naming both numbers), before any rank starts.
            HorovodJobFailed: a rank raised or died, or could not choose its network interface on
                its host (the cause names the host); with ``max_failures``, a lost rank only once
                the relaunches are spent.
            RelaunchImpossible: a relaunch found the cluster without the task slots.
        """
        return run_with_retries(lambda attempt: self._launch(attempt, kwargs), main, self.max_failures)

    def _launch(self, main: Callable[..., Any], kwargs: Any) -> Any:
        """One attempt: every rank of the run, on ``main`` as :func:`run_with_retries` wrapped it
        (its ``history``: the attempts before it, each with its world size)."""
        if self.np < 0:
            iface = local_interface(self.network_interface)
            check_local_gpus(-self.np, visible_gpu_count(os.environ))
            self.before_ranks()
            return run_local(main, kwargs, -self.np, iface, self.log_dir, self.rank_timeouts)
        history: List[Dict[str, Any]] = getattr(main, "history")
        previous = history[-1]["world_size"] if history else None
        return run_spark(main, kwargs, self.bounds, self.slots_timeout_s, self.network_interface, self.log_dir,
                         self.before_ranks, self.rank_timeouts, previous)
