"""Local ranks (``HorovodRunner(np=-N)``): N processes on this machine by Horovod's own launcher.

``horovod.runner.run`` (Gloo) starts the ranks; each rank's exception is written to a folder of
this run by :class:`_Recorded` before it propagates, and :func:`collect_failures` turns those
records and Horovod's message into :class:`~pipelines.launch.failures.RankFailure` s. Two faults of
Horovod 0.28.1's launcher are mended here (:func:`repair_horovod_env`, :func:`mend_pad_rank`).
"""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import tempfile
from typing import Any, Callable, Dict, List, Optional

from pipelines.atomic import write_json
from pipelines.launch.failures import (HorovodJobFailed, RankFailure, exit_cause, failure_record, log_rank_failure,
                                       shell_status, signal_is_loss)
from pipelines.launch.gpus import nccl_env, rank_gpu_env
from pipelines.launch.rankenv import failure_dir_env, keep_env, read_rank_environment

log = logging.getLogger("pipelines")

# horovod.runner.run (0.28.1) starts from ``cycle_time_ms = None,`` and ``cache_capacity = None,``
# (stray commas: tuples) and passes them on as HOROVOD_CYCLE_TIME="(None,)" and
# HOROVOD_CACHE_CAPACITY="(None,)", which Horovod's core reads as 0: a background thread that never
# sleeps between cycles and no response cache. On a CPU it steals a core from the training: a rank
# alone on one core trained at half speed. ``horovodrun`` itself sets neither. The launching
# process's own values are handed over (pipelines.launch.rankenv.keep_env), which horovod.runner.run leaves alone.
_BROKEN_BY_HOROVOD_RUN = ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")


def pad_rank(rank: int, size: int) -> str:
    """Horovod's name of a rank's log folder (``rank.<this>``): ``rank`` zero-padded to the digits
    of ``size - 1``, and ``"0"`` for a world of one."""
    return str(rank).zfill(len(str(max(size - 1, 0))))


def mend_pad_rank() -> None:
    """Give Horovod's launcher a :func:`pad_rank` that takes a world of one.

    Horovod 0.28.1's ``gloo_run._pad_rank`` computes ``int(log10(size - 1)) + 1`` digits, a
    ``ValueError: math domain error`` for one process, so every one-rank local run with rank logs
    (``jobs/train.py --spark-np -1``) failed before its rank started. Same names for every other size.
    """
    from horovod.runner import gloo_run  # in the function: `import pipelines` stays free of Horovod

    gloo_run._pad_rank = pad_rank


def repair_horovod_env(kept: Dict[str, str]) -> None:
    """Replace the ``"(None,)"`` values ``horovod.runner.run`` gives some tuning variables, before
    ``hvd.init()`` reads them: by the launching process's own value when it had one (``kept``:
    :attr:`pipelines.launch.rankenv.RankEnvironment.kept`), else by nothing (Horovod's defaults
    apply). Values that are not ``"(None,)"`` stay."""
    for name in _BROKEN_BY_HOROVOD_RUN:
        if os.environ.get(name) == "(None,)":
            if name in kept:
                os.environ[name] = kept[name]
            else:
                del os.environ[name]


class _Recorded:
    """Wraps ``main`` so that a rank's exception is written to the run's failure folder before it
    propagates: the start of a rank of Horovod's launcher, which reads what the launcher handed it."""

    def __init__(self, main: Callable[..., Any]):
        self.main = main

    def __call__(self, **kwargs: Any) -> Any:
        handed = read_rank_environment()
        repair_horovod_env(handed.kept)
        try:
            return self.main(**kwargs)
        except BaseException as exc:
            record = failure_record(exc)
            log_rank_failure(record)
            directory = handed.failure_dir
            if directory:
                write_json(os.path.join(directory, f"rank-{record['rank']}.json"), record)
            # Horovod's task runner prints what propagates, secrets and all (str(exc) and Python's
            # traceback): the rank ends on the redacted cause alone, status 1 as before
            raise SystemExit(f"rank {record['rank']} on {record['host']} failed: {record['cause']}") from None


def run_local(main: Callable[..., Any], kwargs: Dict[str, Any], world_size: int, iface: Optional[str],
              log_dir: Optional[str]) -> Any:
    """Run ``main(**kwargs)`` on ``world_size`` local ranks (``horovod.runner.run``, Gloo) over the
    interface ``iface`` (None: Horovod's choice; NCCL's too, unless the user set
    ``NCCL_SOCKET_IFNAME``), GPUs numbered in PCI bus order, each rank's output in ``log_dir``
    (Horovod's ``rank.R/stdout``, ``rank.R/stderr``) when given; return rank 0's value.

    Raises:
        HorovodJobFailed: a rank raised or died (:func:`collect_failures`).
    """
    import horovod.runner  # in the function: `import pipelines` stays free of Horovod

    mend_pad_rank()
    with tempfile.TemporaryDirectory(prefix="hvd-failures-") as failures:
        handed = {**failure_dir_env(failures), **keep_env(_BROKEN_BY_HOROVOD_RUN, os.environ),
                  **rank_gpu_env([], [], os.environ), **nccl_env(iface, os.environ)}  # none the user set
        os.environ.update(handed)  # inherited by the ranks
        try:
            if log_dir:
                os.makedirs(log_dir, exist_ok=True)
            results = horovod.runner.run(_Recorded(main), kwargs=kwargs, num_proc=world_size,
                                         hosts=f"localhost:{world_size}", use_gloo=True,
                                         network_interfaces=[iface] if iface else None,
                                         output_filename=log_dir)
        except RuntimeError as exc:
            raise HorovodJobFailed(collect_failures(failures, str(exc))) from exc
        finally:
            for name in handed:
                os.environ.pop(name, None)
    return results[0]


def collect_failures(directory: str, horovod_message: str) -> List[RankFailure]:
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
                            r["secondary"] or (len(own) > 1 and first is not None and r["rank"] != first), here,
                            refused=r.get("refused", False))
                for r in records]
    if first is not None and not any(f.rank == first for f in failures):  # killed: it could not say why
        code = shell_status(int(match.group(2)))
        failures.append(RankFailure(first, exit_cause(code), host=here, lost=signal_is_loss(code)))
    if not failures:
        failures.append(RankFailure(-1, horovod_message.strip(), host=here))
    return failures
