"""How a job's ranks are started, apart from what each rank does: ``LaunchConfig``.

Launch settings (how many ranks, where, waits, network, relaunches) are kept apart from the stage's own config,
as ``horovod.spark.run`` and Ray's ``ScalingConfig`` do. The command line, notebooks and tests build the same
object; a rank never sees it."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional

from pipelines.launch.rankenv import timeouts_env
from pipelines.launch.runner import HorovodRunner
from pipelines.launch.watchdog import DEFAULT_STALL_TIMEOUT_S
from pipelines.launch.worlds import WorldBounds
from pipelines.runtime.config import field
from pipelines.runtime.errors import Refused

DEFAULT_RENDEZVOUS_TIMEOUT_S = 300.0  # Horovod's own 30 s fails a host a minute late (a cold venv, an image pull)


@dataclass
class LaunchConfig:
    """Where and how the ranks run: ``np`` ranks (Horovod's and Databricks' ``HorovodRunner`` name)."""

    np: int = field(0, flag="--spark-np",
                    help="ranks to launch: N > 0 Spark barrier tasks, N < 0 -N local ones; "
                         "0 = this is a rank (horovodrun)")
    slots_timeout: float = field(60.0, help="with --spark-np N > 0: seconds to wait for N task slots before "
                                            "refusing the run")
    network_interface: str = field("", help="with --spark-np: the hosts' Gloo interface, e.g. eth0; "
                                            "default: HOROVOD_GLOO_IFACE or each host's")
    max_failures: int = field(0, help="with --spark-np: most relaunches from the newest checkpoint after a rank "
                                      "or host is lost; 0 = none")
    min_np: Optional[int] = field(None, help="with --spark-np N > 0 and --max-failures: fewest slots a relaunch may "
                                             "run on; default N")
    max_np: Optional[int] = field(None, help="with --min-np: a relaunch takes at most this many slots (>= N); "
                                             "default N")

    rendezvous_timeout: float = field(DEFAULT_RENDEZVOUS_TIMEOUT_S,
                                      help="seconds each rank waits in Gloo's rendezvous for the others "
                                           "(HOROVOD_GLOO_TIMEOUT_SECONDS)")
    stall_timeout: float = field(DEFAULT_STALL_TIMEOUT_S,
                                 help="seconds a rank may go without progress before it ends as stalled "
                                      "(a lost rank to --max-failures)")

    def __post_init__(self) -> None:
        if not isinstance(self.np, int) or isinstance(self.np, bool):
            raise Refused(f"--spark-np must be an integer, got {self.np!r}")
        if self.network_interface and not self.np:
            raise Refused("--network-interface applies to --spark-np runs; under horovodrun use "
                          "horovodrun's own --network-interface")
        if not isinstance(self.max_failures, int) or self.max_failures < 0:
            raise Refused(f"--max-failures must be >= 0, got {self.max_failures}")
        if self.max_failures and not self.np:
            raise Refused("--max-failures applies to --spark-np runs (the launching driver relaunches the "
                          "ranks); under horovodrun, its elastic mode (--min-np, --host-discovery-script) goes on "
                          "with the ranks left, else rerun it with --resume")
        self._check_world_bounds()
        for flag, value in (("--slots-timeout", self.slots_timeout), ("--rendezvous-timeout", self.rendezvous_timeout),
                            ("--stall-timeout", self.stall_timeout)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise Refused(f"{flag} must be a positive number of seconds, got {value!r}")

    def _check_world_bounds(self) -> None:
        """Refuse ``--min-np``/``--max-np`` where they cannot act, or bounds no run keeps."""
        if self.min_np is None and self.max_np is None:
            return
        if not self.np:
            raise Refused("--min-np and --max-np apply to --spark-np runs; under horovodrun give horovodrun's own "
                          "--min-np, --max-np and --host-discovery-script (its elastic mode: docs/cluster.md)")
        if self.np < 0:
            raise Refused("--min-np and --max-np apply to Spark barrier tasks (--spark-np N > 0): local ranks "
                          "(--spark-np -N) are relaunched on the -N they started with")
        self.bounds  # noqa: B018 - raises on bounds no run keeps
        if not self.max_failures:
            raise Refused("--min-np and --max-np bound the relaunches after a lost rank: give --max-failures K "
                          "(K >= 1) too")

    @property
    def bounds(self) -> WorldBounds:
        """The world's bounds: ``abs(np)`` ranks, relaunches on ``min_np`` to ``max_np`` (default ``abs(np)``).

        Raises:
            pipelines.runtime.errors.Refused: as ``check_bounds``."""
        return WorldBounds.of(self.world_size, self.min_np, self.max_np)

    def timeouts_env(self, environ: Mapping[str, str]) -> Dict[str, str]:
        """The variables giving every rank these waits (``environ``: the launching process's)."""
        return timeouts_env(self.rendezvous_timeout, self.stall_timeout, environ)

    @property
    def launches(self) -> bool:
        """Whether this process starts the ranks (``np != 0``); else it is a rank itself (horovodrun)."""
        return self.np != 0

    @property
    def world_size(self) -> int:
        """The number of ranks this process launches: ``abs(np)``."""
        return abs(self.np)

    def runner(self, log_dir: Optional[str] = None, before_ranks: Optional[Callable[[], None]] = None) -> HorovodRunner:
        """The ``HorovodRunner`` these settings describe.

        Raises:
            ValueError: ``np == 0`` (this process is a rank: nothing to launch)."""
        return HorovodRunner(np=self.np, slots_timeout_s=self.slots_timeout,
                             network_interface=self.network_interface or None, max_failures=self.max_failures,
                             min_np=self.min_np, max_np=self.max_np, log_dir=log_dir, before_ranks=before_ranks,
                             rank_timeouts=self.timeouts_env(os.environ))
