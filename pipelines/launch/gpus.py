"""Which GPUs a rank may see, decided where the ranks are launched, and which interface NCCL uses.

As ``TorchDistributor``: the rank starts with exactly its GPUs visible, in PCI bus order."""
from __future__ import annotations

import re
import shutil
import subprocess
from typing import Dict, List, Mapping, Optional, Sequence

from pipelines.launch.rankenv import assigned_gpus_env
from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural

CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
DEVICE_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
NCCL_IFACE = "NCCL_SOCKET_IFNAME"

_INDEX = re.compile(r"0|[1-9][0-9]*")  # CUDA_VISIBLE_DEVICES' integers: no sign, no zero padding
_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]+(/[0-9]+/[0-9]+)?")  # nvidia-smi -L's names, which CUDA takes too


def parse_visible(value: Optional[str]) -> Optional[List[str]]:
    """``CUDA_VISIBLE_DEVICES`` as a list of entries; None when unset (all visible), ``[]`` when empty (none)."""
    if value is None:
        return None
    return [entry.strip() for entry in value.split(",") if entry.strip()]


def task_gpus(addresses: Sequence[str], visible: Optional[Sequence[str]],
              gpu_count: Optional[int] = None) -> List[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries of the rank a Spark task starts, one per Spark GPU address.

    An integer address indexes ``visible`` (the executor's entries) when set, else is kept; a GPU/MIG UUID is kept.

    Raises:
        ValueError: an address neither index nor UUID, a UUID not visible, or an index beyond the visible GPUs."""
    owned = []
    for address in addresses:
        if _UUID.fullmatch(address):
            if visible is not None and address not in visible:
                raise Refused(f"Spark assigned GPU {address}, which is not among this executor's "
                              f"{CUDA_VISIBLE}={','.join(visible)}")
            owned.append(address)
            continue
        if not _INDEX.fullmatch(address):
            raise Refused(f"Spark assigned GPU address {address!r}: neither an index (0, 1, ...) nor a GPU "
                          f"UUID (GPU-...); fix the worker's GPU discovery script")
        index, count = int(address), len(visible) if visible is not None else gpu_count
        if count is not None and index >= count:
            given = f" ({CUDA_VISIBLE}={','.join(visible)})" if visible is not None else ""
            raise Refused(f"Spark assigned GPU address {index} but this executor sees {plural(count, 'GPU')}"
                          f"{given}: an isolated executor's discovery script must number its GPUs "
                          f"0..{max(count - 1, 0)} as the executor sees them")
        owned.append(visible[index] if visible is not None else address)
    return owned


def check_local_gpus(local_size: int, gpu_count: Optional[int]) -> None:
    """Refuse more ranks on one host than its GPUs (one GPU per rank); ``gpu_count`` 0 or None means CPU ranks.

    Raises:
        ValueError: naming both numbers."""
    if gpu_count and local_size > gpu_count:
        raise Refused(f"{plural(local_size, 'rank')} on this host but {plural(gpu_count, 'GPU')}: start at most one rank per GPU "
                      f"(--spark-np -{gpu_count}, horovodrun -np {gpu_count}), or hide the GPUs "
                      f"({CUDA_VISIBLE}=) to train on the CPU")


def visible_gpu_count(environ: Mapping[str, str]) -> Optional[int]:
    """GPUs a process started with ``environ`` would see; 0 without ``nvidia-smi``, None when it fails."""
    visible = parse_visible(environ.get(CUDA_VISIBLE))
    if visible is not None:
        return len(visible)
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def rank_gpu_env(owned: Sequence[str], addresses: Sequence[str], environ: Mapping[str, str]) -> Dict[str, str]:
    """A rank's GPU variables: ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` (unless ``environ`` sets one)."""
    env = {name: value for name, value in DEVICE_ORDER.items() if name not in environ}
    if owned:
        env.update({CUDA_VISIBLE: ",".join(owned), **assigned_gpus_env(addresses)})
    return env


def nccl_env(iface: Optional[str], environ: Mapping[str, str]) -> Dict[str, str]:
    """``NCCL_SOCKET_IFNAME`` = Gloo's ``iface`` (else NCCL may pick a bridge or storage NIC), unless ``environ`` sets it."""
    if not iface or NCCL_IFACE in environ:
        return {}
    return {NCCL_IFACE: iface}

