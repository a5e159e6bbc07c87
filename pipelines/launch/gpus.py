"""Which GPUs a rank may see, decided where the ranks are launched, and which interface NCCL uses.

A Spark task is given GPU *addresses* by Spark's resource scheduling (the worker's discovery
script, ``scripts/gpu_discovery.sh``). As PySpark's ``TorchDistributor`` does
(``_get_gpus_owned``), an integer address is an index into the executor's own
``CUDA_VISIBLE_DEVICES`` when one is set (YARN, Kubernetes and ``docker --gpus`` isolate a
container's GPUs that way), and the rank's process is started with ``CUDA_VISIBLE_DEVICES`` set
to exactly its GPUs and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (CUDA's default order is fastest first;
``nvidia-smi``, and so the discovery script, number GPUs by PCI bus). TensorFlow in that process
then sees its own GPU as GPU 0 (:mod:`pipelines.training.devices`). Pure functions, tested
with fake GPU lists; :func:`visible_gpu_count` asks ``nvidia-smi``.
"""
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
    """``CUDA_VISIBLE_DEVICES`` as a list of its entries; None when unset (every GPU visible),
    ``[]`` when set empty (none visible)."""
    if value is None:
        return None
    return [entry.strip() for entry in value.split(",") if entry.strip()]


def task_gpus(addresses: Sequence[str], visible: Optional[Sequence[str]],
              gpu_count: Optional[int] = None) -> List[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries of the rank a Spark task starts.

    Args:
        addresses: the GPU addresses Spark assigned to the task (``TaskContext.resources()['gpu']``).
        visible: the executor's own ``CUDA_VISIBLE_DEVICES`` (:func:`parse_visible`), or None.
        gpu_count: GPUs this executor sees (:func:`visible_gpu_count`), None when unknown.

    Returns:
        one entry per address: an integer address indexes ``visible`` when set, else it is kept; a
        GPU or MIG UUID is kept (CUDA takes UUIDs), and must be among ``visible`` when set.

    Raises:
        ValueError: an address that is neither an integer (no zero padding) nor a UUID; an index
            beyond the visible GPUs (an isolated executor whose discovery script reports the
            host's numbering): the message names the address and the number of visible GPUs.
    """
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
    """Refuse more ranks on one host than its GPUs, where it has GPUs (each rank takes one GPU:
    two on one GPU would share its memory and its compute); ``gpu_count`` 0 or None: CPU ranks.

    Raises:
        ValueError: naming both numbers.
    """
    if gpu_count and local_size > gpu_count:
        raise Refused(f"{plural(local_size, 'rank')} on this host but {plural(gpu_count, 'GPU')}: start at most one rank per GPU "
                      f"(--spark-np -{gpu_count}, horovodrun -np {gpu_count}), or hide the GPUs "
                      f"({CUDA_VISIBLE}=) to train on the CPU")


def visible_gpu_count(environ: Mapping[str, str]) -> Optional[int]:
    """GPUs a process started with ``environ`` would see: the entries of its
    ``CUDA_VISIBLE_DEVICES`` when set, else the GPUs ``nvidia-smi`` lists; 0 without
    ``nvidia-smi`` (no NVIDIA driver); None when ``nvidia-smi`` fails."""
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
    """The variables a rank's process gets for its GPUs: ``CUDA_VISIBLE_DEVICES`` = ``owned`` and
    Spark's ``addresses`` (:func:`pipelines.launch.rankenv.assigned_gpus_env`: the rank then uses
    every GPU it sees instead of picking one by local rank) when it was given any;
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless ``environ`` (the user's) sets an order."""
    env = {name: value for name, value in DEVICE_ORDER.items() if name not in environ}
    if owned:
        env.update({CUDA_VISIBLE: ",".join(owned), **assigned_gpus_env(addresses)})
    return env


def nccl_env(iface: Optional[str], environ: Mapping[str, str]) -> Dict[str, str]:
    """``NCCL_SOCKET_IFNAME`` = the interface chosen for Gloo (``iface``), so that NCCL's traffic
    between hosts takes the same network (else NCCL may pick a container bridge or a storage
    NIC); nothing when ``environ`` (the user's) has its own ``NCCL_SOCKET_IFNAME`` or no
    interface was chosen."""
    if not iface or NCCL_IFACE in environ:
        return {}
    return {NCCL_IFACE: iface}

