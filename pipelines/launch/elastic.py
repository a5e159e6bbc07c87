"""horovodrun's elastic mode: the ranks that remain after a lost one continue from the newest
complete checkpoint, on the world the host discovery script offers.

``horovodrun -np N --min-np M --max-np X --host-discovery-script S python jobs/train.py ...`` starts
each worker with ``HOROVOD_ELASTIC=1`` (:func:`under_elastic`), and the job then trains under
:func:`run_elastic`. What Horovod 0.28.1 does (``horovod/runner/elastic/driver.py``,
``registration.py``, ``horovod/common/elastic.py``) and what that asks of a job:

* A worker that dies is recorded as failed once every other worker has come back to Horovod's
  rendezvous; its host is then blacklisted (for good, or for ``--blacklist-cooldown-range``), and
  the others go on with the slots left if at least ``--min-np`` (else the driver waits up to
  ``--elastic-timeout`` for slots). One machine must therefore list each slot under its own name
  (:mod:`pipelines.launch.discovery`).
* The workers left see ``HorovodInternalError`` in their next collective; Horovod's ``run_fn``
  restores the :class:`~horovod.common.elastic.State`, shuts Horovod down, initialises it again
  (the new rank and world size) and calls the function again.
* Slots the discovery script adds (or takes away from a live worker) are told to rank 0, and every
  rank raises ``HostsUpdatedInterrupt`` at the next ``State.check_host_updates()``: here each
  epoch's end, after its checkpoint (:class:`pipelines.training.callbacks.HostsUpdateCheck`); a new
  worker is then started and joins.

Here the state is the newest complete checkpoint, not memory: the State holds nothing (its sync,
commit and restore cost nothing), and each call of the training function after a reset is a
relaunch, as ``--max-failures``'s are (:class:`ElasticRun`): it continues the run's own newest
complete checkpoint at the new world size, and a worker that joins reads the same checkpoint.
"""
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
    """One worker's record of an elastic run: Horovod's ``state``, the attempts so far (each call of
    the training function, with its world size and why it ended), its place in the last one, and
    the training run's id (which every call continues)."""

    def __init__(self, state):
        self.state = state
        self.attempts: List[Dict] = []  # the attempts that ended: {"attempt", "world_size", "failure"}
        self.run_id: Optional[str] = None
        self.rank: Optional[int] = None  # this worker's rank in the last attempt (None: it joins anew)
        self.hosts: List[str] = []  # each rank's host in the last attempt
        self.ended: Optional[str] = None  # why this worker's last attempt ended

    def joined(self, rank: int, size: int) -> List[Dict]:
        """Called by every rank at each call's start, once Horovod has its new world (``rank`` of
        ``size``): one allgather of each rank's place in the previous world and its host, from
        which :func:`ended_attempt` names the ranks that were lost; returns the attempts, this one
        last (:attr:`pipelines.launch.rankenv.RankEnvironment.attempts`)."""
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
    """The record of attempt ``number``, which ended as this worker saw (``ended``: why; ``None``:
    this worker was not in it), from ``places``: each rank's ``(rank in that attempt or None,
    that attempt's world size, host)`` now, and ``hosts``: each rank's host in that attempt.
    The lost ranks are that world's ranks no rank now had: ``{"attempt", "world_size",
    "failure": "rank 1 on HOST lost: WHY"}`` (or just ``WHY`` when none was lost: the slots changed)."""
    before = next((size for rank, size, _ in places if rank is not None), None)
    if before is None or ended is None:
        return None
    lost = sorted(set(range(before)) - {rank for rank, _, _ in places})
    who = ", ".join(f"rank {r} on {hosts[r]}" if r < len(hosts) else f"rank {r}" for r in lost)
    return {"attempt": number, "world_size": before, "failure": f"{who} lost: {ended}" if lost else ended}


_current: Optional[ElasticRun] = None  # the process's elastic run, while run_elastic runs


def current() -> Optional[ElasticRun]:
    """The :class:`ElasticRun` of this worker while :func:`run_elastic` runs, else ``None``."""
    return _current


def run_elastic(main: Callable[..., Any], **kwargs: Any) -> Tuple[Any, int]:
    """Run ``main(**kwargs, run_id=...)`` under Horovod's elastic ``run_fn``: a call that a lost rank
    or a change of the hosts ends is made again, after Horovod's reset, on the new world (with the
    run id the earlier calls had: :attr:`ElasticRun.run_id`). ``main`` calls ``hvd.init()`` and,
    on every rank at its start, :meth:`ElasticRun.joined` (:func:`current`).

    Returns:
        ``(main's value, this worker's rank in the world that finished)``.

    Raises:
        what ``main`` raises but a peer's loss (:func:`pipelines.launch.failures.is_secondary`).
    """
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
    """One call of ``main``; a peer's loss becomes Horovod's ``HorovodInternalError`` (what
    ``run_fn`` resets on), a change of the hosts stays ``HostsUpdatedInterrupt``; either is
    recorded in ``run`` as why the attempt ended."""
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
    """One line for the error a peer's loss raised here: ``Type: `` and the first line of its message
    that names Horovod or Gloo (TensorFlow puts ``Graph execution error:`` and the op's place
    first), its first sentence, without TensorFlow's ``{{function_node ...}}``, at most 200 characters."""
    lines = [re.sub(r"\{\{[^}]*\}\}\s*", "", line).strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line]
    named = next((line for line in lines if is_secondary(RuntimeError(line))), lines[0] if lines else "")
    return f"{type(exc).__name__}: {named.split('. ')[0][:200]}"


def _reset() -> None:
    """Horovod's reset between two calls (shut down, initialise: the new world), and Keras' graph
    of the call that ended freed first (the next call builds its model anew)."""
    import horovod.tensorflow as hvd_tf

    from pipelines.stack.kerasapi import keras

    keras.backend.clear_session()
    hvd_tf.shutdown()
    hvd_tf.init()
