"""One rank in a fresh interpreter inside a barrier task or a local run; it dies with its task."""
from __future__ import annotations

import base64
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

import cloudpickle

from pipelines.io.atomic import write_json
from pipelines.launch.failures import exit_cause, failure_record, log_rank_failure, signal_is_loss
from pipelines.launch.ranklogs import forward

log = logging.getLogger("pipelines")

_outcome_path: Optional[str] = None  # where this rank's outcome goes: set by child_main, in the rank's process


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Make this process (a rank, between fork and exec) receive SIGKILL when its parent dies."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def rank_command(job: str, result: str) -> List[str]:
    """The command line of a rank's process: ``child_main`` on the paths ``job`` and ``result`` (not ``-m``)."""
    return [sys.executable, "-c", "import sys; from pipelines.launch.child import child_main; "
                                  "sys.exit(child_main(sys.argv[1], sys.argv[2]))", job, result]


def run_child(payload: bytes, env: Dict[str, str], rank: int,
              sink: tuple = (None, "", "")) -> Dict[str, Any]:
    """Run one rank in a fresh interpreter, its output forwarded to the driver's sink ``(address, token, this host)``.

    Returns:
        ``{'rank', 'status', 'result' | 'cause', 'log_lines'}`` (``log_lines``: lines sent to the sink)."""
    with tempfile.TemporaryDirectory(prefix=f"hvd-rank{rank}-") as work:
        job, result = os.path.join(work, "job.pkl"), os.path.join(work, "result.json")
        # the payload holds the rank's config, storage credentials included: owner-only, and
        # handed over by path, never on the child's command line (which every local user can read)
        with os.fdopen(os.open(job, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(payload)
        proc = subprocess.Popen(rank_command(job, result), env=dict(env, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        address, token, host = sink
        with proc.stdout:
            lines = forward(proc.stdout, address, token, rank, host)
        proc.wait()
        if os.path.exists(result):
            with open(result) as f:
                record = json.load(f)
        else:
            record = {"status": "error", "cause": exit_cause(proc.returncode), "secondary": False,
                      "lost": signal_is_loss(proc.returncode)}
        record["rank"], record["log_lines"] = rank, lines
        record["host"] = env.get("HOROVOD_HOSTNAME", "")
        return record


def write_outcome(record: Dict[str, Any]) -> None:
    """Write ``record`` as this rank's outcome for its launcher; nothing outside ``child_main`` (e.g. horovodrun)."""
    if _outcome_path:
        write_json(_outcome_path, record)


def child_main(job_path: str, result_path: str) -> int:
    """Entry point of a rank's process: run the pickled function, write its outcome."""
    global _outcome_path
    _outcome_path = result_path
    with open(job_path, "rb") as f:
        main, kwargs = cloudpickle.load(f)
    try:
        value = main(**kwargs)
        record = {"status": "ok", "result": base64.b64encode(cloudpickle.dumps(value)).decode()}
        code = 0
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, which raises
        record = {"status": "error", **failure_record(exc)}
        log_rank_failure(record)
        code = 1
    write_outcome(record)
    return code
