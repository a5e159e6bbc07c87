"""horovodrun's elastic mode: the ranks left after a lost one continue from the newest complete checkpoint.

The ``State`` holds nothing: each call after a reset resumes from the checkpoint."""
from __future__ import annotations

import functools
import logging
import os
import re
import socket
from typing import Any, Callable, Dict, List, Optional, Tuple

from pipelines.launch.failures import is_secondary
from pipelines.runtime.logs import plural

log = logging.getLogger("pipelines")

ELASTIC_ENV = "HOROVOD_ELASTIC"  # horovodrun sets it to 1 for every worker of an elastic run (gloo_run.py)


def under_elastic(environ) -> bool:
    """Whether this process is a worker of horovodrun's elastic mode (``HOROVOD_ELASTIC=1``)."""
    return environ.get(ELASTIC_ENV) == "1"


class ElasticRun:
    """One worker's record of an elastic run: Horovod's ``state``, the ended attempts, and the run id."""

    def __init__(self, state):
        self.state = state
        self.attempts: List[Dict] = []  # the attempts that ended: {"attempt", "world_size", "failure"}
        self.run_id: Optional[str] = None
        self.rank: Optional[int] = None  # this worker's rank in the last attempt (None: it joins anew)
        self.hosts: List[str] = []  # each rank's host in the last attempt
        self.ended: Optional[str] = None  # why this worker's last attempt ended

    def joined(self, rank: int, size: int) -> List[Dict]:
        """Called by every rank at each call's start with its new ``rank`` of ``size``; one allgather names the lost ranks.

        Returns:
            The attempts, this one last (``RankEnvironment.attempts``)."""
        import horovod.tensorflow as hvd_tf

        host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
        places = hvd_tf.allgather_object((self.rank, len(self.hosts), host), name="elastic_joined")
        ended = ended_attempt(len(self.attempts) + 1, places, self.hosts, self.ended)
        if ended is not None:
            self.attempts.append(ended)
            if rank == 0:
                log.warning("attempt %d: %s (world size %d -> %d), from the newest complete checkpoint, after %s",
                            len(self.attempts) + 1, plural(size, "rank"), ended["world_size"], size, ended["failure"])
        self.rank, self.hosts, self.ended = rank, [h for _, _, h in places], None
        return self.attempts + [{"attempt": len(self.attempts) + 1, "world_size": size, "failure": None}]


def ended_attempt(number: int, places: List[Tuple[Optional[int], int, str]], hosts: List[str],
                  ended: Optional[str]) -> Optional[Dict]:
    """The record of attempt ``number`` as this worker saw it end (``ended``: why), or None if it was not in it.

    ``places``: each rank's ``(rank then or None, world size then, host)``."""
    before = next((size for rank, size, _ in places if rank is not None), None)
    if before is None or ended is None:
        return None
    lost = sorted(set(range(before)) - {rank for rank, _, _ in places})
    who = ", ".join(f"rank {r} on {hosts[r]}" if r < len(hosts) else f"rank {r}" for r in lost)
    return {"attempt": number, "world_size": before, "failure": f"{who} lost: {ended}" if lost else ended}


_current: Optional[ElasticRun] = None  # the process's elastic run, while run_elastic runs


def current() -> Optional[ElasticRun]:
    """This worker's ``ElasticRun`` while ``run_elastic`` runs, else None."""
    return _current


def run_elastic(main: Callable[..., Any], **kwargs: Any) -> Tuple[Any, int]:
    """Run ``main(**kwargs, run_id=...)`` under Horovod's elastic ``run_fn``, again after each reset, same run id.

    Returns:
        ``(main's value, this worker's rank in the world that finished)``.

    Raises:
        What ``main`` raises, except a peer's loss."""
    import horovod.tensorflow as hvd_tf
    from horovod.common.elastic import ObjectState, run_fn

    global _current
    # nothing in memory: the checkpoints are the state
    run = ElasticRun(ObjectState(hvd_tf.broadcast_object, hvd_tf.rank))
    _current = run
    try:
        value = run_fn(functools.partial(_attempt, run, main, kwargs), _reset)(run.state)
    finally:
        _current = None
    return value, hvd_tf.rank()


def _attempt(run: ElasticRun, main: Callable[..., Any], kwargs: Dict[str, Any], state) -> Any:
    """One call of ``main``: a peer's loss is re-raised as ``HorovodInternalError`` (``run_fn`` resets on it)."""
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    try:
        return main(**kwargs, run_id=run.run_id)
    except HostsUpdatedInterrupt:
        run.ended = "the host discovery script changed the slots"
        log.warning("%s: continuing from the newest complete checkpoint on the new world", run.ended)
        raise
    except Exception as exc:  # noqa: BLE001 - only a peer's loss is Horovod's to reset on
        if not (isinstance(exc, HorovodInternalError) or is_secondary(exc)):
            raise
        run.ended = peer_loss(exc)
        log.warning("a rank was lost (%s): the ranks left continue from the newest complete checkpoint", run.ended)
        raise HorovodInternalError(exc) from exc


def peer_loss(exc: BaseException) -> str:
    """One line (at most 200 characters) for a peer-loss error, from its first line naming Horovod or Gloo."""
    lines = [re.sub(r"\{\{[^}]*\}\}\s*", "", line).strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line]
    named = next((line for line in lines if is_secondary(RuntimeError(line))), lines[0] if lines else "")
    return f"{type(exc).__name__}: {named.split('. ')[0][:200]}"


def _reset() -> None:
    """Horovod's reset between two calls (shut down, initialise), Keras' session cleared first."""
    import horovod.tensorflow as hvd_tf

    from pipelines.stack.kerasapi import keras

    keras.backend.clear_session()
    hvd_tf.shutdown()
    hvd_tf.init()
