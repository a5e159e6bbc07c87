"""One machine's slots under horovodrun's elastic mode, each under a name of its own.

Horovod 0.28.1's elastic driver blacklists the *host* of a worker that failed, with every slot on
it, and ends the job when every host that ran a worker is blacklisted
(``horovod/runner/elastic/registration.py``, ``_on_workers_recorded``; horovod#1965). A machine
listed once (``localhost:2``) therefore loses the whole job with one lost rank, whatever
``--min-np`` says (seen here: ``blacklist failing host: localhost``, then ``blacklisted slots count
== 2 -> stop running``; ``--blacklist-cooldown-range`` does not help, the job ends before the
cooldown starts).

``scripts/host_discovery.sh`` lists each slot of this machine under its own name instead: slot
``i`` is 127.0.0.1 written with ``i`` leading zeros in its last number (``127.0.0.1``,
``127.0.0.01``, ``127.0.0.001``, ...). The C library reads every one of them as 127.0.0.1
(``inet_aton``), so Horovod starts the worker on this machine without ssh, and Gloo runs over
``lo``; a lost rank takes only its own slot away. Horovod then sees each rank alone on its
"host" (local rank 0 of 1); :func:`local_slot` gives the rank its slot back as its local rank,
so that it takes GPU ``i`` (the script numbers GPU slots as ``nvidia-smi`` numbers the GPUs) and
its own share of the cores.
"""
from __future__ import annotations

import re
from typing import Mapping, Optional, Tuple

#: the names scripts/host_discovery.sh gives this machine's slots: 127.0.0.1 with leading zeros
SLOT_NAME = re.compile(r"^127\.0\.0\.(0*)1$")


def slot_name(index: int) -> str:
    """The name of this machine's slot ``index`` (0-based): ``127.0.0.`` + ``index`` zeros + ``1``."""
    if index < 0:
        raise ValueError(f"a slot index is >= 0, got {index}")
    return "127.0.0." + "0" * index + "1"


def slot_of(host: str) -> Optional[int]:
    """The slot index a :func:`slot_name` names, or ``None`` for any other host name."""
    match = SLOT_NAME.match(host or "")
    return len(match.group(1)) if match else None


def local_slot(environ: Mapping[str, str]) -> Optional[Tuple[int, int]]:
    """``(local_rank, local_size)`` of a rank that horovodrun started on one of this machine's
    slot names (``HOROVOD_HOSTNAME``): its slot, and the ranks on this machine (every rank of the
    world it started in, ``HOROVOD_SIZE``, and more than its slot); ``None`` for a rank on a
    host of its own name."""
    slot = slot_of(environ.get("HOROVOD_HOSTNAME", ""))
    if slot is None:
        return None
    return slot, max(slot + 1, int(environ.get("HOROVOD_SIZE") or 1))
