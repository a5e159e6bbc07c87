"""The variables a launcher hands its ranks: written here, read by ``read_rank_environment`` alone, once.

- ``PIPELINES_ATTEMPTS``: JSON list of the earlier attempts (``attempts_env``).
- ``PIPELINES_ASSIGNED_GPUS``: the GPU addresses Spark gave a barrier task's rank (``assigned_gpus_env``).
- ``PIPELINES_STALL_TIMEOUT``: seconds without progress before a rank ends as stalled (``timeouts_env``).
- ``PIPELINES_FAULT_INJECT``: test hook ``rank=R,epoch=E,mode=M[,...]`` (``training/faults.py``), ignored
  unless ``PIPELINES_FAULT_TOKEN`` names the test suite's token file (``fault_armed``)."""
from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

log = logging.getLogger("pipelines")

ATTEMPTS_ENV = "PIPELINES_ATTEMPTS"
ASSIGNED_ENV = "PIPELINES_ASSIGNED_GPUS"
STALL_ENV = "PIPELINES_STALL_TIMEOUT"
GLOO_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"  # read by Horovod's Gloo context at hvd.init()
FAULT_ENV = "PIPELINES_FAULT_INJECT"
FAULT_TOKEN_ENV = "PIPELINES_FAULT_TOKEN"
#: what the test suite's token file holds; a production process, given the hook's variable alone,
#: injects nothing
FAULT_TOKEN_TEXT = "pipelines test suite: fault injection armed\n"


@dataclass(frozen=True)
class RankEnvironment:
    """What a rank's launcher handed it, read by ``read_rank_environment``."""

    #: every attempt of this job so far, this one last, each with the world size it ran on:
    #: ``[{"attempt": 1, "world_size": 3, "failure": "rank 1 on HOST failed: ..."}, ...,
    #: {"attempt": n, "world_size": 2, "failure": None}]``; one attempt outside a relauncher
    attempts: List[Dict] = field(default_factory=lambda: [{"attempt": 1, "world_size": 1, "failure": None}])
    assigned_gpus: List[str] = field(default_factory=list)  #: GPU addresses the launcher gave the rank
    fault: str = ""  #: the test hook's spec; "" = none or not armed (``fault_armed``)
    fault_ignored: bool = False  #: a spec was given without the test suite's token
    stall_timeout_s: float = 0.0  #: seconds without progress before the rank ends as stalled; 0: not watched

    @property
    def relaunched(self) -> bool:
        """Whether this is a relaunch after a lost rank (the rank continues from its checkpoints)."""
        return len(self.attempts) > 1


def read_rank_environment(environ: Optional[Mapping[str, str]] = None) -> RankEnvironment:
    """The ``RankEnvironment`` of ``environ`` (default ``os.environ``); this attempt's world size is ``HOROVOD_SIZE``."""
    env = os.environ if environ is None else environ
    earlier = json.loads(env.get(ATTEMPTS_ENV) or "[]")
    spec = env.get(FAULT_ENV, "").strip()
    armed = bool(spec) and fault_armed(env.get(FAULT_TOKEN_ENV, ""))
    if spec and not armed and env.get("HOROVOD_RANK", "0") == "0":
        log.warning("%s is set but the test suite's token is not (%s): no fault is injected", FAULT_ENV,
                    FAULT_TOKEN_ENV)
    return RankEnvironment(
        attempts=earlier + [{"attempt": len(earlier) + 1, "world_size": int(env.get("HOROVOD_SIZE") or 1),
                             "failure": None}],
        assigned_gpus=[a for a in env.get(ASSIGNED_ENV, "").split(",") if a],
        fault=spec if armed else "", fault_ignored=bool(spec) and not armed,
        stall_timeout_s=float(env.get(STALL_ENV) or 0))


def fault_armed(path: str) -> bool:
    """Whether ``path`` is the test suite's token file: this user's regular file, mode ``0o600`` or stricter,
    holding exactly ``FAULT_TOKEN_TEXT``."""
    if not path:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.getuid() or status.st_mode & 0o077:
            return False
        return os.read(fd, len(FAULT_TOKEN_TEXT) + 1) == FAULT_TOKEN_TEXT.encode()
    finally:
        os.close(fd)


def fault_token_env(path: str) -> Dict[str, str]:
    """The variable that arms the fault hook with the token file ``path``."""
    return {FAULT_TOKEN_ENV: path}


def timeouts_env(rendezvous_timeout_s: float, stall_timeout_s: float, environ: Mapping[str, str]) -> Dict[str, str]:
    """The variables bounding a rank's waits, in seconds: Gloo's rendezvous (unless in ``environ``), the watchdog."""
    gloo = environ.get(GLOO_TIMEOUT_ENV) or str(max(1, int(round(rendezvous_timeout_s))))
    return {GLOO_TIMEOUT_ENV: gloo, STALL_ENV: f"{stall_timeout_s:g}"}


def own_timeouts(rank_timeouts: Mapping[str, str], environ: Mapping[str, str]) -> Dict[str, str]:
    """``rank_timeouts`` as one host applies them: a Gloo timeout in that host's ``environ`` is kept."""
    own = environ.get(GLOO_TIMEOUT_ENV)
    return dict(rank_timeouts, **{GLOO_TIMEOUT_ENV: own}) if own and rank_timeouts else dict(rank_timeouts)


def gloo_timeout(env: Mapping[str, str]) -> str:
    """The Gloo timeout in seconds, as text, of a rank started with ``env`` (Horovod's default ``"30"``)."""
    return env.get(GLOO_TIMEOUT_ENV) or "30"


def attempts_env(history: Sequence[Dict]) -> Dict[str, str]:
    """The variable that tells a rank the earlier attempts ``history`` of its job."""
    return {ATTEMPTS_ENV: json.dumps(list(history))}


def assigned_gpus_env(addresses: Sequence[str]) -> Dict[str, str]:
    """The variable that tells a rank the GPU addresses its launcher gave it."""
    return {ASSIGNED_ENV: ",".join(addresses)}
