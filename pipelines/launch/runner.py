"""``HorovodRunner``: run one function on N Horovod ranks, locally or as Spark barrier tasks."""
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
    """Run a function on ``abs(np)`` Horovod ranks: ``np < 0`` local processes, ``np > 0`` Spark barrier tasks.

    Args:
        slots_timeout_s: seconds to wait for the cluster's executors to offer the task slots.
        network_interface: Gloo's interface on every host (e.g. ``eth0``); default ``HOROVOD_GLOO_IFACE``.
        max_failures: relaunches after a lost rank (0: none); the function must resume from its checkpoints.
        min_np, max_np: with ``np > 0`` and ``max_failures``: a relaunch's world size bounds. Default: ``np``.
        log_dir: local folder keeping each rank's whole output. None: shown live at the driver only.
        before_ranks: called on every attempt just before any rank starts.
        rank_timeouts: variables bounding every rank's waits (``rankenv.timeouts_env``); None: Horovod's.

    Raises:
        ValueError: ``np == 0``, a negative ``max_failures``, bounds no run keeps, or bounds with ``np < 0``."""

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
        """Run ``main(**kwargs)`` (picklable; ``main`` calls ``hvd.init()``) on every rank; return rank 0's value.

        Raises:
            ClusterConfigError: the Spark configuration forbids barrier tasks.
            ValueError: before any rank starts: no SparkSession, too few slots, an unusable interface, too few GPUs.
            HorovodJobFailed: a rank raised or died (a lost one only once relaunches are spent).
            RelaunchImpossible: a relaunch found too few task slots."""
        return run_with_retries(lambda attempt: self._launch(attempt, kwargs), main, self.max_failures)

    def _launch(self, main: Callable[..., Any], kwargs: Any) -> Any:
        """One attempt of the run, on ``main`` as ``run_with_retries`` wrapped it (``main.history``: earlier attempts)."""
        if self.np < 0:
            iface = local_interface(self.network_interface)
            check_local_gpus(-self.np, visible_gpu_count(os.environ))
            self.before_ranks()
            return run_local(main, kwargs, -self.np, iface, self.log_dir, self.rank_timeouts)
        history: List[Dict[str, Any]] = getattr(main, "history")
        previous = history[-1]["world_size"] if history else None
        return run_spark(main, kwargs, self.bounds, self.slots_timeout_s, self.network_interface, self.log_dir,
                         self.before_ranks, self.rank_timeouts, previous)
