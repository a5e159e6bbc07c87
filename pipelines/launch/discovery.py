"""One machine's slots under horovodrun's elastic mode, each under a name of its own.

Horovod 0.28.1 blacklists a failed worker's whole host, so each slot is 127.0.0.1 spelt with leading zeros."""
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
    """The slot index a ``slot_name`` names, or None for any other host."""
    match = SLOT_NAME.match(host or "")
    return len(match.group(1)) if match else None


def local_slot(environ: Mapping[str, str]) -> Optional[Tuple[int, int]]:
    """``(local_rank, local_size)`` of a rank started on a slot name (``HOROVOD_HOSTNAME``), else None.

    ``local_size`` is at least the world size ``HOROVOD_SIZE`` and above the slot index."""
    slot = slot_of(environ.get("HOROVOD_HOSTNAME", ""))
    if slot is None:
        return None
    return slot, max(slot + 1, int(environ.get("HOROVOD_SIZE") or 1))
